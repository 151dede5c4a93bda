//! Byte-level BPE (GPT-2's) over whole corpora, for `tinygpt prepare`: learning the merges and
//! encoding, with the same results as Hugging Face `tokenizers`' `train` and `encode`, several
//! times faster.
//!
//! `tokenizers` runs GPT-2's split regex on a backtracking engine and allocates a string per
//! word (learning) or an `Encoding` with offsets per call (encoding), for every word of the
//! corpus. A corpus is mostly the same few thousand words again and again, so here the text is
//! split with a DFA regex into borrowed words; learning counts them without allocating and hands
//! the counts to `tokenizers`' BPE trainer, and encoding looks each word up in a cache, so only
//! a word not seen before goes through the BPE model's merges. The encoder is used only for the
//! pipeline tinygpt itself trains (GPT-2's byte-level pre-tokenizer and a BPE model, nothing
//! else); any other tokenizer goes through `encode`.

use std::sync::LazyLock;

use ahash::AHashMap;
use anyhow::{Result, anyhow};
use compact_str::CompactString;
use regex::Regex;
use tokenizers::models::ModelWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{Model, Tokenizer};

/// GPT-2's split (`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`)
/// without the look-ahead, which a DFA cannot run: [`words`] gives a run of whitespace back its
/// last character instead, which is what `\s+(?!\S)` does.
static SPLIT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+")
        .expect("a valid regex")
});

/// GPT-2's byte-to-character table (`bytes_to_unicode`): printable bytes stand for themselves,
/// the others for the characters from U+0100 on, in order.
static BYTE_CHARS: LazyLock<[char; 256]> = LazyLock::new(|| {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut table = ['\0'; 256];
    let mut next = 256;
    for b in 0..=255u8 {
        table[b as usize] = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).expect("below U+0200")
        };
    }
    table
});

/// Words cached per encoder; beyond this, new words are merged every time they appear.
const CACHE_WORDS: usize = 1 << 18;

/// The pieces GPT-2's split regex cuts `text` into, in order; together they are `text`.
pub fn words(text: &str) -> impl Iterator<Item = &str> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let found = SPLIT.find_at(text, at)?;
        let mut end = found.end();
        // `\s+(?!\S)`: a run of two or more whitespace characters before more text leaves its
        // last character to the next word.
        // (Only the `\s+` alternative ends with whitespace.)
        let last = found
            .as_str()
            .chars()
            .next_back()
            .expect("matches are not empty");
        if end < text.len() && last.is_whitespace() && found.len() > last.len_utf8() {
            end -= last.len_utf8();
        }
        let word = &text[at..end];
        debug_assert_eq!(found.start(), at, "the split covers every character");
        at = end;
        Some(word)
    })
}

/// `word` in byte-level form (each byte as its character in [`BYTE_CHARS`]), appended to `out`.
fn byte_level(word: &str, out: &mut String) {
    out.extend(word.bytes().map(|b| BYTE_CHARS[b as usize]));
}

/// Learns byte-level BPE with `vocab_size` tokens (merges of pairs seen at least twice) from
/// `chunks`, pieces of text each cut between words. Equal to `tokenizers`' `train` with GPT-2's
/// pre-tokenizer; the words are counted on every core.
pub fn learn<S: AsRef<str> + Sync>(chunks: &[S], vocab_size: usize) -> Result<Tokenizer> {
    let trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut model = BPE::default();
    trainer
        .do_train(&count_words(chunks), &mut model)
        .map_err(|e| anyhow!("training the BPE tokenizer failed: {e}"))?;
    let byte_level = ByteLevel::new(false, true, true);
    let mut tokenizer = Tokenizer::new(model);
    tokenizer
        .with_pre_tokenizer(Some(byte_level))
        .with_decoder(Some(byte_level));
    Ok(tokenizer)
}

