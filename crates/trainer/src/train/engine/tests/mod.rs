use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Device, Tensor};
use tinygpt_model::MomentState;

use super::*;
use crate::backend::Memory;
use crate::bench::{VOCAB, random_tokens};
use crate::config::RunConfig;
use crate::config::presets::ConfigSource;
use crate::train::optim::{Optimizer, moments_from_burn, optimizer};
use crate::train::session::train_step;

fn config() -> RunConfig {
    config_with_layers(2)
}

/// [`config`] with `n_layer` blocks.
fn config_with_layers(n_layer: usize) -> RunConfig {
    let n_layer = format!("model.n_layer={n_layer}");
    let overrides = [
        n_layer.as_str(),
        "model.n_head=2",
        "model.n_embd=16",
        "model.block_size=8",
        "train.batch_size=3",
        "train.grad_accum=2",
        "train.warmup_iters=2",
    ];
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    ConfigSource::Preset("baby").load(&overrides).unwrap()
}

/// A model of `config`'s shape on flex, under autodiff. Burn draws weights at their first use:
/// here, under the random streams' lock, so that they never interleave with another test's
/// draws (a Burn step's dropout masks, drawn under it).
fn model(config: &RunConfig) -> Gpt {
    let device = Device::flex().autodiff();
    let _streams = tinygpt_model::seeded(&device, 0);
    let gpt = config.gpt(VOCAB).init(&device).unwrap();
    tinygpt_model::ParamLayout::of(&gpt).flatten(&gpt);
    gpt
}

/// An engine on flex for `model` as the CPU trains (Burn's AdamW, outcomes read at once),
/// or as a GPU does (`device_like`: [`DeviceAdamW`], outcomes left on the device).
/// The engine `placement` decides for `optimizer`'s rule in `dtype`, opened, with the note of
/// the decision: what set-up does in two steps.
fn open_for(
    placement: &Placement,
    model: Gpt,
    optimizer: Optimizer,
    threads: usize,
    dtype: TrainDType,
) -> Result<(Box<dyn Engine>, Option<String>)> {
    let (kind, note) = placement.engine_for(dtype, optimizer.rule.update_kind())?;
    let settings = Settings {
        threads,
        dtype,
        checkpointing: false,
    };
    let engine = open(placement, kind, model, optimizer, settings, None)?;
    Ok((engine, note))
}

fn engine(config: &RunConfig, model: Gpt, device_like: bool) -> Box<dyn Engine> {
    engine_in(config, model, device_like, TrainDType::F32)
}

/// [`engine`] with its steps in `dtype`.
fn engine_in(
    config: &RunConfig,
    model: Gpt,
    device_like: bool,
    dtype: TrainDType,
) -> Box<dyn Engine> {
    let placement = Placement {
        device: Device::flex(),
        device_name: "flex",
        engine: if device_like {
            EngineKind::Device
        } else {
            EngineKind::Autodiff
        },
        strict: false,
        memory: if device_like {
            Memory::Unreported
        } else {
            Memory::Host
        },
        note: None,
        switches: Default::default(),
    };
    let optim = Optimizer::for_run(config, &model, optimizer(config, &model));
    open_for(&placement, model, optim, 1, dtype).unwrap().0
}

fn weights(engine: &mut dyn Engine) -> Vec<Vec<f32>> {
    let model = engine.model().unwrap().valid();
    let mut all = Vec::new();
    struct Collect<'a>(&'a mut Vec<Vec<f32>>);
    impl ModuleVisitor for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0
                .push(param.val().into_data().try_to_vec::<f32>().unwrap());
        }
    }
    model.visit(&mut Collect(&mut all));
    all
}

/// AdamW's state as the engine checkpoints it, read back.
fn saved_moments(config: &RunConfig, engine: &mut dyn Engine) -> Vec<MomentState> {
    let bytes = engine.optimizer_bytes().unwrap();
    let template = optimizer(config, engine.model().unwrap());
    let loaded = template
        .from_bytes(burn::tensor::Bytes::from_bytes_vec(bytes))
        .unwrap();
    moments_from_burn(&loaded).unwrap()
}

