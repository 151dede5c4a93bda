//! The corpus, its train/val split, and batches of `(inputs, targets)` for the model.

use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tinygpt_model::IGNORE_INDEX;

use crate::chat::Taught;
use crate::config::presets;
use crate::config::{Batching, DataSection};
use crate::data::conversations::{self, Conversations};
use crate::data::documents::{Documents, val_start, window_count, window_span};
use crate::data::prepare::Verification;
use crate::data::split::train_tokens;
use crate::data::tokenizer::Tokenizer;
use crate::data::tokens::Tokens;

/// Reads a text corpus; a missing, unreadable, non-UTF-8 or empty file is an error. The name
/// of a corpus built into the binary ([`presets::BUILTIN_CORPUS`]) reads that copy.
pub fn read_corpus(path: &Path) -> Result<String> {
    if let Some(text) = presets::builtin_corpus(path) {
        return Ok(text.to_string());
    }
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read corpus {}", path.display()))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "corpus {} is not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })?;
    if text.trim().is_empty() {
        bail!("corpus {} is empty", path.display());
    }
    Ok(text)
}

/// One split of the corpus.
pub enum Split {
    /// The token stream; samples are random windows of `block_size + 1` tokens.
    Packed(Tokens),
    /// Documents; samples are windows of one document, padded to the longest in the batch.
    Documents(Documents),
    /// Conversations; samples are whole conversations, only their replies taught.
    Conversations(Conversations),
}

impl Split {
    /// Whether the split holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens in the split.
    pub fn len(&self) -> usize {
        match self {
            Self::Packed(ids) => ids.len(),
            Self::Documents(docs) => docs.tokens(),
            Self::Conversations(c) => c.tokens(),
        }
    }
}

/// Token ids `[batch, seq]`, targets `[batch, seq]` (`IGNORE_INDEX` where padded), on the host.
pub struct Batch {
    pub inputs: Vec<i64>,
    pub targets: Vec<i64>,
    pub batch: usize,
    pub seq: usize,
}

impl Batch {
    /// Inputs `[batch, seq]` and flattened targets `[batch * seq]` on `device`.
    pub(crate) fn to_device(&self, device: &Device) -> (Tensor<2, Int>, Tensor<1, Int>) {
        let inputs = Tensor::from_data(
            TensorData::new(self.inputs.clone(), [self.batch, self.seq]),
            device,
        );
        let targets = Tensor::from_data(
            TensorData::new(self.targets.clone(), [self.batch * self.seq]),
            device,
        );
        (inputs, targets)
    }

    /// Targets the loss counts (not padding).
    pub(crate) fn counted_targets(&self) -> usize {
        self.targets.iter().filter(|&&t| t != IGNORE_INDEX).count()
    }

    /// [`counted_targets`](Self::counted_targets), none being an error (the loss would have
    /// nothing to average).
    pub(crate) fn kept_targets(&self) -> Result<usize> {
        Ok(tinygpt_model::step::kept_targets(&self.targets)?)
    }
}

/// The corpus as train and val token splits.
pub struct Dataset {
    pub train: Split,
    pub val: Split,
    pub block_size: usize,
    /// The check of the token files behind the splits, running while training starts.
    pub verification: Verification,
}

impl Dataset {
    /// Tokenizes `text` and splits it: the last `val_fraction` is validation.
    pub fn new(
        text: &str,
        tokenizer: &Tokenizer,
        data: &DataSection,
        block_size: usize,
    ) -> Result<Self> {
        match data.batching {
            Batching::Packed => {
                let ids = tokenizer.encoder().encode(text)?;
                let n = train_tokens(ids.len(), data.val_fraction);
                let (train, val) = (ids[..n].to_vec(), ids[n..].to_vec());
                Self::packed(Tokens::from_vec(train), Tokens::from_vec(val), block_size)
            }
            Batching::Documents => {
                let docs = Documents::of_text(text, tokenizer, &data.separator, block_size)?;
                let val = val_start(docs.offsets(), data.val_fraction)
                    .with_context(|| format!("documents separated by {:?}", data.separator))?;
                Self::documents(docs.part(0..val)?, docs.part(val..docs.len())?)
            }
        }
    }

    /// Packed splits of token streams (in memory or mapped token files); each must be longer
    /// than a block.
    pub fn packed(train: Tokens, val: Tokens, block_size: usize) -> Result<Self> {
        for (name, split) in [("train", &train), ("val", &val)] {
            if split.len() <= block_size {
                bail!(
                    "corpus too short: the {name} split has {} tokens but block_size {block_size} \
                     needs at least {} (use a longer text or a smaller model.block_size)",
                    split.len(),
                    block_size + 1
                );
            }
        }
        Ok(Self {
            train: Split::Packed(train),
            val: Split::Packed(val),
            block_size,
            verification: Verification::none(),
        })
    }

