//! One transformer block, forward and backward side by side (llm.c's layout):
//!
//! ```text
//! mid = x   + dropout(attend(rope(qk_norm(ln_1(x) · W_attn + b))) · W_attn_proj + b)
//! out = mid + dropout(act(ln_2(mid) · W_fc + b) · W_mlp_proj + b)
//! ```
//!
//! Each variable part (the norm, QK-norm, rotary positions, the activation) is a pair of
//! kernels in its own file, picked here by the model's config.
//!
//! The forward is the one both the training step (`workspace.rs`) and the decoder (`decode.rs`)
//! run: they differ only in how the heads attend (whole causal sequences, or new rows against a
//! KV cache), which they pass in. A block feature is written here once.

use super::adapters::{self, AdapterActs};
use super::dims::Dims;
use super::kernels::attention::{self, Shape};
use super::kernels::matmul::{View, matmul};
use super::kernels::norm::{self, Normed};
use super::kernels::rows::F32Rows;
use super::kernels::{gelu, gelu_tanh, qk_norm, relu2, swiglu};
use super::params::{BlockParams, stacked_row_values};
pub(super) use super::product::{Ctx, Weight, linear_split, per_row};
use crate::arch::{LoraTarget, Mlp};

/// One block's activations for `rows` tokens: what the forward writes and the backward reads.
#[derive(Debug, Default)]
pub(super) struct BlockActs {
    /// `ln_1` output `[rows, width]` and its per-row mean and 1/std.
    pub ln_1: Vec<f32>,
    pub ln_1_mean: Vec<f32>,
    pub ln_1_rstd: Vec<f32>,
    /// `[rows, qkv_width]` (`3·width` without grouped heads): queries and keys after QK-norm
    /// and the rotation.
    pub qkv: Vec<f32>,
    /// With QK-norm: the normalised queries and keys before the rotation `[rows, qk_width]`,
    /// and each head's `1/rms` `[rows, heads + kv_heads]`.
    pub qk_n: Vec<f32>,
    pub qk_rstd: Vec<f32>,
    /// Softmax weights (training: `[seqs, heads, seq, seq]`), and dropout's scales on them
    /// (empty = none).
    pub att: Vec<f32>,
    pub att_mask: Vec<f32>,
    /// Heads' outputs, concatenated `[rows, width]`.
    pub y: Vec<f32>,
    /// Dropout on the attention branch `[rows, width]` (empty = none).
    pub attn_mask: Vec<f32>,
    /// Residual stream after attention `[rows, width]`.
    pub mid: Vec<f32>,
    pub ln_2: Vec<f32>,
    pub ln_2_mean: Vec<f32>,
    pub ln_2_rstd: Vec<f32>,
    /// MLP pre-activation `[rows, fc_width]` and activation output `[rows, hidden]`.
    pub fc: Vec<f32>,
    pub act: Vec<f32>,
    /// Dropout on the MLP branch `[rows, width]` (empty = none).
    pub mlp_mask: Vec<f32>,
    /// What the LoRA adapters beside its matrices keep ([`adapters`]).
    pub adapters: AdapterActs,
}

impl BlockActs {
    /// Floats held in every buffer.
    pub(super) fn floats(&self) -> usize {
        [
            &self.ln_1,
            &self.ln_1_mean,
            &self.ln_1_rstd,
            &self.qkv,
            &self.qk_n,
            &self.qk_rstd,
            &self.att,
            &self.att_mask,
            &self.y,
            &self.attn_mask,
            &self.mid,
            &self.ln_2,
            &self.ln_2_mean,
            &self.ln_2_rstd,
            &self.fc,
            &self.act,
            &self.mlp_mask,
        ]
        .into_iter()
        .chain(self.adapters.buffers())
        .map(|b| b.len())
        .sum()
    }

