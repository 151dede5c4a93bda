//! Flash attention against the explicit path and an f64 reference, on wgpu (lavapipe in CI):
//! outputs, log-sum-exp and the gradients of `q`, `k`, `v`, with and without dropout.

use burn::tensor::{Device, Distribution, Tensor, TensorData};
use tinygpt_attention::flash::{
    self, flash_attention, flash_attention_packed_parts, flash_attention_parts,
};
use tinygpt_attention::{AttentionKernel, CausalSelfAttentionConfig, Pass};

type Shape4 = [usize; 4];

#[path = "support/normals.rs"]
mod normals;
#[path = "support/wgpu.rs"]
mod support_wgpu;
use normals::normal;
use support_wgpu::wgpu_device_of_two;

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec_as::<f32>().unwrap()
}

fn tensor(data: &[f32], shape: Shape4, device: &Device) -> Tensor<4> {
    Tensor::from_data(TensorData::new(data.to_vec(), shape), device)
}

/// max |a - b| / max |b|.
fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-12);
    let diff = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (&x, y)| m.max((x as f64 - y).abs()));
    diff / scale
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert!(
        got.iter().all(|x| x.is_finite()),
        "{what}: non-finite values"
    );
    let err = rel_err(got, want);
    assert!(err <= 1e-4, "{what}: relative error {err:e} > 1e-4");
}

/// Attention computed in f64, forward and backward, row by row as the formulas read.
struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
    d_q: Vec<f64>,
    d_k: Vec<f64>,
    d_v: Vec<f64>,
}

