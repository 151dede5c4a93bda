//! The GPT end to end: shapes, parameter counts, init loss, ignore_index, training, generation.

#[path = "../common/mod.rs"]
mod common;
mod generation;

use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Distribution, Int, Tensor, TensorData};
use common::seeded;
use std::ops::ControlFlow;
use tinygpt_model::gpu::Kernels;
use tinygpt_model::parts::{Mlp, Norm, Position, ProjInit};

use tinygpt_model::{
    GenerateError, GenerateOptions, Gpt, GptConfig, GptConfigError, IGNORE_INDEX, LossError,
    ModelError, Pass, cross_entropy, generate, generate_cancellable, score,
};

/// burn-ndarray is deprecated upstream in favour of flex; tinygpt still supports and tests it.
#[allow(deprecated)]
fn ndarray() -> Device {
    Device::ndarray()
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec_as::<f32>().unwrap()
}

fn ints(data: &[i64], shape: [usize; 2], device: &Device) -> Tensor<2, Int> {
    Tensor::from_data(TensorData::new(data.to_vec(), shape), device)
}

fn random_tokens(batch: usize, seq: usize, vocab: usize, device: &Device) -> Tensor<2, Int> {
    Tensor::<2>::random(
        [batch, seq],
        Distribution::Uniform(0.0, vocab as f64),
        device,
    )
    .int()
    .clamp(0, vocab as i64 - 1)
}

/// Mean next-token loss of `tokens[:, :-1] -> tokens[:, 1:]`.
fn lm_loss(model: &Gpt, tokens: Tensor<2, Int>, pass: Pass) -> Tensor<1> {
    let [batch, seq] = tokens.dims();
    let inputs = tokens.clone().slice([0..batch, 0..seq - 1]);
    let targets = tokens
        .slice([0..batch, 1..seq])
        .reshape([batch * (seq - 1)]);
    let logits = model.forward(inputs, pass).unwrap();
    cross_entropy(
        logits.reshape([batch * (seq - 1), model.vocab_size()]),
        targets,
    )
    .unwrap()
}

/// Trains on `tokens` with AdamW until the loss is below `target` or `max_steps` pass; returns
/// the model and the losses.
fn fit(
    mut model: Gpt,
    tokens: Tensor<2, Int>,
    lr: f64,
    max_steps: usize,
    target: f32,
) -> (Gpt, Vec<f32>) {
    let mut optim = AdamWConfig::new().with_weight_decay(0.0).init();
    let mut losses = Vec::new();
    for _ in 0..max_steps {
        let loss = lm_loss(&model, tokens.clone(), Pass::Train);
        let value = values(loss.clone())[0];
        assert!(value.is_finite(), "loss became {value}");
        losses.push(value);
        if value < target {
            break;
        }
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(lr, model, grads);
    }
    (model, losses)
}

/// A small model trained on a repeating pattern, so its next-token choices are clear-cut.
fn patterned_model(device: &Device) -> Gpt {
    patterned_model_with(device, |config| config)
}

/// [`patterned_model`] with other parts, and its logits soft-capped at `softcap` (0 = none).
fn patterned_model_with(device: &Device, parts: impl FnOnce(GptConfig) -> GptConfig) -> Gpt {
    let ad = device.clone().autodiff();
    let config = parts(
        GptConfig::new(12)
            .with_block_size(16)
            .with_n_layer(2)
            .with_n_head(2)
            .with_n_embd(32),
    );
    let model = config.init(&ad).unwrap();
    let pattern: Vec<i64> = (0..4 * 16).map(|i| [1, 5, 2, 7, 3, 5, 9][i % 7]).collect();
    let tokens = ints(&pattern, [4, 16], &ad);
    let (model, losses) = fit(model, tokens, 1e-2, 300, 0.05);
    assert!(
        *losses.last().unwrap() < 0.05,
        "pattern not learned: {losses:?}"
    );
    model.valid()
}

// ---------------------------------------------------------------- architecture

#[test]
fn forward_shapes() {
    let _seeded = seeded();
    let device = Device::flex();
    for config in [
        GptConfig::baby(65),
        GptConfig::minimal(30),
        GptConfig::new(11).with_tie_embeddings(false),
    ] {
        let model = config.init(&device).unwrap();
        let logits = model
            .forward(
                random_tokens(3, 17, config.vocab_size, &device),
                Pass::Infer,
            )
            .unwrap();
        assert_eq!(logits.dims(), [3, 17, config.vocab_size]);
    }
}