    /// Every buffer sized for `rows` rows of model `d`, `att` for `att_len` attention
    /// weights; the dropout masks only with `dropout`.
    pub(super) fn resize(&mut self, rows: usize, d: &Dims, att_len: usize, dropout: bool) {
        let (width, hidden) = (d.width, d.hidden);
        let size = |buf: &mut Vec<f32>, len: usize| buf.resize(len, 0.0);
        let qk = if d.qk_norm { rows * d.qk_width() } else { 0 };
        size(&mut self.qk_n, qk);
        size(&mut self.qk_rstd, qk / d.d_head());
        for buf in [&mut self.ln_1, &mut self.y, &mut self.mid, &mut self.ln_2] {
            size(buf, rows * width);
        }
        for buf in [
            &mut self.ln_1_mean,
            &mut self.ln_1_rstd,
            &mut self.ln_2_mean,
            &mut self.ln_2_rstd,
        ] {
            size(buf, rows);
        }
        size(&mut self.qkv, rows * d.qkv_width());
        size(&mut self.att, att_len);
        size(&mut self.fc, rows * d.fc_width);
        size(&mut self.act, rows * hidden);
        let masks = if dropout { rows * width } else { 0 };
        size(&mut self.att_mask, if dropout { att_len } else { 0 });
        size(&mut self.attn_mask, masks);
        size(
            &mut self.mlp_mask,
            if d.mlp == Mlp::None { 0 } else { masks },
        );
    }
}

/// What the heads read and write in [`forward`]: queries, keys and values `[rows, qkv_width]`,
/// their outputs `y [rows, width]`, a buffer for attention weights and dropout's scales on them.
pub(super) struct Heads<'a> {
    pub qkv: &'a [f32],
    pub y: &'a mut [f32],
    pub att: &'a mut Vec<f32>,
    pub att_mask: &'a [f32],
}

/// Block `p`'s forward over the rows of `x` (`[rows, width]`) into `out`, keeping in `a` what
/// the backward needs; `attend` computes the heads' outputs from `qkv`.
pub(super) fn forward(
    p: &BlockParams,
    a: &mut BlockActs,
    x: &[f32],
    out: &mut [f32],
    ctx: Ctx<'_>,
    attend: impl FnOnce(Heads<'_>),
) {
    let d = ctx.dims;
    let (rows, c, hidden) = (a.ln_1_rstd.len(), d.width, d.hidden);
    queries_keys_values(p, a, x, ctx);
    attend(Heads {
        qkv: &a.qkv,
        y: &mut a.y,
        att: &mut a.att,
        att_mask: &a.att_mask,
    });
    let w = ctx.weight(&p.attn_proj_w, |q| &q.attn_proj);
    ctx.linear(&mut a.mid, &a.y, w, p.attn_proj_b.get(), rows, c, c);
    let (t, dims) = (LoraTarget::AttnProj, (rows, c, c));
    adapters::forward(p, &mut a.adapters, t, &mut a.mid, &a.y, dims);
    apply_mask(&mut a.mid, &a.attn_mask);
    a.mid.iter_mut().zip(x).for_each(|(m, x)| *m += x);
    let activation: fn(&mut [f32], &[f32], usize) = match d.mlp {
        Mlp::Gelu => |act, fc, _| gelu::forward(act, fc),
        Mlp::GeluTanh => |act, fc, _| gelu_tanh::forward(act, fc),
        Mlp::Relu2 => |act, fc, _| relu2::forward(act, fc),
        Mlp::SwiGlu => swiglu::forward,
        Mlp::None => {
            // No MLP: the block ends after attention.
            out.copy_from_slice(&a.mid);
            return;
        }
    };
    let ln_2 = Normed {
        out: &mut a.ln_2,
        mean: &mut a.ln_2_mean,
        rstd: &mut a.ln_2_rstd,
    };
    let (gamma, beta) = (p.ln_2_gamma.get(), p.ln_2_beta.get());
    norm::forward(d.norm, ln_2, &a.mid, gamma, beta, d.epsilon);
    let fc = d.fc_width;
    let w = ctx.weight(&p.c_fc_w, |q| &q.c_fc);
    ctx.linear(&mut a.fc, &a.ln_2, w, p.c_fc_b.get(), rows, c, fc);
    let (t, dims) = (LoraTarget::Fc, (rows, c, fc));
    adapters::forward(p, &mut a.adapters, t, &mut a.fc, &a.ln_2, dims);
    activation(&mut a.act, &a.fc, hidden);
    let w = ctx.weight(&p.mlp_proj_w, |q| &q.mlp_proj);
    ctx.linear(out, &a.act, w, p.mlp_proj_b.get(), rows, hidden, c);
    let (t, dims) = (LoraTarget::MlpProj, (rows, hidden, c));
    adapters::forward(p, &mut a.adapters, t, out, &a.act, dims);
    apply_mask(out, &a.mlp_mask);
    out.iter_mut().zip(&a.mid).for_each(|(o, m)| *o += m);
}

/// The start of [`forward`]: the rows' queries, keys and values (`ln_1`, the projection,
/// QK-norm and the rotation) in `a.qkv` `[rows, qkv_width]`.
pub(super) fn queries_keys_values(p: &BlockParams, a: &mut BlockActs, x: &[f32], ctx: Ctx<'_>) {
    let d = ctx.dims;
    let (rows, c) = (a.ln_1_rstd.len(), d.width);
    let ln_1 = Normed {
        out: &mut a.ln_1,
        mean: &mut a.ln_1_mean,
        rstd: &mut a.ln_1_rstd,
    };
    let (gamma, beta) = (p.ln_1_gamma.get(), p.ln_1_beta.get());
    norm::forward(d.norm, ln_1, x, gamma, beta, d.epsilon);
    ctx.linear(
        &mut a.qkv,
        &a.ln_1,
        ctx.weight(&p.c_attn_w, |q| &q.c_attn),
        p.c_attn_b.get(),
        rows,
        c,
        d.qkv_width(),
    );
    let (t, dims) = (LoraTarget::Qkv, (rows, c, d.qkv_width()));
    adapters::forward(p, &mut a.adapters, t, &mut a.qkv, &a.ln_1, dims);
    positions_forward(a, ctx);
}

/// QK-norm, then the rotation, on the queries and keys of every row of `a.qkv` (the first
/// `qk_width` columns), in place: what the heads attend with.
fn positions_forward(a: &mut BlockActs, ctx: Ctx<'_>) {
    let d = ctx.dims;
    let (w, heads) = (d.qk_width(), d.heads + d.kv_heads);
    let rows = a.qkv.chunks_exact_mut(d.qkv_width()).enumerate();
    for (r, row) in rows {
        let qk = &mut row[..w];
        if d.qk_norm {
            let n = &mut a.qk_n[r * w..(r + 1) * w];
            let rstd = &mut a.qk_rstd[r * heads..(r + 1) * heads];
            qk_norm::forward(qk, n, rstd, d.epsilon);
        }
        if d.rope.is_some() {
            ctx.rope.rotate(qk, ctx.position(r), false);
        }
    }
}

/// The backward of [`positions_forward`]: the gradient of the attended queries and keys in
/// `d_qkv` becomes that of the projection's output.
fn positions_backward(d_qkv: &mut [f32], a: &BlockActs, ctx: Ctx<'_>) {
    let d = ctx.dims;
    let (w, heads) = (d.qk_width(), d.heads + d.kv_heads);
    for (r, row) in d_qkv.chunks_exact_mut(d.qkv_width()).enumerate() {
        let dqk = &mut row[..w];
        if d.rope.is_some() {
            ctx.rope.rotate(dqk, ctx.position(r), true);
        }
        if d.qk_norm {
            let n = &a.qk_n[r * w..(r + 1) * w];
            let rstd = &a.qk_rstd[r * heads..(r + 1) * heads];
            qk_norm::backward_in_place(dqk, n, rstd);
        }
    }
}

/// Scratch of the backward pass: a branch's gradient `[rows, width]`, a wide one `[rows,
/// hidden]`, `qkv`'s `[rows, 3·width]`, and the attention backward's maps.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    pub d_branch: Vec<f32>,
    pub d_wide: Vec<f32>,
    pub d_qkv: Vec<f32>,
    pub maps: Vec<f32>,
    /// A LoRA adapter's `dy · Bᵀ`, `[rows, rank]`.
    pub lora_t: Vec<f32>,
}

