//! The model's parameters as `f32` buffers, one per parameter, read from a [`Gpt`] and written
//! back as weights or as gradients keyed by its [`ParamId`]s. Which buffers there are, in which
//! order and of which shapes comes from the model's [`ParamLayout`] (the parameter table's
//! present slots): each [`Slot`] names the field it is kept in.

mod model;

use std::sync::Arc;

use super::buffer::Buffer;
use super::kernels::k_quants::columns::Frozen;
use super::kernels::k_quants::q4_1::{Q41Matrix, Q51Matrix};
use super::kernels::k_quants::q4_k::{Q4KMatrix, Q5KMatrix};
use super::kernels::k_quants::q6_k::Q6KMatrix;
use super::kernels::q4_0::Q4Matrix;
use super::kernels::q5_0::Q5Matrix;
use super::kernels::q8::Q8Matrix;
use super::kernels::rows::F32Rows;
use crate::arch::{BaseWeights, BlockSlot, Factor, LoraTarget, Slot};
use crate::optim::ParamLayout;

/// One block's parameters. Linear weights are `[in, out]` as in Burn; what a model lacks (no
/// bias, no gain for `rms_unit`, no shift for RMSNorm, no MLP for `mlp = "none"`) is
/// [`Buffer::Absent`].
#[derive(Debug, Clone, Default)]
pub(crate) struct BlockParams {
    pub ln_1_gamma: Buffer,
    pub ln_1_beta: Buffer,
    /// `[width, qkv_width]` (`3·width` without grouped heads).
    pub c_attn_w: Buffer,
    pub c_attn_b: Buffer,
    /// `[width, width]`.
    pub attn_proj_w: Buffer,
    pub attn_proj_b: Buffer,
    pub ln_2_gamma: Buffer,
    pub ln_2_beta: Buffer,
    /// `[width, fc_width]` (`hidden`, or `2·hidden` for SwiGLU's gate and up).
    pub c_fc_w: Buffer,
    pub c_fc_b: Buffer,
    /// `[hidden, width]`.
    pub mlp_proj_w: Buffer,
    pub mlp_proj_b: Buffer,
    /// The LoRA adapters on its matrices (all absent without).
    pub lora: BlockLora,
    /// Its frozen matrices held quantised (`[lora] base = "q8_0"` or `"q4_k"`, `frozen.rs`), by
    /// [`LoraTarget`], their buffers above then [`Buffer::Elsewhere`]; `None`: in f32 above.
    pub base_held: [Option<Frozen>; 4],
}

/// A LoRA adapter's factors: `a [n_in, rank]`, `b [rank, n_out]`; both absent without one.
#[derive(Debug, Clone, Default)]
pub(crate) struct Adapter {
    pub a: Buffer,
    pub b: Buffer,
}

impl Adapter {
    pub(crate) fn factor(&self, factor: Factor) -> &Buffer {
        match factor {
            Factor::A => &self.a,
            Factor::B => &self.b,
        }
    }

    fn factor_mut(&mut self, factor: Factor) -> &mut Buffer {
        match factor {
            Factor::A => &mut self.a,
            Factor::B => &mut self.b,
        }
    }
}

/// One block's LoRA adapters, one per matrix, their scale (`alpha / rank`) and the dropout on
/// their inputs while training (`[lora] dropout`).
#[derive(Debug, Clone, Default)]
pub(crate) struct BlockLora {
    pub scale: f32,
    pub dropout: f32,
    pub qkv: Adapter,
    pub attn_proj: Adapter,
    pub fc: Adapter,
    pub mlp_proj: Adapter,
}

impl BlockLora {
    /// Whether `target`'s matrix has an adapter.
    pub(crate) fn has(&self, target: LoraTarget) -> bool {
        self.get(target).a != Buffer::Absent
    }

    pub(crate) fn get(&self, target: LoraTarget) -> &Adapter {
        match target {
            LoraTarget::Qkv => &self.qkv,
            LoraTarget::AttnProj => &self.attn_proj,
            LoraTarget::Fc => &self.fc,
            LoraTarget::MlpProj => &self.mlp_proj,
        }
    }