/// How often each word occurs in `chunks`, keyed by its byte-level form (what BPE's trainer
/// counts). Each thread counts every n-th chunk into a map of borrowed words.
fn count_words<S: AsRef<str> + Sync>(chunks: &[S]) -> AHashMap<CompactString, u64> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let counts: Vec<AHashMap<&str, u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut counts = AHashMap::<&str, u64>::new();
                    for chunk in chunks.iter().skip(t).step_by(threads) {
                        for word in words(chunk.as_ref()) {
                            *counts.entry(word).or_default() += 1;
                        }
                    }
                    counts
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut all = AHashMap::new();
    let mut mapped = String::new();
    for (word, n) in counts.into_iter().flatten() {
        mapped.clear();
        byte_level(word, &mut mapped);
        *all.entry(CompactString::from(mapped.as_str())).or_default() += n;
    }
    all
}

/// An encoder with its own word cache (one per thread).
pub(crate) struct BpeEncoder<'a> {
    model: &'a BPE,
    cache: AHashMap<Box<str>, Box<[u32]>>,
    /// The byte-level form of the word being merged.
    mapped: String,
}

impl<'a> BpeEncoder<'a> {
    /// An encoder for `tokenizer`, or `None` if its pipeline is not exactly GPT-2's byte-level
    /// BPE as tinygpt trains it (no normalizer, no added tokens but special ones that text never
    /// gives, no prefix space, no dropout, no truncation or padding): those go through
    /// `Tokenizer::encode`.
    pub fn new(tokenizer: &'a Tokenizer) -> Option<Self> {
        let ModelWrapper::BPE(model) = tokenizer.get_model() else {
            return None;
        };
        let byte_level = match tokenizer.get_pre_tokenizer() {
            Some(PreTokenizerWrapper::ByteLevel(b)) => b,
            _ => return None,
        };
        let plain = tokenizer.get_normalizer().is_none()
            && byte_level.use_regex
            && !byte_level.add_prefix_space
            && matches!(
                tokenizer.get_post_processor(),
                None | Some(PostProcessorWrapper::ByteLevel(_))
            )
            // Special tokens are never read out of text (`encode_special_tokens`); other
            // added tokens would be.
            && (tokenizer.get_added_tokens_decoder().values())
                .all(|t| t.special && tokenizer.get_encode_special_tokens())
            && tokenizer.get_truncation().is_none()
            && tokenizer.get_padding().is_none()
            && model.dropout.is_none_or(|p| p == 0.0)
            && !model.ignore_merges
            && model.continuing_subword_prefix.is_none()
            && model.end_of_word_suffix.is_none();
        plain.then(|| Self {
            model,
            cache: AHashMap::new(),
            mapped: String::new(),
        })
    }

