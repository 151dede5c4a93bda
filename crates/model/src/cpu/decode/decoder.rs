//! [`FusedDecoder`]: sampling's forward pass on the CPU, with a KV cache, by the same kernels as
//! the fused training step.
//!
//! Sampling feeds one token at a time, so every product is a vector times a matrix: Burn pays a
//! kernel launch, an allocation and a tensor op's bookkeeping for each of the ~20 ops per layer,
//! which costs more than the arithmetic at the baby size. Here a token is one pass over the
//! weights with no allocation.

use std::sync::Arc;

use tinygpt_attention::AttentionError;

use super::attend::{Cache, attend, attend_cached, attend_chunk, attend_window};
use super::cache::StreamCache;
use super::plan::Matrices;
use super::quant::{RowWeights, WeightFormat};
use crate::cpu::block::{self, BlockActs, Ctx, Weight, linear_split};
use crate::cpu::dims::Dims;
use crate::cpu::error::FusedError;
use crate::cpu::kernels::matmul::dot;
use crate::cpu::kernels::norm::{self, Normed};
use crate::cpu::kernels::{rope, softcap};
use crate::cpu::params::{Params, RowMatrix};
use crate::cpu::spin_pool::{Helpers, SpinPool, split_columns};
use crate::error::ModelError;
use crate::nn::Gpt;
use crate::optim::ParamLayout;
use crate::sample::Decoder;

/// The most tokens of a prompt (or of a window rebuilt) one forward pass reads; longer ones go
/// through in chunks of this many. A server decoding many streams feeds a long prompt a chunk a
/// step, so the others wait one chunk's time between their tokens, not the whole prompt's; a
/// chunk is long enough that its products run at the blocked kernels' speed.
pub const PREFILL_CHUNK: usize = 256;

/// A [`Gpt`]'s weights read onto the host, and the keys and values of the tokens fed so far
/// (one sequence). Gives the same logits as [`Gpt::forward`] to float rounding; the tests
/// check it.
///
/// ```text
/// let mut decoder = FusedDecoder::new(&model)?;
/// let tokens = tinygpt_model::generate(&mut decoder, &prompt, &options, |id| print(id))?;
/// ```
#[derive(Debug)]
pub struct FusedDecoder {
    dims: Dims,
    /// The weights, read-only while decoding: shared by the decoders made with
    /// [`FusedDecoder::share`].
    shared: Arc<DecoderWeights>,
    /// Threads besides the caller's that share each token's products (none by default).
    helpers: SpinPool,
    /// Per block, the cached keys and values `[block_size, kv_width]` (`width` without grouped
    /// heads); rows `0..len` are filled.
    cache: StreamCache,
    /// The residual stream of the rows being fed `[rows, width]`, into and out of a block.
    x: Vec<f32>,
    next: Vec<f32>,
    /// A block's activations for those rows (the training step's, without dropout).
    acts: BlockActs,
    /// Rotary positions' tables (empty without them).
    rope: rope::Tables,
    /// One row of attention scores.
    scores: Vec<f32>,
    /// The final norm and head of the last row, and its logits.
    head: HeadRows,
    /// While [`FusedDecoder::attention_maps`] runs: which blocks' weights it keeps, and those
    /// kept so far.
    maps: Option<Maps>,
}

/// What [`FusedDecoder::attention_maps`] keeps while its pass runs.
#[derive(Debug)]
struct Maps {
    /// Per block, whether its weights are wanted.
    wanted: Vec<bool>,
    /// Per block so far, its weights `[heads, seq, seq]` (empty where not wanted).
    kept: Vec<Vec<f32>>,
}

/// A decoder's weights: what the matrices left in [`Params`]' layout (embeddings, norms,
/// biases) and the matrices as rows, in f32 or `Q8_0` (their buffers in `weights` then empty).
#[derive(Debug)]
struct DecoderWeights {
    weights: Params,
    matrices: RowWeights,
}

/// The final norm and the LM head of rows that each want the logits of their next token,
/// computed row by row as one stream alone (so [`FusedDecoder`]'s last row and
/// [`FusedBatch`](super::FusedBatch)'s rows give the same numbers), and their scratch.
#[derive(Debug, Default)]
pub(crate) struct HeadRows {
    ln_f: Vec<f32>,
    mean: Vec<f32>,
    rstd: Vec<f32>,
    /// `[rows, vocab]`.
    pub logits: Vec<f32>,
    /// The soft-cap's `tanh` values of the logits (kept only because the kernel writes them).
    capped: Vec<f32>,
}