    pub(crate) fn get_mut(&mut self, target: LoraTarget) -> &mut Adapter {
        match target {
            LoraTarget::Qkv => &mut self.qkv,
            LoraTarget::AttnProj => &mut self.attn_proj,
            LoraTarget::Fc => &mut self.fc,
            LoraTarget::MlpProj => &mut self.mlp_proj,
        }
    }
}

/// The rows a token's embedding is looked up in ([`Params::embed`]): the embedding's own
/// (`own`, first: an untied embedding a decoder holds as a file's blocks), its f32 values
/// where held, else a tied head's rows (`tied_head`).
#[derive(Clone, Copy, Default)]
pub(crate) struct Lookup<'a> {
    pub own: Option<&'a RowMatrix>,
    pub tied_head: Option<&'a RowMatrix>,
}

/// A matrix as the decoder keeps it: rows of outputs, each output's weights contiguous
/// (`[n_out, n_in]`, as GGUF stores them), in int8 or f32; or, for a training step, a frozen
/// matrix dequantised into training's layout `[n_in, n_out]` (`frozen.rs`).
#[derive(Debug, Clone)]
pub(crate) enum RowMatrix {
    Q8(Q8Matrix),
    Q4(Q4Matrix),
    Q5(Q5Matrix),
    /// A file's `Q4_K` blocks, as it stores them.
    Q4K(Q4KMatrix),
    /// A file's `Q4_1` blocks, as it stores them.
    Q41(Q41Matrix),
    /// A file's `Q5_1` blocks, as it stores them.
    Q51(Q51Matrix),
    /// A file's `Q5_K` blocks, as it stores them.
    Q5K(Q5KMatrix),
    /// A file's `Q6_K` blocks, as it stores them.
    Q6K(Q6KMatrix),
    F32(F32Rows),
    /// Ranges of output rows stored each its own way (a file's `attn_q`, `attn_k`, `attn_v` as
    /// one matrix), top to bottom; none of them stacked again.
    Stacked(Vec<RowMatrix>),
    Columns(Vec<f32>),
}

/// One block's matrices as the decoder keeps them (`None`: in [`BlockParams`]' f32 layout).
#[derive(Debug, Clone, Default)]
pub(crate) struct RowBlock {
    pub c_attn: Option<RowMatrix>,
    pub attn_proj: Option<RowMatrix>,
    pub c_fc: Option<RowMatrix>,
    pub mlp_proj: Option<RowMatrix>,
}

impl RowBlock {
    /// The rows of `matrix` (named by the adapter it can take).
    pub(crate) fn get(&self, matrix: LoraTarget) -> &Option<RowMatrix> {
        match matrix {
            LoraTarget::Qkv => &self.c_attn,
            LoraTarget::AttnProj => &self.attn_proj,
            LoraTarget::Fc => &self.c_fc,
            LoraTarget::MlpProj => &self.mlp_proj,
        }
    }

    pub(crate) fn get_mut(&mut self, matrix: LoraTarget) -> &mut Option<RowMatrix> {
        match matrix {
            LoraTarget::Qkv => &mut self.c_attn,
            LoraTarget::AttnProj => &mut self.attn_proj,
            LoraTarget::Fc => &mut self.c_fc,
            LoraTarget::MlpProj => &mut self.mlp_proj,
        }
    }

    /// Bytes of its matrices (int8 rows: bytes and scales; f32 rows: 4 a weight).
    pub(crate) fn bytes(&self) -> usize {
        let bytes = |m: &Option<RowMatrix>| m.as_ref().map_or(0, RowMatrix::bytes);
        LoraTarget::all().map(|t| bytes(self.get(t))).sum()
    }
}

/// Output row `j` of the matrix `parts` stack (top to bottom) into `out [n_in]`.
pub(crate) fn stacked_row_values(parts: &[RowMatrix], j: usize, out: &mut [f32]) {
    let mut j = j;
    for part in parts {
        let n = part.out_rows(out.len());
        if j < n {
            return part.row_values(j, out);
        }
        j -= n;
    }
}

