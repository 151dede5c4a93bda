//! The fused CPU step against Burn's autodiff of the same model: loss and every gradient, with
//! and without biases, tied and untied heads, padded batches and several thread counts; and its
//! dropout against finite differences; AdamW on its buffers against Burn's AdamW.

mod common;

use burn::module::{Module, ModuleVisitor, Param, ParamGroup, ParamId};
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::{Device, Int, Tensor, TensorData};
use common::{seeded, sliding};
use tinygpt_model::parts::{Mlp, Norm, Position, ProjInit};
use tinygpt_model::{
    AdamWSettings, FusedCpu, FusedDecoder, FusedError, Gpt, GptConfig, IGNORE_INDEX, LossError,
    ModelError, Pass, TokenBatch, cross_entropy,
};

/// A small deterministic token stream.
fn tokens(len: usize, vocab: usize, salt: u64) -> Vec<i64> {
    (0..len as u64)
        .map(|i| ((i * 2654435761 + salt * 40503) >> 7) as i64 % vocab as i64)
        .collect()
}

fn token_batch<'a>(
    inputs: &'a [i64],
    targets: &'a [i64],
    batch: usize,
    seq: usize,
) -> TokenBatch<'a> {
    TokenBatch {
        inputs,
        targets,
        batch,
        seq,
    }
}

fn model(config: &GptConfig) -> Gpt {
    let device = Device::flex().autodiff();
    common::init(config, &device)
}

/// Burn's loss and gradients for the batch, through `Gpt::forward` and `cross_entropy`.
fn burn_reference(gpt: &Gpt, batch: &TokenBatch<'_>) -> (f64, GradientsParams) {
    let device = gpt.wte.weight.device();
    let inputs = Tensor::<2, Int>::from_data(
        TensorData::new(batch.inputs.to_vec(), [batch.batch, batch.seq]),
        &device,
    );
    let targets = Tensor::<1, Int>::from_data(
        TensorData::new(batch.targets.to_vec(), [batch.batch * batch.seq]),
        &device,
    );
    let logits = gpt.forward(inputs, Pass::Train).unwrap();
    let [b, s, v] = logits.dims();
    let loss = cross_entropy(logits.reshape([b * s, v]), targets).unwrap();
    let value = loss.clone().into_scalar::<f32>() as f64;
    (value, GradientsParams::from_grads(loss.backward(), gpt))
}

/// For every parameter: max |a - b| / max |b|, the worst over the model, and the parameters
/// seen.
fn worst_relative_error(gpt: &Gpt, a: &GradientsParams, b: &GradientsParams) -> (f32, usize) {
    struct Compare<'a>(&'a GradientsParams, &'a GradientsParams, f32, usize);
    impl ModuleVisitor for Compare<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let get = |g: &GradientsParams| {
                g.get::<D>(param.id)
                    .map(|g| g.into_data().try_to_vec::<f32>().unwrap())
            };
            let a = get(self.0).expect("a gradient for every parameter");
            // A parameter the loss does not reach (`ln_2` of a block without an MLP) has no
            // gradient in Burn; the fused engine's must then be zero.
            let b = get(self.1).unwrap_or_else(|| vec![0.0; a.len()]);
            assert_eq!(a.len(), b.len());
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
            let diff = a
                .iter()
                .zip(&b)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            self.2 = self.2.max(diff / scale);
            self.3 += 1;
        }
    }
    let mut visitor = Compare(a, b, 0.0, 0);
    gpt.visit(&mut visitor);
    (visitor.2, visitor.3)
}

fn check_against_burn(config: GptConfig, batch: TokenBatch<'_>, threads: usize) {
    let gpt = model(&config);
    let (want_loss, want) = burn_reference(&gpt, &batch);
    let mut fused = FusedCpu::new(&gpt, threads).unwrap();
    let loss = fused.accumulate(batch, 1.0, None).unwrap();
    let got = fused.take_gradients(&gpt);
    assert!(
        ((loss - want_loss) / want_loss).abs() < 1e-5,
        "loss {loss} vs Burn {want_loss}"
    );
    let (error, params) = worst_relative_error(&gpt, &got, &want);
    assert_eq!(params, gpt.num_params_tensors());
    assert!(error < 1e-4, "worst gradient relative error {error}");
    // Evaluation gives the same loss without touching the gradients.
    assert!((fused.loss(batch).unwrap() - loss).abs() < 1e-9);
}