    /// Documents splits; each must have a window.
    pub fn documents(train: Documents, val: Documents) -> Result<Self> {
        for (name, split) in [("train", &train), ("val", &val)] {
            if split.windows() == 0 {
                bail!(
                    "corpus too short: the {name} split has no document of 2 or more tokens \
                     (`documents` batching)"
                );
            }
        }
        let block_size = train.block_size();
        Ok(Self {
            train: Split::Documents(train),
            val: Split::Documents(val),
            block_size,
            verification: Verification::none(),
        })
    }

    /// Conversations splits (each holds at least one).
    pub fn conversations(train: Conversations, val: Conversations, block_size: usize) -> Self {
        Self {
            train: Split::Conversations(train),
            val: Split::Conversations(val),
            block_size,
            verification: Verification::none(),
        }
    }

    /// A random batch of `batch` samples from `split`, drawn with `rng` (nanoGPT's `get_batch`).
    pub fn sample(&self, split: &Split, batch: usize, rng: &mut StdRng) -> Batch {
        match split {
            Split::Packed(ids) => {
                let seq = self.block_size;
                let mut inputs = Vec::with_capacity(batch * seq);
                let mut targets = Vec::with_capacity(batch * seq);
                for _ in 0..batch {
                    let i = rng.random_range(0..ids.len() - seq);
                    ids.extend_i64(i, seq, &mut inputs);
                    ids.extend_i64(i + 1, seq, &mut targets);
                }
                Batch {
                    inputs,
                    targets,
                    batch,
                    seq,
                }
            }
            Split::Documents(docs) => {
                let picked: Vec<Vec<u32>> = (0..batch)
                    .map(|_| docs.window(rng.random_range(0..docs.windows())))
                    .collect();
                pad(&picked.iter().collect::<Vec<_>>())
            }
            Split::Conversations(c) => {
                let rows: Vec<Taught> = (0..batch)
                    .map(|_| c.row(rng.random_range(0..c.len())))
                    .collect();
                taught_batch(&rows)
            }
        }
    }
}

/// A batch of conversations, only their replies counted.
fn taught_batch(rows: &[Taught]) -> Batch {
    let (inputs, targets, seq) = conversations::batch(rows);
    Batch {
        inputs,
        targets,
        batch: rows.len(),
        seq,
    }
}

/// All of `text` as one split (to evaluate on another file), cut as `data.batching` says.
pub fn whole_split(
    text: &str,
    tokenizer: &Tokenizer,
    data: &DataSection,
    block_size: usize,
) -> Result<Split> {
    let split = match data.batching {
        Batching::Packed => Split::Packed(Tokens::from_vec(tokenizer.encoder().encode(text)?)),
        Batching::Documents => Split::Documents(Documents::of_text(
            text,
            tokenizer,
            &data.separator,
            block_size,
        )?),
    };
    if split.len() < 2 {
        bail!("the text has fewer than 2 tokens: nothing to predict");
    }
    Ok(split)
}

/// The whole `split` as deterministic batches: consecutive windows of `block_size` targets
/// (packed) or every document, so each token is predicted exactly once. Batches are cut as they
/// are taken: a mapped split of any size is never copied whole.
pub fn sweep(
    split: &Split,
    block_size: usize,
    batch: usize,
) -> Box<dyn Iterator<Item = Batch> + '_> {
    match split {
        Split::Packed(ids) => {
            let spans = window_spans(ids.len(), block_size);
            Box::new((0..spans.len()).step_by(batch.max(1)).map(move |first| {
                let last = (first + batch).min(spans.len());
                let (from, to) = (spans[first].0, spans[last - 1].1);
                ids.prefetch(from, to - from);
                let pieces: Vec<Vec<u32>> = spans[first..last]
                    .iter()
                    .map(|&(start, end)| ids.slice(start, end - start))
                    .collect();
                pad(&pieces.iter().collect::<Vec<_>>())
            }))
        }
        Split::Documents(docs) => {
            Box::new((0..docs.windows()).step_by(batch.max(1)).map(move |first| {
                let last = (first + batch).min(docs.windows());
                let pieces: Vec<Vec<u32>> = (first..last).map(|k| docs.window(k)).collect();
                pad(&pieces.iter().collect::<Vec<_>>())
            }))
        }
        Split::Conversations(c) => Box::new((0..c.len()).step_by(batch.max(1)).map(move |first| {
            let last = (first + batch).min(c.len());
            let rows: Vec<Taught> = (first..last).map(|k| c.row(k)).collect();
            taught_batch(&rows)
        })),
    }
}

