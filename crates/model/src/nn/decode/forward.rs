//! The decode forwards of [`Gpt`] and its [`Block`]s: a sequence fed in pieces through its
//! caches, continuous batching's step of many sequences, and the decode step a GPU captures and
//! replays. Each gives what [`Gpt::forward`] gives over the whole sequence, to float rounding;
//! the attention's own are in `tinygpt_attention`'s `decode.rs`.

use burn::tensor::{Int, Tensor, TensorData};
use tinygpt_attention::{AttentionError, KvCache, Pass, StepAt, StepTables};

use crate::error::ModelError;
use crate::gpu::Kernels;
use crate::nn::block::{Block, residual};
use crate::nn::gpt::Gpt;

/// What a decode forward feeds: token ids `[rows, new]` on the model's device and, with a
/// bigram table ([`GptConfig::bigram`](crate::GptConfig::bigram)), each token's row of it: its
/// pair with the token before it, which a decoder knows and the caches do not. Made by
/// [`Gpt::ids`]; a model without the table takes token ids alone (`Ids::from`).
#[derive(Debug, Clone)]
pub struct Ids {
    pub tokens: Tensor<2, Int>,
    pub pairs: Option<Tensor<2, Int>>,
}

impl From<Tensor<2, Int>> for Ids {
    fn from(tokens: Tensor<2, Int>) -> Self {
        Self {
            tokens,
            pairs: None,
        }
    }
}

/// The token before each of `tokens` fed after `before` (`None`: they start a context):
/// `[before, tokens[0], tokens[1], …]`, one each.
pub fn befores(before: Option<u32>, tokens: &[u32]) -> Vec<Option<u32>> {
    let rest = tokens.iter().take(tokens.len().saturating_sub(1)).copied();
    std::iter::once(before).chain(rest.map(Some)).collect()
}

impl Gpt {
    /// `tokens` (`shape`, row by row) as a decode forward feeds them, token `i` after
    /// `before[i]` (`None`: the first of its context; [`befores`] for a run of tokens).
    pub fn ids(&self, tokens: &[u32], before: &[Option<u32>], shape: [usize; 2]) -> Ids {
        let device = self.wte.weight.device();
        let ids: Vec<i64> = tokens.iter().map(|&id| id.into()).collect();
        let pairs = self.pair_ids(tokens, before);
        Ids {
            tokens: Tensor::from_data(TensorData::new(ids, shape), &device),
            pairs: pairs.map(|p| Tensor::from_data(TensorData::new(p, shape), &device)),
        }
    }

    /// The bigram table's rows of `tokens`, token `i` after `before[i]`, on the host: what
    /// [`ids`](Self::ids) uploads, and a captured step's buffers are refilled with. `None`
    /// without a table.
    pub(crate) fn pair_ids(&self, tokens: &[u32], before: &[Option<u32>]) -> Option<Vec<i64>> {
        self.bigram.as_ref()?;
        let config = self.config();
        let pair = |(&token, &before): (&u32, &Option<u32>)| {
            config.bigram_pair(before.map(|b| b as usize), token as usize) as i64
        };
        Some(tokens.iter().zip(before).map(pair).collect())
    }

    /// Incremental forward for sampling: `ids` `[batch, new]` follow the `caches[0].len()`
    /// tokens already cached (one [`KvCache`] per layer). Returns `[batch, new, vocab_size]`.
    /// Token ids as in [`forward`](Self::forward).
    pub fn forward_cached(
        &self,
        ids: Ids,
        caches: &mut [KvCache],
    ) -> Result<Tensor<3>, ModelError> {
        let past = caches.first().map_or(0, KvCache::len);
        let mut x = self.embed(ids.tokens, ids.pairs, past, Pass::Infer)?;
        for (block, cache) in self.h.iter().zip(caches.iter_mut()) {
            x = block.forward_cached(x, cache)?;
        }
        Ok(self.head(x))
    }

    /// Continuous batching's step: the next token of each of `tokens.len()` sequences of
    /// different lengths, `tokens[r]` following the tokens `caches[r]` (that sequence's caches,
    /// one per layer) hold, the last of them `before[r]`. Returns the logits `[rows,
    /// vocab_size]` of the token after each; row `r` is what
    /// [`forward_cached`](Self::forward_cached) gives that sequence alone, up to float rounding
    /// ([`CausalSelfAttention::forward_rows`](tinygpt_attention::CausalSelfAttention::forward_rows)).
    pub fn forward_rows(
        &self,
        tokens: &[u32],
        before: &[Option<u32>],
        caches: &mut [&mut [KvCache]],
    ) -> Result<Tensor<2>, ModelError> {
        let rows = tokens.len();
        let positions: Vec<i64> = caches
            .iter()
            .map(|c| c.first().map_or(0, KvCache::len) as i64)
            .collect();
        if let Some(&longest) = positions.iter().max()
            && longest as usize >= self.block_size()
        {
            return Err(AttentionError::SequenceTooLong {
                len: longest as usize + 1,
                max: self.block_size(),
            }
            .into());
        }
        let device = self.wte.weight.device();
        let positions = Tensor::from_data(TensorData::new(positions, [rows, 1]), &device);
        let ids = self.ids(tokens, before, [rows, 1]);
        let mut x = self.embed_at(ids.tokens, positions, ids.pairs, Pass::Infer)?;
        for (l, block) in self.h.iter().enumerate() {
            let mut layer: Vec<&mut KvCache> = caches.iter_mut().map(|c| &mut c[l]).collect();
            x = block.forward_rows(x, &mut layer)?;
        }
        let vocab = self.vocab_size();
        Ok(self.head(x).reshape([rows, vocab]))
    }

