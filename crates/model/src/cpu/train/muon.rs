//! Muon on the fused engine's buffers (the step itself is [`FusedCpu::muon_step`](crate::FusedCpu::muon_step), in
//! `fused_muon.rs`): the blocks' matrices take Nesterov momentum
//! orthogonalised by Newton–Schulz, the other parameters AdamW ([`super::adamw`]), as the
//! trainer's Burn optimizer does with its Muon group (Burn's `Muon` algorithm: Nesterov
//! momentum without dampening, Frobenius normalisation clamped at 1e-7, five quintic steps with
//! (3.4445, −4.775, 2.0315) on the wide orientation, the learning rate scaled by
//! `√max(1, rows/cols)` of the `[in, out]` weight). Newton–Schulz runs on the engine's own
//! matmuls, one matrix per thread.

use crate::arch::Slot;
use crate::cpu::kernels::matmul::{View, matmul_into};
use crate::optim::{NEWTON_SCHULZ, NEWTON_SCHULZ_EPSILON, NEWTON_SCHULZ_STEPS};

/// Muon's state per entry of the layout: `Some` for the matrices it updates.
#[derive(Debug, Default)]
pub(crate) struct Velocities {
    pub entries: Vec<Option<Velocity>>,
}

#[derive(Debug, Clone)]
pub(crate) struct Velocity {
    /// The weight's slot and `[rows, cols]`, the buffer (zeros before the first step: `v = g`)
    /// and the update's, kept between steps.
    pub slot: Slot,
    pub rows: usize,
    pub cols: usize,
    pub v: Vec<f32>,
    pub update: Vec<f32>,
    pub step: u64,
}

impl Velocities {
    /// Whether layout entry `i` is one of Muon's matrices.
    pub(crate) fn updates(&self, i: usize) -> bool {
        self.entries.get(i).is_some_and(Option::is_some)
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
