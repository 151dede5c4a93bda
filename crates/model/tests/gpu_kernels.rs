//! The fused GPU kernels equal the Burn ops they replace, forward and gradients under autodiff,
//! on wgpu (lavapipe in CI): LayerNorm (with and without its shift), RMSNorm (with and without
//! its gain) and the cross-entropy with
//! ignored targets, on shapes that are not multiples of the kernels' cube size. And the model
//! takes them: the same `Gpt` gives the same loss and gradients on wgpu as on flex, read as a
//! training step reads it too. And `sum_all`, the model's whole-tensor sum, adds every element;
//! and decoding's products by the rows kernel equal Burn's matmul.

mod common;

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::LayerNormConfig;
use burn::tensor::{Device, FloatDType, Int, Tensor, TensorData};
use tinygpt_model::gpu::rows::{self, MAX_ROWS};
use tinygpt_model::gpu::{
    cross_entropy, cross_entropy_parts, embedding, layer_norm, layer_norm_parts, rms_norm,
};
use tinygpt_model::{GptConfig, Pass, gpu::sum_all, step::cross_entropy_ops};

/// Numbers in [-scale, scale) from a fixed-seed xorshift.
fn numbers(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * scale
        })
        .collect()
}

fn tensor<const D: usize>(values: Vec<f32>, shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

fn read<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

fn assert_close(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

/// `sum_all` adds every element on wgpu, where Burn's whole-tensor reduction stops at the
/// first 2^18 of an axis: lengths below a stage's row, between rows, past 2^18 and at ten
/// million (a model's gradients), against the host's f64 sum; and ones that all lie past
/// index 2^18, which that reduction misses entirely.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn sum_all_adds_every_element_on_a_gpu() {
    let device = common::wgpu_device_of_two();
    for (case, n) in [1usize, 1000, 1025, 262_148, 1_000_003, 10_000_000]
        .into_iter()
        .enumerate()
    {
        let values = numbers(case as u64, n, 1.0);
        let want: f64 = values.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        let x = tensor(values, [n], &device);
        let got = f64::from(read(sum_all(x.square()))[0]);
        assert!(
            (got - want).abs() <= 1e-5 * want,
            "{n} squares: {got} vs {want}"
        );
    }
    let n = 300_000;
    let late_ones = (0..n).map(|i| f32::from(u8::from(i >= 1 << 18))).collect();
    let got = read(sum_all(tensor(late_ones, [n], &device)))[0];
    assert_eq!(got, (n - (1 << 18)) as f32, "ones past index 2^18");
}

/// Rows and widths: one value, fewer than a cube's units, a cube's worth, several passes.
const LAYER_NORM_SHAPES: [[usize; 2]; 4] = [[1, 1], [3, 5], [37, 128], [130, 300]];

#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn the_fused_layer_norm_is_burns() {
    let device = common::wgpu_device_of_two();
    for (case, [rows, channels]) in LAYER_NORM_SHAPES.into_iter().enumerate() {
        let seed = case as u64;
        // An offset mean, as activations have, and gains away from 1.
        let x: Vec<f32> = numbers(seed, rows * channels, 3.0)
            .iter()
            .map(|v| v + 1.5)
            .collect();
        let gamma = numbers(seed + 100, channels, 1.0);
        let beta = numbers(seed + 200, channels, 1.0);
        let dy = numbers(seed + 300, rows * channels, 1.0);
        for with_beta in [true, false] {
            let what = format!("[{rows}, {channels}] beta={with_beta}");
            // Burn's LayerNorm under autodiff, the reference.
            let ad = device.clone().autodiff();
            let mut ln = LayerNormConfig::new(channels)
                .with_bias(with_beta)
                .init(&ad);
            ln.gamma = Param::from_tensor(tensor(gamma.clone(), [channels], &ad));
            if with_beta {
                ln.beta = Some(Param::from_tensor(tensor(beta.clone(), [channels], &ad)));
            }
            let x_ref = tensor(x.clone(), [rows, channels], &ad).require_grad();
            let y_ref = ln.forward(x_ref.clone());
            let loss = (y_ref.clone() * tensor(dy.clone(), [rows, channels], &ad)).sum();
            let ref_grads = loss.backward();
            let dx_ref = read(x_ref.grad(&ref_grads).unwrap());
            let dg_ref = read(ln.gamma.val().grad(&ref_grads).unwrap());
            let db_ref = ln
                .beta
                .as_ref()
                .map(|b| read(b.val().grad(&ref_grads).unwrap()));

            // The fused op under autodiff, through the same loss.
            let x_fused = tensor(x.clone(), [rows, channels], &ad).require_grad();
            let g_fused = tensor(gamma.clone(), [channels], &ad).require_grad();
            let b_fused = with_beta.then(|| tensor(beta.clone(), [channels], &ad).require_grad());
            let y = layer_norm(x_fused.clone(), g_fused.clone(), b_fused.clone(), 1e-5);
            assert_close(&read(y.clone()), &read(y_ref), 1e-5, &format!("y {what}"));
            let loss = (y * tensor(dy.clone(), [rows, channels], &ad)).sum();
            let grads = loss.backward();
            assert_close(
                &read(x_fused.grad(&grads).unwrap()),
                &dx_ref,
                1e-4,
                &format!("dx {what}"),
            );
            assert_close(
                &read(g_fused.grad(&grads).unwrap()),
                &dg_ref,
                1e-4,
                &format!("dγ {what}"),
            );
            if let (Some(b), Some(db_ref)) = (b_fused, db_ref) {
                let db = read(b.grad(&grads).unwrap());
                assert_close(&db, &db_ref, 1e-4, &format!("dβ {what}"));
            }
        }
        // Called directly, the statistics are the row's mean and 1/√(var + ε).
        let parts = layer_norm_parts(
            tensor(x.clone(), [rows, channels], &device),
            tensor(gamma.clone(), [channels], &device),
            tensor(beta.clone(), [channels], &device),
            tensor(dy.clone(), [rows, channels], &device),
            1e-5,
            true,
        );
        let (mean, rstd) = (read(parts.mean), read(parts.rstd));
        for row in 0..rows {
            let values = &x[row * channels..(row + 1) * channels];
            let mu = values.iter().map(|&v| f64::from(v)).sum::<f64>() / channels as f64;
            let var = values
                .iter()
                .map(|&v| (f64::from(v) - mu).powi(2))
                .sum::<f64>()
                / channels as f64;
            assert!(
                (f64::from(mean[row]) - mu).abs() < 1e-5,
                "mean of row {row}"
            );
            let r = 1.0 / (var + 1e-5).sqrt();
            assert!(
                (f64::from(rstd[row]) - r).abs() < 1e-4 * r,
                "rstd of row {row}"
            );
        }
    }
}