fn max_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn the_device_engine_trains_as_burns_adamw_and_reads_outcomes_only_when_asked() {
    let config = config();
    let data = random_tokens(&config);
    let model = model(&config);
    let (mut cpu, mut gpu) = (
        engine(&config, model.clone(), false),
        engine(&config, model, true),
    );
    assert!(
        gpu.describe().contains("AdamW on the device"),
        "{}",
        gpu.describe()
    );
    let mut cpu_steps = Vec::new();
    for step in 0..6 {
        train_step(cpu.as_mut(), &data, &config, step).unwrap();
        train_step(gpu.as_mut(), &data, &config, step).unwrap();
        cpu_steps.extend(cpu.outcomes(false).unwrap());
        assert_eq!(
            cpu_steps.len(),
            step + 1,
            "the CPU's outcome is known at once"
        );
        assert!(
            gpu.outcomes(false).unwrap().is_empty(),
            "read before it was asked for"
        );
    }
    let gpu_steps = gpu.outcomes(true).unwrap();
    assert_eq!(gpu_steps.len(), 6);
    assert!(
        gpu.outcomes(true).unwrap().is_empty(),
        "each outcome is handed out once"
    );
    for (c, g) in cpu_steps.iter().zip(&gpu_steps) {
        assert!(c.applied && g.applied);
        assert!((c.loss - g.loss).abs() < 1e-5, "{c:?} vs {g:?}");
        assert!((c.grad_norm - g.grad_norm).abs() < 1e-4, "{c:?} vs {g:?}");
    }
    let difference = max_difference(&weights(cpu.as_mut()), &weights(gpu.as_mut()));
    assert!(difference < 2e-6, "weights differ by {difference}");
    // Both checkpoint Burn's optimizer record, with the same step counts and moments.
    let (want, got) = (
        saved_moments(&config, cpu.as_mut()),
        saved_moments(&config, gpu.as_mut()),
    );
    assert_eq!(want.len(), got.len());
    for (w, g) in want.iter().zip(&got) {
        assert_eq!((w.id, w.time, &w.shape), (g.id, g.time, &g.shape));
        assert_eq!(w.time, 6);
        let difference = max_difference(
            &[w.moment_1.clone(), w.moment_2.clone()],
            &[g.moment_1.clone(), g.moment_2.clone()],
        );
        assert!(
            difference < 1e-6,
            "moments of {:?} differ by {difference}",
            w.id
        );
    }
}

/// On a GPU (lavapipe in CI) the device engine's flat AdamW is the fused kernel, with the
/// fused LayerNorm and loss: it trains as Burn's ops and Burn's AdamW do on flex. With 2
/// blocks the gradients fit one `cat`'s bindings; with 6 they are gathered in groups, and at
/// 64 wide there are more than 2^18 of them, past which Burn's own whole-tensor sum stops
/// counting on wgpu (the gradient norm must still be the CPU's).
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn the_fused_kernels_on_a_gpu_train_as_burns_ops_on_the_cpu() {
    for (n_layer, n_embd) in [(2, 16), (6, 64)] {
        fused_kernels_train_as_burns_ops(n_layer, n_embd);
    }
}

