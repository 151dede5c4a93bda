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

use super::dims::Dims;
use super::kernels::attention::{self, Shape};
use super::kernels::matmul::{View, linear, matmul};
use super::kernels::norm::{self, Normed};
use super::kernels::q8::{self, Q8Matrix};
use super::kernels::rows::{self, F32Rows};
use super::kernels::{gelu, gelu_tanh, qk_norm, relu2, rope, swiglu};
use super::params::{BlockParams, RowBlock, RowMatrix};
use super::spin_pool::{SpinPool, split_columns, split_rows};
use crate::arch::Mlp;

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
        .iter()
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

/// From this many rows (a prompt's chunk) a product with helpers is split by rows: each thread
/// multiplies its rows by all the weights, which fewer rows could not pay for (every thread
/// reads every weight).
const SPLIT_ROWS: usize = 16;

/// What a block computes with besides its weights: the model's sizes and parts, the rotary
/// tables, and where its rows sit (row `r` at position `first + r % period`: whole sequences in
/// training, the rows after the cache in decoding; or, with `streams`, each row a stream of its
/// own at position `streams[r]`: batched decoding).
#[derive(Clone, Copy)]
pub(super) struct Ctx<'a> {
    pub dims: &'a Dims,
    pub rope: &'a rope::Tables,
    pub first: usize,
    pub period: usize,
    pub streams: Option<&'a [usize]>,
    /// The block's matrices as the decoder keeps them, as rows (`None`: training's layout).
    pub matrices: Option<&'a RowBlock>,
    /// Every row of a product by rows computed as a token alone is, however many rows (a
    /// window scored); otherwise many rows of one sequence (a prompt) take a blocked f32
    /// product (of the dequantised weights, for `Q8_0`). Separate `streams` always are.
    pub rows_alone: bool,
    /// Threads a single row's products are split over (one sequence decoding), if any.
    pub helpers: Option<&'a SpinPool>,
}

/// A linear layer's weight: `[n_in, n_out]` in f32 (training's layout), or the decoder's rows
/// of outputs in int8 or f32.
#[derive(Clone, Copy)]
pub(super) enum Weight<'a> {
    F32(&'a [f32]),
    Q8(&'a Q8Matrix),
    Rows(&'a F32Rows),
}

impl<'a> Weight<'a> {
    /// The decoder's `m`, or `f32` (training's layout) where it keeps none.
    pub(super) fn of(m: Option<&'a RowMatrix>, f32: &'a [f32]) -> Self {
        match m {
            Some(RowMatrix::Q8(q)) => Weight::Q8(q),
            Some(RowMatrix::F32(r)) => Weight::Rows(r),
            None => Weight::F32(f32),
        }
    }

    /// `out [rows, n_out] = x [rows, n_in] · w + b` on this thread, the decoder's rows row by
    /// row with `per_row` (see [`per_row`]), else as one blocked product. Training's layout is
    /// never separate streams: the decoder keeps its matrices as rows.
    pub(super) fn product(self, out: &mut [f32], x: &[f32], b: &[f32], per_row: bool, n_in: usize) {
        match self {
            Weight::Q8(w) => q8::product(out, x, w, b, per_row),
            Weight::Rows(w) => rows::product(out, x, w, b, per_row),
            Weight::F32(w) => linear(out, x, w, b, x.len() / n_in, n_in, w.len() / n_in),
        }
    }
}

/// Whether a product of `rows` rows by the decoder's rows runs row by row, each as a token
/// alone is computed (a token, separate streams or rows scored as tokens: `alone`; in int8 for
/// `Q8_0`), or as one blocked f32 product (a prompt's chunk; of the dequantised weights for
/// `Q8_0`).
pub(super) fn per_row(alone: bool, rows: usize) -> bool {
    alone || rows < q8::GEMM_ROWS
}

impl<'a> Ctx<'a> {
    fn position(&self, row: usize) -> usize {
        match self.streams {
            Some(positions) => positions[row],
            None => self.first + row % self.period,
        }
    }

    /// The weight `f32` (`[n_in, n_out]`), or its rows where the decoder keeps `which` of
    /// them so.
    fn weight<'w>(&self, f32: &'w [f32], which: fn(&RowBlock) -> &Option<RowMatrix>) -> Weight<'w>
    where
        'a: 'w,
    {
        Weight::of(self.matrices.and_then(|q| which(q).as_ref()), f32)
    }

    /// A linear layer over the rows; separate streams each as if alone. With helpers, one
    /// row's outputs are split over the threads, and [`SPLIT_ROWS`] or more rows by rows.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        out: &mut [f32],
        x: &[f32],
        w: Weight<'_>,
        b: &[f32],
        rows: usize,
        n_in: usize,
        n_out: usize,
    ) {
        let (out, x) = (&mut out[..rows * n_out], &x[..rows * n_in]);
        let helpers = self.helpers.filter(|h| h.parts() > 1);
        match helpers {
            Some(helpers) if rows == 1 => linear_split(out, x, w, b, helpers),
            Some(helpers) if rows >= SPLIT_ROWS => {
                let per_row = self.per_row(w, rows);
                split_rows(helpers, out, n_out, &|part, r0| {
                    let x = &x[r0 * n_in..(r0 + part.len() / n_out) * n_in];
                    w.product(part, x, b, per_row, n_in);
                });
            }
            _ => w.product(out, x, b, self.per_row(w, rows), n_in),
        }
    }

    /// [`per_row`] for this block's rows, decided on the whole product so that a thread's
    /// share of its rows is computed as the whole would be.
    fn per_row(&self, w: Weight<'_>, rows: usize) -> bool {
        matches!(w, Weight::Q8(_) | Weight::Rows(_))
            && per_row(self.rows_alone || self.streams.is_some(), rows)
    }
}

