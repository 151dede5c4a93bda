//! The decoder's matrices each stored as a file says: a [`WeightPlan`] names, for every block's
//! four matrices and the head, the storage of each range of output rows (a GGUF file's
//! `attn_q`, `attn_k` and `attn_v` are one `c_attn` here, and llama.cpp may store them in
//! different types). A range in a type of blocks of 32 is quantised by ggml's reference
//! quantiser, which gives a file made by that quantiser its own blocks back; a range in a
//! k-quant is the file's own blocks ([`Storage::Blocks`]), multiplied as they are.

use std::sync::Arc;

use super::quant::{RowWeights, WeightFormat};
use crate::arch::{BlockSlot, GptConfig, LoraTarget, Mlp, Slot, parameter_table};
use crate::cpu::buffer::Buffer;
use crate::cpu::dims::Dims;
use crate::cpu::error::FusedError;
use crate::cpu::kernels::k_quants::columns::Frozen;
use crate::cpu::kernels::k_quants::q4_1::{Q41, Q51};
use crate::cpu::kernels::k_quants::{KMatrix, q4_k::Q4K, q4_k::Q5K, q6_k::Q6K};
use crate::cpu::kernels::q4_0::Q4Matrix;
use crate::cpu::kernels::q5_0::Q5Matrix;
use crate::cpu::kernels::q8::{BLOCK, Q8Matrix};
use crate::cpu::kernels::rows::F32Rows;
use crate::cpu::params::{BlockParams, Params, RowBlock, RowMatrix};
use crate::nn::Gpt;

/// `rows` consecutive output rows of a matrix, stored as `storage` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub rows: usize,
    pub storage: Storage,
}

/// Where a segment's rows come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// The model's values, quantised as `format` (or kept in f32).
    Quantise(WeightFormat),
    /// A file's blocks, as it stores them.
    Blocks(FileBlocks),
    /// The model's values in the type's blocks by ggml's reference quantiser (what llama.cpp
    /// writes for them); where a row is not whole blocks, in the type llama.cpp falls back to
    /// ([`BlockType::fallback`]), else f32.
    Encode(BlockType),
}

/// The GGUF types whose blocks the decoder multiplies as a file stores them (`Q8_0`, `Q5_0` and
/// `Q4_0` rearranged into its rows' layouts, the others as they are).
pub use crate::arch::BlockType;

/// A range of a file's tensor: `[rows, n_in]` values in `kind`'s super-blocks, row after row,
/// as the file stores them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileBlocks {
    pub kind: BlockType,
    pub bytes: Arc<[u8]>,
}

impl Segment {
    /// `rows` rows of the model's values quantised as `format`.
    pub fn quantised(rows: usize, format: WeightFormat) -> Self {
        Self {
            rows,
            storage: Storage::Quantise(format),
        }
    }
}

/// One block's matrices, each as its segments (top to bottom: their rows add up to the
/// matrix's outputs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockPlan {
    /// Queries, keys and values `[n_embd → q + k + v]`.
    pub qkv: Vec<Segment>,
    /// The attention's output projection.
    pub attn_proj: Vec<Segment>,
    /// The MLP's first matrix (SwiGLU's gate, then up).
    pub fc: Vec<Segment>,
    /// The MLP's second matrix (empty where the block has no MLP).
    pub mlp_proj: Vec<Segment>,
}

/// How the decoder stores each matrix: per block, and the head's (the embedding's rows where
/// tied).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WeightPlan {
    pub blocks: Vec<BlockPlan>,
    pub head: Vec<Segment>,
    /// An untied embedding's rows `[vocab, n_embd]`, each token's looked up in them (a file's
    /// blocks: the values the import made of them); empty: looked up in the model's f32
    /// values.
    pub embedding: Vec<Segment>,
}

impl WeightPlan {
    /// Every matrix of `gpt` one segment in `format`: the plan [`Matrices::Uniform`] follows.
    pub fn uniform(gpt: &Gpt, format: WeightFormat) -> Result<Self, FusedError> {
        Ok(Self::each(
            &Dims::of(gpt)?,
            gpt.h.len(),
            Storage::Quantise(format),
        ))
    }