impl RowMatrix {
    /// Its output rows, for rows `n_in` long.
    pub(crate) fn out_rows(&self, n_in: usize) -> usize {
        match self {
            RowMatrix::Q8(q) => q.rows,
            RowMatrix::Q4(q) => q.rows,
            RowMatrix::Q5(q) => q.rows,
            RowMatrix::Q4K(q) => q.rows,
            RowMatrix::Q41(q) => q.rows,
            RowMatrix::Q51(q) => q.rows,
            RowMatrix::Q5K(q) => q.rows,
            RowMatrix::Q6K(q) => q.rows,
            RowMatrix::F32(r) => r.rows,
            RowMatrix::Columns(w) => w.len() / n_in,
            RowMatrix::Stacked(parts) => parts.iter().map(|p| p.out_rows(n_in)).sum(),
        }
    }

    /// Output row `j`'s weights into `out [n_in]` (what every product by it multiplies).
    pub(crate) fn row_values(&self, j: usize, out: &mut [f32]) {
        let n_in = out.len();
        match self {
            RowMatrix::Q8(q) => q.dequantise_row(j, out),
            RowMatrix::Q4(q) => q.dequantise_row(j, out),
            RowMatrix::Q5(q) => q.dequantise_row(j, out),
            RowMatrix::Q4K(q) => q.dequantise_row(j, out),
            RowMatrix::Q41(q) => q.dequantise_row(j, out),
            RowMatrix::Q51(q) => q.dequantise_row(j, out),
            RowMatrix::Q5K(q) => q.dequantise_row(j, out),
            RowMatrix::Q6K(q) => q.dequantise_row(j, out),
            RowMatrix::F32(r) => out.copy_from_slice(&r.w[j * n_in..(j + 1) * n_in]),
            RowMatrix::Columns(w) => {
                let n_out = w.len() / n_in;
                out.iter_mut()
                    .enumerate()
                    .for_each(|(i, o)| *o = w[i * n_out + j]);
            }
            RowMatrix::Stacked(parts) => stacked_row_values(parts, j, out),
        }
    }

    /// Bytes it holds (blocks: values and scales; f32: 4 a weight).
    pub(crate) fn bytes(&self) -> usize {
        match self {
            RowMatrix::Q8(q) => q.bytes(),
            RowMatrix::Q4(q) => q.bytes(),
            RowMatrix::Q5(q) => q.bytes(),
            RowMatrix::Q4K(q) => q.bytes(),
            RowMatrix::Q41(q) => q.bytes(),
            RowMatrix::Q51(q) => q.bytes(),
            RowMatrix::Q5K(q) => q.bytes(),
            RowMatrix::Q6K(q) => q.bytes(),
            RowMatrix::F32(r) => 4 * r.w.len(),
            RowMatrix::Columns(w) => 4 * w.len(),
            RowMatrix::Stacked(parts) => parts.iter().map(RowMatrix::bytes).sum(),
        }
    }
}

/// The field each of a block's slots is kept in: one exhaustive match each way (shared and
/// mutable), so a slot added to the table does not compile until it has a field.
macro_rules! block_fields {
    ($($slot:ident => $field:ident),* $(,)?) => {
        impl BlockParams {
            pub(crate) fn buffer(&self, slot: BlockSlot) -> &Buffer {
                match slot {
                    $(BlockSlot::$slot => &self.$field,)*
                }
            }

            pub(crate) fn buffer_mut(&mut self, slot: BlockSlot) -> &mut Buffer {
                match slot {
                    $(BlockSlot::$slot => &mut self.$field,)*
                }
            }
        }
    };
}

block_fields! {
    Ln1Gain => ln_1_gamma,
    Ln1Bias => ln_1_beta,
    AttnWeight => c_attn_w,
    AttnBias => c_attn_b,
    AttnProjWeight => attn_proj_w,
    AttnProjBias => attn_proj_b,
    Ln2Gain => ln_2_gamma,
    Ln2Bias => ln_2_beta,
    FcWeight => c_fc_w,
    FcBias => c_fc_b,
    MlpProjWeight => mlp_proj_w,
    MlpProjBias => mlp_proj_b,
}