trait CountTensors {
    fn num_params_tensors(&self) -> usize;
}

impl CountTensors for Gpt {
    fn num_params_tensors(&self) -> usize {
        struct Count(usize);
        impl ModuleVisitor for Count {
            fn visit_float<const D: usize>(&mut self, _: &Param<Tensor<D>>) {
                self.0 += 1;
            }
        }
        let mut count = Count(0);
        self.visit(&mut count);
        count.0
    }
}

#[test]
fn loss_and_gradients_match_burn_autodiff() {
    let _seeded = seeded();
    let (inputs, targets) = (tokens(3 * 16, 13, 1), tokens(3 * 16, 13, 2));
    let batch = token_batch(&inputs, &targets, 3, 16);
    check_against_burn(sliding(), batch, 1);
    // The batch split over threads (3 sequences on 2 threads: 2 + 1).
    check_against_burn(sliding(), batch, 2);
    // No biases, untied head (nanoGPT's shakespeare-char model has no biases).
    check_against_burn(
        sliding().with_bias(false).with_tie_embeddings(false),
        batch,
        3,
    );
    // Another LayerNorm ε: the kernels take the config's.
    check_against_burn(sliding().with_layer_norm_eps(1e-3), batch, 2);
}

/// Every variant of every part on its own (the variants from the types, so a new one is checked
/// here too), then Llama's and nanochat's combinations (the `modern` preset's parts at this
/// size): the fused loss and every gradient equal Burn autodiff's. Output projections keep
/// GPT-2's init here (zero ones would leave most gradients trivially zero); the init computes
/// nothing the engine runs.
#[test]
fn each_newer_part_matches_burn_autodiff() {
    let _seeded = seeded();
    let (inputs, targets) = (tokens(3 * 16, 13, 1), tokens(3 * 16, 13, 2));
    let batch = token_batch(&inputs, &targets, 3, 16);
    let modern = GptConfig::modern(13);
    let each_part = (Norm::all()
        .filter(|&n| n != Norm::default())
        .map(|n| sliding().with_norm(n)))
    .chain(
        Mlp::all()
            .filter(|&m| m != Mlp::default())
            .map(|m| sliding().with_mlp(m)),
    )
    .chain(
        Position::all()
            .filter(|&p| p != Position::default())
            .map(|p| sliding().with_position(p)),
    );
    for config in each_part.chain([
        // A bigram table (rows drawn, not at zero: `common::init`), with learned positions.
        sliding().with_bigram(true),
        // The attention lessons' bare model: no norm, no MLP, one head.
        GptConfig::minimal(13).with_block_size(16).with_n_embd(24),
        // A tight cap, so tanh bends the logits.
        sliding().with_logit_softcap(0.5),
        sliding()
            .with_position(Position::Rope)
            .with_rope_theta(100.0),
        sliding().with_qk_norm(true),
        sliding().with_mlp(Mlp::SwiGlu).with_mlp_hidden(Some(24)),
        // Grouped-query heads (4 over 2) and multi-query heads with rotary positions and
        // QK-norm: each key/value head's gradient gathers its whole group's.
        sliding().with_n_head(4).with_n_kv_head(Some(2)),
        sliding()
            .with_n_kv_head(Some(1))
            .with_position(Position::Rope)
            .with_qk_norm(true),
        // Llama's parts: rotary positions, RMSNorm with gain, SwiGLU, grouped heads, no biases.
        sliding()
            .with_n_head(4)
            .with_n_kv_head(Some(2))
            .with_position(Position::Rope)
            .with_norm(Norm::Rms)
            .with_mlp(Mlp::SwiGlu)
            .with_bias(false),
        sliding()
            .with_position(modern.position)
            .with_norm(modern.norm)
            .with_qk_norm(modern.qk_norm)
            .with_mlp(modern.mlp)
            .with_bias(modern.bias)
            .with_tie_embeddings(modern.tie_embeddings)
            .with_logit_softcap(modern.logit_softcap),
        sliding()
            .with_position(modern.position)
            .with_norm(modern.norm)
            .with_mlp(modern.mlp)
            .with_bigram(true),
    ]) {
        check_against_burn(config, batch, 2);
    }
    // The zero init trains the same kernels: the step's loss is Burn's.
    for init in ProjInit::all().filter(|&i| i != ProjInit::default()) {
        check_against_burn(sliding().with_proj_init(init), batch, 2);
    }
}