    /// Every matrix of a model of dimensions `d` and `layers` blocks one segment stored as
    /// `storage`.
    fn each(d: &Dims, layers: usize, storage: Storage) -> Self {
        let one = |rows: usize| {
            vec![Segment {
                rows,
                storage: storage.clone(),
            }]
        };
        let mlp = match d.mlp {
            Mlp::None => (vec![], vec![]),
            Mlp::Gelu | Mlp::GeluTanh | Mlp::Relu2 | Mlp::SwiGlu => (one(d.fc_width), one(d.width)),
        };
        let block = BlockPlan {
            qkv: one(d.qkv_width()),
            attn_proj: one(d.width),
            fc: mlp.0,
            mlp_proj: mlp.1,
        };
        Self {
            blocks: vec![block; layers],
            head: one(d.vocab),
            embedding: vec![],
        }
    }
}

impl WeightPlan {
    /// Whether a decoder following this plan reads `slot`'s f32 values from the model (of a
    /// `tied` head or not). It does not read a block's matrix whose rows are all a file's
    /// blocks ([`Storage::Blocks`]), nor the head's, nor the embedding where its own rows are
    /// (an untied model's) or a tied head's are: the embedding's rows are then looked up in
    /// those blocks, which give the values the import made of them.
    pub fn reads(&self, slot: Slot, tied: bool) -> bool {
        let from_blocks = |segments: &[Segment]| {
            !segments.is_empty()
                && segments
                    .iter()
                    .all(|s| matches!(s.storage, Storage::Blocks(_)))
        };
        match slot {
            Slot::Block(l, at) => {
                let Some(b) = self.blocks.get(l) else {
                    return true;
                };
                match at {
                    BlockSlot::AttnWeight => !from_blocks(&b.qkv),
                    BlockSlot::AttnProjWeight => !from_blocks(&b.attn_proj),
                    BlockSlot::FcWeight => !from_blocks(&b.fc),
                    BlockSlot::MlpProjWeight => !from_blocks(&b.mlp_proj),
                    BlockSlot::Ln1Gain
                    | BlockSlot::Ln1Bias
                    | BlockSlot::AttnBias
                    | BlockSlot::AttnProjBias
                    | BlockSlot::Ln2Gain
                    | BlockSlot::Ln2Bias
                    | BlockSlot::FcBias
                    | BlockSlot::MlpProjBias => true,
                }
            }
            Slot::TokenEmbedding => {
                !(from_blocks(&self.embedding) || tied && from_blocks(&self.head))
            }
            Slot::LmHead => !from_blocks(&self.head),
            Slot::PositionEmbedding
            | Slot::BigramEmbedding
            | Slot::FinalNormGain
            | Slot::FinalNormBias
            | Slot::Adapter { .. } => true,
        }
    }
}

/// The decoder's matrices: every one in one format, every one quantised into one type's
/// blocks ([`Storage::Encode`]), or each as a plan says.
#[derive(Debug, Clone)]
pub enum Matrices {
    Uniform(WeightFormat),
    Encoded(BlockType),
    Planned(Arc<WeightPlan>),
}

impl From<WeightFormat> for Matrices {
    fn from(format: WeightFormat) -> Self {
        Matrices::Uniform(format)
    }
}

impl Matrices {
    /// Whether a decoder with these matrices reads `slot`'s f32 values from the model
    /// ([`WeightPlan::reads`]; every one but where a plan gives a file's blocks).
    pub(crate) fn reads(&self, slot: Slot, tied: bool) -> bool {
        match self {
            Matrices::Uniform(_) | Matrices::Encoded(_) => true,
            Matrices::Planned(plan) => plan.reads(slot, tied),
        }
    }

