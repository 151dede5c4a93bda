//! [`FusedEngine`]: hand-written forward, backward, AdamW and Muon on the CPU ([`FusedCpu`]),
//! the batch split over threads.

use std::path::Path;

use anyhow::{Context, Result};
use replace_with::replace_with_or_abort;
use tinygpt_model::{BaseWeights, FusedCpu, Gpt, TokenBatch, step::LentWeights};

use super::{Engine, Sampler, Saving, Step};
use crate::backend::EngineKind;
use crate::data::{Batch, mix};
use crate::distributed::Ranks;
use crate::run::checkpoint::WriteFile;
use crate::train::optim::{Optimizer, States, UpdateRule, muon_ids, states_from_burn};
use crate::train::state_pack::{self, states_pack};

/// The weights and the optimizer's state live in [`FusedCpu`]'s buffers between steps; the
/// [`Gpt`] is given the weights only when asked for (checkpoints, sampling), and the
/// optimizer's state is serialised from the buffers, so a step copies nothing to or from Burn
/// and no Burn record of the state is held.
pub(super) struct FusedEngine {
    weights: Weights,
    rule: UpdateRule,
    threads: usize,
    /// Outcomes of steps taken, not yet handed out.
    known: Vec<Step>,
    /// The ranks a step's micro-batches are dealt to, when there are several.
    ranks: Option<Ranks>,
    /// A LoRA run's last checkpoint's model: the trained weights alone, the base left hollow
    /// ([`FusedCpu::trained_weights`]); dropped at the next step.
    trained: Option<Box<Gpt>>,
}

/// Where the weights are between calls: in the engine (the model a hollow of the same
/// parameters), or lent to the model with the engine ([`LentWeights`]), which then cannot step
/// until it is reclaimed. Moved from one to the other by value.
enum Weights {
    Held {
        fused: Box<FusedCpu>,
        hollow: Box<Gpt>,
    },
    Lent(Box<LentWeights>),
}

impl FusedEngine {
    pub fn new(
        model: Gpt,
        optimizer: Optimizer,
        threads: usize,
        checkpointing: bool,
        ranks: Option<Ranks>,
    ) -> Result<Self> {
        // The weights move into the buffers; the model keeps none (written in when asked).
        let muon = muon_ids(&model);
        let (mut fused, hollow) = FusedCpu::taking(model, threads)?;
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
            weights: Weights::Held {
                fused: Box::new(fused),
                hollow: Box::new(hollow),
            },
            rule: optimizer.rule,
            threads,
            known: Vec::new(),
            ranks,
            trained: None,
        })
    }
}

impl Weights {
    /// The engine, whichever way its weights are, to read from.
    fn fused(&self) -> &FusedCpu {
        match self {
            Weights::Held { fused, .. } => fused,
            Weights::Lent(lent) => lent.fused(),
        }
    }

    /// The model with every weight: the buffers' weights lent to it (the gradients' buffer
    /// freed first, there are none between steps, so that the model's copy takes its place; a
    /// frozen base moved, not copied).
    fn lent(&mut self) -> &LentWeights {
        replace_with_or_abort(self, |weights| match weights {
            Weights::Held { mut fused, hollow } => {
                fused.release_gradients();
                if int8_base(&fused) {
                    // The base goes out in f32, four times its int8 bytes: in the room the
                    // step's buffers held.
                    fused.release_buffers();
                    release_freed_memory();
                }
                Weights::Lent(Box::new(fused.lend_weights(*hollow)))
            }
            lent => lent,
        });
        match self {
            Weights::Lent(lent) => lent,
            Weights::Held { .. } => unreachable!("lent just above"),
        }
    }

    /// The engine to step or evaluate with: the weights taken back from the model first (a
    /// frozen base moved back into the buffers), so that the model holds no copy of them.
    fn held(&mut self) -> &mut FusedCpu {
        replace_with_or_abort(self, |weights| match weights {
            Weights::Lent(lent) => {
                let (fused, hollow) = lent.reclaim();
                if int8_base(&fused) {
                    release_freed_memory();
                }
                Weights::Held {
                    fused: Box::new(fused),
                    hollow: Box::new(hollow),
                }
            }
            held => held,
        });
        match self {
            Weights::Held { fused, .. } => fused,
            Weights::Lent(_) => unreachable!("reclaimed just above"),
        }
    }
}

