//! A LoRA run's frozen base held quantised (QLoRA's idea): with `[lora] base = "q8_0"` every
//! block's matrices whose inputs are whole blocks of 32 kept in int8 ([`Int8Columns`]), 1.0625
//! bytes a weight instead of 4; with `"q4_k"` in `Q4_K`'s super-blocks, or `Q5_0`'s blocks
//! where the inputs are not whole super-blocks ([`BlockColumns`]), 0.5625 or 0.6875 bytes a
//! weight; in [`BlockParams::base_held`], their f32 buffers [`Buffer::Elsewhere`].
//! Training dequantises one block's matrices at a time into training's own layout
//! ([`dequantised`]) and multiplies by them as by f32 weights, forward and backward (the same
//! kernels as a base holding the rounded values in f32). Lent to Burn's model (where the
//! trainer asks for the whole model: its checkpoints, samples and attention maps need none of
//! the base from it) they go as f32 and are quantised again when taken back: the model's
//! values were rounded to `Q8_0` when its adapters were attached
//! ([`Gpt::with_lora`](crate::Gpt::with_lora)), and rounding them again gives the same bytes
//! (where it would not, [`BlockColumns`] keeps those rows in f32: the values are always the
//! model's).

use super::buffer::Buffer;
use super::kernels::k_quants::columns::Frozen;
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
    /// Holds the frozen base as `base` says ([`BaseWeights::held_as`]): every frozen block matrix it
    /// quantises moves from its f32 buffer into its blocks, one at a time.
    pub(crate) fn hold_base(&mut self, base: BaseWeights) {
        self.base = base;
        if base == BaseWeights::F32 {
            return;
        }
        let layout = self.shared_layout();
        for entry in layout.entries().iter().filter(|e| !layout.trains(e)) {
            if let &[n_in, _] = &entry.shape[..] {
                self.hold_matrix(entry.slot, n_in);
            }
        }
    }

    /// Holds frozen `slot` (a matrix of `n_in` inputs) as the base says, if it is a block
    /// matrix the base quantises and its f32 values are here: as each comes in
    /// ([`take`](Self::take), [`reclaim`](Self::reclaim)), so that the base is never held
    /// whole in f32.
    pub(crate) fn hold_matrix(&mut self, slot: Slot, n_in: usize) {
        let (Slot::Block(l, slot), Some(kind)) = (slot, self.base.held_as(n_in)) else {
            return;
        };
        let Some(target) = matrix(slot) else {
            return;
        };
        let layout = self.layout();
        let whole = Slot::Block(l, slot);
        if !layout
            .entries()
            .iter()
            .any(|e| e.slot == whole && !layout.trains(e))
        {
            return;
        }
        let block = &mut self.blocks[l];
        if let Some(values) = block.buffer_mut(slot).take(Buffer::Elsewhere) {
            block.base_held[target as usize] = Some(Frozen::quantise(&values, n_in, kind));
        }
    }

    /// A copy of `slot`'s values in Burn's layout (dequantised when held quantised).
    pub(crate) fn values(&self, slot: Slot) -> Vec<f32> {
        match self.held(slot) {
            Some(m) => m.values(),
            None => self.slot(slot).values().to_vec(),
        }
    }

    /// `slot`'s values in Burn's layout, moved out (dequantised when held quantised, the
    /// quantised copy then dropped): it is left [`Buffer::Elsewhere`].
    pub(crate) fn take_values(&mut self, slot: Slot) -> Vec<f32> {
        if let (Slot::Block(l, _), Some(t)) = (slot, block_matrix(slot))
            && let Some(m) = self.blocks[l].base_held[t as usize].take()
        {
            return m.values();
        }
        let taken = self.slot_mut(slot).take(Buffer::Elsewhere);
        taken.expect("a parameter lent is held")
    }

    /// `slot`'s quantised copy, if it is held so.
    fn held(&self, slot: Slot) -> Option<&Frozen> {
        let Slot::Block(l, _) = slot else {
            return None;
        };
        self.blocks[l].base_held[block_matrix(slot)? as usize].as_ref()
    }

    /// Bytes of the frozen base's quantised copies.
    pub(crate) fn base_held_bytes(&self) -> usize {
        let blocks = self
            .blocks
            .iter()
            .flat_map(|b| b.base_held.iter().flatten());
        blocks.map(Frozen::bytes).sum()
    }
}

/// Block `p`'s quantised matrices dequantised into `out` in training's layout (its
/// allocations reused), for a step's products: `None` when `p` holds them in f32 (`out` left
/// as it is).
pub(crate) fn dequantised<'a>(p: &BlockParams, out: &'a mut RowBlock) -> Option<&'a RowBlock> {
    if p.base_held.iter().all(Option::is_none) {
        return None;
    }
    for target in LoraTarget::all() {
        let out = out.get_mut(target);
        match &p.base_held[target as usize] {
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
