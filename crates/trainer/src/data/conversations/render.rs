//! Conversations to tokens, on every core: each rendered through the chat template with its
//! taught marks (`chat/taught.rs`) and laid end to end with where each starts, the layout that
//! training reads in memory and `tinygpt prepare` writes to disk; and the text a new tokenizer
//! learns from them.

use anyhow::{Context, Result};

use super::mask::Mask;
use super::store::Store;
use crate::chat::jsonl::Numbered;
use crate::chat::{ChatTemplate, Taught};
use crate::data::tokenizer::TokenizerKind;
use crate::data::tokenizer::{Tokenizer, special};
use crate::data::tokens::Tokens;

/// Conversations end to end: their ids `[tokens]`, taught marks `[tokens]` (1 taught), and where
/// each starts, then the end `[conversations + 1]`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rendered {
    pub ids: Vec<u32>,
    pub taught: Vec<u8>,
    pub offsets: Vec<u64>,
}

impl Default for Rendered {
    fn default() -> Self {
        Self {
            ids: Vec::new(),
            taught: Vec::new(),
            offsets: vec![0],
        }
    }
}

impl Rendered {
    /// Conversations held.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Tokens held.
    pub fn tokens(&self) -> u64 {
        self.ids.len() as u64
    }

    /// Tokens marked taught.
    pub fn taught_tokens(&self) -> u64 {
        self.taught.iter().map(|&t| u64::from(t)).sum()
    }

    pub fn push(&mut self, row: &Taught) {
        self.ids.extend_from_slice(&row.ids);
        self.taught.extend(row.taught.iter().map(|&t| u8::from(t)));
        self.offsets.push(self.ids.len() as u64);
    }

    /// `other`'s conversations after these.
    pub(crate) fn append(&mut self, other: Rendered) {
        let base = self.ids.len() as u64;
        self.ids.extend(other.ids);
        self.taught.extend(other.taught);
        self.offsets
            .extend(other.offsets[1..].iter().map(|o| o + base));
    }

    /// Splits off conversations `at..` as their own stream.
    pub(crate) fn split_off(&mut self, at: usize) -> Rendered {
        let from = self.offsets[at];
        let offsets = self.offsets[at..].iter().map(|o| o - from).collect();
        self.offsets.truncate(at + 1);
        Rendered {
            ids: self.ids.split_off(from as usize),
            taught: self.taught.split_off(from as usize),
            offsets,
        }
    }

    /// These conversations as a split's storage, in memory.
    pub(crate) fn into_store(self) -> Store {
        Store {
            ids: Tokens::from_vec(self.ids),
            taught: Mask::from_vec(self.taught),
            offsets: self.offsets,
        }
    }
}

/// Each of `conversations` rendered with `template` and `tokenizer`, in order, on every core.
/// A conversation the template cannot render is an error naming its line.
pub(crate) fn render_all(
    conversations: &[Numbered],
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
) -> Result<Rendered> {
    let parts = par_chunks(conversations, |part| {
        let mut out = Rendered::default();
        for (line, messages) in part {
            let row = template
                .render_taught(messages, tokenizer)
                .with_context(|| format!("line {line}"))?;
            out.push(&row);
        }
        Ok::<_, anyhow::Error>(out)
    });
    let mut all = Rendered::default();
    for part in parts {
        all.append(part?);
    }
    Ok(all)
}

/// `work` over contiguous parts of `items`, one part per core; the results in order.
pub(crate) fn par_chunks<T: Sync, R: Send>(items: &[T], work: impl Fn(&[T]) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let size = items.len().div_ceil(threads).max(1);
    if items.len() <= size {
        return vec![work(items)];
    }
    std::thread::scope(|scope| {
        let work = &work;
        let handles: Vec<_> = items
            .chunks(size)
            .map(|part| scope.spawn(move || work(part)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// The text a new tokenizer learns from one conversation: what `template` writes for it (no
/// generation prompt), in pieces cut at tinygpt's special tokens, which are tokens of their own
/// and never text to learn (nor do words on either side of one run together).
pub(crate) fn learning_pieces(
    template: &ChatTemplate,
    (line, messages): &Numbered,
) -> Result<Vec<String>> {
    let rendered = template
        .render_with(messages, false)
        .with_context(|| format!("line {line}"))?;
    let mut pieces = Vec::new();
    let mut rest = rendered.as_str();
    loop {
        let next = special::OWN
            .iter()
            .filter_map(|m| rest.find(m).map(|at| (at, m.len())))
            .min();
        let Some((at, len)) = next else {
            pieces.push(rest.to_owned());
            break;
        };
        pieces.push(rest[..at].to_owned());
        rest = &rest[at + len..];
    }
    pieces.retain(|p| !p.is_empty());
    Ok(pieces)
}

/// A tokenizer of `kind` learnt from `pieces` of text (BPE with `bpe_vocab_size` tokens in all),
/// then tinygpt's special tokens.
pub fn learn(kind: TokenizerKind, pieces: &[String], bpe_vocab_size: usize) -> Result<Tokenizer> {
    match kind {
        TokenizerKind::Char => Ok(Tokenizer::from_char_set(
            pieces.iter().flat_map(|p| p.chars()).collect(),
        )),
        TokenizerKind::Bpe => Tokenizer::train_bpe(pieces, bpe_vocab_size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatSection, Message};

    #[test]
    fn pieces_are_cut_at_the_markers_and_streams_split_and_join() {
        let template = ChatTemplate::new(None, &ChatSection::own()).unwrap();
        let messages = vec![Message::new("user", "hi"), Message::new("assistant", "yo")];
        let pieces = learning_pieces(&template, &(1, messages.clone())).unwrap();
        assert_eq!(pieces, ["hi", "yo"]);
        let tokenizer = learn(TokenizerKind::Char, &pieces, 0).unwrap();
        let conversations: Vec<Numbered> = (0..5).map(|i| (i + 1, messages.clone())).collect();
        let mut all = render_all(&conversations, &template, &tokenizer).unwrap();
        assert_eq!(all.len(), 5);
        let one = template.render_taught(&messages, &tokenizer).unwrap();
        assert_eq!(all.tokens(), 5 * one.ids.len() as u64);
        let tail = all.split_off(3);
        assert_eq!((all.len(), tail.len()), (3, 2));
        assert_eq!(
            tail.offsets,
            [0, one.ids.len() as u64, all.tokens() / 3 * 2]
        );
        let mut joined = all.clone();
        joined.append(tail);
        assert_eq!(
            joined,
            render_all(&conversations, &template, &tokenizer).unwrap()
        );
    }
}