/// Block `p`'s backward through the whole-sequence causal attention of `shape`: `d_resid` holds
/// the gradient of the block's output and is left holding that of its input `x`; the gradients
/// of its parameters are added into `g`.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    p: &BlockParams,
    g: &mut BlockParams,
    a: &BlockActs,
    x: &[f32],
    d_resid: &mut [f32],
    s: &mut Scratch,
    shape: Shape,
    ctx: Ctx<'_>,
) {
    let d = ctx.dims;
    let (rows, c) = (a.ln_1_rstd.len(), shape.width);
    mlp_backward(p, g, a, d_resid, s, ctx);
    // mid = x + dropout(attention(ln_1(x)) · W + b)
    masked(&mut s.d_branch, d_resid, &a.attn_mask);
    let d_y = &mut s.d_wide[..rows * c];
    let (lora, t) = ((&a.adapters, &mut s.lora_t), LoraTarget::AttnProj);
    matrix_backward((p, g), lora, t, d_y, (&s.d_branch, &a.y), ctx, rows);
    attention::backward(
        &mut s.d_qkv,
        d_y,
        &a.qkv,
        &a.att,
        &a.att_mask,
        &mut s.maps,
        shape,
    );
    positions_backward(&mut s.d_qkv, a, ctx);
    let (lora, t) = ((&a.adapters, &mut s.lora_t), LoraTarget::Qkv);
    let d_x = &mut s.d_branch;
    matrix_backward((p, g), lora, t, d_x, (&s.d_qkv, &a.ln_1), ctx, rows);
    let (gamma, beta) = (g.ln_1_gamma.get_mut(), g.ln_1_beta.get_mut());
    let stats = (&a.ln_1_mean[..], &a.ln_1_rstd[..]);
    let (dout, gain) = (&s.d_branch, p.ln_1_gamma.get());
    norm::backward(d.norm, d_resid, gamma, beta, dout, x, stats, gain);
}