impl HeadRows {
    /// The logits `[rows, vocab]` of the rows of `x` (`[rows, width]`), in `self.logits`; by
    /// the head's rows, or with `head` `None` the embedding's (a tied head: the decoder keeps
    /// every untied head as rows). Each row alone with `streams`.
    pub(crate) fn forward(
        &mut self,
        d: &Dims,
        w: &Params,
        head: Option<&RowMatrix>,
        x: &[f32],
        streams: bool,
        helpers: Option<&Helpers<'_>>,
    ) {
        let c = d.width;
        let n = x.len() / c;
        self.ln_f.resize(n * c, 0.0);
        self.mean.resize(n, 0.0);
        self.rstd.resize(n, 0.0);
        for (i, x) in x.chunks_exact(c).enumerate() {
            let ln_f = Normed {
                out: &mut self.ln_f[i * c..(i + 1) * c],
                mean: &mut self.mean[i..i + 1],
                rstd: &mut self.rstd[i..i + 1],
            };
            let (gamma, beta) = (w.ln_f_gamma.get(), w.ln_f_beta.get());
            norm::forward(d.norm, ln_f, x, gamma, beta, d.epsilon);
        }
        self.logits.resize(n * d.vocab, 0.0);
        if let Some(helpers) = helpers.filter(|h| n == 1 && h.parts() > 1) {
            let h = &self.ln_f[..c];
            match head {
                Some(_) => {
                    let weight = Weight::of(head, &w.lm_head);
                    linear_split(&mut self.logits, h, weight, &[], helpers);
                }
                None => split_columns(helpers, &mut self.logits, &|part, j0| {
                    for (logit, j) in part.iter_mut().zip(j0..) {
                        *logit = dot(h, &w.wte.values()[j * c..(j + 1) * c]);
                    }
                }),
            }
        } else if let Some(head) = head {
            let weight = Weight::rows(head);
            weight.product(
                &mut self.logits,
                &self.ln_f,
                &[],
                block::per_row(streams, n),
                c,
            );
        } else {
            let rows = self
                .logits
                .chunks_exact_mut(d.vocab)
                .zip(self.ln_f.chunks_exact(c));
            for (logits, h) in rows {
                for (logit, row) in logits.iter_mut().zip(w.wte.values().chunks_exact(c)) {
                    *logit = dot(h, row);
                }
            }
        }
        if d.softcap > 0.0 {
            self.capped.resize(self.logits.len(), 0.0);
            softcap::forward(&mut self.logits, &mut self.capped, d.softcap);
        }
    }
}

impl FusedDecoder {
    /// Reads `gpt`'s sizes and weights (dropout is off while sampling).
    pub fn new(gpt: &Gpt) -> Result<Self, FusedError> {
        Self::with_weights(gpt, WeightFormat::F32)
    }

    /// [`FusedDecoder::new`], the matrices kept in `format`, or each as a [`WeightPlan`]
    /// says (quantised once, here).
    ///
    /// [`WeightPlan`]: super::WeightPlan
    pub fn with_weights(gpt: &Gpt, matrices: impl Into<Matrices>) -> Result<Self, FusedError> {
        // LoRA adapters are merged into their matrices: a decoder reads dense weights.
        let merged;
        let gpt = match gpt.lora_scale() {
            Some(_) => {
                merged = gpt.clone().merge_lora();
                &merged
            }
            None => gpt,
        };
        let dims = Dims::of(gpt)?;
        let matrices = matrices.into();
        // What the matrices take from a file's blocks is never read (a model loaded for this
        // decoder may not have made it: `Matrices::unread_parameters`).
        let tied = gpt.config().tie_embeddings;
        let layout = Arc::new(ParamLayout::of(gpt));
        let mut weights = Params::read_where(gpt, layout, |slot| matrices.reads(slot, tied));
        let matrices = matrices.take(&mut weights, &dims)?;
        Ok(Self::on(
            dims,
            Arc::new(DecoderWeights { weights, matrices }),
        ))
    }