    /// The logits `[vocab_size]` of the token after `tokens`, fed through `caches` (one
    /// sequence's) after the tokens they hold, the last of them `before`:
    /// [`forward_cached`](Self::forward_cached)'s last position.
    pub(crate) fn next_logits(
        &self,
        tokens: &[u32],
        before: Option<u32>,
        caches: &mut [KvCache],
    ) -> Result<Tensor<1>, ModelError> {
        let ids = self.ids(tokens, &befores(before, tokens), [1, tokens.len()]);
        let logits = self.forward_cached(ids, caches)?;
        let [_, seq, vocab] = logits.dims();
        Ok(logits.narrow(1, seq - 1, 1).reshape([vocab]))
    }

    /// The decode step a GPU runs per token ([`StepAt`]): `ids` `[rows, new]`, row `r` the
    /// next token (or `new` tokens of a prompt, [`StepAt::tokens`]) of the sequence whose keys
    /// and values `caches` (one fixed cache per layer, [`new_fixed_caches`](Self::new_fixed_caches),
    /// holding `rows` sequences) keep in their row `r`, at `at`'s positions of row `r`. Returns
    /// the logits of each row's last token, `[rows, vocab_size]`: row `r` is what
    /// [`forward_cached`](Self::forward_cached) gives that sequence there, up to float
    /// rounding. The launches are the same at every position: nothing in them depends on it.
    pub fn forward_step(
        &self,
        ids: Ids,
        at: &StepAt,
        caches: &mut [KvCache],
    ) -> Result<Tensor<2>, ModelError> {
        let (rows, new) = (at.rows(), at.tokens_per_row());
        let mut x = self.embed_at(ids.tokens, at.positions(), ids.pairs, Pass::Infer)?;
        for (block, cache) in self.h.iter().zip(caches.iter_mut()) {
            x = block.forward_step(x, at, cache)?;
        }
        // Only the last token's logits are wanted: the head reads one row a sequence.
        let x = if new > 1 { x.narrow(1, new - 1, 1) } else { x };
        let vocab = self.vocab_size();
        Ok(self.head(x).reshape([rows, vocab]))
    }

    /// The tables every [`forward_step`](Self::forward_step) of this model reads, made once per
    /// decoder: key positions `0..block_size` and, with rotary positions, the rotations.
    pub fn step_tables(&self) -> StepTables {
        let rope_base = self.h.first().and_then(|block| block.attn.rope_base);
        let d_head = self.config().n_embd / self.config().n_head;
        // The decode-attention kernel where the model runs tinygpt's kernels, unless its
        // decoding says otherwise.
        let kernels = match self.decoding().attention_kernel {
            true => self.kernels(),
            false => Kernels::Burn,
        };
        let device = self.wte.weight.device();
        StepTables::new(self.block_size(), d_head, rope_base, kernels, &device)
    }

    /// Empty caches, one per layer, for [`forward_cached`](Self::forward_cached).
    pub fn new_caches(&self) -> Vec<KvCache> {
        vec![KvCache::new(); self.h.len()]
    }

    /// Empty caches of `block_size` rows, one per layer: every token then runs the same tensor
    /// shapes ([`KvCache::with_capacity`]), what a GPU wants.
    pub fn new_fixed_caches(&self) -> Vec<KvCache> {
        vec![KvCache::with_capacity(self.block_size()); self.h.len()]
    }
}

impl Block {
    /// Incremental form of [`forward`](Self::forward) (see [`CausalSelfAttention::forward_cached`]).
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        cache: &mut KvCache,
    ) -> Result<Tensor<3>, AttentionError> {
        let a = self
            .attn
            .forward_cached(self.attn_input(x.clone()), cache)?;
        Ok(self.feed_forward(residual(x, a), Pass::Infer))
    }

    /// Continuous batching's step, one token a row (see
    /// [`CausalSelfAttention::forward_rows`]): `[rows, 1, n_embd] -> [rows, 1, n_embd]`.
    pub fn forward_rows(
        &self,
        x: Tensor<3>,
        caches: &mut [&mut KvCache],
    ) -> Result<Tensor<3>, AttentionError> {
        let a = self.attn.forward_rows(self.attn_input(x.clone()), caches)?;
        Ok(self.feed_forward(residual(x, a), Pass::Infer))
    }

    /// The decode step, one token a row or a prompt's chunk, positions on the device (see
    /// [`CausalSelfAttention::forward_step`]): `[rows, new, n_embd] -> [rows, new, n_embd]`.
    pub fn forward_step(
        &self,
        x: Tensor<3>,
        at: &StepAt,
        cache: &mut KvCache,
    ) -> Result<Tensor<3>, AttentionError> {
        let a = self
            .attn
            .forward_step(self.attn_input(x.clone()), at, cache)?;
        Ok(self.feed_forward(residual(x, a), Pass::Infer))
    }
}