/// RMSNorm is the LayerNorm kernels uncentred: equal to the Burn ops of
/// [`tinygpt_model::step::rms_norm_ops`] under autodiff, forward and gradients, with and without the
/// gain; called directly, its statistics are a zero mean and `1/√(mean(x²) + ε)`.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn the_fused_rms_norm_is_the_burn_ops() {
    let device = common::wgpu_device_of_two();
    for (case, [rows, channels]) in LAYER_NORM_SHAPES.into_iter().enumerate() {
        let seed = 500 + case as u64;
        // An offset mean, which RMSNorm keeps (LayerNorm would remove it).
        let x: Vec<f32> = numbers(seed, rows * channels, 3.0)
            .iter()
            .map(|v| v + 1.5)
            .collect();
        let gamma = numbers(seed + 100, channels, 1.0);
        let dy = numbers(seed + 300, rows * channels, 1.0);
        let ad = device.clone().autodiff();
        for with_gain in [true, false] {
            let what = format!("[{rows}, {channels}] gain={with_gain}");
            let run = |fused: bool| {
                let x = tensor(x.clone(), [rows, channels], &ad).require_grad();
                let g = with_gain.then(|| tensor(gamma.clone(), [channels], &ad).require_grad());
                let y = match fused {
                    true => rms_norm(x.clone(), g.clone(), 1e-5),
                    false => {
                        let y = tinygpt_model::step::rms_norm_ops(
                            x.clone().reshape([1, rows, channels]),
                            g.clone(),
                            1e-5,
                        );
                        y.reshape([rows, channels])
                    }
                };
                let loss = (y.clone() * tensor(dy.clone(), [rows, channels], &ad)).sum();
                let grads = loss.backward();
                let dg = g.map(|g| read(g.grad(&grads).unwrap()));
                (read(y), read(x.grad(&grads).unwrap()), dg)
            };
            let ((y, dx, dg), (y_ref, dx_ref, dg_ref)) = (run(true), run(false));
            assert_close(&y, &y_ref, 1e-5, &format!("y {what}"));
            assert_close(&dx, &dx_ref, 1e-4, &format!("dx {what}"));
            if let (Some(dg), Some(dg_ref)) = (dg, dg_ref) {
                assert_close(&dg, &dg_ref, 1e-4, &format!("dγ {what}"));
            }
        }
        let parts = layer_norm_parts(
            tensor(x.clone(), [rows, channels], &device),
            tensor(gamma.clone(), [channels], &device),
            Tensor::zeros([channels], &device),
            tensor(dy.clone(), [rows, channels], &device),
            1e-5,
            false,
        );
        let (mean, rstd) = (read(parts.mean), read(parts.rstd));
        for row in 0..rows {
            let values = &x[row * channels..(row + 1) * channels];
            let ms = values.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / channels as f64;
            assert_eq!(mean[row], 0.0, "mean of row {row}");
            let r = 1.0 / (ms + 1e-5).sqrt();
            assert!(
                (f64::from(rstd[row]) - r).abs() < 1e-4 * r,
                "rstd of row {row}"
            );
        }
    }
}

