//! A rank other than 0 of a run over ranks: it takes what rank 0 resolved ([`Handoff`]),
//! reads the corpus itself, and takes each step rank 0 orders, adding its micro-batches'
//! gradients to the others' inside the engine. It writes nothing and prints nothing; an error
//! ends the whole job (the caller aborts every rank).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};

use super::engine::{self, Settings};
use super::optim::{Optimizer, load_optimizer};
use super::ranks::{Handoff, Order, check_data, check_weights};
use super::session::train_step;
use crate::config::UpdateKind;
use crate::data::corpus;
use crate::distributed::Ranks;

/// Trains as rank `ranks.rank()` until rank 0 says the run is over; whether it ended because a
/// rank was signalled (`stop`, set by this one's Ctrl-C handler, or another's).
pub fn follow(ranks: &Ranks, stop: &AtomicBool) -> Result<bool> {
    let Handoff {
        backend,
        config,
        tokenizer,
        weights,
        param_ids,
        optimizer,
    } = Handoff::receive(ranks)?;
    // Never a run directory of its own: a path that is none, so the corpus is prepared in a
    // temporary directory when it is text.
    let nowhere = Path::new("");
    let data = corpus::for_run(nowhere, &config, &tokenizer, false).with_context(|| {
        format!(
            "rank {} (host {}) cannot read the corpus {}",
            ranks.rank(),
            ranks.host(),
            config.data.path.display()
        )
    })?;
    check_data(ranks, &data, &config)?;
    // Rank 0's backend (a resumed run's own where `--backend` was not given); a GPU's, this
    // host's GPU for this rank.
    let placement = backend.placement_for(ranks.local_rank()).with_context(|| {
        let (rank, host) = (ranks.rank(), ranks.host());
        format!(
            "rank {rank} (host {host}) cannot start the {} backend",
            backend.name()
        )
    })?;
    let (kind, _) = placement.engine_for(config.train.dtype, UpdateKind::of(&config))?;
    let device = placement.device.clone().autodiff();
    let kernel = config.train.attention_kernel;
    let mut model = config
        .gpt(tokenizer.vocab_size())
        .init_with_attention(&device, kernel)?;
    if let Some(lora) = &config.lora {
        // The adapters' shapes; their factors (and the base) come with rank 0's weights.
        model = model.with_lora(lora)?;
    }
    crate::run::weights::load_weights(&mut model, weights)?;
    let model = crate::run::weights::restore_param_ids(model, &param_ids)?;
    let model = placement.model(model);
    let burn = load_optimizer(&config, &model, optimizer)?;
    let optimizer = Optimizer::for_run(&config, &model, burn);
    let settings = Settings::for_ranks(&config, ranks);
    let mut engine = engine::open(&placement, kind, model, optimizer, settings, Some(ranks))?;
    let mut stopped = false;
    loop {
        let asked = stop.load(Ordering::SeqCst);
        let order = Order {
            stop: asked,
            ..Order::default()
        }
        .exchange(ranks);
        stopped |= order.stop;
        if order.check {
            check_weights(ranks, engine.as_mut(), order.at)?;
        }
        if !order.go {
            return Ok(stopped);
        }
        train_step(engine.as_mut(), &data, &config, order.at)?;
        // Rank 0 accounts the outcomes; here they are only let go.
        engine.outcomes(false)?;
    }
}
