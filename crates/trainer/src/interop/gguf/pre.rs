//! llama.cpp's pre-tokenizers (`tokenizer.ggml.pre`: how byte-level BPE splits text before
//! merging) both ways: each name read here as the Hugging Face pre-tokenizer that splits text
//! the same way, and a tokenizer's own pre-tokenizer named by what it does to a text that tells
//! them apart, as llama.cpp's converter names one.

use anyhow::{Result, anyhow, bail};
use serde_json::{Value as Json, json};

/// The regular expression llama.cpp splits text by for each `tokenizer.ggml.pre` read here,
/// written as Hugging Face's pre-tokenizer (the two cut text the same way).
pub(super) fn hf_form(pre: &str) -> Option<Json> {
    let byte_level = |regex: bool| {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
               "use_regex": regex})
    };
    let split = |pattern: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
             "invert": false},
            byte_level(false),
        ]})
    };
    const LLAMA3: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| \
                          ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    const QWEN2: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| \
                         ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    Some(match pre {
        // GPT-2's expression (`'s|'t|… ?\p{L}+| ?\p{N}+|…`), which ByteLevel applies itself.
        "gpt-2" | "gpt2" => byte_level(true),
        // Digits one by one, then GPT-2's expression.
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true),
        ]}),
        "llama-bpe" | "llama3" => split(LLAMA3),
        "qwen2" => split(QWEN2),
        _ => return None,
    })
}

/// The `tokenizer.ggml.pre` whose split of text before BPE is the tokenizer's own (`hf`, its
/// Hugging Face form), found as llama.cpp's converter finds one: by what it does to a text that
/// tells them apart. A tokenizer none of them matches is refused: llama.cpp would cut its text
/// otherwise.
pub(super) fn name_of(hf: &Json) -> Result<&'static str> {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    // Hugging Face's NFC changes no text already composed; llama.cpp applies none.
    if !(hf["normalizer"].is_null() || hf["normalizer"] == json!({"type": "NFC"})) {
        bail!(
            "its tokenizer normalizes text ({}), which llama.cpp's byte-level BPE does not",
            hf["normalizer"]
        );
    }
    let splits = |json: &Json| -> Option<Vec<String>> {
        let pre: tokenizers::PreTokenizerWrapper = serde_json::from_value(json.clone()).ok()?;
        let mut text = PreTokenizedString::from(TELLS_APART);
        pre.pre_tokenize(&mut text).ok()?;
        let pieces = text.get_splits(OffsetReferential::Original, OffsetType::Byte);
        Some(pieces.into_iter().map(|(s, _, _)| s.to_string()).collect())
    };
    let own = splits(&hf["pre_tokenizer"]);
    NAMES
        .into_iter()
        .find(|name| own.is_some() && hf_form(name).as_ref().and_then(splits) == own)
        .ok_or_else(|| {
            anyhow!(
                "its tokenizer splits text before BPE ({}) as none of llama.cpp's \
                 pre-tokenizers tinygpt writes does ({})",
                hf["pre_tokenizer"],
                NAMES.join(", ")
            )
        })
}

/// The `tokenizer.ggml.pre` values read and written here.
pub(super) const NAMES: [&str; 4] = ["gpt-2", "smollm", "llama-bpe", "qwen2"];

/// llama.cpp's converter's text for telling pre-tokenizers apart (`get_vocab_base_pre`).
const TELLS_APART: &str = "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) \
    😶\u{200d}🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 \
    33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на \
    Български \'\'\'\'\'\'```````\"\"\"\"......!!!!!!?????? I\'ve been \'told he\'s there, \'RE you \
    sure? \'M not sure I\'ll make it, \'D you like some tea? We\'Ve a\'lL";

#[cfg(test)]
mod tests {
    use super::*;

    fn named(normalizer: Json, pre_tokenizer: Json) -> Result<&'static str> {
        name_of(&json!({"normalizer": normalizer, "pre_tokenizer": pre_tokenizer}))
    }

    /// The text tells the four apart: each name's own form is named as itself.
    #[test]
    fn every_name_is_told_apart() {
        for name in NAMES {
            assert_eq!(named(Json::Null, hf_form(name).unwrap()).unwrap(), name);
        }
    }

    /// Pre-tokenizers as Hugging Face's `tokenizer.json` files write them (SmolLM2's, Llama
    /// 3's, Qwen2's with its NFC), not only as the import writes them.
    #[test]
    fn hugging_faces_own_forms_are_named() {
        let byte_level = |regex: bool| {
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                   "use_regex": regex})
        };
        let smollm = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true)]});
        assert_eq!(named(Json::Null, smollm).unwrap(), "smollm");
        let split = |digits: &str| {
            let regex = format!(
                "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{{L}}\\p{{N}}]?\\p{{L}}+|\\p{{N}}{digits}| \
                 ?[^\\s\\p{{L}}\\p{{N}}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
            );
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
                 "invert": false}, byte_level(false)]})
        };
        assert_eq!(named(Json::Null, split("{1,3}")).unwrap(), "llama-bpe");
        assert_eq!(named(json!({"type": "NFC"}), split("")).unwrap(), "qwen2");
        assert_eq!(named(Json::Null, byte_level(true)).unwrap(), "gpt-2");
    }

    #[test]
    fn other_splits_and_normalizers_are_refused() {
        let err = named(Json::Null, json!({"type": "Whitespace"})).unwrap_err();
        assert!(err.to_string().contains("as none of llama.cpp's"), "{err}");
        let err = named(json!({"type": "Lowercase"}), hf_form("gpt-2").unwrap()).unwrap_err();
        assert!(err.to_string().contains("normalizes text"), "{err}");
    }
}