#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn the_fused_cross_entropy_is_burns() {
    let device = common::wgpu_device_of_two();
    for (case, [rows, vocab]) in [[1, 2], [5, 65], [64, 65], [33, 300], [7, 1000]]
        .into_iter()
        .enumerate()
    {
        let seed = 1000 + case as u64;
        let logits = numbers(seed, rows * vocab, 6.0);
        // Every third target ignored (-1), except in a single-row batch.
        let targets: Vec<i64> = numbers(seed + 1, rows, 1.0)
            .iter()
            .enumerate()
            .map(|(i, u)| match i % 3 == 1 {
                true => -1,
                false => ((u + 1.0) / 2.0 * vocab as f32).min(vocab as f32 - 1.0) as i64,
            })
            .collect();
        let kept = targets.iter().filter(|&&t| t >= 0).count();
        let what = format!("[{rows}, {vocab}]");
        let ad = device.clone().autodiff();
        let ids =
            |d: &Device| Tensor::<1, Int>::from_data(TensorData::new(targets.clone(), [rows]), d);

        let reference = tensor(logits.clone(), [rows, vocab], &ad).require_grad();
        let loss_ref = cross_entropy_ops(reference.clone(), ids(&ad), kept);
        let grads = loss_ref.backward();
        let d_ref = read(reference.grad(&grads).unwrap());
        let loss_ref = read(loss_ref);

        let fused = tensor(logits.clone(), [rows, vocab], &ad).require_grad();
        let loss = cross_entropy(fused.clone(), ids(&ad), kept);
        assert_close(
            &read(loss.clone()),
            &loss_ref,
            1e-5,
            &format!("loss {what}"),
        );
        let grads = loss.backward();
        let d_logits = read(fused.grad(&grads).unwrap());
        assert_close(&d_logits, &d_ref, 1e-5, &format!("d logits {what}"));
        for (row, &t) in targets.iter().enumerate() {
            if t < 0 {
                let zero = d_logits[row * vocab..(row + 1) * vocab]
                    .iter()
                    .all(|&g| g == 0.0);
                assert!(zero, "an ignored row got a gradient: {what} row {row}");
            }
        }

        // Called directly: each row's log-sum-exp, in f64 on the host.
        let (_, lse, _) = cross_entropy_parts(
            tensor(logits.clone(), [rows, vocab], &device),
            ids(&device),
            Tensor::ones([rows], &device),
        );
        for (row, got) in read(lse).into_iter().enumerate() {
            let values = &logits[row * vocab..(row + 1) * vocab];
            let want = values.iter().map(|&v| f64::from(v).exp()).sum::<f64>().ln();
            assert!(
                (f64::from(got) - want).abs() < 1e-5 * want.abs().max(1.0),
                "lse {what} {row}"
            );
        }
    }
}

