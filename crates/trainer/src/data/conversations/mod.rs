//! Conversations for supervised fine-tuning (`data.path` a `.jsonl` file, or a directory
//! `tinygpt prepare` wrote from one): each conversation rendered through the run's chat template
//! is one sample, right-padded to the longest in its batch, so no conversation attends to
//! another. A target is counted by the loss only where the model is taught to write it (the
//! assistant's replies and the end of their turns); every other target, and padding, is
//! `ignore_index`.
//!
//! ```text
//! render.rs  conversations to ids, taught marks and offsets, on every core
//! mask.rs    the taught marks, in memory or mapped from disk
//! ```
//!
//! The last `val_fraction` of the conversations (at least one) is validation. A conversation
//! longer than `block_size + 1` tokens is cut to that, and one with nothing taught within it is
//! left out, when a split is read for a block size: prepared files hold them whole.

pub mod mask;
pub mod render;
mod store;

use anyhow::{Result, bail};
use tinygpt_model::IGNORE_INDEX;

use crate::chat::jsonl::Numbered;
use crate::chat::{ChatTemplate, Taught};
use crate::data::tokenizer::Tokenizer;
pub use store::Store;

/// The conversations of a split that fit a block size: each cut to at most `block_size + 1`
/// tokens, those with nothing taught within that left out.
#[derive(Clone)]
pub struct Conversations {
    store: Store,
    /// Each kept conversation's start in the store, and its length after the cut.
    rows: Vec<(u64, u32)>,
    /// Targets the loss counts in one pass (a row's first token is never a target).
    taught_targets: usize,
}

/// What reading a conversation file did, for the run's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub train: usize,
    pub val: usize,
    /// Targets the loss counts in one pass over each split.
    pub train_taught: usize,
    pub val_taught: usize,
    /// Conversations cut to `block_size + 1` tokens, and those left out because nothing they
    /// teach fits in that.
    pub cut: usize,
    pub dropped: usize,
}

impl Summary {
    pub fn describe(&self) -> String {
        let mut line = format!(
            "{} train / {} val conversations ({} / {} taught tokens an epoch)",
            self.train, self.val, self.train_taught, self.val_taught
        );
        if self.cut + self.dropped > 0 {
            line.push_str(&format!(
                "; {} cut to block_size + 1 tokens, {} left out (no reply within it)",
                self.cut, self.dropped
            ));
        }
        line
    }
}

/// How many of `n` conversations are validation: the last `fraction`, at least one, and at
/// least one left to train on.
pub(crate) fn val_count(n: usize, fraction: f64) -> usize {
    ((n as f64 * fraction).round() as usize).clamp(1, n.saturating_sub(1).max(1))
}

/// `conversations` (read from JSONL, with their line numbers) rendered and split into train and
/// val, as `tinygpt prepare` splits them.
pub fn split(
    conversations: &[Numbered],
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    block_size: usize,
    val_fraction: f64,
) -> Result<(Conversations, Conversations, Summary)> {
    if conversations.len() < 2 {
        bail!("one conversation: at least 2 are needed (one to train on, one to validate)");
    }
    let mut train = render::render_all(conversations, template, tokenizer)?;
    let val = train.split_off(train.len() - val_count(train.len(), val_fraction));
    from_stores(train.into_store(), val.into_store(), block_size)
}

/// The train and val splits of these stores for `block_size`; a split left with no
/// conversation is an error.
pub(crate) fn from_stores(
    train: Store,
    val: Store,
    block_size: usize,
) -> Result<(Conversations, Conversations, Summary)> {
    let (train, train_cut, train_dropped) = Conversations::new(train, block_size)?;
    let (val, val_cut, val_dropped) = Conversations::new(val, block_size)?;
    for (name, split) in [("train", &train), ("val", &val)] {
        if split.is_empty() {
            bail!(
                "the {name} split has no conversation with a reply within block_size + 1 = {} \
                 tokens",
                block_size + 1
            );
        }
    }
    let summary = Summary {
        train: train.len(),
        val: val.len(),
        train_taught: train.taught_targets(),
        val_taught: val.taught_targets(),
        cut: train_cut + val_cut,
        dropped: train_dropped + val_dropped,
    };
    Ok((train, val, summary))
}

/// All of `conversations` as one split (to evaluate on another file), as [`split`] renders
/// them.
pub fn whole(
    conversations: &[Numbered],
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    block_size: usize,
) -> Result<Conversations> {
    let rendered = render::render_all(conversations, template, tokenizer)?;
    let (all, ..) = Conversations::new(rendered.into_store(), block_size)?;
    if all.is_empty() {
        bail!("no conversation has a reply within block_size + 1 tokens");
    }
    Ok(all)
}