fn fused_kernels_train_as_burns_ops(n_layer: usize, n_embd: usize) {
    let gpu = crate::backend::Backend::Wgpu
        .placement()
        .expect("NO WGPU ADAPTER FOUND: install mesa-vulkan-drivers for lavapipe");
    let mut config = config_with_layers(n_layer);
    config.model.n_embd = n_embd;
    let data = random_tokens(&config);
    let model = model(&config);
    let on_gpu = config
        .gpt(VOCAB)
        .init(&gpu.device.clone().autodiff())
        .unwrap()
        .load_record(model.clone().into_record());
    let mut cpu = engine(&config, model, false);
    let optim = Optimizer::for_run(&config, &on_gpu, optimizer(&config, &on_gpu));
    let (mut gpu, _) = open_for(&gpu, on_gpu, optim, 1, TrainDType::F32).unwrap();
    assert_eq!(gpu.kind(), EngineKind::Device);
    for step in 0..4 {
        train_step(cpu.as_mut(), &data, &config, step).unwrap();
        train_step(gpu.as_mut(), &data, &config, step).unwrap();
    }
    let (want, got) = (cpu.outcomes(true).unwrap(), gpu.outcomes(true).unwrap());
    for (c, g) in want.iter().zip(&got) {
        assert!(
            (c.loss - g.loss).abs() < 1e-4,
            "{n_layer} blocks: {c:?} vs {g:?}"
        );
        assert!(
            (c.grad_norm - g.grad_norm).abs() < 1e-3 * c.grad_norm,
            "{n_layer} blocks: {c:?} vs {g:?}"
        );
    }
    // AdamW's first steps move a weight by about the learning rate whatever its gradient's
    // size, so a gradient within rounding of zero moves its weight either way on the two
    // devices: a few weights in 10^3 may differ by up to that much; all the others agree. A
    // wrong gradient moves whole tensors apart.
    let (want, got) = (weights(cpu.as_mut()), weights(gpu.as_mut()));
    let difference = max_difference(&want, &got);
    let (total, apart) = want
        .iter()
        .flatten()
        .zip(got.iter().flatten())
        .fold((0, 0), |(n, far), (a, b)| {
            (n + 1, far + usize::from((a - b).abs() > 1e-5))
        });
    assert!(
        difference < 1e-3 && apart * 1_000 <= total,
        "{n_layer} blocks, {n_embd} wide: weights differ by up to {difference}, \
         {apart} of {total} by more than 1e-5"
    );
    let (want, got) = (
        saved_moments(&config, cpu.as_mut()),
        saved_moments(&config, gpu.as_mut()),
    );
    assert_eq!(want.len(), got.len());
    for (w, g) in want.iter().zip(&got) {
        assert_eq!((w.id, w.time), (g.id, g.time));
    }
}

#[test]
fn mixed_precision_steps_see_the_f32_loss_and_update_f32_weights() {
    let config = config();
    let data = random_tokens(&config);
    let model = model(&config);
    let mut outcomes = Vec::new();
    for (dtype, device_like) in [
        (TrainDType::F32, false),
        (TrainDType::Bf16, false),
        (TrainDType::F16, false),
        (TrainDType::Bf16, true),
        (TrainDType::F16, true),
    ] {
        let mut engine = engine_in(&config, model.clone(), device_like, dtype);
        for step in 0..3 {
            train_step(engine.as_mut(), &data, &config, step).unwrap();
        }
        let steps = engine.outcomes(true).unwrap();
        assert_eq!(steps.len(), 3);
        assert!(steps.iter().all(|s| s.applied), "{dtype:?}: {steps:?}");
        // The master weights stay f32 (what checkpoints save), and they moved.
        let trained = engine.model().unwrap().valid();
        assert_eq!(trained.wte.weight.dtype(), burn::tensor::DType::F32);
        assert_eq!(
            trained.h[0].attn.c_attn.weight.dtype(),
            burn::tensor::DType::F32
        );
        outcomes.push((dtype, steps, weights(engine.as_mut())));
    }
    let (_, f32_steps, f32_weights) = &outcomes[0];
    for (dtype, steps, weights) in &outcomes[1..] {
        // Step 0: the same weights and batch, the matmuls in 8 (bf16) or 11 (f16) bits.
        let difference = (steps[0].loss - f32_steps[0].loss).abs();
        assert!(
            difference < 1e-2,
            "{dtype:?}: step-0 loss off by {difference}"
        );
        // The f16 loss scale is divided out again: norms as f32's, to the dtype's digits.
        let ratio = steps[0].grad_norm / f32_steps[0].grad_norm;
        assert!((ratio - 1.0).abs() < 0.05, "{dtype:?}: norm ratio {ratio}");
        let moved = max_difference(weights, f32_weights);
        assert!(
            moved > 0.0 && moved < 1e-2,
            "{dtype:?}: weights off by {moved}"
        );
    }
}