    /// The parameters of a model of `config`, by Burn path, whose values a decoder with these
    /// matrices never reads ([`WeightPlan::reads`]): a model loaded only to make that decoder
    /// need not read them from its file, nor hold them.
    pub fn unread_parameters(&self, config: &GptConfig) -> Vec<String> {
        let table = parameter_table(config).into_iter();
        table
            .filter(|name| name.present && !self.reads(name.slot, config.tie_embeddings))
            .map(|name| name.burn)
            .collect()
    }

    /// `w`'s matrices as rows, leaving in `w` only what stays in its layout (as
    /// [`RowWeights::take`]); a plan that does not fit the model is an error naming the matrix.
    /// A plan held nowhere else gives up each file's tensor as it is made into the decoder's
    /// rows: a tensor rearranged into them is not held twice while the others are made.
    pub(crate) fn take(self, w: &mut Params, d: &Dims) -> Result<RowWeights, FusedError> {
        match self {
            Matrices::Uniform(format) => Ok(RowWeights::take(w, d, format)),
            Matrices::Encoded(kind) => {
                let mut plan = WeightPlan::each(d, w.blocks.len(), Storage::Encode(kind));
                // An untied embedding in the type's blocks too, as an export in the type
                // writes it and llama.cpp looks it up.
                if !matches!(w.lm_head, Buffer::Absent) {
                    plan.embedding = vec![Segment {
                        rows: d.vocab,
                        storage: Storage::Encode(kind),
                    }];
                }
                planned(w, d, plan)
            }
            Matrices::Planned(plan) => planned(w, d, Arc::unwrap_or_clone(plan)),
        }
    }
}

fn planned(w: &mut Params, d: &Dims, plan: WeightPlan) -> Result<RowWeights, FusedError> {
    if plan.blocks.len() != w.blocks.len() {
        return Err(misfit(format!(
            "the plan has {} blocks, the model {}",
            plan.blocks.len(),
            w.blocks.len()
        )));
    }
    let (c, hidden) = (d.width, d.hidden);
    let mut blocks = Vec::with_capacity(plan.blocks.len());
    for (l, (p, b)) in w.blocks.iter_mut().zip(plan.blocks).enumerate() {
        let part = |name: &str| format!("block {l}'s {name}");
        let block = |p: &mut BlockParams| -> Result<RowBlock, FusedError> {
            Ok(RowBlock {
                c_attn: segmented(
                    &mut p.c_attn_w,
                    (c, d.qkv_width()),
                    b.qkv,
                    &part("queries, keys and values"),
                )?,
                attn_proj: segmented(&mut p.attn_proj_w, (c, c), b.attn_proj, &part("projection"))?,
                c_fc: segmented(
                    &mut p.c_fc_w,
                    (c, d.fc_width),
                    b.fc,
                    &part("first MLP matrix"),
                )?,
                mlp_proj: segmented(
                    &mut p.mlp_proj_w,
                    (hidden, c),
                    b.mlp_proj,
                    &part("MLP projection"),
                )?,
            })
        };
        blocks.push(block(p)?);
    }
    let head = match &w.lm_head {
        // Tied: the embedding's rows, which its lookup reads in f32 where they are held (and
        // from these rows where the plan left them unread: `WeightPlan::reads`).
        Buffer::Absent => Some(stacked(w.wte.get(), (c, d.vocab), plan.head, "head")?),
        _ => segmented(&mut w.lm_head, (c, d.vocab), plan.head, "head")?,
    };
    // An untied embedding's own rows, where the plan gives them (its f32 values, if held,
    // stay for what else reads them).
    let embedding = match plan.embedding.is_empty() {
        true => None,
        false => Some(stacked(
            w.wte.get(),
            (c, d.vocab),
            plan.embedding,
            "embedding",
        )?),
    };
    Ok(RowWeights {
        blocks,
        head,
        embedding,
    })
}

