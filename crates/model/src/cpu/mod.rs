//! [`FusedCpu`]: the GPT's training step written out by hand for the CPU.
//!
//! Burn's autodiff records every tensor op of [`Gpt::forward`] and replays it backwards, each op
//! a separate pass over memory with a fresh allocation. This module computes the same loss and
//! the same gradients with one hand-written backward per layer (llm.c's approach): activations
//! live in buffers reused from step to step, LayerNorm, GELU, softmax and cross-entropy are one
//! loop each, the matmuls go to `gemm` with AVX-512 kernels where the CPU has them, and the batch
//! is split into contiguous groups of sequences that run on separate threads, their gradients
//! summed in a fixed order.
//!
//! It is an accelerator for the CPU, not a second model: the weights are read from a [`Gpt`], the
//! gradients go back as Burn [`GradientsParams`] for Burn's optimizer, and the tests check loss
//! and every gradient against Burn's autodiff of [`Gpt::forward`] + [`cross_entropy`].
//!
//! [`cross_entropy`]: crate::cross_entropy

mod attention;
mod cross_entropy;
mod dropout;
mod fast_math;
mod gelu;
mod layer_norm;
mod matmul;
mod params;

use burn::optim::GradientsParams;
use thiserror::Error;

use crate::error::{LossError, ModelError};
use crate::gpt::Gpt;
use crate::loss::IGNORE_INDEX;
use attention::Shape;
use dropout::Rng;
use matmul::{View, matmul};
use params::Params;

/// Why [`FusedCpu`] cannot run a model or a batch.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum FusedError {
    #[error(
        "the fused CPU step needs every block's LayerNorms and MLP (this model has `{0}` off); \
         use --backend flex"
    )]
    Unsupported(&'static str),
    #[error("inputs and targets hold {inputs} and {targets} ids for a [{batch}, {seq}] batch")]
    BatchShape {
        inputs: usize,
        targets: usize,
        batch: usize,
        seq: usize,
    },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Loss(#[from] LossError),
}

/// A batch on the host: `inputs` and `targets` are `[batch, seq]` row-major; targets may be
/// [`IGNORE_INDEX`].
#[derive(Debug, Clone, Copy)]
pub struct TokenBatch<'a> {
    pub inputs: &'a [i64],
    pub targets: &'a [i64],
    pub batch: usize,
    pub seq: usize,
}

/// The model's sizes, read from its tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Dims {
    vocab: usize,
    block_size: usize,
    width: usize,
    heads: usize,
    dropout: f32,
}

impl Dims {
    fn of(gpt: &Gpt) -> Result<Self, FusedError> {
        for block in &gpt.h {
            if block.ln_1.is_none() || block.ln_2.is_none() || gpt.ln_f.is_none() {
                return Err(FusedError::Unsupported("layer_norm"));
            }
            if block.mlp.is_none() {
                return Err(FusedError::Unsupported("mlp"));
            }
        }
        Ok(Self {
            vocab: gpt.vocab_size,
            block_size: gpt.block_size,
            width: gpt.wte.weight.dims()[1],
            heads: gpt.h.first().map_or(1, |b| b.attn.n_heads),
            dropout: gpt.drop.prob as f32,
        })
    }
}

/// Computes loss and gradients of a [`Gpt`] on the CPU with fused, hand-written kernels, on
/// `threads` threads. Create it once and reuse it: its buffers are kept between calls.
///
/// ```text
/// let mut fused = FusedCpu::new(&model, 2)?;
/// fused.read_weights(&model);                 // after every optimizer step
/// let loss = fused.accumulate(batch, 1.0, Some(seed))?;
/// let grads = fused.take_gradients(&model);   // Burn GradientsParams for the optimizer
/// ```
#[derive(Debug)]
pub struct FusedCpu {
    dims: Dims,
    weights: Params,
    grads: Params,
    work: Vec<Workspace>,
}

impl FusedCpu {
    /// Reads `gpt`'s sizes and weights. `threads` (≥ 1) is how many groups a batch is split into;
    /// results are reproducible for a given value.
    pub fn new(gpt: &Gpt, threads: usize) -> Result<Self, FusedError> {
        let dims = Dims::of(gpt)?;
        let weights = Params::read(gpt);
        let mut grads = Params::default();
        grads.zero_like(&weights);
        let work = (0..threads.max(1)).map(|_| Workspace::default()).collect();
        Ok(Self {
            dims,
            weights,
            grads,
            work,
        })
    }

    /// Re-reads the weights of `gpt` (same architecture), e.g. after an optimizer step.
    pub fn read_weights(&mut self, gpt: &Gpt) {
        self.weights = Params::read(gpt);
    }

    /// The mean loss over the kept targets of `batch`, without gradients or dropout (evaluation).
    pub fn loss(&mut self, batch: TokenBatch<'_>) -> Result<f64, FusedError> {
        self.run(batch, None, None)
    }

