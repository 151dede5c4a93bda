//! Text to batches, in the order data flows:
//!
//! ```text
//! corpus.rs      a run's tokens: a prepared directory, or text prepared into the run first
//!   prepare/     text to token files, streamed, on every core (format, sources, chunks, scan,
//!                encode, split)
//!   tokenizer/   char or byte-level BPE, their special tokens, Hugging Face JSON;
//!                byte_level_bpe.rs learns and encodes whole corpora
//! tokens.rs      token files mapped from disk (a corpus of any size in flat memory)
//! documents.rs   documents and the windows they are cut into
//! conversations/ chat conversations (JSONL, or prepared) for fine-tuning, only the replies
//!                taught
//! split.rs       where the validation split starts
//! dataset.rs     the splits, and random batches of `(inputs, targets)` from them
//! ```

pub mod byte_level_bpe;
pub mod conversations;
pub mod corpus;
pub mod dataset;
pub mod documents;
pub mod prepare;
pub mod split;
pub mod tokenizer;
pub mod tokens;

pub use dataset::{Batch, Dataset, Split, mix, read_corpus, step_rng, sweep, whole_split};