/// Burn's record does not hold the config, and the modules' fields are public: a model can come
/// to hold weights of another architecture (here a wider embedding put in its place) while its
/// config says otherwise. The model says so, and the fused engine and its decoder refuse it
/// rather than read its weights by the wrong shapes.
#[test]
fn weights_that_do_not_fit_the_config_are_refused() {
    let _seeded = seeded();
    let model = model(&sliding());
    assert_eq!(model.check_config(), Ok(()));
    let wider = sliding().with_n_embd(48).init(&Device::flex()).unwrap();
    let mut mixed = model.clone();
    mixed.wte = wider.wte.clone();
    let err = mixed.check_config().unwrap_err();
    assert!(
        err.to_string()
            .contains("`wte.weight` is [13, 48], the config says [13, 32]"),
        "{err}"
    );
    assert!(matches!(
        FusedCpu::new(&mixed, 1),
        Err(FusedError::Model(_))
    ));
    assert!(FusedDecoder::new(&mixed).is_err());
    // A head the tied config does not have.
    let untied = sliding()
        .with_tie_embeddings(false)
        .init(&Device::flex())
        .unwrap();
    let mut headed = model;
    headed.lm_head = untied.lm_head.clone();
    let err = headed.check_config().unwrap_err();
    assert!(
        err.to_string().contains("`lm_head.weight` is not in it"),
        "{err}"
    );
}

#[test]
fn shorter_sequences_and_padding_match_burn() {
    let _seeded = seeded();
    // Right-padded documents: padded targets are ignored, and causal attention means no real
    // token looks at the padding.
    let seq = 11;
    let inputs = tokens(2 * seq, 13, 3);
    let mut targets = tokens(2 * seq, 13, 4);
    for t in &mut targets[seq - 4..seq] {
        *t = IGNORE_INDEX;
    }
    let batch = token_batch(&inputs, &targets, 2, seq);
    check_against_burn(sliding(), batch, 2);
}

#[test]
fn long_sequences_span_several_query_blocks() {
    let _seeded = seeded();
    // 150 tokens: query blocks of 64, 64 and 22 rows, each seeing a different number of keys.
    let config = sliding()
        .with_block_size(160)
        .with_n_layer(1)
        .with_dropout(0.0);
    let seq = 150;
    let (inputs, targets) = (tokens(2 * seq, 13, 13), tokens(2 * seq, 13, 14));
    let batch = token_batch(&inputs, &targets, 2, seq);
    check_against_burn(config, batch, 2);
}

/// The attention weights the engine gives for a run's snapshots (`FusedCpu::attention_maps`)
/// are those of Burn's forward on the same weights, every layer and head: the classic parts,
/// grouped heads with rotary positions and QK-norm, and the lessons' bare one-head model.
#[test]
fn attention_maps_are_burns() {
    let _seeded = seeded();
    let prompt: Vec<i64> = tokens(9, 13, 21);
    for config in [
        sliding(),
        sliding()
            .with_n_head(4)
            .with_n_kv_head(Some(2))
            .with_position(Position::Rope)
            .with_rope_theta(100.0)
            .with_qk_norm(true),
        GptConfig::minimal(13).with_block_size(16).with_n_embd(24),
    ] {
        let gpt = model(&config);
        let ids = Tensor::<2, Int>::from_data(
            TensorData::new(prompt.clone(), [1, prompt.len()]),
            &gpt.wte.weight.device(),
        );
        let (_, want) = gpt.forward_with_attention(ids).unwrap();
        let got = FusedCpu::new(&gpt, 2)
            .unwrap()
            .attention_maps(&prompt)
            .unwrap();
        assert_eq!(got.len(), want.len(), "{config:?}");
        for (layer, (got, want)) in got.iter().zip(want).enumerate() {
            let want = want.into_data().try_to_vec::<f32>().unwrap();
            let seq = prompt.len();
            assert_eq!(got.len() * seq * seq, want.len(), "heads of layer {layer}");
            for (g, w) in got.iter().flatten().zip(&want) {
                assert!((g - w).abs() < 1e-5, "layer {layer}: {g} vs Burn's {w}");
            }
        }
    }
    // A prompt the model cannot take is an error, not a panic.
    let mut fused = FusedCpu::new(&model(&sliding()), 1).unwrap();
    assert!(fused.attention_maps(&[]).is_err());
    assert!(fused.attention_maps(&[13]).is_err());
}

