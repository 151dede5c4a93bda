//! AdamW on the flat buffers, the same arithmetic as Burn's `AdamW` (so a run can move between
//! the two and resume bit for bit): Burn spends a dozen whole-tensor ops, each a pass over
//! memory with an allocation, per parameter; here it is one loop.

use crate::cpu::params::Params;
use crate::fast_math::vectorized;
use crate::optim::AdamWSettings;

/// The moments of every parameter, in its [`Params`]' layout.
#[derive(Debug, Clone, Default)]
pub(crate) struct Moments {
    pub m: Params,
    pub v: Params,
    /// Steps taken, per entry of the layout (Burn counts per parameter).
    pub time: Vec<usize>,
}

impl Moments {
    /// Zero moments and no steps, shaped like `weights` (Burn's state before the first step).
    pub(crate) fn zeros(weights: &Params) -> Self {
        let mut moments = Self::default();
        moments.m.zero_like(weights);
        moments.v.zero_like(weights);
        moments.time = vec![0; weights.layout().entries().len()];
        moments
    }

    /// One AdamW step of `weights` along `grads` at learning rate `lr` (times each group's
    /// ratio), parameter by parameter in the layout's order.
    pub(crate) fn step(
        &mut self,
        weights: &mut Params,
        grads: &Params,
        settings: &AdamWSettings,
        lr: f64,
    ) {
        self.step_some(weights, grads, settings, lr, |_| false);
    }

    /// [`step`](Self::step) of every entry but those `skip` marks (by index in the layout):
    /// another rule updates them, and their moments and steps stay as they are.
    pub(crate) fn step_some(
        &mut self,
        weights: &mut Params,
        grads: &Params,
        settings: &AdamWSettings,
        lr: f64,
        skip: impl Fn(usize) -> bool,
    ) {
        // The layout is shared (an `Arc`): no copy of it per step.
        let layout = weights.shared_layout();
        for (i, (entry, time)) in layout.entries().iter().zip(&mut self.time).enumerate() {
            // A frozen parameter (LoRA's base) has no moments.
            if skip(i) || !layout.trains(entry) {
                continue;
            }
            *time += 1;
            let t = *time as i32;
            // The group's rate: `× 1` is the schedule's own, exactly.
            let lr = lr * settings.lr_ratios.of(entry.slot);
            let decay = if settings.decayed.contains(&entry.id) {
                lr * settings.weight_decay as f64
            } else {
                0.0
            };
            let s = settings;
            // Burn's order of operations, each rounded to f32 where Burn's ops round.
            let scalars = [
                s.beta_1,
                1.0 - s.beta_1,
                s.beta_2,
                1.0 - s.beta_2,
                1.0 - s.beta_1.powi(t),
                1.0 - s.beta_2.powi(t),
                s.epsilon,
                (1.0 - decay) as f32,
                lr as f32,
            ];
            let slot = entry.slot;
            let (m, v) = (self.m.slot_mut(slot), self.v.slot_mut(slot));
            update(
                weights.slot_mut(slot).values_mut(),
                grads.slot(slot).values(),
                m.values_mut(),
                v.values_mut(),
                &scalars,
                decay != 0.0,
            );
        }
    }
}

vectorized! {
    /// `m = β1·m + (1-β1)·g`, `v = β2·v + (1-β2)·g²`, `w = w·(1 - lr·wd) - lr · (m/c1) /
    /// (√(v/c2) + ε)` with `c = 1 - β^t`; `s` holds those scalars in that order.
    fn update(w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: &[f32; 9], decay: bool) {
        let [b1, f1, b2, f2, c1, c2, eps, keep, lr] = *s;
        for (((w, &g), m), v) in w.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            *m = *m * b1 + g * f1;
            *v = *v * b2 + g * g * f2;
            let delta = (*m / c1) / ((*v / c2).sqrt() + eps);
            let decayed = if decay { *w * keep } else { *w };
            *w = decayed - delta * lr;
        }
    }
}