/// `w [n_in, n_out]` as rows stored as `segments` say, its buffer then freed (`None`: a
/// matrix the model lacks, whose segments must be none). A buffer left unread
/// ([`Buffer::Elsewhere`]: [`WeightPlan::reads`]) is made of the segments' blocks alone.
fn segmented(
    w: &mut Buffer,
    (n_in, n_out): (usize, usize),
    segments: Vec<Segment>,
    name: &str,
) -> Result<Option<RowMatrix>, FusedError> {
    let rows = match w {
        Buffer::Held(_) => w
            .take(Buffer::Elsewhere)
            .map(|w| F32Rows::from_columns(&w, n_in).w),
        _ if segments.is_empty() => return Ok(None),
        Buffer::Elsewhere => None,
        Buffer::Absent | Buffer::Frozen => return Err(misfit(format!("the model has no {name}"))),
    };
    stacked(rows.as_deref(), (n_in, n_out), segments, name).map(Some)
}

/// `rows [n_out, n_in]` stored as `segments` say: one matrix where there is one segment.
/// `rows` is `None` where the model's values were not read: then every segment must be a
/// file's blocks.
fn stacked(
    rows: Option<&[f32]>,
    (n_in, n_out): (usize, usize),
    segments: Vec<Segment>,
    name: &str,
) -> Result<RowMatrix, FusedError> {
    if rows.is_some_and(|r| r.len() != n_out * n_in) {
        return Err(misfit(format!("the {name} is not {n_out} rows of {n_in}")));
    }
    let total: usize = segments.iter().map(|s| s.rows).sum();
    if total != n_out || segments.iter().any(|s| s.rows == 0) {
        return Err(misfit(format!(
            "the {name}'s segments hold {total} rows, the matrix {n_out}"
        )));
    }
    let mut parts = Vec::with_capacity(segments.len());
    let mut first = 0;
    for s in segments {
        let values = || {
            let values = rows.map(|rows| &rows[first * n_in..(first + s.rows) * n_in]);
            values.ok_or_else(|| misfit(format!("the {name}'s values were not read")))
        };
        parts.push(match s.storage {
            Storage::Quantise(format) => stored(values()?, n_in, format),
            Storage::Blocks(blocks) => {
                let kind = blocks.kind;
                kept(blocks, s.rows, n_in).ok_or_else(|| {
                    misfit(format!(
                        "{name}: the kept {kind:?} blocks do not hold {} rows of {n_in}",
                        s.rows
                    ))
                })?
            }
            Storage::Encode(kind) => encoded(values()?, s.rows, n_in, kind),
        });
        first += s.rows;
    }
    Ok(match parts.len() {
        1 => parts.pop().expect("one part"),
        _ => RowMatrix::Stacked(parts),
    })
}

/// Rows `[n, n_in]` stored as `format` (f32 where a row is not whole blocks, as llama.cpp
/// keeps such a matrix).
fn stored(rows: &[f32], n_in: usize, format: WeightFormat) -> RowMatrix {
    let blocks = n_in.is_multiple_of(BLOCK);
    match format {
        WeightFormat::Q8_0 if blocks => RowMatrix::Q8(Q8Matrix::from_rows(rows, n_in)),
        WeightFormat::Q5_0 if blocks => RowMatrix::Q5(Q5Matrix::from_rows(rows, n_in)),
        WeightFormat::Q4_0 if blocks => RowMatrix::Q4(Q4Matrix::from_rows(rows, n_in)),
        WeightFormat::F32 | WeightFormat::Q8_0 | WeightFormat::Q5_0 | WeightFormat::Q4_0 => {
            RowMatrix::F32(F32Rows {
                rows: rows.len() / n_in,
                cols: n_in,
                w: rows.to_vec(),
            })
        }
    }
}

/// Rows `[rows, n_in]` quantised into `kind`'s blocks, or its fallback's where a row is not
/// whole blocks of it, or kept in f32 where it is not whole blocks of either.
fn encoded(values: &[f32], rows: usize, n_in: usize, kind: BlockType) -> RowMatrix {
    let fits = |k: &BlockType| n_in.is_multiple_of(k.values());
    let kind = Some(kind).filter(fits).or(kind.fallback().filter(fits));
    let quantised = kind.and_then(|kind| {
        let bytes = FileBlocks {
            kind,
            bytes: kind.encode_rows(values, n_in).into(),
        };
        kept(bytes, rows, n_in)
    });
    quantised.unwrap_or_else(|| stored(values, n_in, WeightFormat::F32))
}

