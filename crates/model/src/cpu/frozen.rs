//! A LoRA run's frozen base held quantised (QLoRA's idea): with `[lora] base = "q8_0"` every
//! block's matrices whose inputs are whole blocks of 32 kept in int8 ([`Int8Columns`]), 1.0625
//! bytes a weight instead of 4; with `"q4_k"` in `Q4_K`'s super-blocks, or `Q5_0`'s blocks
//! where the inputs are not whole super-blocks ([`BlockColumns`]), 0.5625 or 0.6875 bytes a
//! weight; in [`BlockParams::base_held`], their f32 buffers [`Buffer::Elsewhere`].
//! Training dequantises one block's matrices at a time into training's own layout
//! ([`dequantised`]) and multiplies by them as by f32 weights, forward and backward (the same
//! kernels as a base holding the rounded values in f32). Lent to Burn's model
//! (checkpoints, samples) they go as f32 and are quantised again when taken back: the model's
//! values were rounded to `Q8_0` when its adapters were attached
//! ([`Gpt::with_lora`](crate::Gpt::with_lora)), and rounding them again gives the same bytes
//! (where it would not, [`BlockColumns`] keeps those rows in f32: the values are always the
//! model's).

use super::buffer::Buffer;
use super::decode::BlockType;
use super::kernels::k_quants::columns::{BlockColumns, rounded};
use super::kernels::q8::columns::Int8Columns;
use super::params::{BlockParams, Params, RowBlock, RowMatrix};
use crate::arch::q8_0::round_columns;
use crate::arch::{BaseWeights, BlockSlot, LoraTarget, Slot};

/// A frozen matrix as a quantised base holds it.
#[derive(Debug, Clone)]
pub(crate) enum Frozen {
    Int8(Int8Columns),
    Blocks(BlockColumns),
}

/// `w [n_in, n_out]` rounded along its inputs to the blocks `base` holds it in (unchanged
/// where it holds it in f32): the values Burn's model computes with once its adapters are
/// attached, and which the engine holds again bit for bit.
pub(crate) fn round_for(base: BaseWeights, w: &mut Vec<f32>, n_in: usize) {
    match held_as(base, n_in) {
        None => {}
        Some(BlockType::Q8_0) => round_columns(w, n_in),
        Some(kind) => *w = rounded(w, n_in, kind),
    }
}

/// How `base` holds a frozen matrix of `n_in` inputs: `None` in f32.
pub(crate) fn held_as(base: BaseWeights, n_in: usize) -> Option<BlockType> {
    let fits = |kind: BlockType| n_in.is_multiple_of(kind.values()).then_some(kind);
    match base {
        BaseWeights::F32 => None,
        BaseWeights::Q8_0 => fits(BlockType::Q8_0),
        BaseWeights::Q4K => fits(BlockType::Q4_K).or_else(|| fits(BlockType::Q5_0)),
    }
}

impl Frozen {
    /// `values [n_in, n_out]` held as `kind` (`Q8_0` in int8 columns).
    fn quantise(values: &[f32], n_in: usize, kind: BlockType) -> Self {
        match kind {
            BlockType::Q8_0 => Frozen::Int8(Int8Columns::quantise(values, n_in)),
            _ => Frozen::Blocks(BlockColumns::quantise(values, n_in, kind)),
        }
    }

    /// Its values into `out` `[n_in, n_out]` (its allocation reused).
    fn dequantise_into(&self, out: &mut Vec<f32>) {
        match self {
            Frozen::Int8(m) => m.dequantise_into(out),
            Frozen::Blocks(m) => m.dequantise_into(out),
        }
    }

    /// Its values as a new `[n_in, n_out]` buffer.
    fn values(&self) -> Vec<f32> {
        match self {
            Frozen::Int8(m) => m.values(),
            Frozen::Blocks(m) => m.values(),
        }
    }

    /// Bytes it holds.
    fn bytes(&self) -> usize {
        match self {
            Frozen::Int8(m) => m.bytes(),
            Frozen::Blocks(m) => m.bytes(),
        }
    }
}

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
    /// Holds the frozen base as `base` says ([`held_as`]): every frozen block matrix it
    /// quantises moves from its f32 buffer into its blocks, one at a time.
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
            let Some(kind) = held_as(base, n_in) else {
                continue;
            };
            if let Some(values) = block.buffer_mut(slot).take(Buffer::Elsewhere) {
                block.base_held[target as usize] = Some(Frozen::quantise(&values, n_in, kind));
            }
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