/// The parameter count follows the architecture's formula and matches nanoGPT's printed
/// figures: baby 0.80M, shakespeare-char 10.65M (tied head, position embedding excluded).
#[test]
fn preset_parameter_counts() {
    let _seeded = seeded();
    let device = Device::flex();
    let formula = |c: &GptConfig| {
        let d = c.n_embd;
        let b = usize::from(c.bias);
        let ln = d + b * d;
        let attn = d * 3 * d + b * 3 * d + d * d + b * d;
        let mlp = d * 4 * d + b * 4 * d + 4 * d * d + b * d;
        let block = 2 * ln + attn + mlp;
        c.n_layer * block + ln + c.vocab_size * d + c.block_size * d
    };
    for (config, printed) in [
        (GptConfig::baby(65), "0.80M"),
        (GptConfig::shakespeare_char(65), "10.65M"),
    ] {
        let model = config.init(&device).unwrap();
        assert_eq!(model.num_params(), formula(&config));
        let millions = model.num_params_non_embedding() as f64 / 1e6;
        assert_eq!(format!("{millions:.2}M"), printed);
        println!(
            "{} layers, n_embd {}: {} parameters, {printed} without wpe",
            config.n_layer,
            config.n_embd,
            model.num_params()
        );
    }
    let untied = GptConfig::baby(65)
        .with_tie_embeddings(false)
        .init(&device)
        .unwrap();
    assert_eq!(
        untied.num_params(),
        formula(&GptConfig::baby(65)) + 65 * 128
    );
}

/// GPT-2 init gives near-uniform predictions: on random tokens the loss is within 0.1 of
/// ln(vocab). Precisely, the tied head's logits are LayerNorm output (unit variance) times
/// N(0, 0.02) embeddings, so they have variance σ² = n_embd·0.02², and the expected loss is
/// ln(vocab) + σ²/2 (4.20 for baby, 4.25 at n_embd 384, as nanoGPT's ≈4.2-4.3 at step 0).
#[test]
fn loss_at_init_is_ln_vocab() {
    let _seeded = seeded();
    let device = Device::flex();
    let uniform = (65f32).ln();
    for config in [
        GptConfig::baby(65),
        GptConfig::shakespeare_char(65).with_n_layer(2),
    ] {
        let model = config.init(&device).unwrap();
        let loss = values(lm_loss(
            &model,
            random_tokens(8, 33, 65, &device),
            Pass::Infer,
        ))[0];
        let expected = uniform + config.n_embd as f32 * 0.02f32.powi(2) / 2.0;
        println!(
            "n_embd {}: loss at init {loss:.4}, ln(65) = {uniform:.4}, expected {expected:.4}",
            config.n_embd
        );
        assert!(
            (loss - expected).abs() < 0.06,
            "loss at init {loss} vs expected {expected}"
        );
        if config.n_embd <= 128 {
            assert!(
                (loss - uniform).abs() < 0.1,
                "loss at init {loss} vs ln(65) = {uniform}"
            );
        }
    }
}

#[test]
fn config_errors_name_the_key() {
    let _seeded = seeded();
    let device = Device::flex();
    let err = |c: GptConfig| c.init(&device).map(|_| ()).unwrap_err();
    assert_eq!(
        err(GptConfig::new(0)),
        GptConfigError::Zero { name: "vocab_size" }
    );
    assert_eq!(
        err(GptConfig::new(10).with_n_head(5)).to_string(),
        "`n_head` (5) must divide `n_embd` (128)"
    );
    assert_eq!(
        err(GptConfig::new(10).with_dropout(1.0)).to_string(),
        "`dropout` must be in [0, 1), got 1"
    );
    assert_eq!(
        err(GptConfig::new(10).with_block_size(0)),
        GptConfigError::Zero { name: "block_size" }
    );
}

#[test]
fn bad_tokens_and_long_inputs_are_errors() {
    let _seeded = seeded();
    let device = ndarray();
    let model = GptConfig::new(10).with_block_size(8).init(&device).unwrap();
    // Ids are checked on the host, where a batch is built; the forward pass never reads back.
    let err = model.check_tokens(&[1, 2, 10]).unwrap_err();
    assert_eq!(
        err,
        ModelError::TokenOutOfRange {
            id: 10,
            vocab_size: 10
        }
    );
    let err = model.check_tokens(&[1, -1, 2]).unwrap_err();
    assert_eq!(
        err,
        ModelError::TokenOutOfRange {
            id: -1,
            vocab_size: 10
        }
    );
    let err = model
        .forward(random_tokens(1, 9, 10, &device), Pass::Infer)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "sequence of 9 tokens is longer than the context of 8 tokens"
    );
}

