//! Picking the next token where the logits are: on a GPU, reading a whole row of logits back
//! for every token costs a wait for the device and a copy; this picks the token with tensor ops
//! on the device and reads back three numbers.
//!
//! The rule is the host sampler's (`sampler.rs`) for what it covers — temperature, top-k and one
//! draw — so the same draw gives the same token: the weights `exp((l - max) / T)` (zero outside
//! the top k), their running sum `c`, and the first token whose `c` passes `u · total`.

use burn::tensor::{Int, Tensor};

use super::draw::{Sampled, draw_from};
use super::reads::read_f32;

/// What a decoder needs to pick one token on its device: the sampler's settings and this
/// token's random draw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pick {
    /// 0 = the most likely token.
    pub temperature: f32,
    /// Only the `k` most likely tokens are candidates.
    pub top_k: Option<usize>,
    /// The draw in `[0, 1)` the host sampler would make (unused at temperature 0).
    pub uniform: f64,
    /// Only ids below this are candidates (a padded vocabulary's extra rows are not tokens).
    pub vocab: usize,
}

/// The token a [`Pick`] chose, with its log-probability under the model (the log-softmax of the
/// raw logits) and whether every logit was finite.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Picked {
    pub id: u32,
    pub logprob: f32,
    pub finite: bool,
}

impl Picked {
    /// As the sampler reports a token (no alternatives: a device pick is only made when none
    /// were asked for).
    pub fn sampled(self) -> Sampled {
        Sampled {
            id: self.id,
            logprob: self.logprob,
            top: Vec::new(),
        }
    }
}

impl Pick {
    /// The pick over host `logits` (at least `vocab` of them), by the host sampler's own code:
    /// what a decoder without a device does, and the reference the device pick is tested
    /// against.
    pub fn on_host(&self, logits: &[f32]) -> Picked {
        let logits = &logits[..self.vocab];
        let id = draw_from(logits, self.temperature, self.top_k, self.uniform);
        let finite = logits.iter().all(|l| l.is_finite());
        Picked {
            logprob: Sampled::observe(logits, id, 0).logprob,
            id,
            finite,
        }
    }

    /// The pick over device `logits` `[width]` (`width >= vocab`): tensor ops on their device,
    /// one read of three numbers (id, log-probability, sum of the logits).
    pub fn on_device(&self, logits: Tensor<1>) -> Picked {
        Self::read(self.on_device_unread(logits, None))
    }

    /// [`on_device`](Self::on_device)'s three numbers `[3]`, left on the device. The draw is
    /// `uniform` `[1]` when given (a device buffer: a captured step's launches must not hold
    /// it), else [`Pick::uniform`].
    pub(crate) fn on_device_unread(
        &self,
        logits: Tensor<1>,
        uniform: Option<Tensor<1>>,
    ) -> Tensor<1> {
        let vocab = self.vocab;
        let raw = logits.narrow(0, 0, vocab);
        let max = raw.clone().max();
        let log_z = max.clone() + (raw.clone() - max.expand([vocab])).exp().sum().log();
        let id = match self.temperature {
            0.0 => raw.clone().argmax(0),
            _ => self.draw(raw.clone(), uniform),
        };
        let logprob = raw.clone().select(0, id.clone()) - log_z;
        // A NaN or infinite logit anywhere makes the sum non-finite.
        let sum = raw.sum();
        Tensor::cat(vec![id.float(), logprob, sum], 0)
    }

    /// The pick from [`on_device_unread`](Self::on_device_unread)'s numbers, read to the host.
    pub(crate) fn read(unread: Tensor<1>) -> Picked {
        let read = read_f32(unread);
        Picked {
            id: read[0] as u32,
            logprob: read[1],
            finite: read[2].is_finite() && read[1].is_finite(),
        }
    }

    /// Temperature, top-k and the draw over `logits` `[vocab]`: the id `[1]`.
    fn draw(&self, logits: Tensor<1>, uniform: Option<Tensor<1>>) -> Tensor<1, Int> {
        let vocab = self.vocab;
        let mut logits = logits;
        if let Some(k) = self.top_k.filter(|&k| k < vocab) {
            let kth = logits
                .clone()
                .topk(k, 0)
                .narrow(0, k - 1, 1)
                .expand([vocab]);
            let below = logits.clone().lower(kth);
            logits = logits.mask_fill(below, f32::NEG_INFINITY);
        }
        let max = logits.clone().max().expand([vocab]);
        let weights = ((logits - max) / self.temperature as f64).exp();
        let running = weights.cumsum(0);
        let total = running.clone().narrow(0, vocab - 1, 1).expand([vocab]);
        let target = match uniform {
            Some(uniform) => total.clone() * uniform.expand([vocab]),
            None => total.clone() * self.uniform,
        };
        // The first id whose running sum passes the target is the number of ids before it. Ids
        // whose running sum already is the total never count: a target rounded up to the total
        // still picks a token of non-zero weight.
        let passed = running.clone().lower_equal(target);
        let before_end = running.lower(total);
        passed.bool_and(before_end).int().sum()
    }
}
