//! [`FusedDecoder`]: sampling's forward pass on the CPU, with a KV cache, by the same kernels as
//! the fused training step.
//!
//! Sampling feeds one token at a time, so every product is a vector times a matrix: Burn pays a
//! kernel launch, an allocation and a tensor op's bookkeeping for each of the ~20 ops per layer,
//! which costs more than the arithmetic at the baby size. Here a token is one pass over the
//! weights with no allocation.

use super::attention::{self, Shape};
use super::fast_math::{self, vectorized};
use super::matmul::{dot, dot_lanes, linear};
use super::params::Params;
use super::{Dims, FusedError, gelu, layer_norm};
use crate::error::ModelError;
use crate::generate::Decoder;
use crate::gpt::Gpt;
use tinygpt_attention::AttentionError;

/// A [`Gpt`]'s weights read onto the host, and the keys and values of the tokens fed so far
/// (one sequence). Gives the same logits as [`Gpt::forward`] to float rounding; the tests
/// check it.
///
/// ```text
/// let mut decoder = FusedDecoder::new(&model)?;
/// let tokens = tinygpt_model::generate(&mut decoder, &prompt, &options, |id| print(id))?;
/// ```
#[derive(Debug)]
pub struct FusedDecoder {
    dims: Dims,
    weights: Params,
    /// Per block, the cached keys and values `[block_size, width]`; rows `0..len` are filled.
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
    /// Scratch for the rows being fed: the residual stream `[rows, width]`, a LayerNorm's output
    /// and statistics, `qkv [rows, 3·width]`, the heads' outputs, a branch's output, the MLP's
    /// hidden layer before and after GELU `[rows, 4·width]`, attention weights `[heads, rows,
    /// rows]` of a whole window, one row of attention scores, logits.
    x: Vec<f32>,
    ln: Vec<f32>,
    mean: Vec<f32>,
    rstd: Vec<f32>,
    qkv: Vec<f32>,
    y: Vec<f32>,
    branch: Vec<f32>,
    fc: Vec<f32>,
    act: Vec<f32>,
    att: Vec<f32>,
    scores: Vec<f32>,
    logits: Vec<f32>,
}

impl FusedDecoder {
    /// Reads `gpt`'s sizes and weights (dropout is off while sampling).
    pub fn new(gpt: &Gpt) -> Result<Self, FusedError> {
        let dims = Dims::of(gpt)?;
        let cache = vec![0.0; dims.block_size * dims.width];
        Ok(Self {
            dims,
            weights: Params::read(gpt),
            keys: vec![cache.clone(); gpt.h.len()],
            values: vec![cache; gpt.h.len()],
            len: 0,
            x: Vec::new(),
            ln: Vec::new(),
            mean: Vec::new(),
            rstd: Vec::new(),
            qkv: Vec::new(),
            y: Vec::new(),
            branch: Vec::new(),
            fc: Vec::new(),
            act: Vec::new(),
            att: Vec::new(),
            scores: vec![0.0; dims.block_size],
            logits: vec![0.0; dims.vocab],
        })
    }

