//! A run trained over ranks ([`crate::distributed`]): what rank 0 hands the others before the
//! first step ([`Handoff`]), its word before each step ([`Order`]), and the checks that every
//! rank holds what rank 0 holds (the data, and the weights at each checkpoint).

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::engine::Engine;
use crate::backend::Backend;
use crate::config::RunConfig;
use crate::data::tokenizer::Tokenizer;
use crate::data::{Dataset, step_rng};
use crate::distributed::Ranks;

/// What one run over ranks needs that one process does not, micro-batches that can be dealt to
/// them: refused in one line otherwise, before anything is written.
pub(crate) fn refuse_undealt(ranks: &Ranks, config: &RunConfig) -> Result<()> {
    let (n, accum) = (ranks.size(), config.train.grad_accum);
    if !accum.is_multiple_of(n) {
        let up = accum.div_ceil(n) * n;
        bail!(
            "train.grad_accum = {accum} cannot be dealt to {n} ranks: each step's micro-batches \
             are split among them, so it must be a multiple of {n} (e.g. --set \
             train.grad_accum={up}), or start a number of ranks that divides {accum}"
        );
    }
    Ok(())
}

/// What rank 0 resolved (a new run, one resumed, one fine-tuned from another) and hands the
/// other ranks, so that they read nothing of the run directory and need no shared file system:
/// the backend, the config, the tokenizer, the weights with their parameter ids, the
/// optimizer's state.
pub(crate) struct Handoff {
    /// The backend rank 0 trains on (a resumed run's own, where `--backend` was not given):
    /// every rank runs the same engine.
    pub backend: Backend,
    pub config: RunConfig,
    pub tokenizer: Tokenizer,
    /// `model.safetensors`' bytes.
    pub weights: Vec<u8>,
    pub param_ids: Vec<u64>,
    /// `optimizer.bpk`'s bytes.
    pub optimizer: Vec<u8>,
}

impl Handoff {
    /// Rank 0: hands `backend`, `engine`'s weights and state, `config` and `tokenizer` to the
    /// others.
    pub(crate) fn send(
        ranks: &Ranks,
        config: &RunConfig,
        tokenizer: &Tokenizer,
        backend: Backend,
        engine: &mut dyn Engine,
    ) -> Result<()> {
        ranks.broadcast_text(backend.name())?;
        ranks.broadcast_text(&config.to_toml())?;
        ranks.broadcast_text(&tokenizer.to_json()?)?;
        let mut optimizer = engine.optimizer_bytes()?;
        let model = engine.model()?;
        let mut weights = crate::run::weights::weights_bytes(model)?;
        let ids = crate::run::weights::param_ids(model);
        ranks.broadcast_text(&serde_json::to_string(&ids)?)?;
        ranks.broadcast(&mut weights);
        ranks.broadcast(&mut optimizer);
        Ok(())
    }

    /// The other ranks: what rank 0 [`send`](Self::send)s.
    pub(crate) fn receive(ranks: &Ranks) -> Result<Self> {
        let name = ranks.broadcast_text("")?;
        let backend = Backend::from_name(&name)
            .with_context(|| format!("rank 0 trains on a backend unknown here: {name}"))?;
        let config = RunConfig::load_str(&ranks.broadcast_text("")?, &[])
            .context("the config rank 0 sent")?;
        let tokenizer = Tokenizer::from_json(&ranks.broadcast_text("")?)?;
        let param_ids = serde_json::from_str(&ranks.broadcast_text("")?)?;
        let (mut weights, mut optimizer) = (Vec::new(), Vec::new());
        ranks.broadcast(&mut weights);
        ranks.broadcast(&mut optimizer);
        Ok(Self {
            backend,
            config,
            tokenizer,
            weights,
            param_ids,
            optimizer,
        })
    }
}

/// Rank 0's word before each step: `at` steps are done; take step `at` when `go` (else the
/// run is over), after checking the weights when `check` (rank 0 has just written a checkpoint
/// of them). And every rank's: `stop` when any was signalled (Ctrl-C), which rank 0 then
/// stops the run for, saving, at its next word.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Order {
    pub at: usize,
    pub go: bool,
    pub check: bool,
    pub stop: bool,
}

impl Order {
    /// Rank 0's `at`, `go` and `check` on every rank, with `stop` when any rank's was set: one
    /// all-reduce, the other ranks adding zeros to rank 0's word and their own `stop`.
    pub(crate) fn exchange(self, ranks: &Ranks) -> Self {
        let leads = ranks.leads();
        let said = |v: bool| f64::from(u8::from(leads && v));
        let at = if leads { self.at as f64 } else { 0.0 };
        let stop = f64::from(u8::from(self.stop));
        let mut values = [at, said(self.go), said(self.check), stop];
        ranks.sum_f64(&mut values);
        Self {
            at: values[0] as usize,
            go: values[1] > 0.0,
            check: values[2] > 0.0,
            stop: values[3] > 0.0,
        }
    }
}

/// An error naming the rank whose weights are not rank 0's after `step` steps.
pub(crate) fn check_weights(ranks: &Ranks, engine: &mut dyn Engine, step: usize) -> Result<()> {
    let sum = engine.weights_checksum()?;
    ranks.check_same(sum, &format!("weights after step {step}"))
}

/// An error naming the rank whose data are not rank 0's: each rank reads the corpus itself.
/// Compared: each split's size and a batch drawn from it as training draws them.
pub(crate) fn check_data(ranks: &Ranks, data: &Dataset, config: &RunConfig) -> Result<()> {
    let mut hash = Sha256::new();
    for split in [&data.train, &data.val] {
        hash.update((split.len() as u64).to_le_bytes());
        let mut rng = step_rng(config.train.seed, 0, CHECK_STREAM);
        let batch = data.sample(split, config.train.batch_size, &mut rng);
        for id in batch.inputs.iter().chain(&batch.targets) {
            hash.update(id.to_le_bytes());
        }
    }
    ranks.check_same(hash.finalize().into(), "data (the corpus or its tokens)")
}

/// The stream of the batches [`check_data`] compares (apart from training's and evaluation's).
const CHECK_STREAM: u64 = 1 << 23;