    /// A decoder of `dims` on `weights` (what stays in their layout: embeddings, norms, biases,
    /// LoRA adapters, f32 matrices) and `matrices` (the rows it keeps), moved in: a training
    /// engine's own weights, given back by [`into_weights`](Self::into_weights).
    pub(crate) fn holding(dims: Dims, weights: Params, matrices: RowWeights) -> Self {
        Self::on(dims, Arc::new(DecoderWeights { weights, matrices }))
    }

    /// The weights and rows [`holding`](Self::holding) moved in, moved out (copied where a
    /// decoder [`share`](Self::share)d from this one still holds them).
    pub(crate) fn into_weights(self) -> (Params, RowWeights) {
        let shared = Arc::try_unwrap(self.shared).unwrap_or_else(|shared| DecoderWeights {
            weights: shared.weights.clone(),
            matrices: shared.matrices.clone(),
        });
        (shared.weights, shared.matrices)
    }

    /// A decoder on the same weights as this one, without copying them: its own (empty) KV
    /// cache and scratch, no helper threads. Every thread of a server decodes on one copy of
    /// the weights so.
    pub fn share(&self) -> Self {
        Self::on(self.dims, self.shared.clone())
    }

    /// A decoder of `dims` on `shared`, its cache empty.
    fn on(dims: Dims, shared: Arc<DecoderWeights>) -> Self {
        Self {
            dims,
            helpers: SpinPool::new(0),
            cache: StreamCache::new(
                shared.weights.blocks.len(),
                dims.block_size,
                dims.kv_width(),
            ),
            x: Vec::new(),
            next: Vec::new(),
            acts: BlockActs::default(),
            rope: match dims.rope {
                Some(base) => rope::Tables::new(dims.block_size, dims.d_head(), base),
                None => rope::Tables::default(),
            },
            scores: vec![0.0; dims.block_size],
            head: HeadRows::default(),
            maps: None,
            shared,
        }
    }

