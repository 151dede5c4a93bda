//! A SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`: Llama 2's, TinyLlama's) read
//! back as the Hugging Face tokenizer that cuts text as llama.cpp does.
//!
//! llama.cpp writes a space as `▁`, puts one in front of the text and after each special token
//! (`tokenizer.ggml.add_space_prefix`, on unless the file says otherwise), starts from the
//! text's characters and, again and again, joins the two neighbours that make the token of the
//! highest score (the leftmost pair where two tie); a character that is no token goes in as its
//! UTF-8 bytes, the tokens `<0x00>`..`<0xFF>`. That is byte-pair encoding whose merges are
//! ranked by the score of the token they make, with byte fallback: Hugging Face's BPE with
//! those merges, the `▁` written by its normalizer (on each piece of text between special
//! tokens, as llama.cpp does), as transformers converts a Llama tokenizer. The one thing ranks
//! cannot say is two different tokens of the same score, which llama.cpp joins leftmost first:
//! such a file is refused.
//!
//! Written ([`metadata`]), such a tokenizer goes back the other way: each token its merges make
//! scores minus the rank of its first merge, so that llama.cpp, joining the neighbours of the
//! highest score first, joins in the merges' order.

use std::collections::HashMap;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value as Json, json};

use super::bpe::{
    CONTROL, NORMAL, USER_DEFINED, bos_processor, listed, merge_pairs, put, token_list,
    tokens_by_id,
};
use super::file::{Gguf, Value};
use crate::data::tokenizer::Tokenizer;

/// llama.cpp's token type of `<unk>`.
const UNKNOWN: i32 = 2;
/// llama.cpp's token type of a byte token (`<0xE3>`).
const BYTE: i32 = 6;

/// The tokenizer of a GGUF file whose `tokenizer.ggml.model` is `llama`.
pub fn tokenizer(gguf: &Gguf) -> Result<Tokenizer> {
    let (tokens, types) = token_list(gguf)?;
    let scores = scores(gguf, tokens.len())?;
    let mut ids = HashMap::with_capacity(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        if ids.insert(token.as_str(), id).is_some() {
            bail!("tokenizer.ggml.tokens holds {token:?} twice");
        }
    }
    let merges = merges(&tokens, &types, &scores, &ids)?;
    let added: Vec<Json> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, kind))| [CONTROL, UNKNOWN, USER_DEFINED].contains(kind))
        .map(|(id, (token, &kind))| {
            // User-defined tokens are read out of any text, as llama.cpp reads them.
            json!({"id": id, "content": token, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": kind != USER_DEFINED})
        })
        .collect();
    let unknown = match gguf.get("tokenizer.ggml.unknown_token_id") {
        Some(id) => id.as_u64().and_then(|id| tokens.get(id as usize)),
        None => tokens
            .iter()
            .zip(&types)
            .find(|(_, k)| **k == UNKNOWN)
            .map(|(t, _)| t),
    };
    let space = json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"});
    let prefix = !matches!(
        gguf.get("tokenizer.ggml.add_space_prefix"),
        Some(Value::Bool(false))
    );
    let normalizer = match prefix {
        true => json!({"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, space,
        ]}),
        false => space,
    };
    let vocab: serde_json::Map<String, Json> = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), id.into()))
        .collect();
    let hf = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": null,
        "post_processor": bos_processor(gguf, &tokens, true),
        // The space put in front of the text comes off again; `▁` is a space, byte tokens
        // bytes.
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": usize::from(prefix), "stop": 0},
        ]},
        "model": {"type": "BPE", "dropout": null, "unk_token": unknown,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": merges},
    });
    Tokenizer::from_hf_value(hf).context("its SentencePiece tokenizer")
}

