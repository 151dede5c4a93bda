//! Memory a run needs, estimated from its config before anything is allocated, and memory the
//! machine has available: a run that cannot fit is refused up front instead of dying in the
//! allocator half-way through its set-up.

use anyhow::{Result, bail};
use tinygpt_model::parts::Mlp;
use tinygpt_model::{FusedCpu, GptConfig, LoraConfig, names::parameter_table};

use crate::backend::EngineKind;
use crate::config::RunConfig;

/// Bytes of one f32.
const F32: u64 = 4;

/// Estimated bytes a training run holds at its peak, by kind. Measured against the fused CPU
/// engine's peak RSS at SmolLM2-135M's shape over a run with its checkpoints
/// (docs/interop.md, 2026-12-02 evening): within 2% under for full, checkpointed and LoRA
/// fine-tuning at 1 × 1024 and 4 × 1024.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The weights, every copy held at once (the fused engine: its buffers, and between
    /// steps Burn's model in place of the gradients; Burn's autodiff: the model and the
    /// serialised copy).
    pub weights: u64,
    /// AdamW's two moments (the fused engine: its own, serialised a tensor at a time).
    pub optimizer: u64,
    /// Gradients (the fused engine: the step's sum and one per thread at work but the first
    /// without accumulation; Burn's autodiff: the micro-batch's and the accumulated ones).
    pub gradients: u64,
    /// Activations saved for the backward pass, for `batch_size × block_size` tokens.
    pub activations: u64,
    /// The program itself, its tokenizer and data, the allocator's slack, and what writing a
    /// checkpoint copies on its way.
    pub overhead: u64,
}

/// How a model is trained, for [`Estimate::for_model`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Work<'a> {
    /// Sequences per micro-batch.
    pub batch_size: usize,
    /// Micro-batches per step.
    pub grad_accum: usize,
    /// The fused engine's threads.
    pub threads: usize,
    /// Activation checkpointing (`train.checkpointing`).
    pub checkpointing: bool,
    /// With LoRA (`[lora]`): the adapters, the only parameters trained with the parts of the
    /// base `also_train` names (the rest of the base is frozen: no gradients, no optimizer
    /// state).
    pub lora: Option<&'a LoraConfig>,
    /// Whether each evaluation samples from the model (`train.sample_tokens` > 0): the fused
    /// engine then decodes from the weights it holds, with a copy of a quantised base's
    /// blocks of 32 in the decoder's layout and a KV cache.
    pub samples: bool,
}

/// What a run holds besides the model's own buffers (measured: ~100 MiB for the baby model).
const OVERHEAD: u64 = 100 << 20;

impl Estimate {
    /// For training `config` with a vocabulary of `vocab_size` on `engine`.
    pub fn training(config: &RunConfig, vocab_size: usize, engine: EngineKind) -> Self {
        let gpt = config.gpt(vocab_size);
        let t = &config.train;
        let work = Work {
            batch_size: t.batch_size,
            grad_accum: t.grad_accum,
            threads: config.workers(),
            checkpointing: t.checkpointing,
            lora: config.lora.as_ref(),
            samples: t.sample_tokens > 0,
        };
        Self::for_model(&gpt, work, engine)
    }