    fn check(&self, tokens: &[u32]) -> Result<(), ModelError> {
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= self.dims.vocab) {
            return Err(ModelError::TokenOutOfRange {
                id: id.into(),
                vocab_size: self.dims.vocab,
            });
        }
        let len = self.len + tokens.len();
        if len > self.dims.block_size {
            return Err(AttentionError::SequenceTooLong {
                len,
                max: self.dims.block_size,
            }
            .into());
        }
        Ok(())
    }

    /// The forward pass of `tokens` at positions `len..len + rows`, appending their keys and
    /// values to the cache; leaves the last row's logits in `self.logits`.
    fn forward(&mut self, tokens: &[u32]) {
        let (c, rows, past) = (self.dims.width, tokens.len(), self.len);
        for buf in [&mut self.x, &mut self.ln, &mut self.y, &mut self.branch] {
            buf.resize(rows * c, 0.0);
        }
        self.mean.resize(rows, 0.0);
        self.rstd.resize(rows, 0.0);
        self.qkv.resize(rows * 3 * c, 0.0);
        self.fc.resize(rows * 4 * c, 0.0);
        self.act.resize(rows * 4 * c, 0.0);
        for (r, (x, &tok)) in self.x.chunks_exact_mut(c).zip(tokens).enumerate() {
            self.weights.embed(x, tok as usize, past + r);
        }
        for l in 0..self.weights.blocks.len() {
            self.attention_branch(l, rows, past);
            self.mlp_branch(l, rows);
        }
        self.last_row_logits(rows);
        self.len += rows;
    }

    /// `x += c_proj(attention(ln_1(x)))` for block `l`, the rows' keys and values cached.
    fn attention_branch(&mut self, l: usize, rows: usize, past: usize) {
        let c = self.dims.width;
        let p = &self.weights.blocks[l];
        let (ln, mean, rstd) = (&mut self.ln, &mut self.mean, &mut self.rstd);
        layer_norm::forward(ln, mean, rstd, &self.x, &p.ln_1_gamma, &p.ln_1_beta);
        linear(&mut self.qkv, ln, &p.c_attn_w, &p.c_attn_b, rows, c, 3 * c);
        let (keys, values) = (&mut self.keys[l], &mut self.values[l]);
        for (r, qkv) in self.qkv.chunks_exact(3 * c).enumerate() {
            let at = (past + r) * c..(past + r + 1) * c;
            keys[at.clone()].copy_from_slice(&qkv[c..2 * c]);
            values[at].copy_from_slice(&qkv[2 * c..]);
        }
        if past == 0 && rows > 1 {
            // A whole window (a prompt, or the rebuild after the window slid): the training
            // kernel's blocked products.
            let heads = self.dims.heads;
            let shape = Shape {
                seqs: 1,
                seq: rows,
                width: c,
                heads,
            };
            self.att.resize(heads * rows * rows, 0.0);
            attention::forward(&mut self.y, &mut self.att, &self.qkv, &[], &mut [], shape);
        } else {
            let rows = self.y.chunks_exact_mut(c).zip(self.qkv.chunks_exact(3 * c));
            for (r, (y, qkv)) in rows.enumerate() {
                let visible = (past + r + 1) * c;
                let scores = &mut self.scores[..past + r + 1];
                let (k, v) = (&keys[..visible], &values[..visible]);
                attend(y, &qkv[..c], k, v, scores, self.dims.heads);
            }
        }
        let (w, b) = (&p.attn_proj_w, &p.attn_proj_b);
        linear(&mut self.branch, &self.y, w, b, rows, c, c);
        add_into(&mut self.x, &self.branch);
    }

    /// `x += mlp(ln_2(x))` for block `l`.
    fn mlp_branch(&mut self, l: usize, rows: usize) {
        let c = self.dims.width;
        let p = &self.weights.blocks[l];
        let (ln, mean, rstd) = (&mut self.ln, &mut self.mean, &mut self.rstd);
        layer_norm::forward(ln, mean, rstd, &self.x, &p.ln_2_gamma, &p.ln_2_beta);
        linear(&mut self.fc, ln, &p.c_fc_w, &p.c_fc_b, rows, c, 4 * c);
        gelu::forward(&mut self.act, &self.fc);
        let (w, b) = (&p.mlp_proj_w, &p.mlp_proj_b);
        linear(&mut self.branch, &self.act, w, b, rows, 4 * c, c);
        add_into(&mut self.x, &self.branch);
    }

    /// The final LayerNorm and the LM head, for the last row only: only its next token is
    /// wanted.
    fn last_row_logits(&mut self, rows: usize) {
        let (c, w) = (self.dims.width, &self.weights);
        let last = &self.x[(rows - 1) * c..];
        let h = &mut self.ln[..c];
        let (mean, rstd) = (&mut self.mean[..1], &mut self.rstd[..1]);
        layer_norm::forward(h, mean, rstd, last, &w.ln_f_gamma, &w.ln_f_beta);
        if w.lm_head.is_empty() {
            for (logit, row) in self.logits.iter_mut().zip(w.wte.chunks_exact(c)) {
                *logit = dot(h, row);
            }
        } else {
            linear(&mut self.logits, h, &w.lm_head, &[], 1, c, self.dims.vocab);
        }
    }
}

/// `x += branch`: a residual connection.
fn add_into(x: &mut [f32], branch: &[f32]) {
    x.iter_mut().zip(branch).for_each(|(x, b)| *x += b);
}

impl Decoder for FusedDecoder {
    fn block_size(&self) -> usize {
        self.dims.block_size
    }

    fn vocab_size(&self) -> usize {
        self.dims.vocab
    }

    fn cached(&self) -> usize {
        self.len
    }

    fn clear(&mut self) {
        self.len = 0;
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.check(tokens)?;
        if tokens.is_empty() {
            return Err(AttentionError::EmptySequence.into());
        }
        self.forward(tokens);
        Ok(self.logits.clone())
    }
}

vectorized! {
    /// One query row's attention over the `visible` cached keys and values, head by head:
    /// `y [width] = softmax(q·Kᵀ/√d) · V` with `q [width]`, `keys`, `values [visible, width]`.
    /// The cache holds only visible tokens, so no causal mask is needed.
    fn attend(
        y: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut [f32],
        heads: usize,
    ) {
        let width = q.len();
        let d = width / heads;
        let scale = 1.0 / (d as f32).sqrt();
        for h in 0..heads {
            let head = h * d..(h + 1) * d;
            let q = &q[head.clone()];
            for (s, k) in scores.iter_mut().zip(keys.chunks_exact(width)) {
                *s = dot_lanes(q, &k[head.clone()]) * scale;
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0.0;
            for s in scores.iter_mut() {
                *s = fast_math::exp(*s - max);
                total += *s;
            }
            let y = &mut y[head.clone()];
            y.fill(0.0);
            for (&s, v) in scores.iter().zip(values.chunks_exact(width)) {
                let p = s / total;
                y.iter_mut().zip(&v[head.clone()]).for_each(|(y, v)| *y += p * v);
            }
        }
    }
}
