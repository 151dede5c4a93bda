//! [`FusedEngine`]: hand-written forward, backward, AdamW and Muon on the CPU ([`FusedCpu`]),
//! the batch split over threads.

use std::path::Path;

use anyhow::{Context, Result};
use tinygpt_model::{BaseWeights, FusedCpu, Gpt, TokenBatch};

use super::{Engine, LOST, OptimizerWriter, Step};
use crate::backend::EngineKind;
use crate::data::{Batch, mix};
use crate::train::optim::{Optimizer, States, UpdateRule, muon_ids, states_from_burn};
use crate::train::state_pack::{self, states_pack};

/// The weights and the optimizer's state live in [`FusedCpu`]'s buffers between steps; the
/// [`Gpt`] is brought up to date only when asked for (checkpoints, sampling), and the
/// optimizer's state is serialised from the buffers, so a step copies nothing to or from Burn
/// and no Burn record of the state is held.
pub(super) struct FusedEngine {
    fused: Box<FusedCpu>,
    rule: UpdateRule,
    /// `None` only while it is being brought up to date.
    model: Option<Gpt>,
    /// Whether the buffers hold weights that `model` does not have yet.
    stale: bool,
    threads: usize,
    /// Outcomes of steps taken, not yet handed out.
    known: Vec<Step>,
}

impl FusedEngine {
    pub fn new(
        model: Gpt,
        optimizer: Optimizer,
        threads: usize,
        checkpointing: bool,
    ) -> Result<Self> {
        // The weights move into the buffers; the model keeps none (written in when asked).
        let muon = muon_ids(&model);
        let (mut fused, model) = FusedCpu::taking(model, threads)?;
        fused.set_checkpointing(checkpointing);
        match &optimizer.rule {
            UpdateRule::AdamW(_) => {}
            UpdateRule::Muon(..) => fused.use_muon(&muon)?,
        }
        // Read into the buffers, then dropped: a resumed run's record is not held twice.
        let states = states_from_burn(&optimizer.burn)?;
        fused
            .load_adamw_state(states.adamw)
            .and_then(|()| fused.load_muon_state(states.muon))
            .context("optimizer state")?;
        Ok(Self {
            fused: Box::new(fused),
            rule: optimizer.rule,
            model: Some(model),
            // The hollow model has no weights: the buffers' must be written in when asked.
            stale: true,
            threads,
            known: Vec::new(),
        })
    }

    /// Writes the buffers' weights into the model, having freed the gradients' buffer (there
    /// are none between steps) so that the model's copy takes its place; a frozen base
    /// (LoRA's) is moved in, not copied.
    fn sync(&mut self) -> Result<()> {
        self.fused.release_gradients();
        if self.stale {
            if self.int8_base() {
                // The base goes out in f32, four times its int8 bytes: in the room the
                // step's buffers held.
                self.fused.release_buffers();
                release_freed_memory();
            }
            let model = self.model.take().context(LOST)?;
            self.model = Some(self.fused.lend_weights(model));
            self.stale = false;
        }
        Ok(())
    }

    /// The model's weights, written in for a checkpoint or a sample, dropped again (a frozen
    /// base taken back into the buffers): the buffers hold them while training.
    fn hollow(&mut self) -> Result<()> {
        if !self.stale {
            let model = self.model.take().context(LOST)?;
            self.model = Some(self.fused.reclaim_weights(model));
            self.stale = true;
            if self.int8_base() {
                release_freed_memory();
            }
        }
        Ok(())
    }

    /// Whether the frozen base is held in int8 (`[lora] base = "q8_0"`): lent out in f32
    /// between steps in place of the step's buffers, what each move frees given back to the
    /// system.
    fn int8_base(&self) -> bool {
        self.fused.base() == BaseWeights::Q8_0
    }
}

/// Hands the allocator's free pages back to the system. Freeing the step's buffers to lend an
/// int8 base out in f32, and its f32 matrices when it comes back, frees blocks of a few
/// megabytes: glibc keeps those in its heap once a larger one has been freed (its threshold
/// for mapping them apart rises), and the process would hold both (measured at SmolLM2-135M's
/// shape, checkpointed: the steps held 115 MiB more without it, the peak 0.85 GiB for 0.80).
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory to the system; no pointer is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Engine for FusedEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Fused
    }

    fn describe(&self) -> String {
        format!("fused CPU engine on {} threads", self.threads)
    }

    fn model(&mut self) -> Result<&Gpt> {
        self.sync()?;
        self.model.as_ref().context(LOST)
    }

    fn optimizer_writer(&mut self) -> Result<OptimizerWriter> {
        let lent = self.fused.lend_adamw_state();
        let muon = self.fused.muon_state();
        Ok(Box::new(move |path: &Path| {
            state_pack::write_lent(path, lent, muon)
        }))
    }

    fn optimizer_bytes(&mut self) -> Result<Vec<u8>> {
        states_pack(States {
            adamw: self.fused.adamw_state(),
            muon: self.fused.muon_state(),
        })
    }

    fn step(
        &mut self,
        batches: &[Batch],
        dropout_seed: u64,
        grad_clip: f64,
        lr: f64,
    ) -> Result<()> {
        self.hollow()?;
        let n = batches.len() as f64;
        let mut loss = 0.0;
        for (k, batch) in batches.iter().enumerate() {
            let seed = mix(dropout_seed, k, 0);
            loss += self
                .fused
                .accumulate(token_batch(batch), 1.0 / n as f32, Some(seed))?
                / n;
        }
        // An infinite bound measures the norm without scaling anything.
        let bound = if grad_clip > 0.0 {
            grad_clip
        } else {
            f64::INFINITY
        };
        let grad_norm = self.fused.clip_grad_norm(bound);
        let step = Step::new(loss, grad_norm);
        if step.applied {
            match &self.rule {
                UpdateRule::AdamW(adamw) => self.fused.adamw_step(lr, adamw),
                UpdateRule::Muon(adamw, muon) => self.fused.muon_step(lr, adamw, muon)?,
            }
            self.stale = true;
        } else {
            self.fused.discard_gradients();
        }
        self.known.push(step);
        Ok(())
    }

    fn outcomes(&mut self, _wait: bool) -> Result<Vec<Step>> {
        Ok(std::mem::take(&mut self.known))
    }

    /// Each batch split over the engine's threads.
    fn losses(&mut self, batches: &[Batch]) -> Result<Vec<f64>> {
        // A frozen base lent to the model comes back first.
        if self.fused.lent() {
            self.hollow()?;
        }
        batches
            .iter()
            .map(|batch| Ok(self.fused.loss(token_batch(batch))?))
            .collect()
    }
}

fn token_batch(batch: &Batch) -> TokenBatch<'_> {
    TokenBatch {
        inputs: &batch.inputs,
        targets: &batch.targets,
        batch: batch.batch,
        seq: batch.seq,
    }
}