/// One row's linear layer `out [n_out] = x [n_in] · w + b`, its outputs split over `helpers`'
/// threads (each output computed as on one thread).
pub(super) fn linear_split(
    out: &mut [f32],
    x: &[f32],
    w: Weight<'_>,
    b: &[f32],
    helpers: &SpinPool,
) {
    match w {
        Weight::Q8(w) => q8::quantized(x, |x| {
            split_columns(helpers, out, &|part, j0| q8::row_range(part, x, w, b, j0));
        }),
        Weight::Rows(w) => split_columns(helpers, out, &|part, j0| {
            rows::row_range(part, x, w, b, j0);
        }),
        // Training's layout (the decoder keeps its matrices as rows): on this thread.
        Weight::F32(w) => linear(out, x, w, b, 1, x.len(), out.len()),
    }
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
    ctx.linear(&mut a.mid, &a.y, w, &p.attn_proj_b, rows, c, c);
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
    norm::forward(d.norm, ln_2, &a.mid, &p.ln_2_gamma, &p.ln_2_beta, d.epsilon);
    let fc = d.fc_width;
    let w = ctx.weight(&p.c_fc_w, |q| &q.c_fc);
    ctx.linear(&mut a.fc, &a.ln_2, w, &p.c_fc_b, rows, c, fc);
    activation(&mut a.act, &a.fc, hidden);
    let w = ctx.weight(&p.mlp_proj_w, |q| &q.mlp_proj);
    ctx.linear(out, &a.act, w, &p.mlp_proj_b, rows, hidden, c);
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
    norm::forward(d.norm, ln_1, x, &p.ln_1_gamma, &p.ln_1_beta, d.epsilon);
    ctx.linear(
        &mut a.qkv,
        &a.ln_1,
        ctx.weight(&p.c_attn_w, |q| &q.c_attn),
        &p.c_attn_b,
        rows,
        c,
        d.qkv_width(),
    );
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
    mlp_backward(p, g, a, d_resid, s, d);
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
    positions_backward(&mut s.d_qkv, a, ctx);
    let dims = (rows, c, d.qkv_width());
    linear_backward(
        &mut s.d_branch,
        &mut g.c_attn_w,
        &mut g.c_attn_b,
        &s.d_qkv,
        &a.ln_1,
        &p.c_attn_w,
        dims,
    );
    let (gamma, beta) = (&mut g.ln_1_gamma, &mut g.ln_1_beta);
    let stats = (&a.ln_1_mean[..], &a.ln_1_rstd[..]);
    norm::backward(
        d.norm,
        d_resid,
        gamma,
        beta,
        &s.d_branch,
        x,
        stats,
        &p.ln_1_gamma,
    );
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
    d: &Dims,
) {
    // The activation's backward in place, or (SwiGLU) into the pre-activation's beside it.
    let in_place: Option<InPlace> = match d.mlp {
        Mlp::Gelu => Some(gelu::backward_in_place),
        Mlp::GeluTanh => Some(gelu_tanh::backward_in_place),
        Mlp::Relu2 => Some(relu2::backward_in_place),
        Mlp::SwiGlu => None,
        Mlp::None => return,
    };
    let (rows, c, hidden) = (a.ln_1_rstd.len(), d.width, d.hidden);
    masked(&mut s.d_branch, d_resid, &a.mlp_mask);
    // The activation's gradient, then (SwiGLU) the pre-activation's beside it.
    let (d_act, d_fc) = s.d_wide.split_at_mut(rows * hidden);
    let dims = (rows, hidden, c);
    linear_backward(
        d_act,
        &mut g.mlp_proj_w,
        &mut g.mlp_proj_b,
        &s.d_branch,
        &a.act,
        &p.mlp_proj_w,
        dims,
    );
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
    let dims = (rows, c, d.fc_width);
    linear_backward(
        &mut s.d_branch,
        &mut g.c_fc_w,
        &mut g.c_fc_b,
        d_fc,
        &a.ln_2,
        &p.c_fc_w,
        dims,
    );
    let (gamma, beta) = (&mut g.ln_2_gamma, &mut g.ln_2_beta);
    let stats = (&a.ln_2_mean[..], &a.ln_2_rstd[..]);
    let dout = &s.d_branch;
    norm::backward(
        d.norm,
        d_resid,
        gamma,
        beta,
        dout,
        &a.mid,
        stats,
        &p.ln_2_gamma,
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
