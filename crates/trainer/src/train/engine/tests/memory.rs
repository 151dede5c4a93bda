//! Activation checkpointing (`train.checkpointing`) on every engine: the same training.

use super::*;

/// `config`'s engine of `kind` (Burn's autodiff, Burn's autodiff with the device's AdamW, or
/// the fused one) on flex, with checkpointing or not.
fn checkpointed(
    config: &RunConfig,
    model: Gpt,
    kind: EngineKind,
    checkpointing: bool,
) -> Box<dyn Engine> {
    let placement = Placement {
        engine: kind,
        strict: true,
        ..Placement::cpu()
    };
    let optim = Optimizer::for_run(config, &model, optimizer(config, &model));
    let settings = Settings {
        threads: 2,
        dtype: TrainDType::F32,
        checkpointing,
    };
    open(&placement, kind, model, optim, settings, None).unwrap()
}

/// Five steps of `config` (with dropout, two micro-batches a step) on each engine train the
/// same weights with checkpointing as without: bit for bit on the fused engine, which
/// recomputes the same arithmetic; within rounding on Burn's, whose recomputed graph may
/// order its sums otherwise.
#[test]
fn checkpointing_trains_the_same_on_every_engine() {
    let mut config = config_with_layers(3);
    config.model.dropout = 0.1;
    let data = random_tokens(&config);
    let model = model(&config);
    for kind in [EngineKind::Fused, EngineKind::Autodiff, EngineKind::Device] {
        let trained = |checkpointing| {
            let mut engine = checkpointed(&config, model.clone(), kind, checkpointing);
            if kind != EngineKind::Fused {
                let device = engine.model().unwrap().wte.weight.device();
                let strategy = device.gradient_checkpointing_strategy();
                let balanced = burn::tensor::GradientCheckpointingStrategy::Balanced;
                assert_eq!(strategy == Some(balanced), checkpointing, "{kind:?}");
            }
            for step in 0..5 {
                train_step(engine.as_mut(), &data, &config, step).unwrap();
            }
            let mut rng = crate::data::step_rng(7, 0, 0);
            let batch = data.sample(&data.val, 3, &mut rng);
            let losses = engine.losses(&[batch]).unwrap();
            (weights(engine.as_mut()), losses)
        };
        let ((plain, plain_loss), (held, held_loss)) = (trained(false), trained(true));
        let moved = max_difference(
            &plain,
            &weights(&mut *engine(&config, model.clone(), false)),
        );
        assert!(moved > 1e-4, "{kind:?} did not train ({moved})");
        match kind {
            EngineKind::Fused => {
                assert_eq!(held, plain, "the fused engine");
                assert_eq!(held_loss, plain_loss);
            }
            _ => {
                let difference = max_difference(&held, &plain);
                assert!(difference < 1e-5, "{kind:?} differs by {difference}");
            }
        }
    }
}

/// The fused engine's state written a tensor at a time (a checkpoint's `optimizer.bpk`) is the
/// bytes it serialises whole, before any step, after AdamW's and after Muon's; and training
/// goes on once the writer is dropped.
#[test]
fn the_state_written_a_tensor_at_a_time_is_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("optimizer.bpk");
    for config in [config(), muon_config(&[])] {
        let data = random_tokens(&config);
        let mut engine = checkpointed(&config, model(&config), EngineKind::Fused, false);
        for step in 0..3 {
            // The writer borrows the engine: it is gone before the engine is read again.
            let write = engine.saving().unwrap().optimizer;
            write(&path).unwrap();
            let written = std::fs::read(&path).unwrap();
            assert_eq!(written, engine.optimizer_bytes().unwrap(), "step {step}");
            train_step(engine.as_mut(), &data, &config, step).unwrap();
        }
        // What was written loads into Burn's optimizer.
        let held = engine.model().unwrap().clone();
        let bytes = std::fs::read(&path).unwrap();
        crate::train::optim::load_optimizer(&config, &held, bytes).unwrap();
    }
}
