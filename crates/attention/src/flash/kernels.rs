//! The CubeCL kernels of flash attention, forward and backward side by side.
//!
//! Every tensor is a `[batch, heads, seq, d_head]` *view* whose channels are contiguous and whose
//! batch, head and row steps are its strides (`q`, `out`, `d_out`, `dQ`; `k`, `v`, `dK`, `dV` with
//! `kv_heads` heads starting at head `k_first` / `v_first` of their view; grouped-query attention
//! when `kv_heads < heads`: query head `h` reads key/value head `h / (heads / kv_heads)` in place).
//! So the kernels read the queries, keys and values where the projection wrote them, side by side
//! in one `[batch, seq, (heads + 2·kv_heads)·d_head]` tensor, write the output as the next
//! projection reads it, `[batch, seq, heads·d_head]`, and the gradients into one tensor shaped
//! like the projection's output: no copy before or after. `lse` is a contiguous
//! `[batch, heads, seq]`. A cube of `block`
//! units owns one block of `block` rows of one `(batch, head)`: unit `u` holds row
//! `block·CUBE_POS_X + u` in registers, and the cube shares the tiles of the other side (keys and
//! values, or queries and output gradients) through shared memory, one row loaded per unit.
//! Causality is a loop bound: a query block never loads the key blocks after it, and within the
//! diagonal block a query stops at its own position, so no score above the diagonal is computed.
//!
//! Dropout on the attention weights is a hash of `(seed, batch·heads + head, query, key)`: the
//! backward recomputes the forward's mask instead of storing it.

use cubecl::prelude::*;

/// Whether the weight of `key` for `query` survives dropout: a 32-bit hash of the position and
/// the call's seed, kept when it is at least `threshold` (= `p · 2³²`).
#[cube]
pub(crate) fn dropout_keeps(
    seed: u32,
    bh: usize,
    query: usize,
    key: usize,
    threshold: u32,
) -> bool {
    let mut h = seed ^ (u32::cast_from(bh) * 0x9E37_79B1u32);
    h = mix32(h ^ u32::cast_from(query));
    h = mix32(h ^ (u32::cast_from(key) * 0x85EB_CA6Bu32));
    h >= threshold
}

/// MurmurHash3's 32-bit finaliser: every input bit flips about half the output bits.
#[cube]
fn mix32(x: u32) -> u32 {
    let mut h = x;
    h ^= h >> 16u32;
    h *= 0x85EB_CA6Bu32;
    h ^= h >> 13u32;
    h *= 0xC2B2_AE35u32;
    h ^= h >> 16u32;
    h
}

/// The weight a kept score carries after dropout: `p / (1 - p_drop)` when kept, else 0.
#[cube]
fn dropped<F: Float>(
    weight: F,
    seed: u32,
    bh: usize,
    query: usize,
    key: usize,
    threshold: u32,
    keep_scale: F,
    #[comptime] dropout: bool,
) -> F {
    let mut out = weight;
    if dropout {
        out = F::new(0.0);
        if dropout_keeps(seed, bh, query, key, threshold) {
            out = weight * keep_scale;
        }
    }
    out
}

/// The smaller of two sizes.
#[cube]
fn smaller(a: usize, b: usize) -> usize {
    let mut out = a;
    if b < a {
        out = b;
    }
    out
}

/// Where head `h` of batch `b` starts in `t`, a `[batch, heads, seq, d_head]` view: row `r` of
/// it is `r · t.stride(2)` further, its channels contiguous after that.
#[cube]
fn head_at<F: Float>(t: &Tensor<F>, b: usize, h: usize) -> usize {
    b * t.stride(0) + h * t.stride(1)
}

/// [`head_at`] of a tensor being written.
#[cube]
fn head_at_mut<F: Float>(t: &mut Tensor<F>, b: usize, h: usize) -> usize {
    b * t.stride(0) + h * t.stride(1)
}

/// Copies row `row` (zeros past `seq`) of the head of `source` starting at `head` into slot
/// `slot` of a shared tile.
#[cube]
fn load_row<F: Float>(
    source: &Tensor<F>,
    tile: &mut Shared<[F]>,
    head: usize,
    row: usize,
    seq: usize,
    slot: usize,
    #[comptime] d_head: usize,
) {
    let at = head + row * source.stride(2);
    for d in 0..d_head {
        let mut x = F::new(0.0);
        if row < seq {
            x = source[at + d];
        }
        tile[slot * d_head + d] = x;
    }
}