    /// Adds `scale ×` the gradients of `batch`'s mean loss to those held (e.g. `scale` =
    /// 1/grad_accum) and returns the mean loss. `dropout_seed`: `None` turns dropout off; with a
    /// seed, each sequence's masks depend only on the seed and its index in the batch.
    pub fn accumulate(
        &mut self,
        batch: TokenBatch<'_>,
        scale: f32,
        dropout_seed: Option<u64>,
    ) -> Result<f64, FusedError> {
        self.run(batch, Some(scale), dropout_seed)
    }

    /// Scales the held gradients by `min(1, max_norm / (‖g‖ + 1e-6))`, ‖g‖ the norm of all of
    /// them together (PyTorch's `clip_grad_norm_`), and returns ‖g‖.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        self.grads.scale_to_norm(max_norm)
    }

    /// The gradients accumulated since the last call, as Burn gradients of `gpt`'s parameters;
    /// the held gradients are reset to zero.
    pub fn take_gradients(&mut self, gpt: &Gpt) -> GradientsParams {
        let grads = self.grads.to_gradients(gpt);
        let weights = &self.weights;
        self.grads.zero_like(weights);
        grads
    }

    fn run(
        &mut self,
        batch: TokenBatch<'_>,
        scale: Option<f32>,
        dropout_seed: Option<u64>,
    ) -> Result<f64, FusedError> {
        self.check(&batch)?;
        let kept = batch.targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
        if kept == 0 {
            return Err(LossError::AllTargetsIgnored {
                ignore_index: IGNORE_INDEX,
            }
            .into());
        }
        let grad_scale = scale.map(|s| s / kept as f32);
        let dropout = dropout_seed.filter(|_| self.dims.dropout > 0.0 && scale.is_some());
        let groups = self.work.len().min(batch.batch);
        let (dims, weights) = (self.dims, &self.weights);
        // Contiguous groups of sequences, the first ones one longer when it does not divide.
        let mut jobs = Vec::with_capacity(groups);
        let mut first = 0;
        for (g, work) in self.work.iter_mut().take(groups).enumerate() {
            let seqs = batch.batch / groups + usize::from(g < batch.batch % groups);
            jobs.push(Job {
                work,
                first,
                seqs,
                batch: &batch,
            });
            first += seqs;
        }
        let sums: Vec<f64> = std::thread::scope(|scope| {
            let mut jobs = jobs.into_iter();
            let here = jobs.next().expect("at least one sequence");
            let handles: Vec<_> = jobs
                .map(|job| scope.spawn(move || job.run(dims, weights, grad_scale, dropout)))
                .collect();
            let mut sums = vec![here.run(dims, weights, grad_scale, dropout)];
            sums.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().expect("worker panicked")),
            );
            sums
        });
        if grad_scale.is_some() {
            for work in &self.work[..groups] {
                self.grads.add(&work.grads);
            }
        }
        Ok(sums.iter().sum::<f64>() / kept as f64)
    }

    fn check(&self, batch: &TokenBatch<'_>) -> Result<(), FusedError> {
        let cells = batch.batch * batch.seq;
        if batch.inputs.len() != cells || batch.targets.len() != cells || cells == 0 {
            return Err(FusedError::BatchShape {
                inputs: batch.inputs.len(),
                targets: batch.targets.len(),
                batch: batch.batch,
                seq: batch.seq,
            });
        }
        if batch.seq > self.dims.block_size {
            return Err(ModelError::Attention(
                tinygpt_attention::AttentionError::SequenceTooLong {
                    len: batch.seq,
                    max: self.dims.block_size,
                },
            )
            .into());
        }
        let vocab = self.dims.vocab as i64;
        let bad_input = batch.inputs.iter().find(|&&id| !(0..vocab).contains(&id));
        let bad_target = batch
            .targets
            .iter()
            .find(|&&id| id != IGNORE_INDEX && !(0..vocab).contains(&id));
        if let Some(&id) = bad_input.or(bad_target) {
            return Err(ModelError::TokenOutOfRange {
                id,
                vocab_size: self.dims.vocab,
            }
            .into());
        }
        Ok(())
    }
}

/// One thread's share of a batch.
struct Job<'a> {
    work: &'a mut Workspace,
    first: usize,
    seqs: usize,
    batch: &'a TokenBatch<'a>,
}

impl Job<'_> {
    fn run(self, dims: Dims, w: &Params, grad_scale: Option<f32>, dropout: Option<u64>) -> f64 {
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
struct Workspace {
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
    grads: Params,
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
            let (te, pe) = (tok as usize * c, (r % seq) * c);
            for ((x, a), b) in row
                .iter_mut()
                .zip(&w.wte[te..te + c])
                .zip(&w.wpe[pe..pe + c])
            {
                *x = a + b;
            }
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

/// `out [rows, n_out] = x [rows, n_in] · w [n_in, n_out] + b` (`b` empty = no bias).
fn linear(
    out: &mut [f32],
    x: &[f32],
    w: &[f32],
    b: &[f32],
    rows: usize,
    n_in: usize,
    n_out: usize,
) {
    let bias = !b.is_empty();
    if bias {
        out.chunks_exact_mut(n_out)
            .for_each(|row| row.copy_from_slice(b));
    }
    matmul(
        out,
        View::new(x, rows, n_in),
        View::new(w, n_in, n_out),
        bias,
    );
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
