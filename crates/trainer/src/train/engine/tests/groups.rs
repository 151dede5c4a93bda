//! Learning-rate groups (`train.embedding_lr_ratio`, `train.head_lr_ratio`) on every engine.

use super::*;

/// A small untied model with a bigram table, its embeddings at ten times the schedule's rate
/// and its head at half, or every parameter at the schedule's (`ratios` false).
fn grouped_config(ratios: bool) -> RunConfig {
    let mut overrides = vec![
        "model.n_layer=2",
        "model.n_head=2",
        "model.n_embd=16",
        "model.block_size=8",
        "model.tie_embeddings=false",
        "model.bigram=true",
        "train.batch_size=3",
        "train.warmup_iters=2",
    ];
    if ratios {
        overrides.extend(["train.embedding_lr_ratio=10", "train.head_lr_ratio=0.5"]);
    }
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    ConfigSource::Preset("modern").load(&overrides).unwrap()
}

/// Burn's optimizer (a group per rate) and the fused engine's AdamW (each slot's rate) train
/// alike, both otherwise than with one rate for all; a run resumed from the checkpointed state
/// continues bit for bit; and a GPU placement hands the groups to Burn's optimizer, saying so.
#[test]
fn learning_rate_groups_train_alike_on_every_engine() {
    let (config, plain) = (grouped_config(true), grouped_config(false));
    let data = random_tokens(&config);
    let model = model(&config);
    let fused = |config: &RunConfig, model: Gpt, optim| {
        let placement = Placement {
            engine: EngineKind::Fused,
            strict: true,
            ..Placement::cpu()
        };
        let optim = Optimizer::for_run(config, &model, optim);
        open_for(&placement, model, optim, 2, TrainDType::F32)
            .unwrap()
            .0
    };
    let trained = |mut engine: Box<dyn Engine>, config: &RunConfig, steps| {
        for step in steps {
            train_step(engine.as_mut(), &data, config, step).unwrap();
        }
        engine
    };
    let mut burn = trained(engine(&config, model.clone(), false), &config, 0..5);
    let optim = optimizer(&config, &model);
    let mut fused_run = trained(fused(&config, model.clone(), optim), &config, 0..5);
    assert_eq!(fused_run.kind(), EngineKind::Fused);
    let (b, f) = (weights(burn.as_mut()), weights(fused_run.as_mut()));
    let difference = max_difference(&b, &f);
    assert!(difference < 1e-5, "the engines differ by {difference}");
    for mut other in [
        trained(engine(&plain, model.clone(), false), &plain, 0..5),
        trained(
            fused(&plain, model.clone(), optimizer(&plain, &model)),
            &plain,
            0..5,
        ),
    ] {
        let moved = max_difference(&weights(other.as_mut()), &b);
        assert!(moved > 1e-3, "one rate for all trained the same ({moved})");
    }
    // Resume the fused run from its checkpointed state (Burn's record, groups and all).
    let mut first = trained(
        fused(&config, model.clone(), optimizer(&config, &model)),
        &config,
        0..3,
    );
    let bytes = first.optimizer_bytes().unwrap();
    let held = first.model().unwrap().clone();
    let loaded = crate::train::optim::load_optimizer(&config, &held, bytes).unwrap();
    let mut resumed = trained(fused(&config, held, loaded), &config, 3..5);
    assert_eq!(weights(resumed.as_mut()), f);
    // On a GPU placement: Burn's optimizer on the device.
    let device_like = Placement {
        engine: EngineKind::Device,
        memory: Memory::Unreported,
        ..Placement::cpu()
    };
    let optim = Optimizer::for_run(&config, &model, optimizer(&config, &model));
    let (engine, note) = open_for(&device_like, model, optim, 1, TrainDType::F32).unwrap();
    assert_eq!(engine.kind(), EngineKind::Autodiff);
    assert!(note.is_some_and(|n| n.contains("lr_ratio")));
}