/// `a[..] · tile[slot, ..]` over `d_head` channels.
#[cube]
fn dot_tile<F: Float>(
    a: &Array<F>,
    tile: &Shared<[F]>,
    slot: usize,
    #[comptime] d_head: usize,
) -> F {
    let mut sum = F::new(0.0);
    for d in 0..d_head {
        sum += a[d] * tile[slot * d_head + d];
    }
    sum
}

/// Forward: `out = softmax(q kᵀ · scale + causal) · v` (dropout on the weights), and the
/// log-sum-exp of each row's scaled scores, `lse`, which the backward needs to rebuild the weights.
///
/// Online softmax (FlashAttention-2): per key block, the row's running maximum, its sum of
/// exponentials and its weighted sum of values are rescaled by `exp(old_max - new_max)`, so the
/// `[seq, seq]` scores never exist outside registers.
#[cube(launch)]
pub(crate) fn flash_forward_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<F>,
    heads: usize,
    kv_heads: usize,
    k_first: usize,
    v_first: usize,
    scale: f32,
    keep_scale: f32,
    threshold: u32,
    seed: u32,
    #[comptime] d_head: usize,
    #[comptime] block: usize,
    #[comptime] dropout: bool,
    #[define(F)] _dtype: ElemType,
) {
    let seq = q.shape(2);
    let bh = CUBE_POS_Y as usize;
    let q_block = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let row = q_block * block + unit;
    let (b, h) = (bh / heads, bh % heads);
    let g = h / (heads / kv_heads);
    let q_at = head_at(q, b, h) + row * q.stride(2);
    let out_at = head_at_mut(out, b, h) + row * out.stride(2);
    let (k_head, v_head) = (head_at(k, b, k_first + g), head_at(v, b, v_first + g));
    let live = row < seq;
    let keep_scale = F::cast_from(keep_scale);

    let mut keys = Shared::<[F]>::new_slice(block * d_head);
    let mut values = Shared::<[F]>::new_slice(block * d_head);
    let mut query = Array::<F>::new(d_head);
    let mut acc = Array::<F>::new(d_head);
    let mut scores = Array::<F>::new(block);
    let scale = F::cast_from(scale);
    for d in 0..d_head {
        let mut x = F::new(0.0);
        if live {
            x = q[q_at + d] * scale;
        }
        query[d] = x;
        acc[d] = F::new(0.0);
    }
    let mut max = F::new(0.0);
    let mut sum = F::new(0.0);
    for k_block in 0..q_block + 1 {
        let first = k_block * block;
        load_row::<F>(k, &mut keys, k_head, first + unit, seq, unit, d_head);
        load_row::<F>(v, &mut values, v_head, first + unit, seq, unit, d_head);
        sync_cube();
        if live {
            // Keys first..=row are visible: all of the block but the diagonal one.
            let visible = smaller(block, row + 1 - first);
            let mut block_max = F::new(0.0);
            for j in 0..visible {
                let s = dot_tile::<F>(&query, &keys, j, d_head);
                scores[j] = s;
                if j == 0 {
                    block_max = s;
                } else {
                    block_max = F::max(block_max, s);
                }
            }
            let mut new_max = block_max;
            let mut correction = F::new(0.0);
            if k_block > 0 {
                new_max = F::max(max, block_max);
                correction = (max - new_max).exp();
            }
            sum *= correction;
            for d in 0..d_head {
                acc[d] *= correction;
            }
            for j in 0..visible {
                let p = (scores[j] - new_max).exp();
                sum += p;
                let w = dropped::<F>(p, seed, bh, row, first + j, threshold, keep_scale, dropout);
                for d in 0..d_head {
                    acc[d] += w * values[j * d_head + d];
                }
            }
            max = new_max;
        }
        sync_cube();
    }
    if live {
        let inv = F::new(1.0) / sum;
        for d in 0..d_head {
            out[out_at + d] = acc[d] * inv;
        }
        lse[bh * seq + row] = max + sum.ln();
    }
}