/// A file's blocks of `rows` rows of `n_in`, as it stores them (the bytes shared, or dropped
/// once rearranged into the decoder's layout); `None` where they do not fit.
fn kept(blocks: FileBlocks, rows: usize, n_in: usize) -> Option<RowMatrix> {
    let bytes = blocks.bytes;
    match blocks.kind {
        BlockType::Q8_0 => Q8Matrix::from_gguf(&bytes, rows, n_in).map(RowMatrix::Q8),
        BlockType::Q5_0 => Q5Matrix::from_gguf(&bytes, rows, n_in).map(RowMatrix::Q5),
        BlockType::Q4_0 => Q4Matrix::from_gguf(&bytes, rows, n_in).map(RowMatrix::Q4),
        BlockType::Q4_1 => KMatrix::<Q41>::from_bytes(bytes, rows, n_in).map(RowMatrix::Q41),
        BlockType::Q5_1 => KMatrix::<Q51>::from_bytes(bytes, rows, n_in).map(RowMatrix::Q51),
        BlockType::Q4_K => KMatrix::<Q4K>::from_bytes(bytes, rows, n_in).map(RowMatrix::Q4K),
        BlockType::Q5_K => KMatrix::<Q5K>::from_bytes(bytes, rows, n_in).map(RowMatrix::Q5K),
        BlockType::Q6_K => KMatrix::<Q6K>::from_bytes(bytes, rows, n_in).map(RowMatrix::Q6K),
    }
}

impl RowWeights {
    /// The rows a decoder on a training engine's weights `w` keeps: each block matrix a
    /// quantised LoRA base holds, from its own blocks ([`frozen_rows`]), and an untied head
    /// moved out of `w` (give it back with [`give_back`](Self::give_back)); every other matrix
    /// stays in `w`'s f32 layout, where the decoder multiplies by it as it is.
    pub(crate) fn of_base(w: &mut Params, d: &Dims) -> Self {
        let block = |p: &BlockParams| {
            let mut rows = RowBlock::default();
            for target in LoraTarget::all() {
                let n_in = match target {
                    LoraTarget::Qkv | LoraTarget::AttnProj | LoraTarget::Fc => d.width,
                    LoraTarget::MlpProj => d.hidden,
                };
                let held = p.base_held[target as usize].as_ref();
                *rows.get_mut(target) = held.map(|m| frozen_rows(m, n_in));
            }
            rows
        };
        Self {
            blocks: w.blocks.iter().map(block).collect(),
            head: w.lm_head.take(Buffer::Elsewhere).map(RowMatrix::Columns),
            embedding: None,
        }
    }

    /// Gives `w` back what [`of_base`](Self::of_base) moved out of it.
    pub(crate) fn give_back(self, w: &mut Params) {
        if let Some(RowMatrix::Columns(head)) = self.head {
            w.lm_head = Buffer::Held(head);
        }
    }
}

/// A matrix of `n_in` inputs a LoRA run's quantised base holds ([`Frozen`]) as the decoder's
/// rows, from its own blocks, never rounded again: shared where the decoder multiplies them as
/// a file stores them, copied into its layout for `Q8_0`, `Q5_0` and `Q4_0`; in training's f32
/// layout where rows are held in f32 beside the blocks.
pub(crate) fn frozen_rows(m: &Frozen, n_in: usize) -> RowMatrix {
    let blocks = match m {
        Frozen::Int8(m) => return RowMatrix::Q8(m.rows()),
        Frozen::Blocks(m) => m.blocks(),
    };
    blocks
        .and_then(|(kind, bytes, rows)| kept(FileBlocks { kind, bytes }, rows, n_in))
        .unwrap_or_else(|| RowMatrix::Columns(m.values()))
}

