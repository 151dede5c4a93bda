//! A decode step's attention in one kernel ([`tinygpt_attention::decode_attention`]) against
//! the definition computed on the host in f64, on wgpu (lavapipe in CI): keys past each query's
//! position hidden, grouped heads reading their key/value head, a prompt's chunk of several
//! queries a row (its last position repeated, as a short chunk repeats it), the heads written
//! side by side.

use burn::tensor::{Tensor, TensorData};
use tinygpt_attention::Kernels;
use tinygpt_attention::decode_attention::{applies, decode_attention};

use super::draws::{fresh_draws, random};
use super::support_wgpu::wgpu_device_of_two;
use super::{rel_err, values};

/// `softmax(q·k_j/√d, j ≤ position) · v` for every row, head and query, in f64:
/// `[rows, new, heads · d]`.
fn by_hand(
    (q, k, v): (&[f32], &[f32], &[f32]),
    [rows, heads, new, d]: [usize; 4],
    (kv_heads, capacity): (usize, usize),
    positions: &[usize],
) -> Vec<f32> {
    let mut out = vec![0f32; rows * new * heads * d];
    for r in 0..rows {
        for h in 0..heads {
            let g = h / (heads / kv_heads);
            for i in 0..new {
                let q_at = ((r * heads + h) * new + i) * d;
                let key = |j: usize| ((r * kv_heads + g) * capacity + j) * d;
                let seen = positions[r * new + i] + 1;
                let scores: Vec<f64> = (0..seen)
                    .map(|j| {
                        let dot: f64 = (0..d)
                            .map(|c| f64::from(q[q_at + c]) * f64::from(k[key(j) + c]))
                            .sum();
                        dot / (d as f64).sqrt()
                    })
                    .collect();
                let most = scores.iter().cloned().fold(f64::MIN, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - most).exp()).collect();
                let total: f64 = weights.iter().sum();
                for c in 0..d {
                    let sum: f64 = (0..seen)
                        .map(|j| weights[j] * f64::from(v[key(j) + c]))
                        .sum();
                    out[((r * new + i) * heads + h) * d + c] = (sum / total) as f32;
                }
            }
        }
    }
    out
}

#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn the_decode_attention_kernel_is_the_masked_softmax() {
    let device = wgpu_device_of_two();
    fresh_draws();
    assert!(applies(Kernels::for_device(&device), 100));
    // One token a row; a chunk of three with its last position repeated; grouped heads; a head
    // wider than the cube's 64 units; a cache longer than them.
    let cases: [([usize; 4], usize, usize, Vec<usize>); 3] = [
        ([2, 4, 1, 8], 4, 10, vec![0, 9]),
        ([2, 4, 3, 8], 2, 10, vec![2, 3, 4, 7, 8, 8]),
        ([1, 3, 2, 80], 1, 100, vec![70, 99]),
    ];
    for (shape, kv_heads, capacity, positions) in cases {
        let [rows, heads, new, d] = shape;
        let q = random(shape, &device);
        let k = random([rows, kv_heads, capacity, d], &device);
        let v = random([rows, kv_heads, capacity, d], &device);
        let host: Vec<f32> = positions.iter().map(|&p| p as f32).collect();
        let at = Tensor::<2>::from_data(TensorData::new(host, [rows, new]), &device);
        let got = decode_attention(q.clone(), k.clone(), v.clone(), at);
        assert_eq!(got.dims(), [rows, new, heads * d]);
        let (q, k, v) = (values(q), values(k), values(v));
        let want = by_hand((&q, &k, &v), shape, (kv_heads, capacity), &positions);
        let err = rel_err(&values(got), &want);
        assert!(
            err < 1e-5,
            "{shape:?}, {kv_heads} kv heads, {positions:?}: {err}"
        );
    }
}
