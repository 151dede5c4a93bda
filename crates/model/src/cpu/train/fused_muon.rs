//! [`FusedCpu`]'s Muon: which matrices it updates, its state in and out, and the step (Muon on
//! the matrices, AdamW on the rest). The arithmetic is `muon.rs`'s.

use burn::module::ParamId;

use super::fused::FusedCpu;
use super::muon::{Velocities, Velocity, orthogonalise};
use crate::cpu::error::FusedError;
use crate::optim::{AdamWSettings, LayoutEntry, MuonSettings, VelocityState};

impl FusedCpu {
    /// Trains the `matrices` (2-D parameters) with Muon from now on, their state zero; the
    /// other parameters stay AdamW's. Refuses a parameter that is not a matrix of this model.
    pub fn use_muon(&mut self, matrices: &[ParamId]) -> Result<(), FusedError> {
        let entries = self.weights.layout().entries();
        for id in matrices {
            match entries.iter().find(|e| e.id == *id) {
                Some(e) if e.shape.len() == 2 => {}
                Some(e) => {
                    let why = format!(
                        "Muon updates matrices, not {:?} of shape {:?}",
                        e.slot, e.shape
                    );
                    return Err(FusedError::OptimizerState(why));
                }
                None => {
                    let why = format!("parameter {id} is not this model's");
                    return Err(FusedError::OptimizerState(why));
                }
            }
        }
        let velocity = |e: &LayoutEntry| Velocity {
            slot: e.slot,
            rows: e.shape[0],
            cols: e.shape[1],
            v: vec![0.0; e.len],
            update: vec![0.0; e.len],
            step: 0,
        };
        let entries = entries
            .iter()
            .map(|e| matrices.contains(&e.id).then(|| velocity(e)))
            .collect();
        self.muon = Some(Velocities { entries });
        Ok(())
    }

    /// Muon's state of each matrix that has taken a step (Burn keeps none before).
    pub fn muon_state(&self) -> Vec<VelocityState> {
        let Some(muon) = &self.muon else {
            return Vec::new();
        };
        let entries = self.weights.layout().entries();
        entries
            .iter()
            .zip(&muon.entries)
            .filter_map(|(e, v)| v.as_ref().map(|v| (e, v)))
            .filter(|(_, v)| v.step > 0)
            .map(|(e, v)| VelocityState {
                id: e.id,
                shape: e.shape.clone(),
                step: v.step,
                velocity: v.v.clone(),
            })
            .collect()
    }

    /// Continues from a saved Muon state (after [`use_muon`](Self::use_muon)): one entry per
    /// matrix, or none. A state that does not fit is refused, and what was held stays.
    pub fn load_muon_state(&mut self, states: Vec<VelocityState>) -> Result<(), FusedError> {
        let refuse = |why: String| Err(FusedError::OptimizerState(why));
        let Some(muon) = &self.muon else {
            return match states.is_empty() {
                true => Ok(()),
                false => refuse("a Muon state for a run without Muon".into()),
            };
        };
        let entries = self.weights.layout().entries();
        let mut loaded = muon.entries.clone();
        for state in states {
            let at = entries.iter().position(|e| e.id == state.id);
            let Some(v) = at.and_then(|i| loaded[i].as_mut()) else {
                return refuse(format!(
                    "a Muon state for {}, not one of its matrices",
                    state.id
                ));
            };
            if state.velocity.len() != v.v.len() {
                let (want, got) = (v.v.len(), state.velocity.len());
                return refuse(format!(
                    "Muon state of {}: {got} values, not {want}",
                    state.id
                ));
            }
            (v.v, v.step) = (state.velocity, state.step);
        }
        self.muon = Some(Velocities { entries: loaded });
        Ok(())
    }

    /// One step: Muon on its matrices (momentum, Newton–Schulz, the shape-scaled rate
    /// `lr · lr_ratio`), AdamW on the rest at `lr`, along the held gradients, which are then
    /// reset to zero. Needs [`use_muon`](Self::use_muon) first.
    pub fn muon_step(
        &mut self,
        lr: f64,
        adamw: &AdamWSettings,
        settings: &MuonSettings,
    ) -> Result<(), FusedError> {
        self.allocate_gradients();
        let Some(muon) = self.muon.as_mut() else {
            return Err(FusedError::OptimizerState(
                "Muon was not set up (use_muon)".into(),
            ));
        };
        let moments = super::fused::moments_mut(&mut self.moments, &self.weights);
        moments.step_some(&mut self.weights, &self.grads, adamw, lr, |i| {
            muon.updates(i)
        });
        // Nesterov momentum (Burn's `Momentum`, no dampening): v ← g + μ·v, the update
        // orthogonalises g + μ·v. One pass each, then Newton–Schulz a matrix per thread.
        let mut matrices: Vec<&mut Velocity> = muon.entries.iter_mut().flatten().collect();
        for v in matrices.iter_mut() {
            let momentum = settings.momentum_at(v.step) as f32;
            let g = self.grads.slot(v.slot).values();
            for ((v, u), &g) in v.v.iter_mut().zip(&mut v.update).zip(g) {
                *v = g + momentum * *v;
                *u = momentum * *v + g;
            }
            v.step += 1;
        }
        let per = matrices.len().div_ceil(self.work.len().max(1)).max(1);
        std::thread::scope(|scope| {
            for chunk in matrices.chunks_mut(per) {
                scope.spawn(move || {
                    for v in chunk {
                        orthogonalise(&mut v.update, v.rows, v.cols);
                    }
                });
            }
        });
        // w ← w·(1 − lr·decay) − lr·√max(1, rows/cols)·update (a factor of exactly 1 without
        // decay leaves w as it is, as Burn's skipped multiply does).
        let lr = lr * settings.lr_ratio;
        let keep = (1.0 - lr * settings.weight_decay) as f32;
        for v in matrices {
            let scale = (lr * (v.rows as f64 / v.cols as f64).max(1.0).sqrt()) as f32;
            let w = self.weights.slot_mut(v.slot).values_mut();
            w.iter_mut()
                .zip(&v.update)
                .for_each(|(w, u)| *w = *w * keep - scale * u);
        }
        self.reset_gradients();
        Ok(())
    }
}