/// An activation's backward that turns the output's gradient into the input's where it lies.
type InPlace = fn(&mut [f32], &[f32]);

/// The MLP branch's backward: `d_resid` holds the gradient of the block's output `out = mid +
/// dropout(act(ln_2(mid) · W_fc + b) · W_proj + b)` and is left holding that of `mid`; without
/// an MLP, `out = mid` and it is left as it is.
fn mlp_backward(
    p: &BlockParams,
    g: &mut BlockParams,
    a: &BlockActs,
    d_resid: &mut [f32],
    s: &mut Scratch,
    ctx: Ctx<'_>,
) {
    let d = ctx.dims;
    // The activation's backward in place, or (SwiGLU) into the pre-activation's beside it.
    let in_place: Option<InPlace> = match d.mlp {
        Mlp::Gelu => Some(gelu::backward_in_place),
        Mlp::GeluTanh => Some(gelu_tanh::backward_in_place),
        Mlp::Relu2 => Some(relu2::backward_in_place),
        Mlp::SwiGlu => None,
        Mlp::None => return,
    };
    let (rows, hidden) = (a.ln_1_rstd.len(), d.hidden);
    masked(&mut s.d_branch, d_resid, &a.mlp_mask);
    // The activation's gradient, then (SwiGLU) the pre-activation's beside it.
    let (d_act, d_fc) = s.d_wide.split_at_mut(rows * hidden);
    let (lora, t) = ((&a.adapters, &mut s.lora_t), LoraTarget::MlpProj);
    matrix_backward((p, g), lora, t, d_act, (&s.d_branch, &a.act), ctx, rows);
    let d_fc: &[f32] = match in_place {
        Some(backward) => {
            backward(d_act, &a.fc);
            d_act
        }
        None => {
            let d_fc = &mut d_fc[..rows * 2 * hidden];
            swiglu::backward(d_fc, d_act, &a.fc, hidden);
            d_fc
        }
    };
    let (lora, t) = ((&a.adapters, &mut s.lora_t), LoraTarget::Fc);
    let d_x = &mut s.d_branch;
    matrix_backward((p, g), lora, t, d_x, (d_fc, &a.ln_2), ctx, rows);
    let (gamma, beta) = (g.ln_2_gamma.get_mut(), g.ln_2_beta.get_mut());
    let stats = (&a.ln_2_mean[..], &a.ln_2_rstd[..]);
    let (dout, gain) = (&s.d_branch, p.ln_2_gamma.get());
    norm::backward(d.norm, d_resid, gamma, beta, dout, &a.mid, stats, gain);
}

/// The backward of `target`'s matrix of the block and of its LoRA adapter, if any, over `rows`
/// rows: `dx` gets the input's gradient (overwritten), the matrix's, its bias's and its
/// adapter's gradients are added into `g`; `(dy, x)` are the output's gradient and the input.
fn matrix_backward(
    (p, g): (&BlockParams, &mut BlockParams),
    (acts, lora_t): (&AdapterActs, &mut Vec<f32>),
    target: LoraTarget,
    dx: &mut [f32],
    (dy, x): (&[f32], &[f32]),
    ctx: Ctx<'_>,
    rows: usize,
) {
    let d = ctx.dims;
    let (dw, db, w, n_in, n_out) = match target {
        LoraTarget::Qkv => {
            let w = ctx.weight(&p.c_attn_w, |q| &q.c_attn);
            (&mut g.c_attn_w, &mut g.c_attn_b, w, d.width, d.qkv_width())
        }
        LoraTarget::AttnProj => {
            let w = ctx.weight(&p.attn_proj_w, |q| &q.attn_proj);
            (&mut g.attn_proj_w, &mut g.attn_proj_b, w, d.width, d.width)
        }
        LoraTarget::Fc => {
            let w = ctx.weight(&p.c_fc_w, |q| &q.c_fc);
            (&mut g.c_fc_w, &mut g.c_fc_b, w, d.width, d.fc_width)
        }
        LoraTarget::MlpProj => {
            let w = ctx.weight(&p.mlp_proj_w, |q| &q.mlp_proj);
            (&mut g.mlp_proj_w, &mut g.mlp_proj_b, w, d.hidden, d.width)
        }
    };
    let dims = (rows, n_in, n_out);
    linear_backward(dx, (dw.get_mut(), db.get_mut()), dy, x, w, dims);
    adapters::backward(p, &mut g.lora, acts, lora_t, target, dx, (dy, x), dims);
}

