//! What a run says while it trains and when it ends: a log line per interval and the summary,
//! from the clocks that time them.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::progress::Progress;
use crate::run::checkpoint::TrainState;

/// The run's clocks: wall time, time spent evaluating, and the window tokens/s is measured over.
pub(crate) struct Clock {
    pub(super) started: Instant,
    elapsed_before: f64,
    pub(super) eval_time: Duration,
    pub(super) window: (Instant, usize),
    first_step: usize,
    last_loss: Option<f64>,
}

impl Clock {
    pub(super) fn new(elapsed_before: f64, step: usize) -> Self {
        Self {
            started: Instant::now(),
            elapsed_before,
            eval_time: Duration::ZERO,
            window: (Instant::now(), step),
            first_step: step,
            last_loss: None,
        }
    }

    /// Training wall time so far, earlier sessions of a resumed run included.
    pub(super) fn elapsed_s(&self) -> f64 {
        self.elapsed_before + self.started.elapsed().as_secs_f64()
    }

    /// Reports the loss at `step` of `max_iters` (learning rate `lr`, `tokens_per_step`): the
    /// progress bar on a terminal, a log line otherwise. Returns the tokens/s it reported.
    pub(super) fn log(
        &mut self,
        progress: &Progress,
        (step, max_iters): (usize, usize),
        loss: f64,
        lr: f64,
        tokens_per_step: u64,
    ) -> f64 {
        self.last_loss = Some(loss);
        let since = self.window.0.elapsed().as_secs_f64();
        let tok_s = (step - self.window.1) as f64 * tokens_per_step as f64 / since.max(1e-9);
        progress.update(
            &format!("loss {loss:.4} | lr {lr:.2e} | {tok_s:.0} tok/s"),
            || {
                format!(
                    "step {step}/{max_iters} | loss {loss:.4} | lr {lr:.2e} | {tok_s:.0} tokens/s"
                )
            },
        );
        if since > 5.0 {
            self.window = (Instant::now(), step);
        }
        tok_s
    }

    /// The summary line at the end of a run in `dir` that reached `state`.
    pub(super) fn summary(&self, state: &TrainState, tokens_per_step: u64, dir: &Path) -> String {
        let wall = self.started.elapsed();
        let train_time = (wall - self.eval_time).as_secs_f64();
        let steps = state.step - self.first_step;
        let tokens_per_s = steps as f64 * tokens_per_step as f64 / train_time.max(1e-9);
        let best = state.best_val_loss.map_or("-".into(), |v| {
            format!("{v:.4} (step {})", state.best_step.unwrap_or(0))
        });
        format!(
            "done: step {} | wall {:.1}s ({train_time:.1}s training, {:.1}s eval) | \
             {tokens_per_s:.0} training tokens/s | last loss {} | best val {best} | {}",
            state.step,
            wall.as_secs_f64(),
            self.eval_time.as_secs_f64(),
            self.last_loss.map_or("-".into(), |l| format!("{l:.4}")),
            dir.display()
        )
    }
}