/// `keep(bh, i, j)`: the dropout multiplier of weight `(i, j)` (1 without dropout).
fn reference(
    [q, k, v, d_out]: [&[f32]; 4],
    [batch, heads, seq, dh]: Shape4,
    keep: &dyn Fn(usize, usize, usize) -> f64,
) -> Reference {
    let n = batch * heads * seq * dh;
    let (mut out, mut d_q, mut d_k, mut d_v) =
        (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let mut lse = vec![0.0; batch * heads * seq];
    let scale = 1.0 / (dh as f64).sqrt();
    let at = |t: &[f32], bh: usize, row: usize, c: usize| f64::from(t[(bh * seq + row) * dh + c]);
    for bh in 0..batch * heads {
        for i in 0..seq {
            let scores: Vec<f64> = (0..=i)
                .map(|j| {
                    (0..dh)
                        .map(|c| at(q, bh, i, c) * at(k, bh, j, c))
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            lse[bh * seq + i] = max + sum.ln();
            let p: Vec<f64> = scores.iter().map(|s| (s - max).exp() / sum).collect();
            let row = (bh * seq + i) * dh;
            // dP̃_ij = dO_i · v_j; dP_ij = keep · dP̃_ij; D_i = Σ_j P_ij dP_ij.
            let dp: Vec<f64> = (0..=i)
                .map(|j| {
                    keep(bh, i, j)
                        * (0..dh)
                            .map(|c| at(d_out, bh, i, c) * at(v, bh, j, c))
                            .sum::<f64>()
                })
                .collect();
            let d_i: f64 = (0..=i).map(|j| p[j] * dp[j]).sum();
            for j in 0..=i {
                let w = p[j] * keep(bh, i, j);
                let ds = p[j] * (dp[j] - d_i) * scale;
                for c in 0..dh {
                    out[row + c] += w * at(v, bh, j, c);
                    d_v[(bh * seq + j) * dh + c] += w * at(d_out, bh, i, c);
                    d_q[row + c] += ds * at(k, bh, j, c);
                    d_k[(bh * seq + j) * dh + c] += ds * at(q, bh, i, c);
                }
            }
        }
    }
    Reference {
        out,
        lse,
        d_q,
        d_k,
        d_v,
    }
}

/// Random `q`, `k`, `v`, `d_out` of `shape`.
fn inputs(shape: Shape4, seed: u64) -> [Vec<f32>; 4] {
    let n = shape.iter().product();
    [0, 1, 2, 3].map(|i| normal(n, seed * 4 + i))
}

/// The explicit path's output and gradients (Burn's autodiff through matmul, mask, softmax).
fn explicit(data: &[Vec<f32>; 4], shape: Shape4, device: &Device) -> [Vec<f32>; 4] {
    let device = device.clone().autodiff();
    let [q, k, v] = [0, 1, 2].map(|i| tensor(&data[i], shape, &device).require_grad());
    let scores = q.clone().matmul(k.clone().swap_dims(2, 3)) / (shape[3] as f64).sqrt();
    let hidden = tinygpt_attention::mask::causal_mask(shape[2], &device)
        .reshape([1, 1, shape[2], shape[2]])
        .expand([shape[0], shape[1], shape[2], shape[2]]);
    let out = tinygpt_attention::mask::mask_then_softmax(scores, hidden).matmul(v.clone());
    let grads = (out.clone() * tensor(&data[3], shape, &device))
        .sum()
        .backward();
    let grad = |t: &Tensor<4>| values(t.grad(&grads).unwrap());
    [values(out), grad(&q), grad(&k), grad(&v)]
}

/// The flash kernels' output and gradients through autodiff (`sum(out ∘ d_out)` backward).
fn flash_autodiff(
    data: &[Vec<f32>; 4],
    shape: Shape4,
    dropout: f64,
    device: &Device,
) -> [Vec<f32>; 4] {
    let device = device.clone().autodiff();
    let [q, k, v] = [0, 1, 2].map(|i| tensor(&data[i], shape, &device).require_grad());
    let out = flash_attention(q.clone(), k.clone(), v.clone(), dropout);
    let grads = (out.clone() * tensor(&data[3], shape, &device))
        .sum()
        .backward();
    let grad = |t: &Tensor<4>| values(t.grad(&grads).unwrap());
    [values(out), grad(&q), grad(&k), grad(&v)]
}

/// Several shapes: one head, batch 1, a single token, seq not a multiple of the 32-row block,
/// several blocks, and a wide head (which shrinks the block to fit shared memory).
const SHAPES: [Shape4; 5] = [
    [1, 1, 1, 4],
    [2, 3, 37, 16],
    [1, 2, 64, 32],
    [2, 1, 70, 64],
    [1, 1, 33, 256],
];

#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn flash_matches_the_explicit_path_and_the_f64_reference() {
    let device = wgpu_device_of_two();
    for (n, shape) in SHAPES.into_iter().enumerate() {
        let data = inputs(shape, n as u64);
        let want = reference(
            [&data[0], &data[1], &data[2], &data[3]],
            shape,
            &|_, _, _| 1.0,
        );
        let flash = flash_autodiff(&data, shape, 0.0, &device);
        let explicit = explicit(&data, shape, &device);
        let names = ["output", "dQ", "dK", "dV"];
        let wants = [&want.out, &want.d_q, &want.d_k, &want.d_v];
        for i in 0..4 {
            assert_close(
                &flash[i],
                wants[i],
                &format!("{shape:?} flash {}", names[i]),
            );
            assert_close(
                &explicit[i],
                wants[i],
                &format!("{shape:?} explicit {}", names[i]),
            );
        }
        let [q, k, v, d_out] = [0, 1, 2, 3].map(|i| tensor(&data[i], shape, &device));
        let ([out, d_q, d_k, d_v], lse) = flash_attention_parts(q, k, v, d_out, 0.0, 0);
        assert_close(&values(lse), &want.lse, &format!("{shape:?} log-sum-exp"));
        // Called directly, the backward kernels give what autodiff gave.
        for (i, direct) in [out, d_q, d_k, d_v].into_iter().enumerate() {
            assert_close(
                &values(direct),
                wants[i],
                &format!("{shape:?} direct {}", names[i]),
            );
        }
    }
}

/// Grouped-query heads: `q` `[batch, heads, seq, d]` over `k`, `v` `[batch, kv_heads, seq, d]`.
/// The kernels read each group's key/value head in place; Burn's autodiff through the explicit
/// path over the repeated heads (`repeat_kv`) sums each key/value head's gradient over its group.
/// Both give the same output and gradients, and the f64 reference over the repeated heads agrees.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn grouped_heads_are_read_in_place_and_their_gradients_summed() {
    use tinygpt_attention::grouped::repeat_kv;
    let device = wgpu_device_of_two().autodiff();
    for (n, ([batch, heads, seq, d], kv_heads)) in [([2, 6, 37, 16], 2), ([1, 4, 70, 32], 1)]
        .into_iter()
        .enumerate()
    {
        let (q_shape, kv_shape) = ([batch, heads, seq, d], [batch, kv_heads, seq, d]);
        let q_len = q_shape.iter().product();
        let kv_len = kv_shape.iter().product();
        let data = [
            normal(q_len, 40 + n as u64),
            normal(kv_len, 50 + n as u64),
            normal(kv_len, 60 + n as u64),
            normal(q_len, 70 + n as u64),
        ];
        let run = |flash: bool| {
            let q = tensor(&data[0], q_shape, &device).require_grad();
            let k = tensor(&data[1], kv_shape, &device).require_grad();
            let v = tensor(&data[2], kv_shape, &device).require_grad();
            let out = if flash {
                flash_attention(q.clone(), k.clone(), v.clone(), 0.0)
            } else {
                let group = heads / kv_heads;
                let (k_all, v_all) = (repeat_kv(k.clone(), group), repeat_kv(v.clone(), group));
                let scores = q.clone().matmul(k_all.swap_dims(2, 3)) / (d as f64).sqrt();
                let hidden = tinygpt_attention::mask::causal_mask(seq, &device)
                    .reshape([1, 1, seq, seq])
                    .expand([batch, heads, seq, seq]);
                tinygpt_attention::mask::mask_then_softmax(scores, hidden).matmul(v_all)
            };
            let grads = (out.clone() * tensor(&data[3], q_shape, &device))
                .sum()
                .backward();
            let grad = |t: &Tensor<4>| values(t.grad(&grads).unwrap());
            [values(out), grad(&q), grad(&k), grad(&v)]
        };
        let (flash, explicit) = (run(true), run(false));
        for (name, (a, b)) in ["output", "dQ", "dK", "dV"]
            .iter()
            .zip(flash.iter().zip(&explicit))
        {
            let b: Vec<f64> = b.iter().map(|&x| f64::from(x)).collect();
            assert_close(
                a,
                &b,
                &format!("{q_shape:?} over {kv_heads} key/value heads: {name}"),
            );
        }
    }
}

/// The projection's packed output read in place (`flash_attention_packed`) gives the numbers of
/// the heads split off it and passed separately, bit for bit: the output, and the gradient of
/// the packed input against the three gradients put back in its columns; with grouped heads and
/// dropout. The separate call is made twice, on the split heads as views (channels contiguous,
/// rows strided: what the kernels now read in place) and on contiguous copies of them.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn packed_heads_give_the_separate_heads_numbers_bit_for_bit() {
    let device = wgpu_device_of_two();
    for (n, (batch, heads, kv_heads, seq, d, p)) in [(2, 6, 2, 37, 16, 0.25), (1, 4, 4, 50, 8, 0.0)]
        .into_iter()
        .enumerate()
    {
        let (groups, seed) = (heads + 2 * kv_heads, 77 + n as u32);
        let width = groups * d;
        let qkv_data = normal(batch * seq * width, 90 + n as u64);
        let grad_data = normal(batch * seq * heads * d, 95 + n as u64);
        let qkv = Tensor::<3>::from_data(TensorData::new(qkv_data, [batch, seq, width]), &device);
        let d_out =
            Tensor::<3>::from_data(TensorData::new(grad_data, [batch, seq, heads * d]), &device);
        let (out, d_qkv) =
            flash_attention_packed_parts(qkv.clone(), heads, kv_heads, d_out.clone(), p, seed);

        let split = qkv.reshape([batch, seq, groups, d]).swap_dims(1, 2);
        let views = [
            split.clone().narrow(1, 0, heads),
            split.clone().narrow(1, heads, kv_heads),
            split.narrow(1, heads + kv_heads, kv_heads),
        ];
        let d_out = d_out.reshape([batch, seq, heads, d]).swap_dims(1, 2);
        // [batch, h, seq, d] -> [batch, seq, h·d]
        let rows = |t: Tensor<4>| {
            let [b, h, s, d] = t.dims();
            t.swap_dims(1, 2).reshape([b, s, h * d])
        };
        for contiguous in [false, true] {
            let [q, k, v] = views.clone().map(|t| match contiguous {
                true => Tensor::from_data(t.into_data(), &device),
                false => t,
            });
            let ([out_s, d_q, d_k, d_v], _) =
                flash_attention_parts(q, k, v, d_out.clone(), p, seed);
            let what = format!("{heads} heads over {kv_heads}, contiguous {contiguous}");
            assert_eq!(values(out.clone()), values(rows(out_s)), "{what}: output");
            let d_split = Tensor::cat(vec![rows(d_q), rows(d_k), rows(d_v)], 2);
            assert_eq!(values(d_qkv.clone()), values(d_split), "{what}: gradients");
        }
    }
}

