//! LoRA on the fused CPU engine against Burn's autodiff of the same model with Burn's own
//! adapters (`Module::apply_lora`): the loss and every adapter factor's gradient, for every
//! config of `configs()`, each matrix adapted alone and all together, on one and two threads;
//! the frozen base gets no gradient and AdamW moves only the factors; a merged model computes
//! what the adapted one does.

mod common;

use burn::module::{Module, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use common::lora::{adapted, batch, burn_loss, check, values};
use common::{configs, seeded};
use tinygpt_model::parts::Position;
use tinygpt_model::{
    AdamWSettings, FusedCpu, Gpt, GptConfig, GptConfigError, LoraConfig, LoraTarget, LrRatios,
    ParamLayout, TokenBatch, names::Slot, names::TrainedPart,
};

/// Every config, every matrix alone and all together: the adapters' gradients are Burn's.
#[test]
fn adapter_gradients_match_burn_autodiff() {
    let _seeded = seeded();
    for config in configs() {
        let mut alone: Vec<Vec<LoraTarget>> = LoraTarget::all()
            .filter(|t| t.shape(&config).is_some())
            .map(|t| vec![t])
            .collect();
        alone.push(LoraTarget::all().collect::<Vec<_>>());
        for targets in alone {
            let targets: Vec<LoraTarget> = targets
                .into_iter()
                .filter(|t| t.shape(&config).is_some())
                .collect();
            let lora = LoraConfig {
                rank: 3,
                alpha: Some(5.0),
                dropout: 0.0,
                targets: Some(targets.clone()),
                base: Default::default(),
                also_train: Vec::new(),
            };
            let gpt = adapted(&config, &lora);
            let factors = 2 * targets.len() * config.n_layer;
            assert_eq!(check(&gpt, 1), factors, "{config:?} {targets:?}");
            assert_eq!(check(&gpt, 2), factors, "{config:?} {targets:?}");
        }
    }
}

/// The parts of the base trained beside the adapters (`also_train`: the embedding, the head,
/// both; tied and untied heads, learned positions and a bigram table among the configs) get
/// Burn's gradients on the fused engine, and the rest of the base none.
#[test]
fn parts_trained_beside_adapters_match_burn_autodiff() {
    let _seeded = seeded();
    let parts = [
        vec![TrainedPart::Embedding],
        vec![TrainedPart::Head],
        vec![TrainedPart::Embedding, TrainedPart::Head],
    ];
    for config in configs() {
        for also_train in parts.clone() {
            let lora = LoraConfig {
                also_train: also_train.clone(),
                ..LoraConfig::new(2)
            };
            let gpt = adapted(&config, &lora);
            let factors = 2 * lora.targets(&config).len() * config.n_layer;
            let layout = ParamLayout::of(&gpt);
            let trained = layout
                .entries()
                .iter()
                .filter(|e| !matches!(e.slot, Slot::Adapter { .. }) && layout.trains(e));
            let slots: Vec<Slot> = trained.map(|e| e.slot).collect();
            let mut embedding = vec![Slot::TokenEmbedding];
            if config.position == Position::Learned {
                embedding.push(Slot::PositionEmbedding);
            }
            if config.bigram {
                embedding.push(Slot::BigramEmbedding);
            }
            let head = match config.tie_embeddings {
                true => vec![Slot::TokenEmbedding],
                false => vec![Slot::LmHead],
            };
            let want = match &also_train[..] {
                [TrainedPart::Embedding] => embedding,
                [TrainedPart::Head] => head,
                _ => {
                    let mut both = embedding;
                    both.extend(head.into_iter().filter(|s| *s == Slot::LmHead));
                    both
                }
            };
            assert_eq!(slots, want, "{config:?} {also_train:?}");
            for threads in [1, 2] {
                let compared = check(&gpt, threads);
                assert_eq!(compared, factors + slots.len(), "{config:?} {also_train:?}");
            }
        }
    }
}

/// AdamW on the fused engine moves the factors and nothing else; merged, the model gives the
/// adapted model's loss.
#[test]
fn adamw_moves_only_the_adapters_and_merging_keeps_the_model() {
    let _seeded = seeded();
    let config = configs().remove(0);
    let gpt = adapted(&config, &LoraConfig::new(2));
    let (inputs, targets) = batch(config.vocab_size);
    let tokens = TokenBatch {
        inputs: &inputs,
        targets: &targets,
        batch: 3,
        seq: 12,
    };
    let mut fused = FusedCpu::new(&gpt, 2).unwrap();
    let settings = AdamWSettings {
        beta_1: 0.9,
        beta_2: 0.95,
        epsilon: 1e-8,
        weight_decay: 0.1,
        decayed: ParamLayout::of(&gpt)
            .entries()
            .iter()
            .map(|e| e.id)
            .collect(),
        lr_ratios: LrRatios::default(),
    };
    let before = ParamLayout::of(&gpt).flatten(&gpt);
    let first = fused.accumulate(tokens, 1.0, None).unwrap();
    fused.adamw_step(1e-5, &settings);
    let stepped = fused.write_weights(gpt.clone());
    let after = ParamLayout::of(&stepped).flatten(&stepped);
    let layout = ParamLayout::of(&stepped);
    let (before, after) = (
        before.into_data().try_to_vec::<f32>().unwrap(),
        after.into_data().try_to_vec::<f32>().unwrap(),
    );
    for entry in layout.entries() {
        let moved = before[entry.range()] != after[entry.range()];
        let adapter = matches!(entry.slot, Slot::Adapter { .. });
        assert_eq!(moved, adapter, "{:?}", entry.slot);
    }
    // The state lists the factors only.
    let state = fused.adamw_state();
    assert_eq!(
        state.len(),
        layout.entries().iter().filter(|e| layout.trains(e)).count()
    );
    let second = fused.loss(tokens).unwrap();
    assert!(second < first, "{second} after a step from {first}");
    let merged = stepped.merge_lora();
    assert_eq!(merged.lora_scale(), None);
    assert!(!ParamLayout::of(&merged).adapted());
    let mut plain = FusedCpu::new(&merged, 1).unwrap();
    let merged_loss = plain.loss(tokens).unwrap();
    assert!(
        (merged_loss - second).abs() < 1e-5,
        "{merged_loss} vs {second}"
    );
}

/// What no model could train is refused in one line: rank 0 or above a matrix's side, an
/// MLP target without an MLP, a target or a part to train twice, adapters on adapters.
#[test]
fn impossible_adapters_are_refused() {
    let config = configs().remove(0);
    let lora = |rank: usize, targets: Vec<LoraTarget>| LoraConfig {
        rank,
        alpha: None,
        dropout: 0.0,
        targets: Some(targets),
        base: Default::default(),
        also_train: Vec::new(),
    };
    let refused = |lora: LoraConfig, config: &GptConfig| {
        let gpt = config.init(&Device::flex()).unwrap();
        match gpt.with_lora(&lora) {
            Err(GptConfigError::Lora(why)) => why,
            other => panic!("{lora:?} was not refused: {:?}", other.map(|_| ())),
        }
    };
    let all: Vec<LoraTarget> = LoraTarget::all().collect();
    assert!(refused(lora(0, all.clone()), &config).contains("at least 1"));
    let wide = config.n_embd + 1;
    assert!(refused(lora(wide, all.clone()), &config).contains("larger than"));
    assert!(refused(lora(2, vec![]), &config).contains("empty"));
    let twice = vec![LoraTarget::Qkv, LoraTarget::Qkv];
    assert!(refused(lora(2, twice), &config).contains("twice"));
    let minimal = GptConfig::minimal(13);
    assert!(refused(lora(2, vec![LoraTarget::Fc]), &minimal).contains("no MLP"));
    let bad_alpha = LoraConfig {
        alpha: Some(-1.0),
        ..LoraConfig::new(2)
    };
    assert!(refused(bad_alpha, &config).contains("positive"));
    let head_twice = LoraConfig {
        also_train: vec![TrainedPart::Head, TrainedPart::Head],
        ..LoraConfig::new(2)
    };
    assert!(refused(head_twice, &config).contains("`also_train` names `head` twice"));
    let once = config
        .init(&Device::flex())
        .unwrap()
        .with_lora(&LoraConfig::new(2))
        .unwrap();
    assert!(once.with_lora(&LoraConfig::new(2)).is_err());
}

/// `[lora] dropout`: the adapters' inputs are dropped out while training, with masks from the
/// step's seed alone.
mod dropout {
    use super::*;

    fn tokens_of(inputs: &[i64], targets: &[i64]) -> TokenBatch<'static> {
        TokenBatch {
            inputs: Vec::leak(inputs.to_vec()),
            targets: Vec::leak(targets.to_vec()),
            batch: 3,
            seq: 12,
        }
    }

    /// `config`'s model with adapters of rank 3 dropping `p` of their inputs, B drawn or not.
    fn dropping(config: &GptConfig, p: f64, drawn: bool) -> Gpt {
        let lora = LoraConfig {
            dropout: p,
            ..LoraConfig::new(3)
        };
        match drawn {
            true => adapted(config, &lora),
            false => common::init(config, &Device::flex().autodiff())
                .with_lora(&lora)
                .unwrap(),
        }
    }

    fn loss(gpt: &Gpt, tokens: TokenBatch<'_>, seed: Option<u64>, threads: usize) -> f64 {
        let mut fused = FusedCpu::new(gpt, threads).unwrap();
        fused.accumulate(tokens, 1.0, seed).unwrap()
    }

    /// Only the low-rank path is dropped out: with `B = 0` it adds nothing, so the loss is
    /// the base's bit for bit whatever the masks; with `B` drawn the masks change the loss,
    /// the same on any thread count, another with another seed, none in evaluation.
    #[test]
    fn only_the_adapters_inputs_are_dropped() {
        let _seeded = seeded();
        for config in [common::small(), common::modern_parts()] {
            let (inputs, targets) = batch(config.vocab_size);
            let tokens = tokens_of(&inputs, &targets);
            let fresh = dropping(&config, 0.3, false);
            let base = loss(&fresh, tokens, None, 1);
            assert_eq!(loss(&fresh, tokens, Some(9), 1).to_bits(), base.to_bits());
            let gpt = dropping(&config, 0.3, true);
            let plain = loss(&gpt, tokens, None, 1);
            let (a, b) = (
                loss(&gpt, tokens, Some(9), 1),
                loss(&gpt, tokens, Some(9), 3),
            );
            // The threads' losses are summed in another order, the masks are the same.
            assert!(
                (a - b).abs() < 1e-6,
                "masks depend on the split: {a} vs {b}"
            );
            assert!(
                (a - loss(&gpt, tokens, Some(10), 1)).abs() > 1e-6,
                "{config:?}"
            );
            assert!((a - plain).abs() > 1e-6, "dropout changes the loss");
            let eval = FusedCpu::new(&gpt, 1).unwrap().loss(tokens).unwrap();
            assert_eq!(eval.to_bits(), plain.to_bits(), "no dropout in evaluation");
        }
    }

    /// `gpt` with every parameter that has a gradient in `grads` moved by `h` times it.
    fn moved(gpt: &Gpt, grads: &GradientsParams, h: f64) -> Gpt {
        struct Move<'a>(&'a GradientsParams, f64);
        impl ModuleMapper for Move<'_> {
            fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
                let Some(g) = self.0.get::<D>(param.id) else {
                    return param;
                };
                let (id, tensor, mapper) = param.consume();
                let value = (tensor + g.mul_scalar(self.1)).detach().require_grad();
                Param::from_mapped_value(id, value, mapper)
            }
        }
        gpt.clone().map(&mut Move(grads, h))
    }

    /// With the masks fixed by the seed the loss is a smooth function of the factors: its
    /// derivative along the fused gradient is the gradient's squared norm.
    #[test]
    fn the_gradient_through_the_masks_is_the_losss() {
        let _seeded = seeded();
        for config in [common::small(), common::modern_parts()] {
            let gpt = dropping(&config, 0.3, true);
            let (inputs, targets) = batch(config.vocab_size);
            let tokens = tokens_of(&inputs, &targets);
            let mut fused = FusedCpu::new(&gpt, 2).unwrap();
            fused.accumulate(tokens, 1.0, Some(9)).unwrap();
            let grads = fused.take_gradients(&gpt);
            let layout = ParamLayout::of(&gpt);
            let norm2: f64 = layout
                .entries()
                .iter()
                .filter_map(|e| values::<2>(&grads, e.id))
                .flatten()
                .map(|v| (v as f64).powi(2))
                .sum();
            assert!(norm2 > 0.0);
            let h = 1e-3 / norm2.sqrt();
            let at = |h: f64| loss(&moved(&gpt, &grads, h), tokens, Some(9), 3);
            let numeric = (at(h) - at(-h)) / (2.0 * h);
            let rel = (numeric - norm2).abs() / norm2;
            assert!(rel < 2e-3, "{config:?}: {numeric} vs |g|² {norm2}");
        }
    }

    /// Checkpointing recomputes each block with the same masks: the same gradients, bit for bit.
    #[test]
    fn checkpointing_redraws_the_adapters_masks() {
        let _seeded = seeded();
        let config = common::modern_parts().with_dropout(0.1);
        let gpt = dropping(&config, 0.2, true);
        let (inputs, targets) = batch(config.vocab_size);
        let tokens = tokens_of(&inputs, &targets);
        let layout = ParamLayout::of(&gpt);
        let run = |checkpointing: bool, threads: usize| {
            let mut fused = FusedCpu::new(&gpt, threads).unwrap();
            fused.set_checkpointing(checkpointing);
            let loss = fused.accumulate(tokens, 1.0, Some(4)).unwrap();
            let grads = fused.take_gradients(&gpt);
            let flat: Vec<u32> = layout
                .entries()
                .iter()
                .filter_map(|e| values::<2>(&grads, e.id))
                .flatten()
                .map(f32::to_bits)
                .collect();
            (loss.to_bits(), flat)
        };
        for threads in [1, 3] {
            assert_eq!(run(true, threads), run(false, threads), "{threads} threads");
        }
    }

    /// Burn's forward drops the adapters' inputs too, in every adapted layer, on a training
    /// pass: with `B = 0` the loss is the base's whatever the masks; with `B` drawn, two
    /// training forwards differ, merged (or on an inference pass, or off the autodiff device)
    /// they do not.
    #[test]
    fn burns_forward_drops_the_adapters_inputs() {
        let _seeded = seeded();
        let config = common::modern_parts();
        let (inputs, targets) = batch(config.vocab_size);
        let tokens = tokens_of(&inputs, &targets);
        let burn_loss = |gpt: &Gpt| burn_loss(gpt, &tokens);
        let training = |gpt: &Gpt| common::lora::burn_training_loss(gpt, &tokens);
        let fresh = dropping(&config, 0.3, false);
        let base = fresh.clone().merge_lora();
        assert!((training(&fresh) - training(&base)).abs() < 1e-6);
        let gpt = dropping(&config, 0.3, true);
        assert_ne!(training(&gpt), training(&gpt), "the masks are drawn afresh");
        assert_eq!(
            burn_loss(&gpt),
            burn_loss(&gpt),
            "an inference pass drops nothing"
        );
        let merged = gpt.clone().merge_lora();
        assert_eq!(merged.lora_dropout(), 0.0);
        assert_eq!(training(&merged), training(&merged));
        assert!((burn_loss(&gpt) - burn_loss(&merged)).abs() < 1e-5);
        let eval = gpt.valid();
        assert_eq!(burn_loss(&eval), burn_loss(&eval));
        assert!((burn_loss(&eval) - burn_loss(&merged)).abs() < 1e-5);
    }
}