/// The embedding whose gradient is a one-hot product gives Burn's rows, and the gradient of
/// Burn's scatter: ids repeated many times, ids never seen (their rows' gradient exactly 0), a
/// batch that is not a multiple of the kernel's cube; and the same bits on every run.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn the_embedding_gradient_is_burns_scatter() {
    let device = common::wgpu_device_of_two().autodiff();
    let (vocab, width, [batch, seq]) = (70, 24, [3, 53]);
    // Ids below 40 only, the small ones far more often (as characters are).
    let ids: Vec<i64> = (0..batch * seq)
        .map(|i| ((i * i * 7 + 3) % 97 % 40) as i64)
        .collect();
    let weights = numbers(1, vocab * width, 1.0);
    let upstream = numbers(2, batch * seq * width, 1.0);
    let run = |ours: bool| {
        let w = tensor(weights.clone(), [vocab, width], &device).require_grad();
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [batch, seq]), &device);
        let rows = match ours {
            true => embedding(w.clone(), ids),
            false => w
                .clone()
                .select(0, ids.reshape([batch * seq]))
                .reshape([batch, seq, width]),
        };
        let g = tensor(upstream.clone(), [batch, seq, width], &device);
        let grads = (rows.clone() * g).sum().backward();
        (read(rows), read(w.grad(&grads).unwrap()))
    };
    let ((rows, grad), (burn_rows, burn_grad)) = (run(true), run(false));
    assert_eq!(rows, burn_rows, "the rows are the weights' rows");
    assert_close(&grad, &burn_grad, 1e-5, "the weights' gradient");
    assert!(
        grad[40 * width..].iter().all(|&g| g == 0.0),
        "ids never seen get no gradient"
    );
    assert!(grad[..width].iter().any(|&g| g != 0.0));
    assert_eq!(
        run(true).1,
        grad,
        "the same sums in the same order on every run"
    );
}

/// Every gradient of a model, by parameter, in visiting order.
fn gradients(model: &tinygpt_model::Gpt, grads: &burn::tensor::Gradients) -> Vec<Vec<f32>> {
    struct Collect<'a>(&'a burn::tensor::Gradients, Vec<Vec<f32>>);
    impl ModuleVisitor for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = param.val().grad(self.0) {
                self.1.push(read(g));
            }
        }
    }
    let mut collect = Collect(grads, Vec::new());
    model.visit(&mut collect);
    collect.1
}