/// Backward, first pass: per row, `stats = [lse, D]` with `D = dO · O`, the row term of the
/// softmax gradient (`dS = P ∘ (dP - D)`; with dropout `dP` is masked and `D` is still `dO · O`).
#[cube(launch)]
pub(crate) fn flash_backward_rows_kernel<F: Float>(
    out: &Tensor<F>,
    d_out: &Tensor<F>,
    lse: &Tensor<F>,
    stats: &mut Tensor<F>,
    #[comptime] d_head: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = ABSOLUTE_POS;
    if row >= lse.len() {
        terminate!();
    }
    // `lse` is `[batch, heads, seq]`: its flat row `row` is `(b, h, r)`.
    let (heads, seq) = (lse.shape(1), lse.shape(2));
    let (bh, r) = (row / seq, row % seq);
    let (b, h) = (bh / heads, bh % heads);
    let out_at = head_at(out, b, h) + r * out.stride(2);
    let grad_at = head_at(d_out, b, h) + r * d_out.stride(2);
    let mut dot = F::new(0.0);
    for d in 0..d_head {
        dot += out[out_at + d] * d_out[grad_at + d];
    }
    stats[2 * row] = lse[row];
    stats[2 * row + 1] = dot;
}

/// Backward, keys and values: unit `u` owns key `j`, sweeps every query block on or after its
/// own, rebuilds `p_ij = exp(q_i·k_j·scale - lse_i)`, and accumulates
/// `dV_j += p̃_ij dO_i` and `dK_j += p_ij (dP̃_ij - D_i) · scale · q_i` in registers (p̃: after
/// dropout), over every query head of its group. One writer per row: no atomics.
#[cube(launch)]
pub(crate) fn flash_backward_dkdv_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    d_out: &Tensor<F>,
    stats: &Tensor<F>,
    d_k: &mut Tensor<F>,
    d_v: &mut Tensor<F>,
    heads: usize,
    kv_heads: usize,
    k_first: usize,
    v_first: usize,
    scale: f32,
    keep_scale: f32,
    threshold: u32,
    seed: u32,
    #[comptime] d_head: usize,
    #[comptime] block: usize,
    #[comptime] dropout: bool,
    #[define(F)] _dtype: ElemType,
) {
    let seq = q.shape(2);
    let group = heads / kv_heads;
    // This cube's key/value head, of `batch·kv_heads`.
    let kv_bh = CUBE_POS_Y as usize;
    let k_block = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let key = k_block * block + unit;
    let (b, g) = (kv_bh / kv_heads, kv_bh % kv_heads);
    let k_at = head_at(k, b, k_first + g) + key * k.stride(2);
    let v_at = head_at(v, b, v_first + g) + key * v.stride(2);
    let first_bh = b * heads + g * group;
    let live = key < seq;
    let scale = F::cast_from(scale);
    let keep_scale = F::cast_from(keep_scale);

    let mut queries = Shared::<[F]>::new_slice(block * d_head);
    let mut grads = Shared::<[F]>::new_slice(block * d_head);
    let mut row_lse = Shared::<[F]>::new_slice(block);
    let mut row_d = Shared::<[F]>::new_slice(block);
    let mut key_row = Array::<F>::new(d_head);
    let mut value_row = Array::<F>::new(d_head);
    let mut dk = Array::<F>::new(d_head);
    let mut dv = Array::<F>::new(d_head);
    for d in 0..d_head {
        let mut kx = F::new(0.0);
        let mut vx = F::new(0.0);
        if live {
            kx = k[k_at + d];
            vx = v[v_at + d];
        }
        key_row[d] = kx;
        value_row[d] = vx;
        dk[d] = F::new(0.0);
        dv[d] = F::new(0.0);
    }
    let blocks = seq.div_ceil(block);
    // Every query head of the group, and each one's query blocks from this key block on.
    for step in 0..group * (blocks - k_block) {
        let bh = first_bh + step / (blocks - k_block);
        let h = bh % heads;
        let q_block = k_block + step % (blocks - k_block);
        let first = q_block * block;
        let row = first + unit;
        load_row::<F>(q, &mut queries, head_at(q, b, h), row, seq, unit, d_head);
        load_row::<F>(
            d_out,
            &mut grads,
            head_at(d_out, b, h),
            row,
            seq,
            unit,
            d_head,
        );
        let mut lse_i = F::new(0.0);
        let mut d_i = F::new(0.0);
        if row < seq {
            lse_i = stats[2 * (bh * seq + row)];
            d_i = stats[2 * (bh * seq + row) + 1];
        }
        row_lse[unit] = lse_i;
        row_d[unit] = d_i;
        sync_cube();
        if live {
            for i in 0..block {
                let query = first + i;
                if query < seq && query >= key {
                    let mut s = F::new(0.0);
                    let mut dp = F::new(0.0);
                    for d in 0..d_head {
                        s += queries[i * d_head + d] * key_row[d];
                        dp += grads[i * d_head + d] * value_row[d];
                    }
                    let p = (s * scale - row_lse[i]).exp();
                    let kept = dropped::<F>(
                        F::new(1.0),
                        seed,
                        bh,
                        query,
                        key,
                        threshold,
                        keep_scale,
                        dropout,
                    );
                    let ds = p * (dp * kept - row_d[i]) * scale;
                    let w = p * kept;
                    for d in 0..d_head {
                        dv[d] += w * grads[i * d_head + d];
                        dk[d] += ds * queries[i * d_head + d];
                    }
                }
            }
        }
        sync_cube();
    }
    if live {
        let dk_at = head_at_mut(d_k, b, k_first + g) + key * d_k.stride(2);
        let dv_at = head_at_mut(d_v, b, v_first + g) + key * d_v.stride(2);
        for d in 0..d_head {
            d_k[dk_at + d] = dk[d];
            d_v[dv_at + d] = dv[d];
        }
    }
}

