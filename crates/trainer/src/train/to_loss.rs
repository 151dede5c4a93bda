//! `--to-loss`: whether a run has reached a target loss over the whole validation split, and
//! when that split need not be measured (weights far from it, by their estimate or because no
//! step has trained them yet).

use std::time::Instant;

use anyhow::Result;

use super::report::Clock;
use super::session::{Estimate, Trainer};
use crate::data::{Batch, sweep};
use crate::progress::Progress;

/// How far above a `--to-loss` target an estimate must be for the whole split not to be
/// measured: this many of its standard errors, and this share of the target (the whole split's
/// windows are not the estimate's random ones).
const FAR_ABOVE: (f64, f64) = (8.0, 0.05);

impl Trainer {
    /// With `--to-loss`, at step 0 of new weights: whether the target is far below what they
    /// can score (saying so), so that step 0 is not evaluated. Weights no step has trained
    /// score the loss of a uniform guess, ln(vocab), in expectation (random logits, the same
    /// law for every token, cannot do better); [`FAR_ABOVE`]'s share of the target above it
    /// is as far as an estimate that skips the whole split.
    pub(super) fn unlearnt_above(&self, to_loss: Option<f64>, progress: &Progress) -> bool {
        let (Some(target), 0, true) = (to_loss, self.state.step, self.new_weights) else {
            return false;
        };
        let vocab = self.config.gpt(self.run.tokenizer.vocab_size()).vocab_size;
        let uniform = (vocab as f64).ln();
        let far = uniform - target > FAR_ABOVE.1 * target;
        if far {
            progress.say(format!(
                "step 0 not evaluated: new weights score about ln({vocab}) = {uniform:.4}, far \
                 above the target {target}"
            ));
        }
        far
    }

    /// With `--to-loss`: the loss over the whole validation split (its time counted as
    /// evaluation, not training), and whether it is at most `target`; saying so when it is.
    /// Not measured again where the `estimate` is the whole split's, nor where it is far above
    /// the target ([`FAR_ABOVE`]): a pass over the split that cannot reach it.
    pub(super) fn reached(
        &mut self,
        target: f64,
        estimate: &Estimate,
        clock: &mut Clock,
        progress: &Progress,
    ) -> Result<bool> {
        let (errors, share) = FAR_ABOVE;
        if let Some(error) = estimate.val_error
            && estimate.val_loss - target > (errors * error).max(share * target)
        {
            progress.say(format!(
                "whole-split val loss not measured: the estimate {:.4} is far above the target \
                 {target} ({:.0} standard errors)",
                estimate.val_loss,
                (estimate.val_loss - target) / error
            ));
            return Ok(false);
        }
        let loss = match estimate.whole_split {
            true => estimate.val_loss,
            false => {
                let started = Instant::now();
                let loss = self.whole_val_loss()?;
                clock.eval_time += started.elapsed();
                clock.window = (Instant::now(), self.state.step);
                loss
            }
        };
        let reached = loss <= target;
        let tokens = self.state.tokens;
        let training = (clock.started.elapsed() - clock.eval_time).as_secs_f64();
        progress.say(match reached {
            true => format!(
                "reached whole-split val loss {loss:.4} <= {target} at step {}: {training:.2}s of \
                 training ({:.2}s wall with evaluations), {tokens} tokens",
                self.state.step,
                clock.started.elapsed().as_secs_f64()
            ),
            false => format!("whole-split val loss {loss:.4} (target {target})"),
        });
        Ok(reached)
    }

    /// The mean loss over every token of the validation split, each predicted once from
    /// windows of up to `block_size` tokens (`tinygpt eval`'s measure), on the engine.
    pub(crate) fn whole_val_loss(&mut self) -> Result<f64> {
        let t = &self.config.train;
        let batches: Vec<Batch> =
            sweep(&self.data.val, self.config.model.block_size, t.batch_size).collect();
        let losses = self.engine.losses(&batches)?;
        let (mut nats, mut tokens) = (0.0, 0usize);
        for (batch, loss) in batches.iter().zip(losses) {
            nats += loss * batch.counted_targets() as f64;
            tokens += batch.counted_targets();
        }
        Ok(nats / tokens.max(1) as f64)
    }
}