    /// For training a model of `gpt`'s shape as `work` says on `engine`.
    pub(crate) fn for_model(gpt: &GptConfig, work: Work, engine: EngineKind) -> Self {
        let Work {
            batch_size,
            grad_accum,
            threads,
            checkpointing,
            lora,
            samples,
        } = work;
        let params = gpt.num_params();
        let adapters = lora.map(|lora| lora.num_params(gpt));
        let base_trained = lora.map_or(0, |lora| lora.base_params_trained(gpt));
        let trained = adapters.map_or(params, |adapters| adapters + base_trained);
        let tokens = (batch_size as u64).saturating_mul(gpt.block_size as u64);
        // The fused engine splits a batch's sequences among its threads, each with its own
        // gradient buffer, but the first thread's share goes straight into the step's sum
        // while it is zero: without accumulation, the first needs none of its own.
        let working = threads.clamp(1, batch_size.max(1)) as u64;
        let own = working - u64::from(grad_accum <= 1);
        // The activations and scratch, then copies of the parameters held as weights,
        // optimizer state and gradients.
        let (activations, weights, optimizer, gradients) = match engine {
            // The engine's own buffers, sized as it sizes them; the weights and moments once
            // (the model's copy is written in only between steps, in place of the gradients'
            // buffer; a frozen base, LoRA's, is moved into it, not copied; the moments are
            // serialised a tensor at a time).
            EngineKind::Fused => {
                let shape = (batch_size, gpt.block_size);
                let bytes = FusedCpu::workspace_bytes_for(gpt, lora, shape, threads, checkpointing);
                (bytes, 1, 2, 1 + own)
            }
            // Burn's graph keeps more intermediates than the fused engine's hand-picked set
            // (scores before and after masking and softmax, GELU's inputs): about twice as
            // many; its balanced checkpointing keeps the matmuls' outputs, most of what a
            // block saves, so it is counted as without.
            EngineKind::Autodiff | EngineKind::Device => {
                let per_token = 2 * activation_floats_per_token(gpt);
                (
                    tokens.saturating_mul(per_token).saturating_mul(F32),
                    2,
                    2,
                    2,
                )
            }
        };
        let copies = |n: u64| params.saturating_mul(n * F32);
        let trained_copies = |n: u64| trained.saturating_mul(n * F32);
        let estimate = Self {
            // The adapters' own factors beside the base.
            weights: copies(weights).saturating_add(adapters.unwrap_or(0) * F32),
            optimizer: trained_copies(optimizer),
            gradients: trained_copies(gradients),
            activations,
            overhead: OVERHEAD.saturating_add(checkpoint_copies(gpt, adapters.is_some())),
        };
        match engine {
            EngineKind::Fused => {
                let sample = samples.then(|| FusedCpu::sample_bytes_for(gpt, lora));
                estimate.with_int8_base(FusedCpu::weight_bytes_for(gpt, lora), sample)
            }
            EngineKind::Autodiff | EngineKind::Device => estimate,
        }
    }

    /// The fused engine's peak when it holds its weights in `held` bytes: less than in f32
    /// with a `q8_0` or `q4_k` base (`[lora] base`). A step holds the base in its blocks
    /// beside the activations; a checkpoint writes the adapters alone and a snapshot's
    /// attention maps come from the engine, so that is the peak, unless a `sample` at each
    /// evaluation takes more: its decoder's bytes, in the room of the activations it frees.
    fn with_int8_base(self, held: u64, sample: Option<u64>) -> Self {
        if held >= self.weights {
            return self;
        }
        let step = Self {
            weights: held,
            overhead: OVERHEAD,
            ..self
        };
        let Some(decoder) = sample else {
            return step;
        };
        let sampling = Self {
            activations: decoder,
            ..step
        };
        match step.total() >= sampling.total() {
            true => step,
            false => sampling,
        }
    }