/// The head's logits are computed 128 rows at a time (never `[rows, vocab]` whole): one thread's
/// share of 300 rows spans three chunks (128, 128 and 44), ignored targets across a chunk's
/// edge; tied and untied heads, with a soft cap: the loss and every gradient are Burn's.
#[test]
fn the_head_taken_a_chunk_of_rows_at_a_time_matches_burn() {
    let _seeded = seeded();
    let base = sliding()
        .with_block_size(160)
        .with_n_layer(1)
        .with_dropout(0.0);
    let seq = 150;
    let inputs = tokens(2 * seq, 13, 15);
    let mut targets = tokens(2 * seq, 13, 16);
    for t in &mut targets[120..140] {
        *t = IGNORE_INDEX;
    }
    let batch = token_batch(&inputs, &targets, 2, seq);
    for config in [
        base.clone(),
        base.clone().with_tie_embeddings(false),
        base.with_logit_softcap(0.5),
    ] {
        check_against_burn(config, batch, 1);
    }
}

#[test]
fn gradients_accumulate_and_reset() {
    let _seeded = seeded();
    let gpt = model(&sliding());
    let (inputs, targets) = (tokens(2 * 16, 13, 5), tokens(2 * 16, 13, 6));
    let batch = token_batch(&inputs, &targets, 2, 16);
    let mut fused = FusedCpu::new(&gpt, 2).unwrap();
    fused.accumulate(batch, 1.0, None).unwrap();
    let once = fused.take_gradients(&gpt);
    fused.accumulate(batch, 0.25, None).unwrap();
    fused.accumulate(batch, 0.75, None).unwrap();
    let twice = fused.take_gradients(&gpt);
    let (error, _) = worst_relative_error(&gpt, &twice, &once);
    assert!(
        error < 1e-6,
        "0.25 + 0.75 of a gradient differs from it by {error}"
    );
}

/// Loss with dropout on, as a function of every weight scaled by `1 + e` in one parameter.
fn dropout_loss(gpt: &Gpt, batch: TokenBatch<'_>, seed: u64, threads: usize) -> (f64, FusedCpu) {
    let mut fused = FusedCpu::new(gpt, threads).unwrap();
    let loss = fused.accumulate(batch, 1.0, Some(seed)).unwrap();
    (loss, fused)
}

#[test]
fn dropout_is_reproducible_independent_of_threads_and_differentiated_correctly() {
    let _seeded = seeded();
    let config = sliding().with_dropout(0.3).with_n_layer(1);
    let gpt = model(&config);
    let (inputs, targets) = (tokens(4 * 16, 13, 7), tokens(4 * 16, 13, 8));
    let batch = token_batch(&inputs, &targets, 4, 16);
    let (a, mut fused) = dropout_loss(&gpt, batch, 9, 1);
    let (b, _) = dropout_loss(&gpt, batch, 9, 3);
    let (c, _) = dropout_loss(&gpt, batch, 10, 1);
    let no_dropout = FusedCpu::new(&gpt, 1).unwrap().loss(batch).unwrap();
    assert!(
        (a - b).abs() < 1e-6,
        "masks depend on the thread split: {a} vs {b}"
    );
    assert!((a - c).abs() > 1e-4, "another seed gives other masks");
    assert!((a - no_dropout).abs() > 1e-4, "dropout changes the loss");

    // Central differences along the gradient of the position embedding (dropout masks are the
    // same for the same seed, so the loss is a smooth function of the weights).
    let grads = fused.take_gradients(&gpt);
    let g = grads
        .get::<2>(gpt.wpe.as_ref().expect("learned positions").weight.id)
        .unwrap()
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    let norm2: f64 = g.iter().map(|v| (*v as f64).powi(2)).sum();
    let h = 1e-2 / norm2.sqrt();
    let shifted = |sign: f64| {
        let mut moved = gpt.clone();
        let table = moved.wpe.as_mut().expect("learned positions");
        let wpe = table.weight.val();
        let step = Tensor::<2>::from_data(TensorData::new(g.clone(), wpe.dims()), &wpe.device());
        table.weight = Param::initialized(table.weight.id, wpe + step * (sign * h));
        dropout_loss(&moved, batch, 9, 2).0
    };
    let numeric = (shifted(1.0) - shifted(-1.0)) / (2.0 * h);
    // Along the gradient, the directional derivative is |g|².
    let rel = (numeric - norm2).abs() / norm2;
    assert!(rel < 2e-2, "finite difference {numeric} vs |g|² {norm2}");
}