fn misfit(why: String) -> FusedError {
    FusedError::Storage(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(rows: usize) -> Segment {
        let bytes = FileBlocks {
            kind: BlockType::Q4_K,
            bytes: Arc::from(Vec::new()),
        };
        Segment {
            rows,
            storage: Storage::Blocks(bytes),
        }
    }

    #[test]
    fn a_matrix_is_read_unless_every_row_is_a_files_blocks() {
        let block = BlockPlan {
            qkv: vec![blocks(8), Segment::quantised(4, WeightFormat::Q8_0)],
            attn_proj: vec![blocks(8)],
            fc: vec![],
            mlp_proj: vec![blocks(8)],
        };
        let mut plan = WeightPlan {
            blocks: vec![block],
            head: vec![blocks(16)],
            embedding: vec![],
        };
        let tied = |slot| plan.reads(slot, true);
        let at = |s| Slot::Block(0, s);
        assert!(
            tied(at(BlockSlot::AttnWeight)),
            "a range quantised from values"
        );
        assert!(!tied(at(BlockSlot::AttnProjWeight)));
        assert!(!tied(at(BlockSlot::MlpProjWeight)));
        assert!(tied(at(BlockSlot::FcWeight)), "no segment gives its rows");
        assert!(tied(at(BlockSlot::Ln1Gain)) && tied(Slot::FinalNormGain));
        assert!(
            tied(Slot::Block(1, BlockSlot::AttnProjWeight)),
            "a block the plan lacks"
        );
        assert!(
            !tied(Slot::TokenEmbedding),
            "tied: looked up in the head's blocks"
        );
        assert!(plan.reads(Slot::TokenEmbedding, false), "untied: its own");
        assert!(!plan.reads(Slot::LmHead, false));
        plan.embedding = vec![blocks(10), Segment::quantised(6, WeightFormat::Q8_0)];
        assert!(
            plan.reads(Slot::TokenEmbedding, false),
            "a range from values"
        );
        plan.embedding = vec![blocks(16)];
        assert!(
            !plan.reads(Slot::TokenEmbedding, false),
            "untied: its own blocks"
        );
        let uniform = Matrices::Uniform(WeightFormat::Q8_0);
        assert!(uniform.reads(Slot::Block(0, BlockSlot::AttnProjWeight), true));
    }

    /// A quantised base's matrix becomes the decoder's rows with its own values: the blocks
    /// as they are (shared for a k-quant), int8 columns as rows, and values that are not the
    /// type's rounding (rows held in f32 beside the blocks) in training's f32 layout.
    #[test]
    fn a_frozen_matrix_becomes_rows_of_the_same_values() {
        use crate::arch::quants::rounded;
        let layer = |n_in: usize, n_out: usize| -> Vec<f32> {
            (0..n_in * n_out)
                .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 0.1)
                .collect()
        };
        let n_out = 24;
        for (kind, n_in, round) in [
            (BlockType::Q8_0, 64, true),
            (BlockType::Q5_0, 96, true),
            (BlockType::Q4_K, 256, true),
            (BlockType::Q5_0, 96, false),
        ] {
            let mut w = layer(n_in, n_out);
            if round && kind != BlockType::Q8_0 {
                w = rounded(&w, n_in, kind);
            }
            let frozen = Frozen::quantise(&w, n_in, kind);
            let values = frozen.values();
            let rows = frozen_rows(&frozen, n_in);
            let shared = matches!(
                (&rows, kind),
                (RowMatrix::Q8(_), BlockType::Q8_0)
                    | (RowMatrix::Q5(_), BlockType::Q5_0)
                    | (RowMatrix::Q4K(_), BlockType::Q4_K)
            );
            assert_eq!(
                shared, round,
                "{kind:?}: its own blocks only when they hold the values"
            );
            assert_eq!(rows.out_rows(n_in), n_out);
            let mut row = vec![0.0; n_in];
            for j in 0..n_out {
                rows.row_values(j, &mut row);
                for (i, v) in row.iter().enumerate() {
                    assert_eq!(
                        v.to_bits(),
                        values[i * n_out + j].to_bits(),
                        "{kind:?} ({i}, {j})"
                    );
                }
            }
        }
    }
}