#[test]
fn weight_decay_applies_to_matrices_only() {
    let _seeded = seeded();
    let model = GptConfig::baby(65).init(&Device::flex()).unwrap();
    // wte, wpe, and per block c_attn, attn.c_proj, c_fc, mlp.c_proj (head tied to wte)
    assert_eq!(model.decayed_param_ids().len(), 2 + 4 * 4);
}

// ---------------------------------------------------------------- loss

/// The loss equals the masked mean written out by hand: log-softmax, pick, average over kept.
#[test]
fn cross_entropy_matches_hand_computation() {
    let _seeded = seeded();
    let device = Device::flex();
    let (n, vocab) = (7, 5);
    let logits = Tensor::<2>::random([n, vocab], Distribution::Normal(0.0, 2.0), &device);
    let targets = [3i64, -1, 0, 4, -1, 2, 1];
    let t = Tensor::<1, Int>::from_data(TensorData::new(targets.to_vec(), [n]), &device);
    let got = values(cross_entropy(logits.clone(), t).unwrap())[0] as f64;
    let rows = values(logits);
    let mut sum = 0f64;
    let mut count = 0;
    for (i, &target) in targets.iter().enumerate() {
        if target == IGNORE_INDEX {
            continue;
        }
        let row: Vec<f64> = rows[i * vocab..(i + 1) * vocab]
            .iter()
            .map(|&x| x as f64)
            .collect();
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let log_sum_exp = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        sum += log_sum_exp - row[target as usize];
        count += 1;
    }
    let expect = sum / count as f64;
    assert!(
        (got - expect).abs() < 1e-5 * expect.abs(),
        "loss {got} vs hand {expect}"
    );
}

/// Appending ignored positions changes neither the loss nor the logits' gradients, and the
/// ignored rows get zero gradient.
#[test]
fn ignored_targets_change_nothing() {
    let _seeded = seeded();
    let device = Device::flex().autodiff();
    let (n, extra, vocab) = (5, 3, 6);
    let base = Tensor::<2>::random([n, vocab], Distribution::Normal(0.0, 1.0), &device);
    let noise = Tensor::<2>::random([extra, vocab], Distribution::Normal(0.0, 1.0), &device);
    let targets: Vec<i64> = vec![1, 0, 5, 2, 2];
    let run = |logits: Tensor<2>, targets: Vec<i64>| {
        let logits = logits.detach().require_grad();
        let len = targets.len();
        let t = Tensor::<1, Int>::from_data(TensorData::new(targets, [len]), &device);
        let loss = cross_entropy(logits.clone(), t).unwrap();
        let grads = loss.backward();
        (values(loss), values(logits.grad(&grads).unwrap()))
    };
    let (loss_a, grad_a) = run(base.clone(), targets.clone());
    let padded_targets = [targets, vec![IGNORE_INDEX; extra]].concat();
    let (loss_b, grad_b) = run(Tensor::cat(vec![base, noise], 0), padded_targets);
    assert!(
        (loss_a[0] - loss_b[0]).abs() < 1e-6,
        "{loss_a:?} vs {loss_b:?}"
    );
    for (a, b) in grad_a.iter().zip(&grad_b[..n * vocab]) {
        assert!((a - b).abs() < 1e-7, "gradient changed: {a} vs {b}");
    }
    assert!(
        grad_b[n * vocab..].iter().all(|&g| g == 0.0),
        "ignored rows got gradient"
    );
}

/// The same through the whole model: a sequence padded with ignored targets gives the same loss
/// and parameter gradients as the sequence alone (causality: earlier logits don't see the pad).
#[test]
fn padding_a_batch_changes_no_parameter_gradient() {
    let _seeded = seeded();
    let device = Device::flex().autodiff();
    let model = GptConfig::new(13)
        .with_block_size(16)
        .with_n_layer(2)
        .with_n_embd(32)
        .init(&device)
        .unwrap();
    let tokens: Vec<i64> = vec![3, 1, 4, 1, 5, 9, 2, 6, 5];
    let run = |inputs: Vec<i64>, targets: Vec<i64>| {
        let len = inputs.len();
        let logits = model
            .forward(ints(&inputs, [1, len], &device), Pass::Train)
            .unwrap();
        let t = Tensor::<1, Int>::from_data(TensorData::new(targets, [len]), &device);
        let loss = cross_entropy(logits.reshape([len, 13]), t).unwrap();
        let grads = loss.backward();
        let wte = values(model.wte.weight.grad(&grads).unwrap());
        let attn = values(model.h[1].attn.c_attn.weight.grad(&grads).unwrap());
        (values(loss)[0], wte, attn)
    };
    let (loss_a, wte_a, attn_a) = run(tokens[..8].to_vec(), tokens[1..].to_vec());
    let padded_inputs = [&tokens[..8], &[0, 0, 0]].concat();
    let padded_targets = [&tokens[1..], &[IGNORE_INDEX; 3]].concat();
    let (loss_b, wte_b, attn_b) = run(padded_inputs, padded_targets);
    assert!((loss_a - loss_b).abs() < 1e-6);
    for (a, b) in wte_a.iter().zip(&wte_b).chain(attn_a.iter().zip(&attn_b)) {
        assert!(
            (a - b).abs() <= 1e-6 + 1e-4 * a.abs(),
            "gradient changed: {a} vs {b}"
        );
    }
}