    /// Appends the ids of `text` to `out`.
    pub fn encode(&mut self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        for word in words(text) {
            if let Some(ids) = self.cache.get(word) {
                out.extend_from_slice(ids);
                continue;
            }
            self.mapped.clear();
            byte_level(word, &mut self.mapped);
            let ids: Box<[u32]> = self
                .model
                .tokenize(&self.mapped)
                .map_err(|e| anyhow!("BPE encoding failed: {e}"))?
                .iter()
                .map(|token| token.id)
                .collect();
            out.extend_from_slice(&ids);
            if self.cache.len() < CACHE_WORDS {
                self.cache.insert(word.into(), ids);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    /// Text with what trips GPT-2's split: whitespace runs before words and at the end,
    /// contractions, digits, punctuation runs, tabs and other Unicode spaces, letters outside
    /// ASCII, combining marks, emoji, CJK.
    const HARD: &str = "Hello,  world!\n\n  It's 2026;   they'll've\t\tgone.  \u{a0}Straße café \
        na\u{ef}ve e\u{301}te\u{301} — «quoted» 3.14159 ½ Ⅻ 東京 🙂🙂 'S 'sup x'd \r\n\t end   ";

    /// What Hugging Face's ByteLevel pre-tokenizer cuts `text` into, mapped back to the text.
    fn reference_words(text: &str) -> Vec<String> {
        let mut pre = PreTokenizedString::from(text);
        ByteLevel::new(false, true, true)
            .pre_tokenize(&mut pre)
            .unwrap();
        pre.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(_, (start, end), _)| text[start..end].to_string())
            .collect()
    }

    #[test]
    fn the_split_is_gpt2s() {
        for text in [HARD, "", " ", "   ", "a", "\n\nword", "x   ", "  \u{3000}y"] {
            let ours: Vec<&str> = words(text).collect();
            assert_eq!(ours, reference_words(text), "{text:?}");
        }
    }

    #[test]
    fn the_byte_table_is_gpt2s() {
        let ours: std::collections::BTreeSet<char> = BYTE_CHARS.iter().copied().collect();
        let theirs: std::collections::BTreeSet<char> = ByteLevel::alphabet().into_iter().collect();
        assert_eq!(ours, theirs);
        assert_eq!(BYTE_CHARS[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_CHARS[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_CHARS[b'A' as usize], 'A');
    }

    fn corpus() -> String {
        let poem = include_str!("../../../../data/paradise-lost.txt");
        format!("{HARD}\n{}", &poem[..poem.floor_char_boundary(200_000)])
    }

    /// Hugging Face's own way: `Tokenizer::train` over `chunks`, with the same trainer settings.
    fn learned_by_hugging_face(chunks: &[&str], vocab_size: usize) -> Tokenizer {
        let mut trainer: tokenizers::models::TrainerWrapper = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        let byte_level = ByteLevel::new(false, true, true);
        let mut tokenizer = Tokenizer::new(BPE::default());
        tokenizer
            .with_pre_tokenizer(Some(byte_level))
            .with_decoder(Some(byte_level));
        tokenizer.train(&mut trainer, chunks.iter()).unwrap();
        tokenizer
    }

    #[test]
    fn learning_equals_hugging_faces_train() {
        let corpus = corpus();
        // Chunks cut between words, as prepare cuts them.
        let mut chunks = Vec::new();
        let mut rest = corpus.as_str();
        while rest.len() > 30_000 {
            let cut = rest[..30_000].rfind(' ').unwrap();
            let cut = rest[..cut].trim_end().len();
            chunks.push(&rest[..cut]);
            rest = &rest[cut..];
        }
        chunks.push(rest);
        assert!(chunks.len() > 4);
        for vocab_size in [300, 1000] {
            let ours = learn(&chunks, vocab_size).unwrap();
            let theirs = learned_by_hugging_face(&chunks, vocab_size);
            assert_eq!(ours.get_vocab_size(true), vocab_size);
            assert_eq!(
                ours.to_string(false).unwrap(),
                theirs.to_string(false).unwrap()
            );
        }
    }

    #[test]
    fn ids_equal_hugging_faces_encode() {
        let corpus = corpus();
        let hf = learned_by_hugging_face(&[&corpus], 400);
        let mut encoder = BpeEncoder::new(&hf).expect("tinygpt's own BPE is plain");
        // Twice: the second pass reads every word from the cache.
        for _ in 0..2 {
            for text in [corpus.as_str(), HARD, "unseen: Ωmega ∑ 🚀 zzz  "] {
                let mut ours = Vec::new();
                encoder.encode(text, &mut ours).unwrap();
                let theirs = hf.encode(text, false).unwrap().get_ids().to_vec();
                assert_eq!(ours, theirs, "{text:.40?}");
            }
        }
    }

    #[test]
    fn other_pipelines_are_left_to_encode() {
        let hf = learn(&["ab ab ab\n"], 260).unwrap();
        let mut prefixed = hf.clone();
        prefixed.with_pre_tokenizer(Some(ByteLevel::new(true, true, true)));
        assert!(BpeEncoder::new(&prefixed).is_none());
        let mut added = hf.clone();
        added
            .add_special_tokens([tokenizers::AddedToken::from("<|endoftext|>", true)])
            .unwrap();
        assert!(BpeEncoder::new(&added).is_none());
        added.set_encode_special_tokens(true);
        assert!(BpeEncoder::new(&added).is_some(), "text never gives them");
        assert!(BpeEncoder::new(&hf).is_some());
    }
}
