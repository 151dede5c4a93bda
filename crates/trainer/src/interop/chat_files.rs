//! A Hugging Face directory's chat parts, in and out: the chat template (`chat_template.jinja`,
//! or `tokenizer_config.json`'s `chat_template`), its `bos_token` and `eos_token`, and the ids
//! that end a turn (`generation_config.json`'s `eos_token_id`, else `config.json`'s).

use std::path::Path;

use anyhow::{Result, anyhow};
use serde_json::{Value, json};

use crate::chat::{ChatSection, ChatTemplate, Message};
use crate::data::tokenizer::Tokenizer;

/// The run's `[chat]` for the directory `dir` whose `config.json` is `config`, and notes for
/// the user: empty for a model without a chat template (a base model). A template that does
/// not compile or render here is left out with a note (the model still imports; `serve
/// --chat-template` can give one).
pub(super) fn read(
    dir: &Path,
    config: &Value,
    tokenizer: &Tokenizer,
) -> Result<(ChatSection, Vec<String>)> {
    let tokenizer_config = match read_json(&dir.join("tokenizer_config.json"))? {
        Some(v) => v,
        None => json!({}),
    };
    let mut notes = Vec::new();
    let template = match std::fs::read_to_string(dir.join("chat_template.jinja")) {
        Ok(text) => text,
        Err(_) => template_of(&tokenizer_config["chat_template"], &mut notes),
    };
    if template.is_empty() {
        return Ok((ChatSection::default(), notes));
    }
    let generation = read_json(&dir.join("generation_config.json"))?;
    let eos = match generation.as_ref().map(|g| &g["eos_token_id"]) {
        Some(ids) if !ids.is_null() => ids.clone(),
        _ => config["eos_token_id"].clone(),
    };
    let (chat, more) = section(template, &tokenizer_config, &eos, tokenizer);
    notes.extend(more);
    Ok((chat, notes))
}

/// The run's `[chat]` from a chat `template`, the `bos_token` and `eos_token` of
/// `tokenizer_config` (strings, or objects with a `content`), and the end-of-turn ids `eos`
/// (one id or a list); notes for the user. A template that does not compile or render here is
/// left out with a note.
pub(super) fn section(
    template: String,
    tokenizer_config: &Value,
    eos: &Value,
    tokenizer: &Tokenizer,
) -> (ChatSection, Vec<String>) {
    let mut notes = Vec::new();
    let token = |key: &str| match &tokenizer_config[key] {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .into(),
        _ => String::new(),
    };
    let chat = ChatSection {
        template,
        bos_token: token("bos_token"),
        eos_token: token("eos_token"),
        stop: stop_tokens(eos, tokenizer, &mut notes),
    };
    if let Err(e) = usable(&chat, tokenizer) {
        notes.push(format!(
            "its chat template is not kept ({e:#}): serve writes conversations as a plain \
             transcript (--chat-template FILE gives one)"
        ));
        return (ChatSection::default(), notes);
    }
    notes.push(match chat.stops().as_slice() {
        [] => "chat template kept; it names no end-of-turn token, so a reply ends at max_tokens \
               or a request's stop"
            .into(),
        stops => format!("chat template kept; a reply ends at {}", stops.join(" or ")),
    });
    (chat, notes)
}

/// The template compiles, writes a one-message conversation, and the tokenizer encodes that.
fn usable(chat: &ChatSection, tokenizer: &Tokenizer) -> Result<()> {
    chat.validate()?;
    let hello = [Message::new("user", "Hello")];
    let text = ChatTemplate::new(None, chat)?.render(&hello)?;
    tokenizer.encode_with_specials(&text)?;
    Ok(())
}

/// `chat_template`: one template, or a list of named ones (the `default` is taken).
fn template_of(value: &Value, notes: &mut Vec<String>) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(named) => {
            let default = named
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str());
            if named.len() > 1 && default.is_some() {
                notes.push("kept the default of its named chat templates".into());
            }
            default.unwrap_or_default().into()
        }
        _ => String::new(),
    }
}

/// The end-of-turn ids (one id or a list) as the tokens they spell: each must be one token
/// that encodes back to its id (a special token), or it is left out with a note.
fn stop_tokens(ids: &Value, tokenizer: &Tokenizer, notes: &mut Vec<String>) -> Vec<String> {
    let ids: Vec<u64> = match ids {
        Value::Number(n) => n.as_u64().into_iter().collect(),
        Value::Array(a) => a.iter().filter_map(Value::as_u64).collect(),
        _ => Vec::new(),
    };
    let mut stop = Vec::new();
    for id in ids {
        let text = u32::try_from(id)
            .ok()
            .and_then(|id| tokenizer.decode(&[id]).ok().map(|t| (id, t)));
        match text {
            Some((id, text)) if tokenizer.encode_with_specials(&text).ok() == Some(vec![id]) => {
                if !stop.contains(&text) {
                    stop.push(text);
                }
            }
            _ => notes.push(format!(
                "end-of-sequence id {id} is not a token of its own in the tokenizer: left out"
            )),
        }
    }
    stop
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| anyhow!("{} is invalid ({e})", path.display())),
        Err(_) => Ok(None),
    }
}

/// What an export writes of `chat` into `tokenizer_config.json` (its template and special
/// tokens) and `generation_config.json` (the end-of-turn ids), as transformers reads them.
/// The BOS and EOS are the template's, else the tokenizer's start and end of text, so that a
/// harness knows the token its rolling perplexity starts from.
pub(super) fn for_export(chat: &ChatSection, tokenizer: &Tokenizer) -> (Value, Value) {
    let mut tokenizer_config = json!({});
    let or = |text: &str, id| match text.is_empty() {
        true => tokenizer.special_text(id).unwrap_or_default().to_owned(),
        false => text.to_owned(),
    };
    for (key, value) in [
        ("chat_template", chat.template.clone()),
        ("bos_token", or(&chat.bos_token, tokenizer.start_of_text())),
        ("eos_token", or(&chat.eos_token, tokenizer.end_of_text())),
    ] {
        if !value.is_empty() {
            tokenizer_config[key] = json!(value);
        }
    }
    let ids: Vec<u32> = chat
        .stops()
        .iter()
        .filter_map(|s| match tokenizer.encode_with_specials(s) {
            Ok(ids) if ids.len() == 1 => Some(ids[0]),
            _ => None,
        })
        .collect();
    let generation = match ids.as_slice() {
        [] => json!({}),
        [one] => json!({ "eos_token_id": one }),
        many => json!({ "eos_token_id": many }),
    };
    (tokenizer_config, generation)
}