/// `v = I` (one channel per key) turns the output into the weights themselves: row `i` of the
/// output is row `i` of `softmax(q kᵀ/√d + mask)` (after dropout).
fn weights(
    q: &[f32],
    k: &[f32],
    shape: Shape4,
    dropout: f64,
    seed: u32,
    device: &Device,
) -> Vec<f32> {
    let [batch, heads, seq, dh] = shape;
    assert_eq!(seq, dh, "v = I needs d_head = seq");
    let eye: Vec<f32> = (0..batch * heads * seq * seq)
        .map(|n| f32::from(u8::from(n % seq == (n / seq) % seq)))
        .collect();
    let zeros = vec![0.0; eye.len()];
    let ([out, ..], _) = flash_attention_parts(
        tensor(q, shape, device),
        tensor(k, shape, device),
        tensor(&eye, shape, device),
        tensor(&zeros, shape, device),
        dropout,
        seed,
    );
    values(out)
}

#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn keys_after_the_query_get_exactly_zero_weight() {
    let device = wgpu_device_of_two();
    let shape = [2, 2, 40, 40];
    let [q, k, ..] = inputs(shape, 7);
    let w = weights(&q, &k, shape, 0.0, 0, &device);
    for (row, weights) in w.chunks(40).enumerate() {
        let i = row % 40;
        assert!(
            weights[i + 1..].iter().all(|&x| x == 0.0),
            "row {i}: {:?}",
            &weights[i + 1..]
        );
        assert!(
            weights[..=i].iter().all(|&x| x > 0.0),
            "row {i}: a visible key got no weight"
        );
        let sum: f32 = weights.iter().sum();
        assert!((sum - 1.0).abs() < 1e-5, "row {i} sums to {sum}");
    }
}