#[test]
fn bad_batches_are_errors() {
    let _seeded = seeded();
    let gpt = model(&sliding());
    let mut fused = FusedCpu::new(&gpt, 2).unwrap();
    let ok = tokens(16, 13, 1);
    let batch =
        |inputs: &'static [i64], targets: &'static [i64], seq| token_batch(inputs, targets, 1, seq);
    let leak = |v: Vec<i64>| -> &'static [i64] { Vec::leak(v) };
    let ok = leak(ok);
    let mut out_of_range = ok.to_vec();
    out_of_range[3] = 13;
    assert_eq!(
        fused.loss(batch(leak(out_of_range), ok, 16)),
        Err(FusedError::Model(ModelError::TokenOutOfRange {
            id: 13,
            vocab_size: 13
        }))
    );
    assert_eq!(
        fused.loss(batch(ok, leak(vec![IGNORE_INDEX; 16]), 16)),
        Err(FusedError::Loss(LossError::AllTargetsIgnored {
            ignore_index: IGNORE_INDEX
        }))
    );
    let long = leak(tokens(17, 13, 1));
    assert!(matches!(
        fused.loss(batch(long, long, 17)),
        Err(FusedError::Model(ModelError::Attention(_)))
    ));
    assert!(matches!(
        fused.loss(batch(ok, &ok[1..], 16)),
        Err(FusedError::BatchShape { .. })
    ));
}

#[test]
fn clipping_scales_to_the_global_norm() {
    let _seeded = seeded();
    let gpt = model(&sliding());
    let (inputs, targets) = (tokens(2 * 16, 13, 11), tokens(2 * 16, 13, 12));
    let batch = token_batch(&inputs, &targets, 2, 16);
    let (_, want) = burn_reference(&gpt, &batch);
    struct SquaredNorm<'a>(&'a GradientsParams, f64);
    impl ModuleVisitor for SquaredNorm<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let g = self.0.get::<D>(param.id).unwrap();
            let values = g.into_data().try_to_vec::<f32>().unwrap();
            self.1 += values.iter().map(|v| (*v as f64).powi(2)).sum::<f64>();
        }
    }
    let norm_of = |grads: &GradientsParams| {
        let mut visitor = SquaredNorm(grads, 0.0);
        gpt.visit(&mut visitor);
        visitor.1.sqrt()
    };
    let want_norm = norm_of(&want);
    let mut fused = FusedCpu::new(&gpt, 2).unwrap();
    fused.accumulate(batch, 1.0, None).unwrap();
    let norm = fused.clip_grad_norm(want_norm / 4.0);
    assert!(
        (norm - want_norm).abs() / want_norm < 1e-5,
        "{norm} vs {want_norm}"
    );
    let clipped = norm_of(&fused.take_gradients(&gpt));
    assert!((clipped - want_norm / 4.0).abs() / clipped < 1e-5);
    // Under the limit nothing changes.
    fused.accumulate(batch, 1.0, None).unwrap();
    fused.clip_grad_norm(want_norm * 2.0);
    let unclipped = norm_of(&fused.take_gradients(&gpt));
    assert!((unclipped - want_norm).abs() / want_norm < 1e-5);
}

/// Every parameter's values, keyed by id.
fn values_by_id(gpt: &Gpt) -> Vec<(ParamId, Vec<f32>)> {
    struct Values(Vec<(ParamId, Vec<f32>)>);
    impl ModuleVisitor for Values {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let values = param.val().into_data().try_to_vec::<f32>().unwrap();
            self.0.push((param.id, values));
        }
    }
    let mut visitor = Values(Vec::new());
    gpt.visit(&mut visitor);
    visitor.0
}