/// Whether the frozen base is held quantised (`[lora] base = "q8_0"` or `"q4_k"`): lent out
/// in f32 between steps in place of the step's buffers, what each move frees given back to
/// the system.
fn int8_base(fused: &FusedCpu) -> bool {
    fused.base() != BaseWeights::F32
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

/// What writes `fused`'s optimizer state to a file (`optimizer.bpk`), a tensor at a time from
/// the engine's own buffers: AdamW's moments shared, not copied, and Muon's momentum.
fn optimizer_writer<'a>(fused: &FusedCpu) -> WriteFile<'a> {
    let (moments, muon) = (fused.share_adamw_state(), fused.muon_state());
    Box::new(move |path: &Path| state_pack::write_shared(path, moments, muon))
}

impl Engine for FusedEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Fused
    }

    fn describe(&self) -> String {
        match &self.ranks {
            Some(ranks) => format!(
                "fused CPU engine on {} threads a rank, {} ranks (MPI; {})",
                self.threads,
                ranks.size(),
                match ranks.overlapped_sum() {
                    Some(_) => "each block's gradients summed as its backward ends",
                    None => "gradients summed after each step",
                }
            ),
            None => format!("fused CPU engine on {} threads", self.threads),
        }
    }

    fn model(&mut self) -> Result<&Gpt> {
        Ok(self.weights.lent().model())
    }

    fn attention_maps(&mut self, prompt: &[u32]) -> Result<Option<Vec<Vec<Vec<f32>>>>> {
        let ids: Vec<i64> = prompt.iter().map(|&id| i64::from(id)).collect();
        Ok(Some(self.weights.held().attention_maps(&ids)?))
    }

    fn sampled(&mut self, sample: Sampler<'_>) -> Result<Option<Vec<u32>>> {
        // A LoRA run's base stays where it is (held in its blocks); any other run's model is
        // lent as for a checkpoint.
        if self.shapes()?.lora_scale().is_none() {
            return Ok(None);
        }
        let threads = self.threads;
        let fused = self.weights.held();
        fused
            .sample_with(threads, |decoder| sample(decoder))
            .map(Some)
    }

    fn shapes(&mut self) -> Result<&Gpt> {
        Ok(match &self.weights {
            Weights::Held { hollow, .. } => hollow,
            Weights::Lent(lent) => lent.model(),
        })
    }

    fn saving(&mut self) -> Result<Saving<'_>> {
        // A LoRA checkpoint holds the trained weights alone: the base stays where it is.
        if let Weights::Held { fused, hollow } = &self.weights
            && hollow.lora_scale().is_some()
        {
            let optimizer = optimizer_writer(fused);
            let trained = self.trained.insert(Box::new(fused.trained_weights(hollow)));
            return Ok(Saving {
                model: trained,
                optimizer,
            });
        }
        let lent = self.weights.lent();
        Ok(Saving {
            optimizer: optimizer_writer(lent.fused()),
            model: lent.model(),
        })
    }

    fn optimizer_bytes(&mut self) -> Result<Vec<u8>> {
        let fused = self.weights.fused();
        states_pack(States {
            adamw: fused.adamw_state(),
            muon: fused.muon_state(),
        })
    }

    fn step(
        &mut self,
        batches: &[Batch],
        dropout_seed: u64,
        grad_clip: f64,
        lr: f64,
    ) -> Result<()> {
        self.trained = None;
        let (fused, rule) = (self.weights.held(), &self.rule);
        let n = batches.len() as f64;
        let mut loss = 0.0;
        // Over ranks, rank r takes micro-batches r, r + N, …: each with its global index's
        // dropout seed, so the work is the one process's, split.
        let (rank, size) = self.ranks.as_ref().map_or((0, 1), |r| (r.rank(), r.size()));
        let last = (rank..batches.len()).step_by(size).next_back();
        // The rank's last micro-batch sums each block's gradients over the ranks as its
        // backward ends, where MPI allows it; otherwise all are summed after.
        let overlapped = self.ranks.as_ref().and_then(|r| r.overlapped_sum());
        for k in (rank..batches.len()).step_by(size) {
            let (batch, seed, scale) = (
                token_batch(&batches[k]),
                mix(dropout_seed, k, 0),
                1.0 / n as f32,
            );
            loss += match overlapped.filter(|_| Some(k) == last) {
                Some(ranks) => fused.accumulate_summed(batch, scale, Some(seed), ranks)?,
                None => fused.accumulate(batch, scale, Some(seed))?,
            } / n;
        }
        if let Some(ranks) = &self.ranks {
            // Two ranks add a + b as one process does: bit for bit; more in another order.
            if overlapped.is_none() {
                fused.for_each_gradient(|g| ranks.sum_f32(g));
            }
            let mut sum = [loss];
            ranks.sum_f64(&mut sum);
            loss = sum[0];
        }
        // An infinite bound measures the norm without scaling anything.
        let bound = if grad_clip > 0.0 {
            grad_clip
        } else {
            f64::INFINITY
        };
        let grad_norm = fused.clip_grad_norm(bound);
        let step = Step::new(loss, grad_norm);
        if step.applied {
            match rule {
                UpdateRule::AdamW(adamw) => fused.adamw_step(lr, adamw),
                UpdateRule::Muon(adamw, muon) => fused.muon_step(lr, adamw, muon)?,
            }
        } else {
            fused.discard_gradients();
        }
        self.known.push(step);
        Ok(())
    }

    fn outcomes(&mut self, _wait: bool) -> Result<Vec<Step>> {
        Ok(std::mem::take(&mut self.known))
    }

    /// The f32 buffers themselves: no copy into the model.
    fn weights_checksum(&mut self) -> Result<[u8; 32]> {
        use sha2::Digest;
        let mut hash = sha2::Sha256::new();
        let hash_values = crate::run::weights::hash_values;
        self.weights
            .held()
            .for_each_weight(|w| hash_values(&mut hash, w));
        Ok(hash.finalize().into())
    }

    /// Each batch split over the engine's threads.
    fn losses(&mut self, batches: &[Batch]) -> Result<Vec<f64>> {
        let fused = self.weights.held();
        batches
            .iter()
            .map(|batch| Ok(fused.loss(token_batch(batch))?))
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