/// With dropout each weight is either dropped (0) or kept and scaled by `1/(1-p)`, about `p` of
/// them are dropped, the mask depends on the seed only, and the backward recomputes the very
/// mask the forward used: the gradients equal the f64 reference's with that mask.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn dropout_masks_are_recomputed_in_the_backward() {
    let device = wgpu_device_of_two();
    let (p, seed) = (0.25, 1234);
    let shape = [2, 2, 48, 48];
    let seq = shape[2];
    let data = inputs(shape, 11);
    let plain = weights(&data[0], &data[1], shape, 0.0, 0, &device);
    let dropped = weights(&data[0], &data[1], shape, p, seed, &device);
    let (mut kept, mut visible) = (0usize, 0usize);
    for (n, (&d, &w)) in dropped.iter().zip(&plain).enumerate() {
        let (i, j) = ((n / seq) % seq, n % seq);
        if j > i {
            assert_eq!(d, 0.0, "({i}, {j}) is above the diagonal");
            continue;
        }
        visible += 1;
        if d != 0.0 {
            kept += 1;
            let scaled = w / (1.0 - p as f32);
            assert!(
                (d - scaled).abs() <= 1e-5 * scaled.max(1.0),
                "({i}, {j}): {d} vs {scaled}"
            );
        }
    }
    let dropped_share = 1.0 - kept as f64 / visible as f64;
    assert!(
        (dropped_share - p).abs() < 0.03,
        "dropped {dropped_share} of the weights, not {p}"
    );
    assert_eq!(
        weights(&data[0], &data[1], shape, p, seed, &device),
        dropped,
        "same seed, same mask"
    );
    assert_ne!(
        weights(&data[0], &data[1], shape, p, seed + 1, &device),
        dropped,
        "another seed"
    );

    // The mask is a function of the position and seed, not of the values: reuse it as the
    // reference's for other values of v and d_out.
    let keep = |bh: usize, i: usize, j: usize| {
        let d = dropped[(bh * seq + i) * seq + j];
        if d == 0.0 { 0.0 } else { 1.0 / (1.0 - p) }
    };
    let want = reference([&data[0], &data[1], &data[2], &data[3]], shape, &keep);
    let [q, k, v, d_out] = [0, 1, 2, 3].map(|i| tensor(&data[i], shape, &device));
    let ([out, d_q, d_k, d_v], _) = flash_attention_parts(q, k, v, d_out, p, seed);
    assert_close(&values(out), &want.out, "output with dropout");
    assert_close(&values(d_q), &want.d_q, "dQ with dropout");
    assert_close(&values(d_k), &want.d_k, "dK with dropout");
    assert_close(&values(d_v), &want.d_v, "dV with dropout");
}