/// Panics unless `a` and `b` hold the same parameters with equal values, naming the first
/// difference.
fn assert_same_weights(a: &Gpt, b: &Gpt, context: &str) {
    let (a, b) = (values_by_id(a), values_by_id(b));
    assert_eq!(a.len(), b.len());
    for ((id_a, a), (id_b, b)) in a.iter().zip(&b) {
        assert_eq!(id_a, id_b);
        if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
            panic!(
                "{context}: parameter {id_a} differs at {i}: {} vs {}",
                a[i], b[i]
            );
        }
    }
}

/// AdamW on the fused buffers against Burn's `AdamW` with the same two groups (decay on the
/// matrices only), step after step on the same gradients: the weights are equal bit for bit, and
/// a state handed to a fresh `FusedCpu` continues the same way.
#[test]
fn adamw_on_the_buffers_equals_burns_adamw() {
    let _seeded = seeded();
    let gpt = model(&sliding().with_tie_embeddings(false));
    let decayed = gpt.decayed_param_ids();
    let settings = AdamWSettings {
        beta_1: 0.9,
        beta_2: 0.95,
        epsilon: 1e-8,
        weight_decay: 0.1,
        decayed: decayed.clone(),
        lr_ratios: Default::default(),
    };
    let adamw = |weight_decay: f32| {
        AdamWConfig::new()
            .with_beta_1(0.9)
            .with_beta_2(0.95)
            .with_epsilon(1e-8)
            .with_weight_decay(weight_decay)
    };
    let mut all = Vec::new();
    gpt.visit(&mut Ids(&mut all));
    let undecayed: Vec<ParamId> = all.into_iter().filter(|id| !decayed.contains(id)).collect();
    let mut burn_optim =
        adamw(0.1)
            .init()
            .with_group(ParamGroup::from_ids(undecayed), adamw(0.0).build(), None);

    let mut owner = FusedCpu::new(&gpt, 2).unwrap();
    let mut helper = FusedCpu::new(&gpt, 2).unwrap();
    let mut burn_model = gpt.clone();
    for step in 0..4u64 {
        let (inputs, targets) = (tokens(3 * 16, 13, 20 + step), tokens(3 * 16, 13, 40 + step));
        let batch = token_batch(&inputs, &targets, 3, 16);
        let lr = 1e-2 / (step + 1) as f64;
        owner.accumulate(batch, 1.0, None).unwrap();
        owner.adamw_step(lr, &settings);
        helper.read_weights(&burn_model);
        helper.accumulate(batch, 1.0, None).unwrap();
        let grads = helper.take_gradients(&burn_model);
        burn_model = burn_optim.step(lr, burn_model, grads);
        assert_same_weights(
            &owner.write_weights(gpt.clone()),
            &burn_model,
            &format!("step {step}"),
        );
    }
    let state = owner.adamw_state();
    assert_eq!(state.len(), gpt.num_params_tensors());
    assert!(state.iter().all(|s| s.time == 4));

    // Resuming: the written weights and the exported state in a new FusedCpu.
    let written = owner.write_weights(gpt.clone());
    let mut resumed = FusedCpu::new(&written, 2).unwrap();
    resumed.load_adamw_state(state.clone()).unwrap();
    let (inputs, targets) = (tokens(2 * 16, 13, 99), tokens(2 * 16, 13, 98));
    let batch = token_batch(&inputs, &targets, 2, 16);
    for fused in [&mut owner, &mut resumed] {
        fused.accumulate(batch, 1.0, None).unwrap();
        fused.adamw_step(1e-3, &settings);
    }
    assert_same_weights(
        &owner.write_weights(gpt.clone()),
        &resumed.write_weights(gpt.clone()),
        "resumed",
    );

    // A state for another model is refused, and leaves nothing half-loaded: the state held
    // before is the state held after, and the next step is the owner's still.
    let before = resumed.adamw_state();
    let mut other = state;
    other.pop();
    assert!(matches!(
        resumed.load_adamw_state(other),
        Err(FusedError::OptimizerState(_))
    ));
    assert!(
        resumed.adamw_state() == before,
        "a refused state changed what was held"
    );
    for fused in [&mut owner, &mut resumed] {
        fused.accumulate(batch, 1.0, None).unwrap();
        fused.adamw_step(1e-3, &settings);
    }
    assert_same_weights(
        &owner.write_weights(gpt.clone()),
        &resumed.write_weights(gpt),
        "a step after the refused state",
    );
}

struct Ids<'a>(&'a mut Vec<ParamId>);
impl ModuleVisitor for Ids<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.push(param.id);
    }
}
