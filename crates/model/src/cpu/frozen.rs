//! A LoRA run's frozen base held in `Q8_0` (`[lora] base = "q8_0"`, QLoRA's idea): every
//! block's matrices whose inputs are whole blocks of 32 kept in int8 ([`Int8Columns`], in
//! [`BlockParams::base_q8`]), their f32 buffers [`Buffer::Elsewhere`], 1.0625 bytes a weight
//! instead of 4.
//! Training dequantises one block's matrices at a time into training's own layout
//! ([`dequantised`]) and multiplies by them as by f32 weights, forward and backward (the same
//! kernels as a base holding the rounded values in f32). Lent to Burn's model
//! (checkpoints, samples) they go as f32 and are quantised again when taken back: the model's
//! values were rounded to `Q8_0` when its adapters were attached
//! ([`Gpt::with_lora`](crate::Gpt::with_lora)), and rounding them again gives the same bytes.

use super::buffer::Buffer;
use super::kernels::q8::columns::Int8Columns;
use super::params::{BlockParams, Params, RowBlock, RowMatrix};
use crate::arch::q8_0::BLOCK;
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
    /// inputs are whole blocks moves from its f32 buffer into int8, one at a time.
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
            if !n_in.is_multiple_of(BLOCK) {
                continue;
            }
            if let Some(values) = block.buffer_mut(slot).take(Buffer::Elsewhere) {
                block.base_q8[target as usize] = Some(Int8Columns::quantise(&values, n_in));
            }
        }
    }

    /// A copy of `slot`'s values in Burn's layout (dequantised when held in int8).
    pub(crate) fn values(&self, slot: Slot) -> Vec<f32> {
        match self.int8(slot) {
            Some(m) => m.values(),
            None => self.slot(slot).values().to_vec(),
        }
    }

    /// `slot`'s values in Burn's layout, moved out (dequantised when held in int8, the int8
    /// copy then dropped): it is left [`Buffer::Elsewhere`].
    pub(crate) fn take_values(&mut self, slot: Slot) -> Vec<f32> {
        if let (Slot::Block(l, _), Some(t)) = (slot, block_matrix(slot))
            && let Some(m) = self.blocks[l].base_q8[t as usize].take()
        {
            return m.values();
        }
        let taken = self.slot_mut(slot).take(Buffer::Elsewhere);
        taken.expect("a parameter lent is held")
    }

    /// `slot`'s int8 copy, if it is held so.
    fn int8(&self, slot: Slot) -> Option<&Int8Columns> {
        let Slot::Block(l, _) = slot else {
            return None;
        };
        self.blocks[l].base_q8[block_matrix(slot)? as usize].as_ref()
    }

    /// Bytes of the frozen base's int8 copies.
    pub(crate) fn base_q8_bytes(&self) -> usize {
        let blocks = self.blocks.iter().flat_map(|b| b.base_q8.iter().flatten());
        blocks.map(Int8Columns::bytes).sum()
    }
}

/// Block `p`'s int8 matrices dequantised into `out` in training's layout (its allocations
/// reused), for a step's products: `None` when `p` holds them in f32 (`out` left as it is).
pub(crate) fn dequantised<'a>(p: &BlockParams, out: &'a mut RowBlock) -> Option<&'a RowBlock> {
    if p.base_q8.iter().all(Option::is_none) {
        return None;
    }
    for target in LoraTarget::all() {
        let out = out.get_mut(target);
        match &p.base_q8[target as usize] {
            Some(m) => {
                if !matches!(out, Some(RowMatrix::Columns(_))) {
                    *out = Some(RowMatrix::Columns(Vec::new()));
                }
                if let Some(RowMatrix::Columns(values)) = out {
                    m.dequantise_into(values);
                }
            }
            None => *out = None,
        }
    }
    Some(out)
}