    /// Splits each token's products over `threads` threads (this one and `threads - 1` that
    /// start now, spin briefly between products and park when decoding pauses): a sequence
    /// decodes faster where one core cannot read the weights as fast as memory gives them.
    /// The logits are the same bit for bit whatever the count.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.helpers = SpinPool::new(threads.max(1) - 1);
        self
    }

    fn check(&self, tokens: &[u32]) -> Result<(), ModelError> {
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= self.dims.vocab) {
            return Err(ModelError::TokenOutOfRange {
                id: id.into(),
                vocab_size: self.dims.vocab,
            });
        }
        let len = self.cache.len + tokens.len();
        if len > self.dims.block_size {
            return Err(AttentionError::SequenceTooLong {
                len,
                max: self.dims.block_size,
            }
            .into());
        }
        Ok(())
    }

    /// The forward pass of `tokens` at positions `len..len + rows`, appending their keys and
    /// values to the cache; leaves the logits `head` asks for in `self.head.logits`.
    fn forward(&mut self, tokens: &[u32], head: Head) {
        let d = self.dims;
        let (c, rows, past) = (d.width, tokens.len(), self.cache.len);
        self.x.resize(rows * c, 0.0);
        self.next.resize(rows * c, 0.0);
        // A whole window (a prompt, or the rebuild after the window slid) goes through the
        // training kernel's blocked products, which keep its weights (and write the attention
        // weights that `maps` asks for).
        let window = past == 0 && (rows > 1 || self.maps.is_some());
        let att = if window { d.heads * rows * rows } else { 0 };
        // Several rows after cached ones (a prompt's later chunks) attend through blocked
        // products too, `[rows, past + rows]` scores at a time.
        let chunk = past > 0 && rows > 1;
        // A row of scores for each thread, or a chunk's rows.
        let scores = match chunk {
            true => rows * (past + rows),
            false => d.block_size * self.helpers.parts(),
        };
        self.scores.resize(self.scores.len().max(scores), 0.0);
        self.acts.resize(rows, &d, att, false);
        for (r, (x, &tok)) in self.x.chunks_exact_mut(c).zip(tokens).enumerate() {
            let pair = d.pair(self.cache.before(tokens, past, past + r), tok as usize);
            let w = &self.shared;
            (w.weights).embed(x, (tok as usize, past + r, pair), w.matrices.lookup());
        }
        let blocks = self.shared.weights.blocks.len();
        for l in 0..blocks {
            if l + 1 == blocks && rows > 1 && head != Head::All && self.maps.is_none() {
                self.last_block(past, rows, head == Head::Last);
                break;
            }
            let (keys, values) = (&mut self.cache.keys[l], &mut self.cache.values[l]);
            let scores = &mut self.scores;
            let helpers = self.helpers.hold();
            let p = &self.shared.weights.blocks[l];
            let ctx = Ctx {
                dims: &d,
                rope: &self.rope,
                first: past,
                period: rows,
                streams: None,
                matrices: Some(&self.shared.matrices.blocks[l]),
                rows_alone: head == Head::All,
                integer: true,
                helpers: Some(&helpers),
            };
            block::forward(p, &mut self.acts, &self.x, &mut self.next, ctx, |h| {
                let cache = Cache {
                    keys,
                    values,
                    past,
                    dims: &d,
                };
                match (window, chunk) {
                    (true, _) => attend_window(h, cache),
                    (false, true) => attend_chunk(h, cache, scores),
                    (false, false) => attend_cached(h, cache, scores, &helpers),
                }
            });
            self.keep_map(l);
            std::mem::swap(&mut self.x, &mut self.next);
        }
        if head == Head::All || (head == Head::Last && rows == 1) {
            let head_rows = self.shared.matrices.head.as_ref();
            let alone = head == Head::All;
            let helpers = self.helpers.hold();
            self.head.forward(
                &self.dims,
                &self.shared.weights,
                head_rows,
                &self.x,
                alone,
                Some(&helpers),
            );
        }
        self.cache.len += rows;
        self.cache.last = tokens[rows - 1];
    }

    /// While [`attention_maps`](Self::attention_maps) runs: block `l`'s attention weights,
    /// just computed, kept if wanted (an empty map in their place if not).
    fn keep_map(&mut self, l: usize) {
        if let Some(maps) = &mut self.maps {
            let att = match maps.wanted[l] {
                true => self.acts.att.clone(),
                false => Vec::new(),
            };
            maps.kept.push(att);
        }
    }

    /// The last block of a feed of `rows` (> 1) rows after `past` cached ones, its input in
    /// `self.x`. Later tokens attend to every row's keys and values, so all are cached; but
    /// only the last row's output is wanted (its logits, with `head`; none for a prompt's chunk
    /// before the last), so attention, projection and MLP run for that row alone, as a token
    /// after the cache: a block's work saved for every other row.
    fn last_block(&mut self, past: usize, rows: usize, head: bool) {
        let d = self.dims;
        let l = self.shared.weights.blocks.len() - 1;
        let p = &self.shared.weights.blocks[l];
        let matrices = &self.shared.matrices;
        let helpers = self.helpers.hold();
        let ctx = |first: usize, period: usize| Ctx {
            dims: &d,
            rope: &self.rope,
            first,
            period,
            streams: None,
            matrices: Some(&matrices.blocks[l]),
            rows_alone: false,
            integer: true,
            helpers: Some(&helpers),
        };
        block::queries_keys_values(p, &mut self.acts, &self.x, ctx(past, rows));
        let (keys, values) = (&mut self.cache.keys[l], &mut self.cache.values[l]);
        let mut cache = Cache {
            keys,
            values,
            past,
            dims: &d,
        };
        cache.append(&self.acts.qkv[..rows * d.qkv_width()]);
        if !head {
            return;
        }
        // The last row attends with the keys and values cached above, its own among them, so
        // the cache holds the same numbers whether this feed's logits are wanted or not (a
        // prompt fed whole, or a chunk at a time).
        let (c, kv, visible) = (d.width, d.kv_width(), past + rows);
        let last = &self.x[(rows - 1) * c..];
        self.acts.resize(1, &d, 0, false);
        let scores = &mut self.scores[..visible];
        let out = &mut self.next[..c];
        block::forward(p, &mut self.acts, last, out, ctx(past + rows - 1, 1), |h| {
            let (keys, values) = (&cache.keys[..visible * kv], &cache.values[..visible * kv]);
            attend(h.y, &h.qkv[..c], keys, values, scores, d.kv_heads)
        });
        let head_rows = matrices.head.as_ref();
        self.head.forward(
            &d,
            &self.shared.weights,
            head_rows,
            &self.next[..c],
            false,
            Some(&helpers),
        );
    }

    /// An empty cache of this model's size, for [`FusedBatch`](super::FusedBatch)'s streams.
    pub(crate) fn empty_cache(&self) -> StreamCache {
        let d = &self.dims;
        StreamCache::new(self.cache.keys.len(), d.block_size, d.kv_width())
    }

    /// Puts `cache` in place of this decoder's own (and its own in `cache`).
    pub(crate) fn swap_cache(&mut self, cache: &mut StreamCache) {
        std::mem::swap(&mut self.cache, cache);
    }

    /// [`Decoder::feed`] of tokens already checked: the logits after them. A feed longer than
    /// [`PREFILL_CHUNK`] goes through in chunks of that many tokens from its start, so that
    /// [`FusedBatch`](super::FusedBatch) can feed a long prompt a chunk a step beside other
    /// streams and compute exactly what this does.
    pub(crate) fn feed_checked(&mut self, tokens: &[u32]) -> &[f32] {
        let chunks = tokens.len().div_ceil(PREFILL_CHUNK);
        for (i, chunk) in tokens.chunks(PREFILL_CHUNK).enumerate() {
            let head = if i + 1 == chunks {
                Head::Last
            } else {
                Head::None
            };
            self.forward(chunk, head);
        }
        &self.head.logits
    }

    /// Every row's logits of `tokens` read from an empty cache, as [`Gpt::forward`] gives a
    /// window's: `each(row, logits [vocab])` in order (what `eval` scores; the window is left
    /// cached). With `Q8_0` matrices every row's products are int8, as a sampled token's are
    /// (a prompt's many rows take the dequantised f32 product instead).
    pub fn window_logits(
        &mut self,
        tokens: &[u32],
        mut each: impl FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        self.clear();
        self.check(tokens)?;
        for (i, chunk) in tokens.chunks(PREFILL_CHUNK).enumerate() {
            self.forward(chunk, Head::All);
            let rows = self.head.logits.chunks_exact(self.dims.vocab);
            rows.enumerate()
                .for_each(|(r, logits)| each(i * PREFILL_CHUNK + r, logits));
        }
        Ok(())
    }

    /// The attention weights over `tokens` read from an empty cache, as
    /// [`Gpt::forward_with_attention`] gives them, of the blocks `wanted` picks (by index; the
    /// others' are empty, and never held: a block's maps are `heads·seq²` values):
    /// `maps[block][head]`, `[seq, seq]` row-major (queries by keys, zero above the diagonal).
    /// They are the weights this decoder attends with, from its own products (int8 ones with
    /// `Q8_0` matrices); the cache is left empty.
    pub fn attention_maps(
        &mut self,
        tokens: &[u32],
        wanted: impl Fn(usize) -> bool,
    ) -> Result<Vec<Vec<Vec<f32>>>, ModelError> {
        self.clear();
        self.check(tokens)?;
        if tokens.is_empty() {
            return Err(AttentionError::EmptySequence.into());
        }
        let blocks = self.shared.weights.blocks.len();
        self.maps = Some(Maps {
            wanted: (0..blocks).map(wanted).collect(),
            kept: Vec::with_capacity(blocks),
        });
        self.forward(tokens, Head::None);
        let maps = self.maps.take().map_or_else(Vec::new, |m| m.kept);
        self.clear();
        let map = tokens.len() * tokens.len();
        Ok(maps
            .into_iter()
            .map(|att| att.chunks_exact(map).map(<[f32]>::to_vec).collect())
            .collect())
    }

    pub(crate) fn dims(&self) -> &Dims {
        &self.dims
    }

    /// The sizes, the weights (and those kept as `Q8_0`) and the rotary tables.
    pub(crate) fn parts(&self) -> (&Dims, &Params, &RowWeights, &rope::Tables) {
        (
            &self.dims,
            &self.shared.weights,
            &self.shared.matrices,
            &self.rope,
        )
    }
}

/// Which logits a forward pass computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    /// None: a prompt's chunk before its last.
    None,
    /// The last row's: the next token's.
    Last,
    /// Every row's: a window scored.
    All,
}

impl Decoder for FusedDecoder {
    fn block_size(&self) -> usize {
        self.dims.block_size
    }

    fn vocab_size(&self) -> usize {
        self.dims.vocab
    }

    fn cached(&self) -> usize {
        self.cache.len
    }

    fn clear(&mut self) {
        self.cache.len = 0;
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.check(tokens)?;
        if tokens.is_empty() {
            return Err(AttentionError::EmptySequence.into());
        }
        Ok(self.feed_checked(tokens).to_vec())
    }
}