#[test]
fn a_non_finite_step_on_the_device_changes_no_weight_and_no_moment() {
    let mut config = config();
    let data = random_tokens(&config);
    let mut gpu = engine(&config, model(&config), true);
    train_step(gpu.as_mut(), &data, &config, 0).unwrap();
    // An absurd learning rate: the update is finite and applied, and blows the weights up
    // so that every later step's loss is not finite.
    config.train.learning_rate = 1e30;
    config.train.warmup_iters = 0;
    train_step(gpu.as_mut(), &data, &config, 1).unwrap();
    let blown = gpu.outcomes(true).unwrap();
    assert!(blown.iter().all(|s| s.applied), "{blown:?}");
    let weights_before = weights(gpu.as_mut());
    let moments_before = saved_moments(&config, gpu.as_mut());
    for step in 2..5 {
        train_step(gpu.as_mut(), &data, &config, step).unwrap();
    }
    let skipped = gpu.outcomes(true).unwrap();
    assert_eq!(skipped.len(), 3);
    assert!(skipped.iter().all(|s| !s.applied), "{skipped:?}");
    let bits = |w: Vec<Vec<f32>>| -> Vec<u32> { w.iter().flatten().map(|x| x.to_bits()).collect() };
    assert!(
        bits(weights(gpu.as_mut())) == bits(weights_before),
        "a skipped step changed a weight"
    );
    let moments_after = saved_moments(&config, gpu.as_mut());
    assert_eq!(moments_after.len(), moments_before.len());
    for (after, before) in moments_after.iter().zip(&moments_before) {
        assert_eq!((after.id, after.time), (before.id, before.time));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(&after.moment_1) == bits(&before.moment_1),
            "moment 1 changed"
        );
        assert!(
            bits(&after.moment_2) == bits(&before.moment_2),
            "moment 2 changed"
        );
    }
}

/// A small model trained with Muon (momentum warm-up over 4 steps), with `more` settings.
fn muon_config(more: &[&str]) -> RunConfig {
    let base = [
        "model.n_layer=2",
        "model.n_head=2",
        "model.n_embd=16",
        "model.block_size=8",
        "train.batch_size=3",
        "train.warmup_iters=2",
        "train.optimizer=\"muon\"",
        "train.muon_momentum_warmup=4",
    ];
    let overrides: Vec<String> = base.iter().chain(more).map(|s| s.to_string()).collect();
    ConfigSource::Preset("baby").load(&overrides).unwrap()
}