/// `tokenizer.ggml.scores`, one per token.
fn scores(gguf: &Gguf, count: usize) -> Result<Vec<f32>> {
    let key = "tokenizer.ggml.scores";
    let items = gguf.get(key).and_then(Value::as_array).ok_or_else(|| {
        anyhow!("its SentencePiece tokenizer has no {key}, which order its merges")
    })?;
    let scores = items
        .iter()
        .map(|v| match v {
            Value::F32(s) if s.is_finite() => Some(*s),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| anyhow!("{key} holds something other than finite f32 numbers"))?;
    if scores.len() != count {
        bail!("{key} has {} entries for {count} tokens", scores.len());
    }
    Ok(scores)
}

/// Every pair of tokens that joins into a token, as `[left, right]`, ranked as llama.cpp joins
/// them: the higher the joined token's score, the earlier (pairs that make the same token in
/// the order of their ids). Only normal and user-defined tokens join or are joined: control,
/// byte and unknown tokens never come out of text's characters.
fn merges(
    tokens: &[String],
    types: &[i32],
    scores: &[f32],
    ids: &HashMap<&str, usize>,
) -> Result<Vec<Json>> {
    let joins = |id: usize| [NORMAL, USER_DEFINED].contains(&types[id]);
    let piece = |text: &str| ids.get(text).copied().filter(|&id| joins(id));
    let mut pairs = Vec::new();
    let mut made_by_score: HashMap<u32, usize> = HashMap::new();
    for (id, token) in tokens.iter().enumerate().filter(|(id, _)| joins(*id)) {
        let mut made = false;
        for (cut, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(cut);
            if let (Some(l), Some(r)) = (piece(left), piece(right)) {
                pairs.push((scores[id], l, r));
                made = true;
            }
        }
        if made && let Some(other) = made_by_score.insert(scores[id].to_bits(), id) {
            bail!(
                "its SentencePiece tokens {:?} and {:?} share the score {}: llama.cpp joins such \
                 tokens leftmost first, which tinygpt's tokenizer cannot do; pass --tokenizer \
                 with the model's Hugging Face tokenizer.json",
                tokens[other],
                token,
                scores[id]
            );
        }
    }
    pairs.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    Ok(pairs
        .into_iter()
        .map(|(_, l, r)| json!([tokens[l], tokens[r]]))
        .collect())
}

/// Whether a tokenizer (`hf`, its Hugging Face form) spells text as SentencePiece does (BPE
/// with byte fallback over text whose spaces are `▁`), and then whether it puts a `▁` in front
/// of each piece of text between special tokens (llama.cpp's `add_space_prefix`). `None` for
/// any other tokenizer; an error for byte fallback with spaces written otherwise.
pub(super) fn space_prefix(hf: &Json) -> Result<Option<bool>> {
    if hf["model"]["byte_fallback"] != true {
        return Ok(None);
    }
    let space = json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"});
    let prepend = json!({"type": "Prepend", "prepend": "▁"});
    let (normalizer, pre) = (&hf["normalizer"], &hf["pre_tokenizer"]);
    let metaspace =
        pre["type"] == "Metaspace" && pre["replacement"] == "▁" && pre["split"] == false;
    Ok(Some(match () {
        _ if pre.is_null() && *normalizer == space => false,
        _ if pre.is_null() && normalizer["normalizers"] == json!([prepend, space]) => true,
        // `first` would put it in front of the text only, not after each special token.
        _ if normalizer.is_null() && metaspace && pre["prepend_scheme"] == "always" => true,
        _ if normalizer.is_null() && metaspace && pre["prepend_scheme"] == "never" => false,
        _ => bail!(
            "its tokenizer falls back to bytes as SentencePiece does but writes spaces as \
             llama.cpp's SentencePiece does not (normalizer {normalizer}, pre-tokenizer {pre})"
        ),
    }))
}

/// The `tokenizer.*` entries of a SentencePiece tokenizer (`hf`, its Hugging Face form, with
/// `prefix` as [`space_prefix`] said) in `rows` tokens: each token with its type and score,
/// the unknown token, the space prefix.
pub(super) fn metadata(hf: &Json, prefix: bool, rows: usize) -> Result<Vec<(String, Value)>> {
    let model = &hf["model"];
    let mut tokens = tokens_by_id(model)?;
    let byte = |t: &str| t.len() == 6 && t.starts_with("<0x") && t.ends_with('>');
    let mut types: Vec<i32> = tokens
        .iter()
        .map(|t| match t.as_deref() {
            Some(t) if byte(t) => BYTE,
            _ => NORMAL,
        })
        .collect();
    for added in hf["added_tokens"].as_array().into_iter().flatten() {
        let text = added["content"]
            .as_str()
            .context("an added token without text")?;
        let id = added["id"]
            .as_u64()
            .context("a token id that is not a number")?;
        let kind = if added["special"] == true {
            CONTROL
        } else {
            USER_DEFINED
        };
        put(&mut tokens, &mut types, id as usize, text, kind);
    }
    let ids: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .filter_map(|(id, t)| Some((t.as_deref()?, id)))
        .collect();
    let unknown = model["unk_token"]
        .as_str()
        .and_then(|t| ids.get(t).copied());
    let scores = scores_of_merges(&merge_pairs(model)?, &tokens, &types, &ids)?;
    if let Some(unknown) = unknown {
        types[unknown] = UNKNOWN;
    }
    let mut scores: Vec<Value> = scores.into_iter().map(Value::F32).collect();
    scores.resize(rows.max(scores.len()), Value::F32(0.0));
    let (tokens, types) = listed(tokens, types, rows)?;
    let mut out = vec![
        ("tokenizer.ggml.model".into(), Value::Str("llama".into())),
        ("tokenizer.ggml.tokens".into(), tokens),
        ("tokenizer.ggml.scores".into(), Value::Array(scores)),
        ("tokenizer.ggml.token_type".into(), types),
        (
            "tokenizer.ggml.add_space_prefix".into(),
            Value::Bool(prefix),
        ),
    ];
    if let Some(unknown) = unknown {
        out.push((
            "tokenizer.ggml.unknown_token_id".into(),
            Value::U32(unknown as u32),
        ));
    }
    Ok(out)
}

/// Each token's score for llama.cpp: minus the rank of the first merge that makes it, 0 for a
/// token no merge makes. llama.cpp ranks a join by the token it makes and joins any two
/// neighbours that make a token, so the merges of one token must follow each other and every
/// way two tokens join into a token must be a merge; otherwise it is an error naming the token.
fn scores_of_merges(
    merges: &[(String, String)],
    tokens: &[Option<String>],
    types: &[i32],
    ids: &HashMap<&str, usize>,
) -> Result<Vec<f32>> {
    let joins = |id: usize| [NORMAL, USER_DEFINED].contains(&types[id]);
    let mut first: HashMap<usize, usize> = HashMap::new();
    let mut pairs = std::collections::HashSet::new();
    let mut last = None;
    for (rank, (left, right)) in merges.iter().enumerate() {
        let joined = format!("{left}{right}");
        let id = *ids
            .get(joined.as_str())
            .with_context(|| format!("its merge {left:?} + {right:?} makes no token"))?;
        if first.contains_key(&id) && last != Some(id) {
            bail!(
                "its merges make {joined:?} at ranks apart, which llama.cpp's SentencePiece \
                 scores cannot say (it ranks a join by the token it makes)"
            );
        }
        first.entry(id).or_insert(rank);
        pairs.insert((left.as_str(), right.as_str()));
        last = Some(id);
    }
    for (id, token) in tokens.iter().enumerate() {
        let Some(token) = token.as_deref().filter(|_| joins(id)) else {
            continue;
        };
        for (cut, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(cut);
            let joinable = |t: &str| ids.get(t).is_some_and(|&id| joins(id));
            if joinable(left) && joinable(right) && !pairs.contains(&(left, right)) {
                bail!(
                    "its tokens {left:?} and {right:?} make {token:?}, which llama.cpp would \
                     join but no merge of the tokenizer does"
                );
            }
        }
    }
    Ok((0..tokens.len())
        .map(|id| first.get(&id).map_or(0.0, |&rank| -(rank as f32)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::tokenizer::TextStream;

    /// A SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, the byte tokens, then `pieces`
    /// (text, score) as normal tokens and `<|user|>` as a user-defined one.
    fn vocabulary(pieces: &[(&str, f32)]) -> Gguf {
        let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
        let mut types = vec![UNKNOWN, CONTROL, CONTROL];
        tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        types.extend([6; 256]);
        tokens.extend(pieces.iter().map(|(t, _)| t.to_string()));
        types.extend(pieces.iter().map(|_| NORMAL));
        tokens.push("<|user|>".into());
        types.push(USER_DEFINED);
        let mut scores = vec![0.0; 259];
        scores.extend(pieces.iter().map(|(_, s)| *s));
        scores.push(0.0);
        let array = |v: Vec<Value>| Value::Array(v);
        Gguf {
            metadata: vec![
                ("tokenizer.ggml.model".into(), Value::Str("llama".into())),
                (
                    "tokenizer.ggml.tokens".into(),
                    array(tokens.into_iter().map(Value::Str).collect()),
                ),
                (
                    "tokenizer.ggml.token_type".into(),
                    array(types.into_iter().map(Value::I32).collect()),
                ),
                (
                    "tokenizer.ggml.scores".into(),
                    array(scores.into_iter().map(Value::F32).collect()),
                ),
            ],
            tensors: Vec::new(),
        }
    }

    const PIECES: [(&str, f32); 9] = [
        ("▁t", -1.0),
        ("he", -2.0),
        ("▁the", -3.0),
        ("▁", -10.0),
        ("t", -11.0),
        ("h", -12.0),
        ("e", -13.0),
        ("n", -14.0),
        ("▁then", -4.0),
    ];

    /// The id [`vocabulary`] gives a byte token, a piece of [`PIECES`] or `<|user|>`.
    fn id(text: &str) -> u32 {
        match text.strip_prefix("<0x") {
            Some(hex) => 3 + u32::from_str_radix(&hex[..2], 16).unwrap(),
            None if text == "<|user|>" => 259 + PIECES.len() as u32,
            None => 259 + PIECES.iter().position(|(t, _)| *t == text).unwrap() as u32,
        }
    }

    #[test]
    fn the_highest_scored_join_goes_first_and_unknown_characters_go_as_bytes() {
        let t = tokenizer(&vocabulary(&PIECES)).unwrap();
        // "▁the": ▁t (-1) before he (-2), then ▁t + he = ▁the.
        assert_eq!(t.encode("the").unwrap(), [id("▁the")]);
        assert_eq!(
            t.encode("then the").unwrap(),
            [id("▁then"), id("▁the")],
            "a space is ▁, and the text starts with one"
        );
        // é is no token: its two UTF-8 bytes.
        assert_eq!(
            t.encode("té").unwrap(),
            [id("▁t"), id("<0xC3>"), id("<0xA9>")]
        );
        // After a special or user-defined token the text starts with a space again.
        assert_eq!(
            t.encode_with_specials("the</s>the<|user|>the").unwrap(),
            [id("▁the"), 2, id("▁the"), id("<|user|>"), id("▁the")]
        );
        assert_eq!(t.decode(&t.encode("then té").unwrap()).unwrap(), "then té");
        // Bytes of text per token, for losses per byte: `▁` is a space.
        let units: Vec<usize> = ["▁the", "<0xC3>", "e", "</s>"]
            .map(|s| t.units(if s == "</s>" { 2 } else { id(s) }))
            .into();
        assert_eq!(units, [4, 1, 1, 0]);
    }

    #[test]
    fn a_stream_gives_a_continuations_spaces() {
        let t = tokenizer(&vocabulary(&PIECES)).unwrap();
        let prompt = t.encode("then").unwrap();
        let mut stream = TextStream::after(&t, &prompt);
        let mut text = String::new();
        for id in t.encode("the té").unwrap() {
            text.extend(stream.push(id));
        }
        text.extend(stream.finish());
        // Alone, "▁the" decodes to "the": the space a text starts with is dropped.
        assert_eq!(text, " the té");
        let mut alone = TextStream::new(&t);
        let first: String = t
            .encode("the")
            .unwrap()
            .into_iter()
            .filter_map(|id| alone.push(id))
            .collect();
        assert_eq!(first, "the");
    }

    /// A prompt starts with BOS, as llama.cpp starts one, unless the file says otherwise; a
    /// text that starts with it gets no second one, and plain encoding (training data, stop
    /// texts) adds none.
    #[test]
    fn a_prompt_starts_with_bos_unless_the_file_says_not() {
        let mut gguf = vocabulary(&PIECES);
        gguf.metadata
            .push(("tokenizer.ggml.bos_token_id".into(), Value::U32(1)));
        let t = tokenizer(&gguf).unwrap();
        assert_eq!(t.prompt_start(), Some(1));
        assert_eq!(t.encode_prompt("the").unwrap(), [1, id("▁the")]);
        assert_eq!(t.encode_prompt("<s>the").unwrap(), [1, id("▁the")]);
        assert_eq!(t.encode_prompt("").unwrap(), [1]);
        assert_eq!(t.encode("the").unwrap(), [id("▁the")]);
        // What `export --format hf` writes keeps it.
        let again =
            Tokenizer::from_hf_value(serde_json::from_str(&t.to_hf_json().unwrap()).unwrap());
        assert_eq!(again.unwrap().prompt_start(), Some(1));
        let key = "tokenizer.ggml.add_bos_token";
        gguf.metadata.push((key.into(), Value::Bool(false)));
        let t = tokenizer(&gguf).unwrap();
        assert_eq!(t.prompt_start(), None);
        assert_eq!(t.encode_prompt("the").unwrap(), [id("▁the")]);
    }

    #[test]
    fn without_a_space_prefix_none_is_written_or_dropped() {
        let mut gguf = vocabulary(&PIECES);
        let key = "tokenizer.ggml.add_space_prefix";
        gguf.metadata.push((key.into(), Value::Bool(false)));
        let t = tokenizer(&gguf).unwrap();
        assert_eq!(t.encode("the").unwrap(), [id("t"), id("he")]);
        assert_eq!(t.decode(&t.encode(" the").unwrap()).unwrap(), " the");
    }

    #[test]
    fn tied_scores_and_missing_scores_are_refused() {
        let mut pieces = PIECES;
        pieces[1].1 = -1.0; // "he" ties "▁t".
        let err = tokenizer(&vocabulary(&pieces)).err().unwrap().to_string();
        assert!(err.contains("share the score"), "{err}");
        let mut gguf = vocabulary(&PIECES);
        gguf.metadata.retain(|(k, _)| k != "tokenizer.ggml.scores");
        let err = tokenizer(&gguf).err().unwrap().to_string();
        assert!(err.contains("tokenizer.ggml.scores"), "{err}");
    }

    /// The Hugging Face form of [`vocabulary`]'s tokenizer with `PIECES`, and that tokenizer.
    fn written() -> (Json, Tokenizer) {
        let t = tokenizer(&vocabulary(&PIECES)).unwrap();
        (serde_json::from_str(&t.to_hf_json().unwrap()).unwrap(), t)
    }

    /// Written back, the vocabulary keeps its tokens and types and orders the tokens its merges
    /// make as its scores did, so it cuts text as before; rows past the tokenizer are unused.
    #[test]
    fn a_written_vocabulary_reads_back_cutting_text_alike() {
        let (hf, t) = written();
        assert_eq!(space_prefix(&hf).unwrap(), Some(true));
        let rows = t.vocab_size() + 2;
        let metadata = metadata(&hf, true, rows).unwrap();
        let array = |key: &str| match metadata.iter().find(|(k, _)| k == key) {
            Some((_, Value::Array(items))) => items.clone(),
            _ => panic!("{key} missing"),
        };
        let original = vocabulary(&PIECES);
        let theirs = |key: &str| {
            original
                .get(key)
                .and_then(Value::as_array)
                .unwrap()
                .to_vec()
        };
        let (types, tokens) = (
            array("tokenizer.ggml.token_type"),
            array("tokenizer.ggml.tokens"),
        );
        assert_eq!(types[..rows - 2], theirs("tokenizer.ggml.token_type")[..]);
        assert_eq!(tokens[..rows - 2], theirs("tokenizer.ggml.tokens")[..]);
        assert!(matches!(types[rows - 1], Value::I32(5)), "an unused row");
        let score = |v: &Value| match v {
            Value::F32(s) => *s,
            _ => panic!("{v:?}"),
        };
        let (ours, before) = (
            array("tokenizer.ggml.scores"),
            theirs("tokenizer.ggml.scores"),
        );
        let made = ["▁t", "he", "▁the", "▁then"].map(|p| id(p) as usize);
        for a in made {
            for b in made {
                let order = |s: &[Value]| score(&s[a]).total_cmp(&score(&s[b]));
                assert_eq!(order(&ours), order(&before), "{a} against {b}");
            }
        }
        let back = tokenizer(&Gguf {
            metadata,
            tensors: Vec::new(),
        })
        .unwrap();
        for text in [
            "then the",
            "té the",
            "the</s>the<|user|>then",
            " the  then\n",
        ] {
            let ids = t.encode_with_specials(text).unwrap();
            assert_eq!(back.encode_with_specials(text).unwrap(), ids, "{text:?}");
        }
    }

    /// Merges llama.cpp's scores cannot say are refused: the merges of one token apart, a
    /// join llama.cpp would make that no merge makes.
    #[test]
    fn merges_scores_cannot_say_are_refused() {
        let (mut hf, _) = written();
        let merges = hf["model"]["merges"].as_array_mut().unwrap();
        assert_eq!(merges.pop(), Some(json!(["▁the", "n"])));
        let err = metadata(&hf, true, 300).unwrap_err().to_string();
        assert!(err.contains("no merge of the tokenizer does"), "{err}");
        let (mut hf, _) = written();
        let merges = hf["model"]["merges"].as_array_mut().unwrap();
        merges.push(json!(["▁t", "he"]));
        let err = metadata(&hf, true, 300).unwrap_err().to_string();
        assert!(err.contains("at ranks apart"), "{err}");
        let (mut hf, _) = written();
        hf["normalizer"] = json!({"type": "NFC"});
        let err = space_prefix(&hf).unwrap_err().to_string();
        assert!(err.contains("writes spaces as"), "{err}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        /// Any vocabulary (any types and scores) reads as a tokenizer or as an error, never a
        /// panic; a tokenizer read encodes and decodes any text.
        #[test]
        fn any_vocabulary_reads_or_is_refused(
            pieces in proptest::collection::btree_map("[▁abé<>/]{1,4}", (-100_000i32..0, 0i32..8), 0..40),
            unknown in 0u64..50,
            text in "[ abé\n<>/s]{0,24}",
        ) {
            let mut gguf = vocabulary(&[]);
            let list = |key: &str, gguf: &mut Gguf, extra: Vec<Value>| {
                if let Some((_, Value::Array(items))) =
                    gguf.metadata.iter_mut().find(|(k, _)| k == key)
                {
                    items.extend(extra);
                }
            };
            list("tokenizer.ggml.tokens", &mut gguf,
                 pieces.keys().map(|t| Value::Str(t.clone())).collect());
            list("tokenizer.ggml.scores", &mut gguf,
                 pieces.values().map(|(s, _)| Value::F32(*s as f32)).collect());
            list("tokenizer.ggml.token_type", &mut gguf,
                 pieces.values().map(|(_, k)| Value::I32(*k)).collect());
            gguf.metadata.push(("tokenizer.ggml.unknown_token_id".into(), Value::U64(unknown)));
            let read = tokenizer(&gguf);
            if let Err(e) = &read {
                // Tokens may repeat the fixed ones (`<s>`) or tie, nothing else.
                let e = e.to_string();
                proptest::prop_assert!(e.contains("twice") || e.contains("share the score"), "{e}");
            }
            if let Ok(t) = read {
                let ids = t.encode_with_specials(&text).unwrap();
                let _ = t.decode(&ids);
                for id in ids {
                    let _ = t.units(id);
                }
            }
        }
    }
}