/// Backward, queries: unit `u` owns query `i`, sweeps the key blocks up to its own and
/// accumulates `dQ_i += p_ij (dP̃_ij - D_i) · scale · k_j`.
#[cube(launch)]
pub(crate) fn flash_backward_dq_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    d_out: &Tensor<F>,
    stats: &Tensor<F>,
    d_q: &mut Tensor<F>,
    heads: usize,
    kv_heads: usize,
    k_first: usize,
    v_first: usize,
    scale: f32,
    keep_scale: f32,
    threshold: u32,
    seed: u32,
    #[comptime] d_head: usize,
    #[comptime] block: usize,
    #[comptime] dropout: bool,
    #[define(F)] _dtype: ElemType,
) {
    let seq = q.shape(2);
    let bh = CUBE_POS_Y as usize;
    let q_block = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let row = q_block * block + unit;
    let (b, h) = (bh / heads, bh % heads);
    let g = h / (heads / kv_heads);
    let (k_head, v_head) = (head_at(k, b, k_first + g), head_at(v, b, v_first + g));
    let q_at = head_at(q, b, h) + row * q.stride(2);
    let grad_at = head_at(d_out, b, h) + row * d_out.stride(2);
    let live = row < seq;
    let scale = F::cast_from(scale);
    let keep_scale = F::cast_from(keep_scale);

    let mut keys = Shared::<[F]>::new_slice(block * d_head);
    let mut values = Shared::<[F]>::new_slice(block * d_head);
    let mut query = Array::<F>::new(d_head);
    let mut grad = Array::<F>::new(d_head);
    let mut dq = Array::<F>::new(d_head);
    let mut lse_i = F::new(0.0);
    let mut d_i = F::new(0.0);
    if live {
        lse_i = stats[2 * (bh * seq + row)];
        d_i = stats[2 * (bh * seq + row) + 1];
    }
    for d in 0..d_head {
        let mut qx = F::new(0.0);
        let mut gx = F::new(0.0);
        if live {
            qx = q[q_at + d];
            gx = d_out[grad_at + d];
        }
        query[d] = qx;
        grad[d] = gx;
        dq[d] = F::new(0.0);
    }
    for k_block in 0..q_block + 1 {
        let first = k_block * block;
        load_row::<F>(k, &mut keys, k_head, first + unit, seq, unit, d_head);
        load_row::<F>(v, &mut values, v_head, first + unit, seq, unit, d_head);
        sync_cube();
        if live {
            let visible = smaller(block, row + 1 - first);
            for j in 0..visible {
                let s = dot_tile::<F>(&query, &keys, j, d_head);
                let dp = dot_tile::<F>(&grad, &values, j, d_head);
                let p = (s * scale - lse_i).exp();
                let kept = dropped::<F>(
                    F::new(1.0),
                    seed,
                    bh,
                    row,
                    first + j,
                    threshold,
                    keep_scale,
                    dropout,
                );
                let ds = p * (dp * kept - d_i) * scale;
                for d in 0..d_head {
                    dq[d] += ds * keys[j * d_head + d];
                }
            }
        }
        sync_cube();
    }
    if live {
        let dq_at = head_at_mut(d_q, b, h) + row * d_q.stride(2);
        for d in 0..d_head {
            d_q[dq_at + d] = dq[d];
        }
    }
}