#[test]
fn all_ignored_is_an_error_not_nan() {
    let _seeded = seeded();
    let device = Device::flex();
    let logits = Tensor::<2>::zeros([3, 4], &device);
    let targets = Tensor::<1, Int>::from_data(TensorData::new(vec![-1i64; 3], [3]), &device);
    assert_eq!(
        cross_entropy(logits.clone(), targets).unwrap_err(),
        LossError::AllTargetsIgnored { ignore_index: -1 }
    );
    let short = Tensor::<1, Int>::from_data(TensorData::new(vec![1i64; 2], [2]), &device);
    assert_eq!(
        cross_entropy(logits, short).unwrap_err(),
        LossError::ShapeMismatch {
            logits: 3,
            targets: 2
        }
    );
    // The hand-written check uses the real log_softmax too: one row, target 0, uniform logits.
    let uniform = values(log_softmax(Tensor::<2>::zeros([1, 4], &device), 1))[0];
    assert!((uniform + 4f32.ln()).abs() < 1e-6);
}

// ---------------------------------------------------------------- training

/// The whole graph trains: one small batch is overfitted below 0.05 within a few hundred steps.
#[test]
fn overfits_one_batch() {
    let _seeded = seeded();
    let device = Device::flex().autodiff();
    let config = GptConfig::new(20)
        .with_block_size(16)
        .with_n_layer(2)
        .with_n_head(2)
        .with_n_embd(48);
    let model = config.init(&device).unwrap();
    let tokens = random_tokens(4, 17, 20, &device);
    let (_, losses) = fit(model, tokens, 3e-3, 400, 0.05);
    println!(
        "overfit: {} steps, loss {:.4} -> {:.4}",
        losses.len(),
        losses[0],
        losses.last().unwrap()
    );
    assert!(
        *losses.last().unwrap() < 0.05,
        "did not overfit: last losses {:?}",
        &losses[losses.len() - 5..]
    );
}

/// The seeds' bare model (no MLP, no LayerNorm) learns too.
#[test]
fn minimal_model_trains() {
    let _seeded = seeded();
    let device = ndarray().autodiff();
    let model = GptConfig::minimal(16).init(&device).unwrap();
    assert!(model.h[0].mlp.is_none() && model.h[0].ln_1.is_none() && model.ln_f.is_none());
    let tokens = random_tokens(4, 17, 16, &device);
    let (_, losses) = fit(model, tokens, 1e-2, 150, 0.0);
    let (first, last) = (losses[0], *losses.last().unwrap());
    println!("minimal: loss {first:.4} -> {last:.4}");
    assert!(
        last < 0.5 * first,
        "minimal model did not learn: {first} -> {last}"
    );
}

// ---------------------------------------------------------------- wgpu

/// The loss at init is the same on wgpu as on flex for the same weights (wgpu on lavapipe in CI).
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn wgpu_matches_flex() {
    let _seeded = seeded();
    let wgpu = common::wgpu_device();
    let flex = Device::flex();
    let model = GptConfig::baby(65).with_n_layer(2).init(&flex).unwrap();
    let tokens = random_tokens(2, 33, 65, &flex);
    let on_flex = values(lm_loss(&model, tokens.clone(), Pass::Infer))[0];
    // Moved, the model is told the GPU's kernels (the fused norms run on wgpu).
    let moved = model
        .to_device(&wgpu)
        .with_kernels(Kernels::for_device(&wgpu));
    let on_wgpu = values(lm_loss(&moved, tokens.to_device(&wgpu), Pass::Infer))[0];
    assert!(
        (on_flex - on_wgpu).abs() < 1e-4,
        "flex {on_flex} vs wgpu {on_wgpu}"
    );
}