/// `optimizer = "muon"`: the blocks' four matrices per layer get Muon's state (a momentum
/// buffer and a step count), everything else AdamW's; a run stopped and resumed from the
/// checkpointed state follows the uninterrupted one bit for bit (the momentum warm-up reads the
/// saved step count); the weights move otherwise than under AdamW; a GPU placement trains it
/// through Burn's optimizer (the host engine).
#[test]
fn muon_updates_the_blocks_matrices_and_resumes_exactly() {
    let config = muon_config(&[]);
    let data = random_tokens(&config);
    let model = model(&config);
    let mut whole = engine(&config, model.clone(), false);
    for step in 0..6 {
        train_step(whole.as_mut(), &data, &config, step).unwrap();
    }
    let mut first = engine(&config, model.clone(), false);
    for step in 0..3 {
        train_step(first.as_mut(), &data, &config, step).unwrap();
    }
    let bytes = first.optimizer_bytes().unwrap();
    let reader =
        burn_pack::Reader::from_bytes(burn::tensor::Bytes::from_bytes_vec(bytes.clone())).unwrap();
    let steps: Vec<u64> = reader
        .scalars()
        .iter()
        .filter(|(name, _)| name.ends_with(".step"))
        .map(|(_, value)| match value {
            burn_pack::Scalar::UInt(n) => *n,
            other => panic!("{other:?}"),
        })
        .collect();
    let names: Vec<String> = reader
        .into_tensors()
        .unwrap()
        .into_iter()
        .map(|t| t.into_parts().unwrap().0)
        .collect();
    let count = |leaf: &str| names.iter().filter(|n| n.ends_with(leaf)).count();
    assert_eq!(count(".velocity"), 4 * 2, "{names:?}");
    assert_eq!(steps, vec![3; 8]);
    let params = crate::run::weights::param_ids(&model).len();
    assert_eq!(count(".moment_1"), params - 8, "{names:?}");
    // Resume: the weights after three steps and the saved state, three more steps.
    let held = first.model().unwrap().clone();
    let loaded = crate::train::optim::load_optimizer(&config, &held, bytes).unwrap();
    let placement = Placement {
        device: Device::flex(),
        device_name: "flex",
        engine: EngineKind::Autodiff,
        strict: false,
        memory: Memory::Host,
        note: None,
        switches: Default::default(),
    };
    let optim = Optimizer::for_run(&config, &held, loaded);
    let mut resumed = open_for(&placement, held, optim, 1, TrainDType::F32)
        .unwrap()
        .0;
    for step in 3..6 {
        train_step(resumed.as_mut(), &data, &config, step).unwrap();
    }
    assert_eq!(weights(resumed.as_mut()), weights(whole.as_mut()));
    // Not AdamW in disguise.
    let mut adamw_config = config.clone();
    adamw_config.train.optimizer = crate::config::OptimizerKind::AdamW;
    let mut adamw = engine(&adamw_config, model.clone(), false);
    for step in 0..6 {
        train_step(adamw.as_mut(), &data, &adamw_config, step).unwrap();
    }
    assert!(max_difference(&weights(adamw.as_mut()), &weights(whole.as_mut())) > 1e-3);
    // A GPU placement (the device engine) hands Muon to Burn's optimizer, and says so.
    let device_like = Placement {
        engine: EngineKind::Device,
        memory: Memory::Unreported,
        ..placement
    };
    let optim = Optimizer::for_run(&config, &model, optimizer(&config, &model));
    let (engine, note) = open_for(&device_like, model, optim, 1, TrainDType::F32).unwrap();
    assert_eq!(engine.kind(), EngineKind::Autodiff);
    assert!(note.is_some_and(|n| n.contains("Muon")));
}

