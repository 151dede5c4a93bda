//! One thread's part of a step: its activation buffers, kept between calls, and the forward and
//! backward passes over them, layer by layer.

use super::attention::{self, Shape};
use super::dropout::Rng;
use super::matmul::{View, linear, matmul};
use super::params::Params;
use super::{Dims, TokenBatch, cross_entropy, gelu, layer_norm};

/// One thread's share of a batch.
pub(super) struct Job<'a> {
    pub work: &'a mut Workspace,
    /// Its sequences: `seqs` of them from index `first` of `batch`.
    pub first: usize,
    pub seqs: usize,
    pub batch: &'a TokenBatch<'a>,
}

impl Job<'_> {
    /// Forward, loss and (with `grad_scale`) backward over the share; returns its summed loss.
    pub(super) fn run(
        self,
        dims: Dims,
        w: &Params,
        grad_scale: Option<f32>,
        dropout: Option<u64>,
    ) -> f64 {
        let seq = self.batch.seq;
        let rows = self.first * seq..(self.first + self.seqs) * seq;
        let inputs = &self.batch.inputs[rows.clone()];
        let targets = &self.batch.targets[rows];
        let work = self.work;
        work.prepare(
            dims,
            w,
            self.seqs,
            seq,
            grad_scale.is_some(),
            dropout.is_some(),
        );
        if let Some(seed) = dropout {
            work.draw_masks(seed, self.first, dims.dropout);
        }
        work.forward(w, inputs);
        let loss = cross_entropy::forward(&mut work.logits, targets, grad_scale);
        if grad_scale.is_some() {
            work.backward(w, inputs);
        }
        loss
    }
}

/// One block's saved activations for `rows = seqs·seq` tokens.
#[derive(Debug, Default)]
struct BlockActs {
    /// `ln_1` output `[rows, width]` and its per-row mean and 1/std.
    ln_1: Vec<f32>,
    ln_1_mean: Vec<f32>,
    ln_1_rstd: Vec<f32>,
    /// `[rows, 3·width]`.
    qkv: Vec<f32>,
    /// Softmax weights `[seqs, heads, seq, seq]`, and dropout's scales on them (empty = none).
    att: Vec<f32>,
    att_mask: Vec<f32>,
    /// Heads' outputs, concatenated `[rows, width]`.
    y: Vec<f32>,
    /// Dropout on the attention branch `[rows, width]` (empty = none).
    attn_mask: Vec<f32>,
    /// Residual stream after attention `[rows, width]`.
    mid: Vec<f32>,
    ln_2: Vec<f32>,
    ln_2_mean: Vec<f32>,
    ln_2_rstd: Vec<f32>,
    /// MLP pre-activation and GELU output, `[rows, 4·width]`.
    fc: Vec<f32>,
    gelu: Vec<f32>,
    mlp_mask: Vec<f32>,
}

/// Buffers of one thread, reused from call to call (resizing keeps their allocations).
#[derive(Debug, Default)]
pub(super) struct Workspace {
    seqs: usize,
    seq: usize,
    width: usize,
    heads: usize,
    /// `resid[0]` is the embedding, `resid[l + 1]` block `l`'s output; `[rows, width]` each.
    resid: Vec<Vec<f32>>,
    emb_mask: Vec<f32>,
    blocks: Vec<BlockActs>,
    ln_f: Vec<f32>,
    ln_f_mean: Vec<f32>,
    ln_f_rstd: Vec<f32>,
    /// Logits `[rows, vocab]`; the loss's gradient after the cross-entropy.
    logits: Vec<f32>,
    /// Backward scratch: residual gradient, a branch gradient, `[rows, 4·width]`, `qkv`'s
    /// gradient, and two `[seq, seq]` maps.
    d_resid: Vec<f32>,
    d_branch: Vec<f32>,
    d_wide: Vec<f32>,
    d_qkv: Vec<f32>,
    scratch: Vec<f32>,
    pub grads: Params,
}

fn size(buf: &mut Vec<f32>, len: usize) {
    buf.resize(len, 0.0);
}

impl Workspace {
    fn prepare(&mut self, d: Dims, w: &Params, seqs: usize, seq: usize, grad: bool, drop: bool) {
        let (rows, c) = (seqs * seq, d.width);
        self.seqs = seqs;
        self.seq = seq;
        self.width = c;
        self.heads = d.heads;
        self.resid.resize_with(w.blocks.len() + 1, Vec::new);
        self.resid.iter_mut().for_each(|r| size(r, rows * c));
        self.blocks.resize_with(w.blocks.len(), Default::default);
        let masks = if drop { rows * c } else { 0 };
        size(&mut self.emb_mask, masks);
        for a in &mut self.blocks {
            for buf in [&mut a.ln_1, &mut a.y, &mut a.mid, &mut a.ln_2] {
                size(buf, rows * c);
            }
            for buf in [
                &mut a.ln_1_mean,
                &mut a.ln_1_rstd,
                &mut a.ln_2_mean,
                &mut a.ln_2_rstd,
            ] {
                size(buf, rows);
            }
            size(&mut a.qkv, rows * 3 * c);
            size(&mut a.att, seqs * d.heads * seq * seq);
            size(&mut a.att_mask, if drop { a.att.len() } else { 0 });
            size(&mut a.attn_mask, masks);
            size(&mut a.fc, rows * 4 * c);
            size(&mut a.gelu, rows * 4 * c);
            size(&mut a.mlp_mask, masks);
        }
        size(&mut self.ln_f, rows * c);
        size(&mut self.ln_f_mean, rows);
        size(&mut self.ln_f_rstd, rows);
        size(&mut self.logits, rows * d.vocab);
        size(&mut self.scratch, 2 * seq * seq);
        if grad {
            size(&mut self.d_resid, rows * c);
            size(&mut self.d_branch, rows * c);
            size(&mut self.d_wide, rows * 4 * c);
            size(&mut self.d_qkv, rows * 3 * c);
            self.grads.zero_like(w);
        }
    }

