//! The two kernels, forward and backward side by side.
//!
//! The packed heads are a contiguous `[vectors, d_head]`: vector `v` is head `v % groups` of row
//! `v / groups` (`groups = heads + 2·kv_heads`, rows `batch·seq`), its position `(v / groups) %
//! seq`, and it is a query or key when `v % groups < qk_heads`. A cube holds `vectors_per_cube`
//! vectors (its `y` axis); along `x`, `lanes` units share one vector, unit `i` owning the pair
//! `(i, i + half)` that the rotation turns together (`half = ⌈d_head/2⌉`; an odd `d_head`,
//! never rotated, leaves the last unit one channel). `lanes` is `half` rounded up to a power of
//! two so that the sums over a vector halve cleanly; the units past `half` (and the rows past
//! the last vector) add zeros and write nothing.
//!
//! With `x` a query or key vector, `n` its normalised form and `y` the output:
//!
//! ```text
//! forward    n = x / rms,  rms = √(Σx²/d + ε)
//!            yᵢ = nᵢ·cosᵢ + nᵢ₊d/2·sin±ᵢ           yᵢ₊d/2 = nᵢ₊d/2·cosᵢ₊d/2 + nᵢ·sin±ᵢ₊d/2
//! backward   dnᵢ = dyᵢ·cosᵢ + dyᵢ₊d/2·sin±ᵢ₊d/2    dnᵢ₊d/2 = dyᵢ₊d/2·cosᵢ₊d/2 + dyᵢ·sin±ᵢ
//!            dx = (dn − n·Σ(dn·n)/d) / rms
//! ```
//!
//! (`sin±` is the sine table with its first half negated, see [`crate::rope`].) A value vector
//! is copied, and so is its gradient: bit for bit. The backward recomputes `rms` from `x` (one
//! sum over `d_head` numbers) rather than keeping it.

use cubecl::prelude::*;

/// Where a unit works: its pair `(first, second)` in the packed heads and `(table_first,
/// table_second)` in its position's row of the tables, whether it has the pair (`live`) and its
/// second channel (`paired`), and whether its vector is a query or key (see the module).
#[derive(CubeType)]
struct Lane {
    first: usize,
    second: usize,
    table_first: usize,
    table_second: usize,
    live: bool,
    paired: bool,
    query_or_key: bool,
}

/// This unit's [`Lane`], for `vectors` vectors of `groups` groups a row.
#[cube]
fn lane(
    vectors: usize,
    seq: usize,
    groups: usize,
    qk_heads: usize,
    #[comptime] d_head: usize,
    #[comptime] vectors_per_cube: usize,
) -> Lane {
    let unit = UNIT_POS_X as usize;
    let vector = CUBE_POS * vectors_per_cube + UNIT_POS_Y as usize;
    let half = d_head.div_ceil(2);
    let live = vector < vectors && unit < half;
    let first = vector * d_head + unit;
    let table_first = ((vector / groups) % seq) * d_head + unit;
    Lane {
        first,
        second: first + half,
        table_first,
        table_second: table_first + half,
        live,
        paired: live && unit + half < d_head,
        query_or_key: vector % groups < qk_heads,
    }
}

/// The sum of `value` over the `lanes` units of this unit's vector (its row `UNIT_POS_Y` of the
/// cube), in `shared` (`lanes` slots a row). Every unit of the cube must call it: it syncs.
#[cube]
fn vector_sum<F: Float>(value: F, shared: &mut Shared<[F]>, #[comptime] lanes: usize) -> F {
    let unit = UNIT_POS_X as usize;
    let base = UNIT_POS_Y as usize * lanes;
    shared[base + unit] = value;
    sync_cube();
    // The cube's `x` extent is `lanes`; read at run time, so the loop is not unrolled.
    let mut stride = CUBE_DIM_X as usize / 2;
    while stride > 0 {
        if unit < stride {
            let (a, b) = (shared[base + unit], shared[base + unit + stride]);
            shared[base + unit] = a + b;
        }
        sync_cube();
        stride /= 2;
    }
    let total = shared[base];
    sync_cube();
    total
}