    pub fn total(&self) -> u64 {
        [
            self.weights,
            self.optimizer,
            self.gradients,
            self.activations,
            self.overhead,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    /// One line: the total and its parts.
    pub fn describe(&self) -> String {
        format!(
            "{} (weights {}, AdamW {}, gradients {}, activations {}, other {})",
            human(self.total()),
            human(self.weights),
            human(self.optimizer),
            human(self.gradients),
            human(self.activations),
            human(self.overhead)
        )
    }

    /// Refuses the run when it cannot fit in the `available` bytes of `memory` ("memory", "GPU
    /// memory"); `None` (the amount cannot be known) checks nothing.
    pub(crate) fn check_fits(&self, available: Option<u64>, memory: &str) -> Result<()> {
        let Some(available) = available else {
            return Ok(());
        };
        if self.total() > available {
            bail!(
                "this run needs about {} of {memory} but {} is available: make the model \
                 (model.n_embd, model.n_layer, model.block_size) or train.batch_size smaller \
                 (nothing was written)",
                self.describe(),
                human(available)
            );
        }
        Ok(())
    }
}

/// Bytes a checkpoint's write holds above the step's peak, measured at SmolLM2-135M's shape
/// (docs/interop.md): the weights go to Burn's model a tensor at a time, each copied on its
/// way, and a trained one once more as it is written: about one copy of the largest tensor
/// with LoRA (+0.11 GiB, its embedding 0.105 GiB), two in full (+0.2 GiB).
fn checkpoint_copies(gpt: &GptConfig, lora: bool) -> u64 {
    let largest = parameter_table(gpt)
        .iter()
        .filter(|p| p.present)
        .map(|p| p.slot.shape(gpt).iter().map(|&n| n as u64).product::<u64>())
        .max()
        .unwrap_or(0);
    largest
        .saturating_mul(F32)
        .saturating_mul(if lora { 1 } else { 2 })
}

/// Floats per token Burn's backward pass needs, roughly: per block, the LayerNorm outputs, q/k/v, the attention weights
/// of its row, the heads' output, the residual and the MLP's two `mlp_width` activations (with
/// dropout, its masks too); the residual stream between blocks; then the logits and their
/// gradient.
fn activation_floats_per_token(gpt: &GptConfig) -> u64 {
    let (c, heads, t) = (gpt.n_embd as u64, gpt.n_head as u64, gpt.block_size as u64);
    let dropout = u64::from(gpt.dropout > 0.0);
    let hidden = gpt.mlp_width() as u64;
    let mlp = match gpt.mlp {
        Mlp::Gelu | Mlp::GeluTanh | Mlp::Relu2 => 2 * hidden,
        // The gate and up halves, and their product.
        Mlp::SwiGlu => 3 * hidden,
        Mlp::None => 0,
    };
    // q/k/v (narrower keys and values with grouped heads), the two norms' outputs, the heads'
    // output and the residual.
    let attention = (gpt.qkv_width() as u64).saturating_add(4 * c);
    let block = attention
        .saturating_add(mlp)
        .saturating_add(heads.saturating_mul(t) * (1 + dropout));
    let block = block.saturating_add(dropout * (c + mlp / 2));
    // Each block's input and the last one's output.
    let stream = (gpt.n_layer as u64 + 1).saturating_mul(c);
    (gpt.n_layer as u64)
        .saturating_mul(block)
        .saturating_add(stream)
        .saturating_add(2 * c + 2 * gpt.vocab_size as u64)
}

/// `bytes` as KiB, MiB, GiB or TiB with three significant digits.
pub fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ if value >= 100.0 => format!("{value:.0} {}", units[unit]),
        _ if value >= 10.0 => format!("{value:.1} {}", units[unit]),
        _ => format!("{value:.2} {}", units[unit]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::host::available_bytes;
    use crate::config::RunConfig;
    use crate::config::presets::ConfigSource;

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.50 KiB");
        assert_eq!(human(48 * 1024 * 1024 * 1024), "48.0 GiB");
        assert_eq!(human(u64::MAX), "16384 PiB");
    }

    #[test]
    fn the_estimate_grows_with_the_model_and_the_batch() {
        let config = ConfigSource::Preset("baby").load(&[]).unwrap();
        let small = Estimate::training(&config, 65, EngineKind::Fused);
        let params = config.gpt(65).num_params();
        assert_eq!(small.weights, 4 * params);
        // The step's sum, and one gradient buffer per thread at work but the first without
        // accumulation.
        let gradients = |batch_size: usize, grad_accum: usize, threads: usize| {
            let work = Work {
                batch_size,
                grad_accum,
                threads,
                checkpointing: false,
                lora: None,
                samples: true,
            };
            Estimate::for_model(&config.gpt(65), work, EngineKind::Fused).gradients / (4 * params)
        };
        assert_eq!((gradients(12, 1, 1), gradients(12, 1, 2)), (1, 2));
        assert_eq!((gradients(12, 2, 1), gradients(12, 2, 2)), (2, 3));
        assert_eq!(gradients(1, 1, 4), 1);
        // Checkpointing holds one block's activations, not four.
        let held = ConfigSource::Preset("baby")
            .load(&["train.checkpointing=true".into()])
            .unwrap();
        let held = Estimate::training(&held, 65, EngineKind::Fused);
        assert!(
            held.activations * 2 < small.activations,
            "{held:?} {small:?}"
        );
        assert_eq!(held.weights, small.weights);
        let bigger_batch = ConfigSource::Preset("baby")
            .load(&["train.batch_size=24".into()])
            .unwrap();
        let big = Estimate::training(&bigger_batch, 65, EngineKind::Fused);
        // Twice the tokens; each thread's attention maps stay one sequence's.
        assert!(
            big.activations <= 2 * small.activations,
            "{big:?} {small:?}"
        );
        assert!(
            big.activations * 10 > 19 * small.activations,
            "{big:?} {small:?}"
        );
        assert_eq!(big.weights, small.weights);
        assert!(Estimate::training(&config, 65, EngineKind::Autodiff).total() > small.total());
        // LoRA: gradients and moments of the adapters alone, the base held once.
        let lora = ConfigSource::Preset("baby")
            .load(&["lora.rank=4".into()])
            .unwrap();
        let adapters = lora.lora.as_ref().unwrap().num_params(&lora.gpt(65));
        let lora = Estimate::training(&lora, 65, EngineKind::Fused);
        assert_eq!(lora.optimizer, 2 * 4 * adapters);
        assert_eq!(
            lora.gradients / (4 * adapters),
            small.gradients / (4 * params)
        );
        assert_eq!(lora.weights, small.weights + 4 * adapters);
        assert!(lora.total() < small.total(), "{lora:?} {small:?}");
        // Parts trained beside them (`also_train`): their gradients and moments too.
        let parts = ConfigSource::Preset("baby")
            .load(&[
                "lora.rank=4".into(),
                "lora.also_train=[\"embedding\"]".into(),
            ])
            .unwrap();
        let gpt = parts.gpt(65);
        let embedding = (gpt.vocab_size + gpt.block_size) * gpt.n_embd;
        assert_eq!(
            parts.lora.as_ref().unwrap().base_params_trained(&gpt),
            embedding as u64
        );
        let parts = Estimate::training(&parts, 65, EngineKind::Fused);
        assert_eq!(parts.optimizer, 2 * 4 * (adapters + embedding as u64));
        assert_eq!(parts.weights, lora.weights);
    }

    /// With a `q8_0` base the larger of the fused engine's two peaks: a step's (the base in
    /// int8, beside the activations) or a sample's (the base in int8, beside the decoder's copy
    /// of it and its cache, the activations freed); Burn's engines hold it in f32 throughout.
    #[test]
    fn an_int8_base_is_counted_at_the_larger_of_its_two_peaks() {
        let load = |batch: usize, base: &str, sample_tokens: usize| {
            let sets = [
                "model.n_embd=256".to_string(),
                "model.n_head=4".into(),
                "lora.rank=4".into(),
                format!("lora.base=\"{base}\""),
                format!("train.batch_size={batch}"),
                format!("train.sample_tokens={sample_tokens}"),
            ];
            ConfigSource::Preset("baby").load(&sets).unwrap()
        };
        let fused = |config: &RunConfig| Estimate::training(config, 65, EngineKind::Fused);
        for batch in [1, 64] {
            let (int8, f32) = (load(batch, "q8_0", 100), load(batch, "f32", 100));
            let (held, plain) = (fused(&int8), fused(&f32));
            assert!(held.total() < plain.total(), "{held:?} {plain:?}");
            let gpt = int8.gpt(65);
            let bytes = FusedCpu::weight_bytes_for(&gpt, int8.lora.as_ref());
            assert!(bytes * 2 < plain.weights, "{bytes} of {plain:?}");
            assert_eq!(held.weights, bytes);
            let step = fused(&load(batch, "q8_0", 0));
            let sample = FusedCpu::sample_bytes_for(&gpt, int8.lora.as_ref());
            assert!(sample > 0);
            assert_eq!(held.activations, step.activations.max(sample));
            if batch == 64 {
                // The activations, and one block's base dequantised per thread.
                assert!(step.activations > plain.activations, "{step:?} {plain:?}");
            }
            let burn = |config: &RunConfig| Estimate::training(config, 65, EngineKind::Autodiff);
            assert_eq!(burn(&int8), burn(&f32));
        }
    }

    #[test]
    fn a_model_beyond_any_machine_is_refused_with_its_size() {
        let config = ConfigSource::Preset("baby")
            .load(&["model.n_embd=65536".into(), "model.n_head=1".into()])
            .unwrap();
        let estimate = Estimate::training(&config, 65, EngineKind::Fused);
        assert!(estimate.total() > 500 << 30, "{}", estimate.describe());
        if available_bytes().is_some() {
            let err = estimate
                .check_fits(available_bytes(), "memory")
                .unwrap_err()
                .to_string();
            assert!(err.contains("this run needs about"), "{err}");
            assert!(err.contains(" of memory but "), "{err}");
            assert!(err.contains("is available"), "{err}");
        }
    }
}