    /// Dropout masks for every site, per sequence (numbered from `first` in the whole batch).
    fn draw_masks(&mut self, seed: u64, first: usize, p: f32) {
        let seqs = self.seqs;
        let mut sites = vec![&mut self.emb_mask];
        for a in &mut self.blocks {
            sites.extend([&mut a.att_mask, &mut a.attn_mask, &mut a.mlp_mask]);
        }
        for (site, mask) in sites.into_iter().enumerate() {
            let per_seq = mask.len() / seqs;
            for (s, chunk) in mask.chunks_exact_mut(per_seq).enumerate() {
                Rng::new(seed, (first + s) as u64, site as u64).fill_mask(chunk, p);
            }
        }
    }

    fn shape(&self) -> Shape {
        Shape {
            seqs: self.seqs,
            seq: self.seq,
            width: self.width,
            heads: self.heads,
        }
    }

    fn forward(&mut self, w: &Params, inputs: &[i64]) {
        let (c, seq, shape) = (self.width, self.seq, self.shape());
        // Token + position embeddings.
        for (r, (row, &tok)) in self.resid[0].chunks_exact_mut(c).zip(inputs).enumerate() {
            w.embed(row, tok as usize, r % seq);
        }
        apply_mask(&mut self.resid[0], &self.emb_mask);
        for (l, (p, a)) in w.blocks.iter().zip(&mut self.blocks).enumerate() {
            let (before, after) = self.resid.split_at_mut(l + 1);
            let (x, out) = (&before[l], &mut after[0]);
            let rows = x.len() / c;
            layer_norm::forward(
                &mut a.ln_1,
                &mut a.ln_1_mean,
                &mut a.ln_1_rstd,
                x,
                &p.ln_1_gamma,
                &p.ln_1_beta,
            );
            linear(
                &mut a.qkv,
                &a.ln_1,
                &p.c_attn_w,
                &p.c_attn_b,
                rows,
                c,
                3 * c,
            );
            attention::forward(
                &mut a.y,
                &mut a.att,
                &a.qkv,
                &a.att_mask,
                &mut self.scratch,
                shape,
            );
            linear(&mut a.mid, &a.y, &p.attn_proj_w, &p.attn_proj_b, rows, c, c);
            apply_mask(&mut a.mid, &a.attn_mask);
            a.mid.iter_mut().zip(x).for_each(|(m, x)| *m += x);
            layer_norm::forward(
                &mut a.ln_2,
                &mut a.ln_2_mean,
                &mut a.ln_2_rstd,
                &a.mid,
                &p.ln_2_gamma,
                &p.ln_2_beta,
            );
            linear(&mut a.fc, &a.ln_2, &p.c_fc_w, &p.c_fc_b, rows, c, 4 * c);
            gelu::forward(&mut a.gelu, &a.fc);
            linear(out, &a.gelu, &p.mlp_proj_w, &p.mlp_proj_b, rows, 4 * c, c);
            apply_mask(out, &a.mlp_mask);
            out.iter_mut().zip(&a.mid).for_each(|(o, m)| *o += m);
        }
        let x = self.resid.last().expect("embedding at least");
        layer_norm::forward(
            &mut self.ln_f,
            &mut self.ln_f_mean,
            &mut self.ln_f_rstd,
            x,
            &w.ln_f_gamma,
            &w.ln_f_beta,
        );
        let rows = x.len() / c;
        let h = View::new(&self.ln_f, rows, c);
        if w.lm_head.is_empty() {
            let vocab = w.wte.len() / c;
            matmul(&mut self.logits, h, View::new(&w.wte, vocab, c).t(), false);
        } else {
            let vocab = w.lm_head.len() / c;
            matmul(&mut self.logits, h, View::new(&w.lm_head, c, vocab), false);
        }
    }

