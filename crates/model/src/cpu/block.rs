//! One transformer block, forward and backward side by side (llm.c's layout):
//!
//! ```text
//! mid = x   + dropout(attend(ln_1(x)) · W_attn_proj + b)
//! out = mid + dropout(gelu(ln_2(mid) · W_fc + b) · W_mlp_proj + b)
//! ```
//!
//! The forward is the one both the training step (`workspace.rs`) and the decoder (`decode.rs`)
//! run: they differ only in how the heads attend (whole causal sequences, or new rows against a
//! KV cache), which they pass in. A block feature is written here once.

use super::attention::{self, Shape};
use super::matmul::{View, linear, matmul};
use super::params::BlockParams;
use super::{gelu, layer_norm};

/// One block's activations for `rows` tokens: what the forward writes and the backward reads.
#[derive(Debug, Default)]
pub(super) struct BlockActs {
    /// `ln_1` output `[rows, width]` and its per-row mean and 1/std.
    pub ln_1: Vec<f32>,
    pub ln_1_mean: Vec<f32>,
    pub ln_1_rstd: Vec<f32>,
    /// `[rows, 3·width]`.
    pub qkv: Vec<f32>,
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
    /// MLP pre-activation and GELU output, `[rows, hidden]`.
    pub fc: Vec<f32>,
    pub gelu: Vec<f32>,
    /// Dropout on the MLP branch `[rows, width]` (empty = none).
    pub mlp_mask: Vec<f32>,
}

impl BlockActs {
    /// Every buffer sized for `rows` rows of `width` and an MLP of `hidden`, `att` for
    /// `att_len` attention weights; the dropout masks only with `dropout`.
    pub(super) fn resize(
        &mut self,
        rows: usize,
        width: usize,
        hidden: usize,
        att_len: usize,
        dropout: bool,
    ) {
        let size = |buf: &mut Vec<f32>, len: usize| buf.resize(len, 0.0);
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
        size(&mut self.qkv, rows * 3 * width);
        size(&mut self.att, att_len);
        size(&mut self.fc, rows * hidden);
        size(&mut self.gelu, rows * hidden);
        let masks = if dropout { rows * width } else { 0 };
        size(&mut self.att_mask, if dropout { att_len } else { 0 });
        size(&mut self.attn_mask, masks);
        size(&mut self.mlp_mask, masks);
    }
}

/// What the heads read and write in [`forward`]: queries, keys and values `[rows, 3·width]`,
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
    hidden: usize,
    epsilon: f32,
    attend: impl FnOnce(Heads<'_>),
) {
    let rows = a.ln_1_mean.len();
    let c = x.len() / rows;
    layer_norm::forward(
        &mut a.ln_1,
        &mut a.ln_1_mean,
        &mut a.ln_1_rstd,
        x,
        &p.ln_1_gamma,
        &p.ln_1_beta,
        epsilon,
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
    attend(Heads {
        qkv: &a.qkv,
        y: &mut a.y,
        att: &mut a.att,
        att_mask: &a.att_mask,
    });
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
        epsilon,
    );
    linear(&mut a.fc, &a.ln_2, &p.c_fc_w, &p.c_fc_b, rows, c, hidden);
    gelu::forward(&mut a.gelu, &a.fc);
    linear(out, &a.gelu, &p.mlp_proj_w, &p.mlp_proj_b, rows, hidden, c);
    apply_mask(out, &a.mlp_mask);
    out.iter_mut().zip(&a.mid).for_each(|(o, m)| *o += m);
}

/// Scratch of the backward pass: a branch's gradient `[rows, width]`, a wide one `[rows,
/// hidden]`, `qkv`'s `[rows, 3·width]`, and the attention backward's maps.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    pub d_branch: Vec<f32>,
    pub d_wide: Vec<f32>,
    pub d_qkv: Vec<f32>,
    pub maps: Vec<f32>,
}

/// Block `p`'s backward through the whole-sequence causal attention of `shape`: `d_resid` holds
/// the gradient of the block's output and is left holding that of its input `x`; the gradients
/// of its parameters are added into `g`.
pub(super) fn backward(
    p: &BlockParams,
    g: &mut BlockParams,
    a: &BlockActs,
    x: &[f32],
    d_resid: &mut [f32],
    s: &mut Scratch,
    shape: Shape,
) {
    let (rows, c) = (a.ln_1_mean.len(), shape.width);
    let hidden = a.fc.len() / rows;
    // out = mid + dropout(gelu(fc) · W + b)
    masked(&mut s.d_branch, d_resid, &a.mlp_mask);
    let d_wide = &mut s.d_wide[..rows * hidden];
    let dims = (rows, hidden, c);
    linear_backward(
        d_wide,
        &mut g.mlp_proj_w,
        &mut g.mlp_proj_b,
        &s.d_branch,
        &a.gelu,
        &p.mlp_proj_w,
        dims,
    );
    gelu::backward_in_place(d_wide, &a.fc);
    let dims = (rows, c, hidden);
    linear_backward(
        &mut s.d_branch,
        &mut g.c_fc_w,
        &mut g.c_fc_b,
        d_wide,
        &a.ln_2,
        &p.c_fc_w,
        dims,
    );
    let stats = (&a.ln_2_mean[..], &a.ln_2_rstd[..]);
    let (gamma, beta) = (&mut g.ln_2_gamma, &mut g.ln_2_beta);
    layer_norm::backward(
        d_resid,
        gamma,
        beta,
        &s.d_branch,
        &a.mid,
        stats.0,
        stats.1,
        &p.ln_2_gamma,
    );
    // mid = x + dropout(attention(ln_1(x)) · W + b)
    masked(&mut s.d_branch, d_resid, &a.attn_mask);
    let d_y = &mut s.d_wide[..rows * c];
    let dims = (rows, c, c);
    linear_backward(
        d_y,
        &mut g.attn_proj_w,
        &mut g.attn_proj_b,
        &s.d_branch,
        &a.y,
        &p.attn_proj_w,
        dims,
    );
    attention::backward(
        &mut s.d_qkv,
        d_y,
        &a.qkv,
        &a.att,
        &a.att_mask,
        &mut s.maps,
        shape,
    );
    let dims = (rows, c, 3 * c);
    linear_backward(
        &mut s.d_branch,
        &mut g.c_attn_w,
        &mut g.c_attn_b,
        &s.d_qkv,
        &a.ln_1,
        &p.c_attn_w,
        dims,
    );
    let stats = (&a.ln_1_mean[..], &a.ln_1_rstd[..]);
    let (gamma, beta) = (&mut g.ln_1_gamma, &mut g.ln_1_beta);
    layer_norm::backward(
        d_resid,
        gamma,
        beta,
        &s.d_branch,
        x,
        stats.0,
        stats.1,
        &p.ln_1_gamma,
    );
}

/// The backward of [`linear`] with `(rows, n_in, n_out)`: `dx = dy · wᵀ` (overwritten),
/// `dw += xᵀ · dy`, `db += Σ_rows dy`.
fn linear_backward(
    dx: &mut [f32],
    dw: &mut [f32],
    db: &mut [f32],
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    (rows, n_in, n_out): (usize, usize, usize),
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