impl Conversations {
    /// The conversations of `store` that fit `block_size`, and how many were cut and left out.
    pub fn new(store: Store, block_size: usize) -> Result<(Self, usize, usize)> {
        let tokens = store.ids.len() as u64;
        let ordered = store.offsets.first() == Some(&0) && store.offsets.is_sorted();
        if !ordered || store.offsets.last() != Some(&tokens) || store.taught.len() as u64 != tokens
        {
            bail!("the conversation offsets or taught marks do not fit the {tokens} tokens");
        }
        let (mut cut, mut dropped, mut taught_targets) = (0, 0, 0);
        let mut rows = Vec::with_capacity(store.offsets.len() - 1);
        store.taught.with(|marks| {
            for pair in store.offsets.windows(2) {
                let (start, len) = (pair[0], pair[1] - pair[0]);
                let kept = len.min(block_size as u64 + 1);
                cut += usize::from(kept < len);
                // The first token is never a target.
                let range = (start + 1).min(start + kept) as usize..(start + kept) as usize;
                let taught = marks[range].iter().filter(|&&t| t != 0).count();
                match taught {
                    0 => dropped += 1,
                    _ => {
                        taught_targets += taught;
                        rows.push((start, kept as u32));
                    }
                }
            }
        });
        let conversations = Self {
            store,
            rows,
            taught_targets,
        };
        Ok((conversations, cut, dropped))
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Tokens in all conversations (as cut).
    pub fn tokens(&self) -> usize {
        self.rows.iter().map(|&(_, len)| len as usize).sum()
    }

    /// Targets the loss counts in one pass (a row's first token is never a target).
    pub(crate) fn taught_targets(&self) -> usize {
        self.taught_targets
    }

    /// Conversation `k`.
    pub fn row(&self, k: usize) -> Taught {
        let (start, len) = self.rows[k];
        let (start, len) = (start as usize, len as usize);
        Taught {
            ids: self.store.ids.slice(start, len),
            taught: self.store.taught.marks(start, len),
        }
    }

    /// The tokens of the first conversation before its first reply: its prompt.
    pub(crate) fn first_prompt(&self) -> Vec<u32> {
        let row = self.row(0);
        let end = row.taught.iter().position(|&t| t).unwrap_or(row.ids.len());
        row.ids[..end].to_vec()
    }
}

/// Inputs and targets of `rows`, right-padded to the longest: a target is the next token where
/// it is taught, else `IGNORE_INDEX` (padding too; padded inputs are token 0, which no real
/// token attends to). Returns the inputs, the targets and the sequence length.
pub fn batch(rows: &[Taught]) -> (Vec<i64>, Vec<i64>, usize) {
    let seq = rows.iter().map(|r| r.ids.len() - 1).max().unwrap_or(1);
    let mut inputs = Vec::with_capacity(rows.len() * seq);
    let mut targets = Vec::with_capacity(rows.len() * seq);
    for row in rows {
        let n = row.ids.len() - 1;
        inputs.extend(row.ids[..n].iter().map(|&t| t as i64));
        inputs.extend(std::iter::repeat_n(0, seq - n));
        let next = row.ids[1..].iter().zip(&row.taught[1..]);
        targets.extend(next.map(|(&id, &taught)| match taught {
            true => id as i64,
            false => IGNORE_INDEX,
        }));
        targets.extend(std::iter::repeat_n(IGNORE_INDEX, seq - n));
    }
    (inputs, targets, seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{Message, Transcript};
    use crate::data::tokenizer::TokenizerKind;

    fn conversations(n: usize) -> Vec<Numbered> {
        (0..n)
            .map(|i| {
                let messages = vec![
                    Message {
                        role: "user".into(),
                        content: format!("{i}+1?"),
                    },
                    Message {
                        role: "assistant".into(),
                        content: format!("{}", i + 1),
                    },
                ];
                (i + 1, messages)
            })
            .collect()
    }

    #[test]
    fn only_taught_targets_count_and_rows_do_not_mix() {
        let template = ChatTemplate::Transcript(Transcript::default());
        let tokenizer =
            Tokenizer::train(TokenizerKind::Char, "user: 0123456789+?\nassistant", 0).unwrap();
        let (train, val, summary) =
            split(&conversations(10), &template, &tokenizer, 64, 0.2).unwrap();
        assert_eq!((summary.train, summary.val), (8, 2));
        // "1\nuser:" … "8\nuser:": seven taught targets each.
        assert_eq!(summary.train_taught, 8 * 7);
        let (inputs, targets, seq) = batch(&[train.row(0), train.row(1)]);
        assert_eq!(seq, train.row(0).ids.len() - 1);
        let counted: Vec<i64> = targets.iter().copied().filter(|&t| t >= 0).collect();
        let one = tokenizer.encode("1\nuser:").unwrap();
        let two = tokenizer.encode("2\nuser:").unwrap();
        let want: Vec<i64> = one.iter().chain(&two).map(|&t| t as i64).collect();
        assert_eq!(counted, want, "only the replies are targets");
        assert_eq!(inputs.len(), targets.len());
        assert_eq!(
            val.first_prompt(),
            tokenizer.encode("user: 8+1?\nassistant: ").unwrap()
        );
    }

    #[test]
    fn long_conversations_are_cut_and_replyless_ones_left_out() {
        let template = ChatTemplate::Transcript(Transcript::default());
        let tokenizer =
            Tokenizer::train(TokenizerKind::Char, "user: 0123456789+?\nassistant", 0).unwrap();
        let mut data = conversations(4);
        data[0].1[0].content = "9".repeat(40);
        // "user: " + 40 + "\nassistant: " is 58 tokens: the reply starts past 32 + 1.
        let (.., summary) = split(&data, &template, &tokenizer, 32, 0.25).unwrap();
        assert_eq!((summary.cut, summary.dropped, summary.train), (1, 1, 2));
        // The first of two is the train split, and it teaches nothing within 33 tokens.
        let err = split(&data[..2], &template, &tokenizer, 32, 0.5)
            .err()
            .unwrap();
        assert!(err.to_string().contains("the train split has no"), "{err}");
        let err = split(&data[..1], &template, &tokenizer, 32, 0.5)
            .err()
            .unwrap();
        assert!(err.to_string().contains("at least 2"), "{err}");
    }
}
