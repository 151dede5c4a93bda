//! Conversations for supervised fine-tuning (`data.path` a `.jsonl` file): each conversation
//! rendered through the run's chat template is one sample, right-padded to the longest in its
//! batch, so no conversation attends to another. A target is counted by the loss only where
//! the model is taught to write it (the assistant's replies and the end of their turns); every
//! other target, and padding, is `ignore_index`.

use anyhow::{Context, Result, bail};
use tinygpt_model::IGNORE_INDEX;

use crate::chat::jsonl::Numbered;
use crate::chat::{ChatTemplate, Taught};
use crate::data::tokenizer::Tokenizer;

/// Rendered conversations, each at most `block_size + 1` tokens.
#[derive(Debug, Clone)]
pub struct Conversations {
    rows: Vec<Taught>,
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

/// `conversations` (read from JSONL, with their line numbers) as train and val splits: the last
/// `val_fraction` of them (at least one) is validation.
pub fn split(
    conversations: &[Numbered],
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    block_size: usize,
    val_fraction: f64,
) -> Result<(Conversations, Conversations, Summary)> {
    let (mut rows, cut, dropped) = rows(conversations, template, tokenizer, block_size)?;
    if rows.len() < 2 {
        bail!(
            "{} conversations with a reply within block_size + 1 tokens: at least 2 are \
             needed (one to train on, one to validate)",
            rows.len()
        );
    }
    let val = ((rows.len() as f64 * val_fraction).round() as usize).clamp(1, rows.len() - 1);
    let val_rows = rows.split_off(rows.len() - val);
    let (train, val) = (Conversations { rows }, Conversations { rows: val_rows });
    let summary = Summary {
        train: train.len(),
        val: val.len(),
        train_taught: train.taught_targets(),
        val_taught: val.taught_targets(),
        cut,
        dropped,
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
    let (rows, _, _) = rows(conversations, template, tokenizer, block_size)?;
    if rows.is_empty() {
        bail!("no conversation has a reply within block_size + 1 tokens");
    }
    Ok(Conversations { rows })
}

/// Each conversation rendered with its taught tokens, cut to `block_size + 1` tokens; those
/// with nothing taught within that left out. Returns them, and how many were cut and left out.
fn rows(
    conversations: &[Numbered],
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    block_size: usize,
) -> Result<(Vec<Taught>, usize, usize)> {
    let (mut cut, mut dropped) = (0, 0);
    let mut rows = Vec::with_capacity(conversations.len());
    for (line, messages) in conversations {
        let mut row = template
            .render_taught(messages, tokenizer)
            .with_context(|| format!("line {line}"))?;
        if row.ids.len() > block_size + 1 {
            cut += 1;
            row.ids.truncate(block_size + 1);
            row.taught.truncate(block_size + 1);
        }
        // The first token is never a target.
        match row.taught.get(1..).is_some_and(|t| t.contains(&true)) {
            true => rows.push(row),
            false => dropped += 1,
        }
    }
    Ok((rows, cut, dropped))
}

impl Conversations {
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Tokens in all conversations.
    pub fn tokens(&self) -> usize {
        self.rows.iter().map(|r| r.ids.len()).sum()
    }

    /// Targets the loss counts in one pass (a row's first token is never a target).
    pub fn taught_targets(&self) -> usize {
        let targets = |r: &Taught| r.taught.iter().skip(1).filter(|&&t| t).count();
        self.rows.iter().map(targets).sum()
    }

    /// Conversation `k`.
    pub fn row(&self, k: usize) -> &Taught {
        &self.rows[k]
    }

    /// The tokens of the first conversation before its first reply: its prompt.
    pub fn first_prompt(&self) -> Vec<u32> {
        let row = &self.rows[0];
        let end = row.taught.iter().position(|&t| t).unwrap_or(row.ids.len());
        row.ids[..end].to_vec()
    }
}

/// Inputs and targets of `rows`, right-padded to the longest: a target is the next token where
/// it is taught, else `IGNORE_INDEX` (padding too; padded inputs are token 0, which no real
/// token attends to). Returns the inputs, the targets and the sequence length.
pub fn batch(rows: &[&Taught]) -> (Vec<i64>, Vec<i64>, usize) {
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
    use crate::config::TokenizerKind;

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
        let err = split(&data[..2], &template, &tokenizer, 32, 0.5).unwrap_err();
        assert!(err.to_string().contains("at least 2"), "{err}");
    }
}