/// Forward: `out` = the packed heads with every query and key normalised (`normalise`), then
/// rotated by its position's angles (`rotate`); value vectors copied.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn qk_forward_kernel<F: Float>(
    qkv: &Tensor<F>,
    cos: &Tensor<F>,
    signed_sin: &Tensor<F>,
    out: &mut Tensor<F>,
    vectors: usize,
    seq: usize,
    groups: usize,
    qk_heads: usize,
    epsilon: f32,
    #[comptime] d_head: usize,
    #[comptime] lanes: usize,
    #[comptime] vectors_per_cube: usize,
    #[comptime] normalise: bool,
    #[comptime] rotate: bool,
    #[define(F)] _dtype: ElemType,
) {
    let at = lane(vectors, seq, groups, qk_heads, d_head, vectors_per_cube);
    let mut a = F::new(0.0);
    let mut b = F::new(0.0);
    if at.live {
        a = qkv[at.first];
    }
    if at.paired {
        b = qkv[at.second];
    }
    if normalise {
        let mut shared = Shared::<[F]>::new_slice(lanes * vectors_per_cube);
        let squares = vector_sum::<F>(a * a + b * b, &mut shared, lanes);
        let rms = F::sqrt(squares / F::cast_from(d_head) + F::cast_from(epsilon));
        if at.query_or_key {
            a /= rms;
            b /= rms;
        }
    }
    if rotate && at.live && at.query_or_key {
        let (i, j) = (at.table_first, at.table_second);
        let turned_a = a * cos[i] + b * signed_sin[i];
        b = b * cos[j] + a * signed_sin[j];
        a = turned_a;
    }
    if at.live {
        out[at.first] = a;
    }
    if at.paired {
        out[at.second] = b;
    }
}

/// Backward: `d_qkv` from the forward's input `qkv` and the output's gradient `d_out`, the
/// rotation undone (its transpose) and then the normalisation's gradient taken; value vectors'
/// gradients copied.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn qk_backward_kernel<F: Float>(
    qkv: &Tensor<F>,
    d_out: &Tensor<F>,
    cos: &Tensor<F>,
    signed_sin: &Tensor<F>,
    d_qkv: &mut Tensor<F>,
    vectors: usize,
    seq: usize,
    groups: usize,
    qk_heads: usize,
    epsilon: f32,
    #[comptime] d_head: usize,
    #[comptime] lanes: usize,
    #[comptime] vectors_per_cube: usize,
    #[comptime] normalise: bool,
    #[comptime] rotate: bool,
    #[define(F)] _dtype: ElemType,
) {
    let at = lane(vectors, seq, groups, qk_heads, d_head, vectors_per_cube);
    let mut da = F::new(0.0);
    let mut db = F::new(0.0);
    if at.live {
        da = d_out[at.first];
    }
    if at.paired {
        db = d_out[at.second];
    }
    if rotate && at.live && at.query_or_key {
        // The rotation's transpose: each channel's gradient gathers from its partner with the
        // partner's sine.
        let (i, j) = (at.table_first, at.table_second);
        let turned_a = da * cos[i] + db * signed_sin[j];
        db = db * cos[j] + da * signed_sin[i];
        da = turned_a;
    }
    if normalise {
        let mut xa = F::new(0.0);
        let mut xb = F::new(0.0);
        if at.live {
            xa = qkv[at.first];
        }
        if at.paired {
            xb = qkv[at.second];
        }
        let mut shared = Shared::<[F]>::new_slice(lanes * vectors_per_cube);
        let squares = vector_sum::<F>(xa * xa + xb * xb, &mut shared, lanes);
        let rms = F::sqrt(squares / F::cast_from(d_head) + F::cast_from(epsilon));
        let (na, nb) = (xa / rms, xb / rms);
        let dot = vector_sum::<F>(da * na + db * nb, &mut shared, lanes) / F::cast_from(d_head);
        if at.query_or_key {
            da = (da - na * dot) / rms;
            db = (db - nb * dot) / rms;
        }
    }
    if at.live {
        d_qkv[at.first] = da;
    }
    if at.paired {
        d_qkv[at.second] = db;
    }
}
