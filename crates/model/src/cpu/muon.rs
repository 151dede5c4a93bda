//! Muon on the fused engine's buffers: the blocks' matrices take Nesterov momentum
//! orthogonalised by Newton–Schulz, the other parameters AdamW ([`super::adamw`]), as the
//! trainer's Burn optimizer does with its Muon group (Burn's `Muon` algorithm: Nesterov
//! momentum without dampening, Frobenius normalisation clamped at 1e-7, five quintic steps with
//! (3.4445, −4.775, 2.0315) on the wide orientation, the learning rate scaled by
//! `√max(1, rows/cols)` of the `[in, out]` weight). Newton–Schulz runs on the engine's own
//! matmuls, one matrix per thread.

use burn::module::ParamId;

use super::matmul::{View, matmul_into};
use super::{FusedCpu, FusedError};
use crate::AdamWSettings;

/// Muon's settings: its learning rate relative to the schedule's, its momentum warm-up and
/// weight decay. The trainer's `[train]` `muon_*` keys.
#[derive(Debug, Clone, PartialEq)]
pub struct MuonSettings {
    /// Muon's learning rate over the schedule's (`muon_learning_rate / learning_rate`): the
    /// schedule moves both groups together.
    pub lr_ratio: f64,
    pub momentum: f64,
    pub momentum_start: f64,
    /// Steps over which the momentum goes from `momentum_start` to `momentum`; 0 = none.
    pub warmup: usize,
    /// Decoupled weight decay, `w ← w·(1 − lr·decay)` at Muon's learning rate.
    pub weight_decay: f64,
}

impl MuonSettings {
    /// The momentum of the update after `step` earlier ones: linear warm-up, then constant.
    pub fn momentum_at(&self, step: u64) -> f64 {
        let done = match self.warmup {
            0 => 1.0,
            w => (step as f64 / w as f64).min(1.0),
        };
        self.momentum_start + done * (self.momentum - self.momentum_start)
    }
}

/// Newton–Schulz's coefficients, steps and normalisation floor (Burn's and Keller Jordan's).
pub const NEWTON_SCHULZ: (f32, f32, f32) = (3.4445, -4.775, 2.0315);
pub const NEWTON_SCHULZ_STEPS: usize = 5;
pub const NEWTON_SCHULZ_EPSILON: f32 = 1e-7;

/// One matrix's Muon state, as Burn's optimizer record keeps it: the momentum buffer (flat, in
/// the parameter's shape) and the updates taken.
#[derive(Debug, Clone, PartialEq)]
pub struct VelocityState {
    pub id: ParamId,
    pub shape: Vec<usize>,
    pub step: u64,
    pub velocity: Vec<f32>,
}

/// Muon's state per entry of the layout: `Some` for the matrices it updates.
#[derive(Debug, Default)]
pub(crate) struct Velocities {
    entries: Vec<Option<Velocity>>,
}

#[derive(Debug, Clone)]
struct Velocity {
    /// The weight's slot and `[rows, cols]`, the buffer (zeros before the first step: `v = g`)
    /// and the update's, kept between steps.
    slot: crate::Slot,
    rows: usize,
    cols: usize,
    v: Vec<f32>,
    update: Vec<f32>,
    step: u64,
}

impl Velocities {
    /// Whether layout entry `i` is one of Muon's matrices.
    pub(crate) fn updates(&self, i: usize) -> bool {
        self.entries.get(i).is_some_and(Option::is_some)
    }
}

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
        let velocity = |e: &crate::LayoutEntry| Velocity {
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
        let Some(muon) = self.muon.as_mut() else {
            return Err(FusedError::OptimizerState(
                "Muon was not set up (use_muon)".into(),
            ));
        };
        let weights = &mut self.weights;
        let moments = self
            .moments
            .get_or_insert_with(|| super::adamw::Moments::zeros(weights));
        moments.step_some(weights, &self.grads, adamw, lr, |i| muon.updates(i));
        // Nesterov momentum (Burn's `Momentum`, no dampening): v ← g + μ·v, the update
        // orthogonalises g + μ·v. One pass each, then Newton–Schulz a matrix per thread.
        let mut matrices: Vec<&mut Velocity> = muon.entries.iter_mut().flatten().collect();
        for v in matrices.iter_mut() {
            let momentum = settings.momentum_at(v.step) as f32;
            let g = self.grads.slot(v.slot);
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
            let w = weights.slot_mut(v.slot);
            w.iter_mut()
                .zip(&v.update)
                .for_each(|(w, u)| *w = *w * keep - scale * u);
        }
        self.grads.zero_like(&self.weights);
        Ok(())
    }
}

/// `g` (`[rows, cols]`, row-major) replaced by the nearest semi-orthogonal matrix, about
/// (`U·Vᵀ` of its SVD): the quintic Newton–Schulz iteration on `g / ‖g‖_F`, on the wide
/// orientation (a tall matrix is transposed first and back after), as Burn's
/// `zeropower_via_newtonschulz`.
pub(crate) fn orthogonalise(g: &mut [f32], rows: usize, cols: usize) {
    let tall = rows > cols;
    let (r, c) = if tall { (cols, rows) } else { (rows, cols) };
    let mut x = match tall {
        true => transpose(g, rows, cols),
        false => g.to_vec(),
    };
    let norm = x
        .iter()
        .map(|v| v * v)
        .sum::<f32>()
        .sqrt()
        .max(NEWTON_SCHULZ_EPSILON);
    x.iter_mut().for_each(|v| *v /= norm);
    let (a, b, cc) = NEWTON_SCHULZ;
    let (mut gram, mut poly, mut next) = (vec![0.0; r * r], vec![0.0; r * r], vec![0.0; r * c]);
    for _ in 0..NEWTON_SCHULZ_STEPS {
        // gram = x·xᵀ; poly = b·gram + c·gram·gram; x = a·x + poly·x.
        let xv = View::new(&x, r, c);
        matmul_into(&mut gram, r, xv, xv.t(), 1.0, false);
        poly.iter_mut().zip(&gram).for_each(|(p, &q)| *p = b * q);
        let gv = View::new(&gram, r, r);
        matmul_into(&mut poly, r, gv, gv, cc, true);
        next.iter_mut().zip(&x).for_each(|(n, &v)| *n = a * v);
        matmul_into(&mut next, c, View::new(&poly, r, r), xv, 1.0, true);
        std::mem::swap(&mut x, &mut next);
    }
    match tall {
        true => g.copy_from_slice(&transpose(&x, cols, rows)),
        false => g.copy_from_slice(&x),
    }
}

/// `[rows, cols]` row-major into `[cols, rows]`.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; m.len()];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = m[i * cols + j];
        }
    }
    t
}