/// A small GPT on wgpu (fused LayerNorm and loss) gives flex's loss and gradients.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn the_model_on_a_gpu_takes_the_fused_kernels_and_trains_as_on_the_cpu() {
    let device = common::wgpu_device_of_two();
    let config = GptConfig {
        vocab_size: 37,
        block_size: 16,
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        ..GptConfig::baby(37)
    };
    let cpu = Device::flex().autodiff();
    // Drawn on flex under the lock that seeds its generator (the record reads every weight);
    // loading it draws nothing, so the minutes on wgpu run beside the other tests'.
    let (model, record) = {
        let _seeded = common::seeded();
        let model = config.init(&cpu).unwrap();
        let record = model.clone().into_record();
        (model, record)
    };
    let gpu = device.clone().autodiff();
    let on_gpu = config.init(&gpu).unwrap().load_record(record);
    let tokens: Vec<i64> = (0..3 * 16).map(|i| (i * 7 % 37) as i64).collect();
    let mut targets: Vec<i64> = (0..3 * 16).map(|i| ((i * 5 + 3) % 37) as i64).collect();
    targets[4] = -1;
    let kept = targets.len() - 1;
    // A training step reads the tied embedding through one node of its own (`autocast`, also
    // in f32): the same loss and gradients, reaching the same parameter.
    let step = on_gpu.autocast(FloatDType::F32);
    assert!(config.tie_embeddings && step.lm_head.is_none());
    assert!(!step.wte.weight.val().is_require_grad() && on_gpu.wte.weight.val().is_require_grad());
    let mut results = Vec::new();
    for (model, reads, device) in [
        (&model, &model, &cpu),
        (&on_gpu, &on_gpu, &gpu),
        (&on_gpu, &step, &gpu),
    ] {
        let inputs = Tensor::<2, Int>::from_data(TensorData::new(tokens.clone(), [3, 16]), device);
        let t = Tensor::<1, Int>::from_data(TensorData::new(targets.clone(), [48]), device);
        let logits = reads
            .forward(inputs, Pass::Train)
            .unwrap()
            .reshape([48, 37]);
        let loss =
            tinygpt_model::step::cross_entropy_counted(logits, t, kept, model.kernels()).unwrap();
        let value = read(loss.clone())[0];
        let grads = loss.backward();
        results.push((value, gradients(model, &grads)));
    }
    let (cpu_loss, cpu_grads) = &results[0];
    for (gpu_loss, gpu_grads) in &results[1..] {
        assert!(
            (cpu_loss - gpu_loss).abs() < 1e-5,
            "{cpu_loss} vs {gpu_loss}"
        );
        assert_eq!(cpu_grads.len(), gpu_grads.len());
        for (i, (c, g)) in cpu_grads.iter().zip(gpu_grads).enumerate() {
            assert_close(g, c, 1e-4, &format!("gradient {i}"));
        }
    }
}

/// Decoding's products by the rows kernel ([`tinygpt_model::gpu::rows`]) equal Burn's matmul, on
/// wgpu: one row and the most it takes, with and without a bias, a weight read through a
/// transposed view (the tied LM head), widths that are no multiple of the cube's 32 columns or
/// of its 8 slices. It takes no more rows than it keeps, and nothing that tracks gradients.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn the_rows_kernel_gives_burns_products() {
    let device = common::wgpu_device_of_two();
    for (k, n) in [(37, 70), (384, 65)] {
        for rows in [1, MAX_ROWS] {
            let x = tensor(numbers(1, rows * k, 1.0), [1, rows, k], &device);
            assert!(rows::takes(&x), "{rows} rows on wgpu");
            let weight = tensor(numbers(2, k * n, 1.0), [k, n], &device);
            let bias = tensor(numbers(3, n, 1.0), [n], &device);
            let want = x.clone().matmul(weight.clone().unsqueeze()) + bias.clone().unsqueeze();
            let got = rows::product(x.clone(), weight.clone(), Some(bias));
            assert_eq!(got.dims(), [1, rows, n]);
            assert_close(&read(got), &read(want), 1e-4, "rows kernel, bias");

            // The weight as the transpose of an `[N, K]` matrix, without a bias.
            let stored = tensor(numbers(4, n * k, 1.0), [n, k], &device);
            let want = x.clone().matmul(stored.clone().transpose().unsqueeze());
            let got = rows::product(x, stored.transpose(), None);
            assert_close(&read(got), &read(want), 1e-4, "rows kernel, transposed");
        }
    }
    let many = Tensor::<2>::zeros([MAX_ROWS + 1, 8], &device);
    assert!(!rows::takes(&many), "more rows than the kernel keeps");
    let tracked = Tensor::<2>::zeros([1, 8], &device.clone().autodiff());
    assert!(!rows::takes(&tracked), "no backward");
}
