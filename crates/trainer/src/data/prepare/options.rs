//! What to prepare ([`PrepareOptions`]) and where its tokenizer comes from.

use std::path::PathBuf;

use super::hold_out::ValSplit;
use crate::data::tokenizer::{Tokenizer, TokenizerKind};

/// The tokenizer: one to learn from the corpus, or one given (a run's, when it is resumed).
pub enum TokenizerSource {
    Learn {
        kind: TokenizerKind,
        bpe_vocab_size: usize,
        /// BPE learns from evenly spaced chunks of the corpus adding up to about this much.
        bpe_sample_bytes: u64,
    },
    Given(Tokenizer),
}

/// What to prepare.
pub struct PrepareOptions {
    /// Files, folders, `-` (standard input) or a built-in corpus name.
    pub inputs: Vec<PathBuf>,
    /// Patterns (`*` = any characters) a file inside a folder must match; files named directly
    /// are always taken.
    pub include: Vec<String>,
    pub tokenizer: TokenizerSource,
    pub val: ValSplit,
    /// Skip (and list) files that are not UTF-8 text instead of stopping.
    pub skip_invalid: bool,
    /// Documents are separated by this: each is encoded on its own (the separator and the
    /// newlines around a document dropped) and where each starts is written, for `documents`
    /// batching.
    pub separator: Option<String>,
    /// Show progress bars (on a terminal).
    pub progress: bool,
    /// [`prepare`] only: on Ctrl-C, SIGTERM or SIGHUP, remove what was written and exit 130
    /// (installs the process's signal handler: for the `prepare` command).
    pub exit_on_signal: bool,
}