/// Where a slot's buffer is kept within its block: one of the block's parameters, or a factor
/// of one of its LoRA adapters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InBlock {
    Param(BlockSlot),
    Factor(LoraTarget, Factor),
}

/// The block `slot` belongs to and its place there; `None` for the embeddings, the final norm
/// and the head, which no block holds.
pub(crate) fn in_block(slot: Slot) -> Option<(usize, InBlock)> {
    match slot {
        Slot::Block(l, s) => Some((l, InBlock::Param(s))),
        Slot::Adapter {
            layer,
            target,
            factor,
            ..
        } => Some((layer, InBlock::Factor(target, factor))),
        Slot::TokenEmbedding
        | Slot::PositionEmbedding
        | Slot::BigramEmbedding
        | Slot::FinalNormGain
        | Slot::FinalNormBias
        | Slot::LmHead => None,
    }
}

impl BlockParams {
    /// The buffer kept at `at`.
    pub(crate) fn part(&self, at: InBlock) -> &Buffer {
        match at {
            InBlock::Param(s) => self.buffer(s),
            InBlock::Factor(target, factor) => self.lora.get(target).factor(factor),
        }
    }

    pub(crate) fn part_mut(&mut self, at: InBlock) -> &mut Buffer {
        match at {
            InBlock::Param(s) => self.buffer_mut(s),
            InBlock::Factor(target, factor) => self.lora.get_mut(target).factor_mut(factor),
        }
    }
}

/// Every parameter of a [`Gpt`] (or a gradient of the same shape): a buffer per slot of its
/// [`ParamLayout`], kept in fields by kind for the kernels; slots outside the layout are
/// [`Buffer::Absent`], a gradient of a frozen parameter [`Buffer::Frozen`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Params {
    /// The parameters there are, in the order every loop over all of them takes.
    layout: Arc<ParamLayout>,
    /// `[vocab, width]`; also the LM head when tied.
    pub wte: Buffer,
    /// `[block_size, width]`.
    pub wpe: Buffer,
    /// The bigram table, `[(vocab + 1)·vocab, width]` (absent without one).
    pub bigram: Buffer,
    pub blocks: Vec<BlockParams>,
    pub ln_f_gamma: Buffer,
    pub ln_f_beta: Buffer,
    /// Untied head `[width, vocab]`; absent when tied.
    pub lm_head: Buffer,
    /// How the frozen base's matrices are held here between uses (`[lora] base`; `frozen.rs`).
    pub(crate) base: BaseWeights,
}

impl Params {
    fn buffer(&self, slot: Slot) -> &Buffer {
        match slot {
            Slot::TokenEmbedding => &self.wte,
            Slot::PositionEmbedding => &self.wpe,
            Slot::BigramEmbedding => &self.bigram,
            Slot::Block(l, s) => self.blocks[l].buffer(s),
            Slot::FinalNormGain => &self.ln_f_gamma,
            Slot::FinalNormBias => &self.ln_f_beta,
            Slot::LmHead => &self.lm_head,
            Slot::Adapter {
                layer,
                target,
                factor,
                ..
            } => self.blocks[layer].lora.get(target).factor(factor),
        }
    }

    fn buffer_mut(&mut self, slot: Slot) -> &mut Buffer {
        match slot {
            Slot::TokenEmbedding => &mut self.wte,
            Slot::PositionEmbedding => &mut self.wpe,
            Slot::BigramEmbedding => &mut self.bigram,
            Slot::Block(l, s) => self.blocks[l].buffer_mut(s),
            Slot::FinalNormGain => &mut self.ln_f_gamma,
            Slot::FinalNormBias => &mut self.ln_f_beta,
            Slot::LmHead => &mut self.lm_head,
            Slot::Adapter {
                layer,
                target,
                factor,
                ..
            } => self.blocks[layer].lora.get_mut(target).factor_mut(factor),
        }
    }

    /// The layout these buffers follow.
    pub(crate) fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The same layout, shared.
    pub(crate) fn shared_layout(&self) -> Arc<ParamLayout> {
        self.layout.clone()
    }