    /// Gradients of every parameter into `self.grads`, from the loss gradient in `self.logits`.
    fn backward(&mut self, w: &Params, inputs: &[i64]) {
        let (c, seq, shape) = (self.width, self.seq, self.shape());
        let rows = self.ln_f.len() / c;
        let g = &mut self.grads;
        let dlogits = &self.logits;
        let vocab = dlogits.len() / rows;
        let dl = View::new(dlogits, rows, vocab);
        let h = View::new(&self.ln_f, rows, c);
        if w.lm_head.is_empty() {
            matmul(&mut self.d_branch, dl, View::new(&w.wte, vocab, c), false);
            matmul(&mut g.wte, dl.t(), h, true);
        } else {
            matmul(
                &mut self.d_branch,
                dl,
                View::new(&w.lm_head, c, vocab).t(),
                false,
            );
            matmul(&mut g.lm_head, h.t(), dl, true);
        }
        self.d_resid.fill(0.0);
        let x = self.resid.last().expect("embedding at least");
        layer_norm::backward(
            &mut self.d_resid,
            &mut g.ln_f_gamma,
            &mut g.ln_f_beta,
            &self.d_branch,
            x,
            &self.ln_f_mean,
            &self.ln_f_rstd,
            &w.ln_f_gamma,
        );
        for l in (0..w.blocks.len()).rev() {
            let (p, a, gb) = (&w.blocks[l], &self.blocks[l], &mut g.blocks[l]);
            let x = &self.resid[l];
            // out = mid + dropout(gelu(fc) · W + b)
            masked(&mut self.d_branch, &self.d_resid, &a.mlp_mask);
            linear_backward(
                &mut self.d_wide,
                &mut gb.mlp_proj_w,
                &mut gb.mlp_proj_b,
                &self.d_branch,
                &a.gelu,
                &p.mlp_proj_w,
                rows,
                4 * c,
                c,
            );
            gelu::backward_in_place(&mut self.d_wide, &a.fc);
            linear_backward(
                &mut self.d_branch,
                &mut gb.c_fc_w,
                &mut gb.c_fc_b,
                &self.d_wide,
                &a.ln_2,
                &p.c_fc_w,
                rows,
                c,
                4 * c,
            );
            layer_norm::backward(
                &mut self.d_resid,
                &mut gb.ln_2_gamma,
                &mut gb.ln_2_beta,
                &self.d_branch,
                &a.mid,
                &a.ln_2_mean,
                &a.ln_2_rstd,
                &p.ln_2_gamma,
            );
            // mid = x + dropout(attention(ln_1(x)) · W + b)
            masked(&mut self.d_branch, &self.d_resid, &a.attn_mask);
            let d_y = &mut self.d_wide[..rows * c];
            linear_backward(
                d_y,
                &mut gb.attn_proj_w,
                &mut gb.attn_proj_b,
                &self.d_branch,
                &a.y,
                &p.attn_proj_w,
                rows,
                c,
                c,
            );
            attention::backward(
                &mut self.d_qkv,
                &*d_y,
                &a.qkv,
                &a.att,
                &a.att_mask,
                &mut self.scratch,
                shape,
            );
            linear_backward(
                &mut self.d_branch,
                &mut gb.c_attn_w,
                &mut gb.c_attn_b,
                &self.d_qkv,
                &a.ln_1,
                &p.c_attn_w,
                rows,
                c,
                3 * c,
            );
            layer_norm::backward(
                &mut self.d_resid,
                &mut gb.ln_1_gamma,
                &mut gb.ln_1_beta,
                &self.d_branch,
                x,
                &a.ln_1_mean,
                &a.ln_1_rstd,
                &p.ln_1_gamma,
            );
        }
        apply_mask(&mut self.d_resid, &self.emb_mask);
        for (r, (d, &tok)) in self.d_resid.chunks_exact(c).zip(inputs).enumerate() {
            let (te, pe) = (tok as usize * c, (r % seq) * c);
            g.wte[te..te + c]
                .iter_mut()
                .zip(d)
                .for_each(|(g, d)| *g += d);
            g.wpe[pe..pe + c]
                .iter_mut()
                .zip(d)
                .for_each(|(g, d)| *g += d);
        }
    }
}

/// The backward of [`linear`]: `dx = dy · wᵀ` (overwritten), `dw += xᵀ · dy`, `db += Σ_rows dy`.
#[allow(clippy::too_many_arguments)]
fn linear_backward(
    dx: &mut [f32],
    dw: &mut [f32],
    db: &mut [f32],
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    rows: usize,
    n_in: usize,
    n_out: usize,
) {
    let dy_view = View::new(dy, rows, n_out);
    matmul(dx, dy_view, View::new(w, n_in, n_out).t(), false);
    matmul(dw, View::new(x, rows, n_in).t(), dy_view, true);
    if !db.is_empty() {
        for row in dy.chunks_exact(n_out) {
            db.iter_mut().zip(row).for_each(|(b, d)| *b += d);
        }
    }
}

/// `x *= mask` element-wise; an empty mask (no dropout) leaves `x` alone.
fn apply_mask(x: &mut [f32], mask: &[f32]) {
    if !mask.is_empty() {
        x.iter_mut().zip(mask).for_each(|(x, m)| *x *= m);
    }
}

/// `out = x * mask` (`out = x` with an empty mask).
fn masked(out: &mut [f32], x: &[f32], mask: &[f32]) {
    out.copy_from_slice(x);
    apply_mask(out, mask);
}