/// The `(start, end)` of each window over `len` tokens: consecutive windows of up to
/// `block_size + 1` tokens sharing their end tokens.
fn window_spans(len: usize, block_size: usize) -> Vec<(usize, usize)> {
    let len = len as u64;
    (0..window_count(len, block_size))
        .map(|k| window_span(k, len, block_size))
        .map(|(start, end)| (start as usize, end as usize))
        .collect()
}

/// Samples of `len + 1` tokens as inputs and shifted targets, right-padded to the longest:
/// padded inputs are token 0 (causal attention means no real token ever looks at them) and
/// padded targets are `IGNORE_INDEX`, so the loss skips them.
fn pad(samples: &[&Vec<u32>]) -> Batch {
    let seq = samples.iter().map(|s| s.len() - 1).max().unwrap_or(1);
    let mut inputs = Vec::with_capacity(samples.len() * seq);
    let mut targets = Vec::with_capacity(samples.len() * seq);
    for sample in samples {
        let n = sample.len() - 1;
        inputs.extend(sample[..n].iter().map(|&t| t as i64));
        inputs.extend(std::iter::repeat_n(0, seq - n));
        targets.extend(sample[1..].iter().map(|&t| t as i64));
        targets.extend(std::iter::repeat_n(IGNORE_INDEX, seq - n));
    }
    Batch {
        inputs,
        targets,
        batch: samples.len(),
        seq,
    }
}

/// The RNG for one purpose at one step: a run is reproducible, and a resumed run draws exactly
/// the batches the uninterrupted run would have, without saving any generator state.
pub fn step_rng(seed: u64, step: usize, stream: u64) -> StdRng {
    StdRng::seed_from_u64(mix(seed, step, stream))
}

/// A seed for (`seed`, `step`, `stream`): distinct inputs give unrelated seeds.
pub fn mix(seed: u64, step: usize, stream: u64) -> u64 {
    // splitmix64's finaliser over the three inputs.
    let mut z = seed
        ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::tokenizer::TokenizerKind;

    fn dataset(text: &str, batching: Batching, block_size: usize) -> Result<Dataset> {
        let tokenizer = Tokenizer::train(TokenizerKind::Char, text, 0)?;
        let data = DataSection {
            batching,
            ..DataSection::default()
        };
        Dataset::new(text, &tokenizer, &data, block_size)
    }

    #[test]
    fn packed_batches_are_shifted_windows() {
        let text: String = "abcdefghij".repeat(10);
        let ds = dataset(&text, Batching::Packed, 8).unwrap();
        assert_eq!((ds.train.len(), ds.val.len()), (90, 10));
        let b = ds.sample(&ds.train, 4, &mut step_rng(1, 0, 0));
        assert_eq!((b.batch, b.seq, b.inputs.len()), (4, 8, 32));
        for row in 0..4 {
            let x = &b.inputs[row * 8..row * 8 + 8];
            let y = &b.targets[row * 8..row * 8 + 8];
            assert_eq!(&x[1..], &y[..7], "targets are inputs shifted by one");
            assert_eq!((y[7] - x[7]).rem_euclid(10), 1);
        }
        // The sweep predicts every val token after the first exactly once.
        let sweep = sweep(&ds.val, 8, 3);
        assert_eq!(sweep.map(|b| b.counted_targets()).sum::<usize>(), 9);
    }

    #[test]
    fn documents_are_padded_with_ignored_targets() {
        let text = "ab\n\nabcde\n\nabc\n\nabcd";
        let ds = dataset(text, Batching::Documents, 8).unwrap();
        let sweep: Vec<Batch> = sweep(&ds.train, 8, 8).collect();
        let b = &sweep[0];
        assert_eq!((b.batch, b.seq), (3, 5));
        // "ab" after the end-of-text token predicts two targets, a and b (ids 1 and 2 after
        // \n); the other three are ignore_index.
        assert_eq!(
            &b.targets[..5],
            &[1, 2, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]
        );
        assert_eq!(b.counted_targets(), 2 + 5 + 3);
    }

    #[test]
    fn short_corpora_are_errors() {
        let err = dataset("abcdefghij", Batching::Packed, 8).err().unwrap();
        assert!(err.to_string().contains("corpus too short"), "{err}");
        let err = dataset("abc", Batching::Documents, 8).err().unwrap();
        assert!(format!("{err:#}").contains("corpus too short"), "{err:#}");
    }
}