    /// The buffer of `slot` ([`Buffer::Absent`] where the model lacks it).
    pub(crate) fn slot(&self, slot: Slot) -> &Buffer {
        self.buffer(slot)
    }

    pub(crate) fn slot_mut(&mut self, slot: Slot) -> &mut Buffer {
        self.buffer_mut(slot)
    }

    /// `out [width] = wte[token] + wpe[position] + bigram[pair]`: one token's input to the
    /// first block (`wte[token]` alone without a position table, rotary positions or none;
    /// `pair`, its row of the bigram table, with one: [`Dims::pair`](super::dims::Dims::pair)).
    ///
    /// Where the decoder holds the embedding's own rows (an untied model's, a file's blocks),
    /// `wte[token]` is their row `token`; where the embedding is not held here (a tied model
    /// whose head a decoder reads from a file's blocks:
    /// [`WeightPlan::reads`](crate::WeightPlan::reads)), that head's row.
    pub(crate) fn embed(
        &self,
        out: &mut [f32],
        (token, position, pair): (usize, usize, usize),
        rows: Lookup<'_>,
    ) {
        let c = out.len();
        let (te, pe) = (token * c, position * c);
        match (rows.own, self.wte.get(), rows.tied_head) {
            (Some(own), _, _) => own.row_values(token, out),
            (None, Some(wte), _) => out.copy_from_slice(&wte[te..te + c]),
            (None, None, Some(head)) => head.row_values(token, out),
            (None, None, None) => panic!("the embedding is neither held nor a tied head's rows"),
        }
        if let Some(wpe) = self.wpe.get() {
            out.iter_mut()
                .zip(&wpe[pe..pe + c])
                .for_each(|(x, b)| *x += b);
        }
        if let Some(bigram) = self.bigram.get() {
            let row = &bigram[pair * c..(pair + 1) * c];
            out.iter_mut().zip(row).for_each(|(x, b)| *x += b);
        }
    }

    /// The dropout on the adapters' inputs (0: none, or no adapters).
    pub(crate) fn lora_dropout(&self) -> f32 {
        self.blocks.first().map_or(0.0, |b| b.lora.dropout)
    }

    /// Zeros shaped like `like`'s trained parameters, kept allocations reused: gradients and
    /// optimizer moments. A frozen parameter's (the base of a model with LoRA adapters,
    /// [`ParamLayout::trains`]) is [`Buffer::Frozen`]: the kernels compute no gradient for it.
    pub(crate) fn zero_like(&mut self, like: &Self) {
        self.blocks.resize_with(like.blocks.len(), Default::default);
        self.layout = like.layout.clone();
        for entry in like.layout.entries() {
            let len = entry.shape.iter().product();
            let buffer = self.slot_mut(entry.slot);
            match like.layout.trains(entry) {
                true => buffer.zero(len),
                false => *buffer = Buffer::Frozen,
            }
        }
    }

    /// `self += other`, slot by slot, for the slots `keep` keeps.
    pub(crate) fn add_where(&mut self, other: &Self, keep: impl Fn(Slot) -> bool) {
        for entry in other.layout.entries().iter().filter(|e| keep(e.slot)) {
            if let (Some(sum), Some(add)) = (
                self.slot_mut(entry.slot).get_mut(),
                other.slot(entry.slot).get(),
            ) {
                sum.iter_mut().zip(add).for_each(|(a, b)| *a += b);
            }
        }
    }

    /// The Euclidean norm of all values together, summed in f64 in the layout's order.
    pub(crate) fn norm(&self) -> f64 {
        let squares: f64 = self
            .layout
            .entries()
            .iter()
            .map(|entry| {
                let values = self.slot(entry.slot).or_none();
                values.iter().map(|&g| f64::from(g * g)).sum::<f64>()
            })
            .sum();
        squares.sqrt()
    }

    /// Multiplies every value by `factor`.
    pub(crate) fn scale(&mut self, factor: f32) {
        let layout = self.layout.clone();
        for entry in layout.entries() {
            if let Some(values) = self.slot_mut(entry.slot).get_mut() {
                values.iter_mut().for_each(|g| *g *= factor);
            }
        }
    }
}
