//! A LoRA run's frozen base held in `Q8_0` (`[lora] base = "q8_0"`, QLoRA's idea): every
//! block's matrices whose inputs are whole blocks of 32 kept as int8 rows
//! ([`BlockParams::base_q8`]), their f32 buffers empty, 1.0625 bytes a weight instead of 4.
//! Training multiplies by them dequantised one block's matrices at a time ([`dequantised`]),
//! forward and backward. Lent to Burn's model (checkpoints, samples) they go as f32 and are
//! quantised again when taken back: the model's values were rounded to `Q8_0` when its adapters
//! were attached ([`Gpt::with_lora`](crate::Gpt::with_lora)), and rounding them again gives the
//! same bytes.

use super::kernels::q8::{BLOCK, Q8Matrix};
use super::kernels::rows::F32Rows;
use super::params::{BlockParams, Params, RowBlock, RowMatrix};
use crate::arch::{BaseWeights, BlockSlot, LoraTarget, Slot};

/// The matrix a slot is, if it is one of a block's.
fn block_matrix(slot: Slot) -> Option<LoraTarget> {
    match slot {
        Slot::Block(_, s) => matrix(s),
        Slot::TokenEmbedding
        | Slot::PositionEmbedding
        | Slot::BigramEmbedding
        | Slot::FinalNormGain
        | Slot::FinalNormBias
        | Slot::LmHead
        | Slot::Adapter { .. } => None,
    }
}

/// The matrix a block's slot is, if it is one.
fn matrix(slot: BlockSlot) -> Option<LoraTarget> {
    LoraTarget::all().find(|t| t.weight() == slot)
}

impl Params {
    /// Holds the frozen base as `base` says: with `Q8_0`, every frozen block matrix whose
    /// inputs are whole blocks moves from its f32 buffer into int8 rows, one at a time.
    pub(crate) fn hold_base(&mut self, base: BaseWeights) {
        self.base = base;
        if base == BaseWeights::F32 {
            return;
        }
        let layout = self.shared_layout();
        for entry in layout.entries().iter().filter(|e| !layout.trains(e)) {
            let (Slot::Block(l, slot), &[n_in, _]) = (entry.slot, &entry.shape[..]) else {
                continue;
            };
            let Some(target) = matrix(slot) else {
                continue;
            };
            let block = &mut self.blocks[l];
            if block.buffer(slot).is_empty() || !n_in.is_multiple_of(BLOCK) {
                continue;
            }
            let values = std::mem::take(block.buffer_mut(slot));
            *block.base_q8.get_mut(target) =
                Some(RowMatrix::Q8(Q8Matrix::from_columns(&values, n_in)));
        }
    }

    /// A copy of `slot`'s values in Burn's layout (dequantised when held in int8).
    pub(crate) fn values(&self, slot: Slot) -> Vec<f32> {
        match self.int8(slot) {
            Some(q) => q.to_columns(),
            None => self.slot(slot).to_vec(),
        }
    }

    /// `slot`'s values in Burn's layout, moved out (dequantised when held in int8, the int8
    /// rows then dropped): its buffer is left empty.
    pub(crate) fn take_values(&mut self, slot: Slot) -> Vec<f32> {
        let Some(values) = self.int8(slot).map(Q8Matrix::to_columns) else {
            return std::mem::take(self.slot_mut(slot));
        };
        if let (Slot::Block(l, s), Some(target)) = (slot, block_matrix(slot)) {
            debug_assert_eq!(self.blocks[l].buffer(s).len(), 0);
            *self.blocks[l].base_q8.get_mut(target) = None;
        }
        values
    }

    /// `slot`'s int8 rows, if it is held so.
    fn int8(&self, slot: Slot) -> Option<&Q8Matrix> {
        let Slot::Block(l, _) = slot else {
            return None;
        };
        match self.blocks[l].base_q8.get(block_matrix(slot)?) {
            Some(RowMatrix::Q8(q)) => Some(q),
            Some(RowMatrix::F32(_)) | None => None,
        }
    }

    /// Whether `slot`'s values are held here, in its buffer or as int8 rows.
    pub(crate) fn holds(&self, slot: Slot, len: usize) -> bool {
        self.int8(slot).is_some() || self.slot(slot).len() == len
    }

    /// Bytes of the frozen base's int8 rows.
    pub(crate) fn base_q8_bytes(&self) -> usize {
        self.blocks.iter().map(|b| b.base_q8.bytes()).sum()
    }
}

/// Block `p`'s int8 matrices dequantised into `out` as f32 rows (its allocations reused), for
/// the products of a step: `None` when `p` holds them in f32 (`out` then left as it is).
pub(crate) fn dequantised<'a>(p: &BlockParams, out: &'a mut RowBlock) -> Option<&'a RowBlock> {
    let mut any = false;
    for target in LoraTarget::all() {
        let out = out.get_mut(target);
        match p.base_q8.get(target) {
            Some(RowMatrix::Q8(q)) => {
                if !matches!(out, Some(RowMatrix::F32(_))) {
                    *out = Some(RowMatrix::F32(F32Rows::default()));
                }
                if let Some(RowMatrix::F32(rows)) = out {
                    q.dequantise_into(rows);
                }
                any = true;
            }
            Some(RowMatrix::F32(_)) | None => *out = None,
        }
    }
    any.then_some(&*out)
}