/// `dx = dy · wᵀ` for a block-quantised `w` of `n_out` rows of `n_in` whose row `j`
/// `dequantise(j, row)` writes (a cold path: the decoder's matrices are not trained).
fn dequantised_dx(
    dx: &mut [f32],
    dy: View<'_>,
    (n_out, n_in): (usize, usize),
    dequantise: impl Fn(usize, &mut [f32]),
) {
    let mut rows = vec![0.0; n_out * n_in];
    for (j, row) in rows.chunks_exact_mut(n_in).enumerate() {
        dequantise(j, row);
    }
    matmul(dx, dy, View::new(&rows, n_out, n_in), false);
}

/// The backward of [`linear`] with `(rows, n_in, n_out)`: `dx = dy · wᵀ` (overwritten),
/// `dw += xᵀ · dy`, `db += Σ_rows dy` (`None`: no bias, or a frozen weight or bias: LoRA's
/// base). Training passes `w` in its own layout (a frozen base held in int8 is dequantised into
/// that layout first: `frozen.rs`); the decoder's rows are multiplied as they are.
fn linear_backward(
    dx: &mut [f32],
    (dw, db): (Option<&mut [f32]>, Option<&mut [f32]>),
    dy: &[f32],
    x: &[f32],
    w: Weight<'_>,
    (rows, n_in, n_out): (usize, usize, usize),
) {
    let dy_view = View::new(dy, rows, n_out);
    match w {
        Weight::F32(w) => matmul(dx, dy_view, View::new(w, n_in, n_out).t(), false),
        Weight::Rows(w) => matmul(dx, dy_view, View::new(&w.w, n_out, n_in), false),
        Weight::Q8(w) => {
            let mut rows = F32Rows::default();
            w.dequantise_into(&mut rows);
            matmul(dx, dy_view, View::new(&rows.w, n_out, n_in), false);
        }
        Weight::Q4(w) => dequantised_dx(dx, dy_view, (n_out, n_in), |j, r| w.dequantise_row(j, r)),
        Weight::Q5(w) => dequantised_dx(dx, dy_view, (n_out, n_in), |j, r| w.dequantise_row(j, r)),
        Weight::Q4K(w) => dequantised_dx(dx, dy_view, (n_out, n_in), |j, r| w.dequantise_row(j, r)),
        Weight::Q41(w) => dequantised_dx(dx, dy_view, (n_out, n_in), |j, r| w.dequantise_row(j, r)),
        Weight::Q51(w) => dequantised_dx(dx, dy_view, (n_out, n_in), |j, r| w.dequantise_row(j, r)),
        Weight::Q5K(w) => dequantised_dx(dx, dy_view, (n_out, n_in), |j, r| w.dequantise_row(j, r)),
        Weight::Q6K(w) => dequantised_dx(dx, dy_view, (n_out, n_in), |j, r| w.dequantise_row(j, r)),
        Weight::Stacked(parts) => dequantised_dx(dx, dy_view, (n_out, n_in), |j, r| {
            stacked_row_values(parts, j, r)
        }),
    }
    if let Some(dw) = dw {
        matmul(dw, View::new(x, rows, n_in).t(), dy_view, true);
    }
    if let Some(db) = db {
        for row in dy.chunks_exact(n_out) {
            db.iter_mut().zip(row).for_each(|(b, d)| *b += d);
        }
    }
}

/// `x *= mask` element-wise; an empty mask (no dropout) leaves `x` alone.
pub(super) fn apply_mask(x: &mut [f32], mask: &[f32]) {
    if !mask.is_empty() {
        x.iter_mut().zip(mask).for_each(|(x, m)| *x *= m);
    }
}

/// `out = x * mask` (`out = x` with an empty mask).
fn masked(out: &mut [f32], x: &[f32], mask: &[f32]) {
    out.copy_from_slice(x);
    apply_mask(out, mask);
}