/// The fused engine's Muon (Newton–Schulz on its own matmuls) is Burn's optimizer's: the same
/// update to 1e-5 of its size on a wide, a square and a tall matrix, the same momentum and step
/// counts in the checkpointed record; and a fused run resumed from that record continues bit
/// for bit.
#[test]
fn the_fused_engines_muon_equals_burns_and_resumes_exactly() {
    let config = muon_config(&["train.muon_weight_decay=0.1"]);
    let data = random_tokens(&config);
    let model = model(&config);
    let fused_engine = |model: Gpt, optim: burn::optim::ModuleOptimizer| {
        let placement = Placement {
            device: Device::flex(),
            device_name: "flex",
            engine: EngineKind::Fused,
            strict: true,
            memory: Memory::Host,
            note: None,
            switches: Default::default(),
        };
        let optim = Optimizer::for_run(&config, &model, optim);
        open_for(&placement, model, optim, 2, TrainDType::F32)
            .unwrap()
            .0
    };
    let start = weights(engine(&config, model.clone(), false).as_mut());
    // Which of `weights`' entries (the model's order) are Muon's matrices.
    let ids = crate::train::optim::muon_ids(&model);
    let mut muon = Vec::new();
    struct Mark<'a>(&'a [burn::module::ParamId], &'a mut Vec<bool>);
    impl ModuleVisitor for Mark<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.1.push(self.0.contains(&param.id));
        }
    }
    model.visit(&mut Mark(&ids, &mut muon));
    assert_eq!(muon.iter().filter(|&&m| m).count(), 4 * 2);
    let (mut burn, mut fused) = (
        engine(&config, model.clone(), false),
        fused_engine(model.clone(), optimizer(&config, &model)),
    );
    assert_eq!(fused.kind(), EngineKind::Fused);
    for step in 0..6 {
        train_step(burn.as_mut(), &data, &config, step).unwrap();
        train_step(fused.as_mut(), &data, &config, step).unwrap();
        if step == 0 {
            // One update: Muon's, matrix by matrix, to 2e-5 of its size; AdamW's as the AdamW
            // tests hold it (near-zero gradients make its first step sign-like). Newton-Schulz's
            // five products summed in two orders (the engine's own matmuls, flex's gemm over its
            // threads) once differed by 1.05e-5 of the update in CI: rounding, not the formula,
            // which a wrong step would miss by the update's whole size.
            let (b, f) = (weights(burn.as_mut()), weights(fused.as_mut()));
            for (((b, f), w), &muon) in b.iter().zip(&f).zip(&start).zip(&muon) {
                let size = b
                    .iter()
                    .zip(w)
                    .map(|(b, w)| (b - w).abs())
                    .fold(0.0, f32::max);
                let diff = max_difference(std::slice::from_ref(b), std::slice::from_ref(f));
                let bound = if muon { 2e-5 * size } else { 2e-6 };
                assert!(
                    diff <= bound,
                    "update differs by {diff} of {size} (Muon: {muon})"
                );
            }
        }
    }
    let difference = max_difference(&weights(burn.as_mut()), &weights(fused.as_mut()));
    assert!(
        difference < 1e-5,
        "weights differ by {difference} after 6 steps"
    );
    let states = |engine: &mut dyn Engine| {
        let bytes = engine.optimizer_bytes().unwrap();
        let loaded = crate::train::optim::load_optimizer(&config, engine.model().unwrap(), bytes);
        crate::train::optim::states_from_burn(&loaded.unwrap()).unwrap()
    };
    let (want, got) = (states(burn.as_mut()), states(fused.as_mut()));
    assert_eq!(
        (want.muon.len(), want.adamw.len()),
        (got.muon.len(), got.adamw.len())
    );
    assert_eq!(want.muon.len(), 4 * 2);
    for (w, g) in want.muon.iter().zip(&got.muon) {
        assert_eq!((w.id, w.step, &w.shape), (g.id, g.step, &g.shape));
        assert_eq!(w.step, 6);
        let diff = max_difference(
            std::slice::from_ref(&w.velocity),
            std::slice::from_ref(&g.velocity),
        );
        assert!(diff < 1e-5, "velocity of {:?} differs by {diff}", w.id);
    }
    // Resume: three steps, the checkpointed record, three more.
    let mut first = fused_engine(model.clone(), optimizer(&config, &model));
    for step in 0..3 {
        train_step(first.as_mut(), &data, &config, step).unwrap();
    }
    let bytes = first.optimizer_bytes().unwrap();
    let held = first.model().unwrap().clone();
    let loaded = crate::train::optim::load_optimizer(&config, &held, bytes).unwrap();
    let mut resumed = fused_engine(held, loaded);
    for step in 3..6 {
        train_step(resumed.as_mut(), &data, &config, step).unwrap();
    }
    let mut whole = fused_engine(model.clone(), optimizer(&config, &model));
    for step in 0..6 {
        train_step(whole.as_mut(), &data, &config, step).unwrap();
    }
    assert_eq!(weights(resumed.as_mut()), weights(whole.as_mut()));
}

mod groups;
mod memory;
