//! Special tokens: ids that stand for no text of the corpus. tinygpt's own tokenizers (char and
//! BPE) have five, after the learnt vocabulary: the end of a text, which starts every document
//! and is the BOS and EOS an export declares, and the four markers of tinygpt's chat format. An
//! imported tokenizer has its own (Hugging Face's `added_tokens` marked `special`).
//!
//! Encoding text never produces a special token, even from text that spells one: a corpus that
//! quotes `<|endoftext|>` is still only text. Only what a chat template writes, a prompt and a
//! stop text are read [`with_specials`](super::Tokenizer::encode_with_specials), as
//! transformers reads a rendered conversation.

/// The end of a text: between documents, and the BOS and EOS of every export.
pub(crate) const END_OF_TEXT: &str = "<|endoftext|>";
/// Opens a system turn of tinygpt's chat format.
pub(crate) const SYSTEM: &str = "<|system|>";
/// Opens a user turn.
pub(crate) const USER: &str = "<|user|>";
/// Opens the assistant's turn.
pub(crate) const ASSISTANT: &str = "<|assistant|>";
/// Ends a turn.
pub(crate) const END: &str = "<|end|>";

/// The special tokens a tokenizer tinygpt learns gets, in id order after the learnt ones.
pub(crate) const OWN: [&str; 5] = [END_OF_TEXT, SYSTEM, USER, ASSISTANT, END];

/// Names of the token that starts a text, in other tokenizers (GPT-2's, Llama's, Llama 3's).
const STARTS: [&str; 3] = [END_OF_TEXT, "<s>", "<|begin_of_text|>"];
/// Names of the token that ends a text.
const ENDS: [&str; 3] = [END_OF_TEXT, "</s>", "<|end_of_text|>"];

/// One special token: its text, id, and whether whitespace beside it belongs to it (Hugging
/// Face's `lstrip`/`rstrip`: matched text swallows the spaces to its left or right).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Special {
    pub text: String,
    pub id: u32,
    pub lstrip: bool,
    pub rstrip: bool,
}

impl Special {
    pub fn new(text: &str, id: u32) -> Self {
        Self {
            text: text.into(),
            id,
            lstrip: false,
            rstrip: false,
        }
    }
}

/// The token a document starts with among `specials`: tinygpt's end of text, else a BOS by
/// its usual name.
pub fn start_of_text(specials: &[Special]) -> Option<u32> {
    first_named(&STARTS, specials)
}

/// The token that ends a text among `specials`: tinygpt's end of text, else an EOS by its
/// usual name.
pub(crate) fn end_of_text(specials: &[Special]) -> Option<u32> {
    first_named(&ENDS, specials)
}

/// The id of the first of `names` that `specials` has.
fn first_named(names: &[&str], specials: &[Special]) -> Option<u32> {
    names
        .iter()
        .find_map(|name| specials.iter().find(|s| s.text == *name))
        .map(|s| s.id)
}

/// One piece of text to encode: plain text, or a special token's id.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    Text(&'a str),
    Special(u32),
}

/// `text` cut at each special token it spells (the earliest first, the longest where two start
/// together), honouring `lstrip`/`rstrip`; empty text pieces are left out.
pub fn pieces<'a>(text: &'a str, specials: &[Special]) -> Vec<Piece<'a>> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        let found = specials
            .iter()
            .filter(|s| !s.text.is_empty())
            .filter_map(|s| rest.find(s.text.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, s)| (*at, std::cmp::Reverse(s.text.len())));
        let Some((at, special)) = found else {
            if !rest.is_empty() {
                out.push(Piece::Text(rest));
            }
            return out;
        };
        let before = match special.lstrip {
            true => rest[..at].trim_end(),
            false => &rest[..at],
        };
        if !before.is_empty() {
            out.push(Piece::Text(before));
        }
        out.push(Piece::Special(special.id));
        rest = &rest[at + special.text.len()..];
        if special.rstrip {
            rest = rest.trim_start();
        }
    }
}

/// The special tokens of a Hugging Face tokenizer (its `added_tokens` marked `special`), by id.
pub(crate) fn specials_of(tokenizer: &tokenizers::Tokenizer) -> Vec<Special> {
    let mut specials: Vec<Special> = tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special)
        .map(|(id, t)| Special {
            text: t.content,
            id,
            lstrip: t.lstrip,
            rstrip: t.rstrip,
        })
        .collect();
    specials.sort_by_key(|s| s.id);
    specials
}

/// The one special token `hf`'s post-processor writes in front of a text, if it writes one.
pub(crate) fn prompt_start(hf: &tokenizers::Tokenizer, specials: &[Special]) -> Option<u32> {
    let ids = |special| hf.encode("a", special).ok().map(|e| e.get_ids().to_vec());
    let (with, without) = (ids(true)?, ids(false)?);
    let at = (0..=with.len().checked_sub(without.len())?)
        .find(|&at| with[at..at + without.len()] == without[..])?;
    match with[..at] {
        [id] if specials.iter().any(|s| s.id == id) => Some(id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_at_the_earliest_and_longest_special() {
        let specials = [
            Special::new("<|end|>", 7),
            Special::new("<|end|>x", 8),
            Special::new("<s>", 9),
        ];
        assert_eq!(
            pieces("a<s>b<|end|>xc<|end|>", &specials),
            [
                Piece::Text("a"),
                Piece::Special(9),
                Piece::Text("b"),
                Piece::Special(8),
                Piece::Text("c"),
                Piece::Special(7),
            ]
        );
        assert_eq!(pieces("", &specials), []);
        assert_eq!(pieces("plain", &[]), [Piece::Text("plain")]);
        let stripping = [Special {
            lstrip: true,
            rstrip: true,
            ..Special::new("<m>", 1)
        }];
        assert_eq!(
            pieces("a  <m>\n b", &stripping),
            [Piece::Text("a"), Piece::Special(1), Piece::Text("b")]
        );
    }

    #[test]
    fn a_document_starts_with_the_end_of_text_else_a_bos() {
        let llama = [Special::new("</s>", 2), Special::new("<s>", 1)];
        assert_eq!(start_of_text(&llama), Some(1));
        assert_eq!(end_of_text(&llama), Some(2));
        let own: Vec<Special> = OWN
            .iter()
            .enumerate()
            .map(|(i, s)| Special::new(s, 65 + i as u32))
            .collect();
        assert_eq!(start_of_text(&own), Some(65));
        assert_eq!(start_of_text(&[Special::new("<|end|>", 3)]), None);
    }
}