/// The stream of seeds: seeded the same, the same calls draw the same masks.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn seeding_the_stream_repeats_the_masks() {
    let device = wgpu_device_of_two();
    let shape = [1, 2, 20, 8];
    let [q, k, v] = [0, 1, 2].map(|i| {
        Tensor::<4>::random(shape, Distribution::Normal(0., 1.), &device).mul_scalar(1.0 + i as f64)
    });
    let run = || [0, 1].map(|_| values(flash_attention(q.clone(), k.clone(), v.clone(), 0.5)));
    flash::seed_dropout(99);
    let first = run();
    flash::seed_dropout(99);
    assert_eq!(run(), first, "same stream seed, same masks");
    assert_ne!(first[0], first[1], "two calls draw two masks");
}

/// The layer with `kernel = "flash"` computes what the explicit one does, forward and every
/// parameter gradient, on wgpu.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn the_layer_with_flash_equals_the_explicit_layer_on_wgpu() {
    the_layer_with_flash_equals_the_explicit_layer(wgpu_device_of_two());
}

/// On a CPU backend `flash` falls back to the explicit path: the same numbers.
#[test]
fn the_layer_with_flash_falls_back_to_the_explicit_layer_on_flex() {
    the_layer_with_flash_equals_the_explicit_layer(Device::flex());
}

fn the_layer_with_flash_equals_the_explicit_layer(device: Device) {
    // Multi-head, grouped heads; then grouped heads with rotary positions and QK-norm before
    // the kernel.
    // Without rotation or QK-norm the flash layer reads the projection's packed output.
    let packed_grouped = CausalSelfAttentionConfig::new(32, 4, 50).with_n_kv_heads(Some(2));
    let grouped = packed_grouped
        .clone()
        .with_rope_base(Some(10000.0))
        .with_qk_norm_eps(Some(1e-6));
    for config in [
        CausalSelfAttentionConfig::new(32, 4, 50),
        packed_grouped,
        grouped,
    ] {
        layer_with_flash_equals_the_explicit_layer(&device, config);
    }
}

fn layer_with_flash_equals_the_explicit_layer(device: &Device, config: CausalSelfAttentionConfig) {
    let device = device.clone().autodiff();
    device.seed(5);
    let layer = config.with_init_std(0.3).init(&device).unwrap();
    let flash_layer = layer.clone().with_kernel(AttentionKernel::Flash);
    let explicit_layer = layer.with_kernel(AttentionKernel::Explicit);
    let x = Tensor::<3>::random([3, 45, 32], Distribution::Normal(0., 1.), &device);
    let g = Tensor::<3>::random([3, 45, 32], Distribution::Normal(0., 1.), &device);
    let run = |layer: &tinygpt_attention::CausalSelfAttention| {
        let y = layer.forward(x.clone(), None, Pass::Train).unwrap();
        let grads = (y.clone() * g.clone()).sum().backward();
        let w = layer.c_attn.weight.val().grad(&grads).unwrap();
        let p = layer.c_proj.weight.val().grad(&grads).unwrap();
        [values(y), values(w), values(p)]
    };
    let (flash, explicit) = (run(&flash_layer), run(&explicit_layer));
    for (name, (a, b)) in ["output", "c_attn grad", "c_proj grad"]
        .iter()
        .zip(flash.iter().zip(&explicit))
    {
        let b: Vec<f64> = b.iter().map(|&x| f64::from(x)).collect();
        assert_close(a, &b, &format!("{device:?} {name}"));
    }
}
