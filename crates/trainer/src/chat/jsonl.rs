//! Conversations for fine-tuning, one JSON object per line, in the shapes people already have:
//! OpenAI's `{"messages": [{"role": "user", "content": "…"}, …]}` (roles `system`, `user`,
//! `assistant`), or `{"prompt": "…", "completion": "…"}` (a user message and the reply). Blank
//! lines are skipped; any other line that is not one of these is an error naming its line.

use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

use super::message::Message;

/// Other fields (OpenAI's `name`, `weight`, an `id`) are let through unread.
#[derive(Deserialize)]
struct WireMessage {
    role: String,
    content: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Line {
    Messages { messages: Vec<WireMessage> },
    Pair { prompt: String, completion: String },
}

const ROLES: [&str; 3] = ["system", "user", "assistant"];

/// Whether `path` names a JSONL file of conversations (by its extension).
pub fn is_jsonl(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "jsonl")
}

/// A conversation and the line of the file it is on (from 1), for errors.
pub(crate) type Numbered = (usize, Vec<Message>);

/// The conversations of the JSONL file at `path`.
pub fn read(path: &Path) -> Result<Vec<Numbered>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read conversations {}", path.display()))?;
    let conversations = parse(&text).with_context(|| path.display().to_string())?;
    if conversations.is_empty() {
        bail!("{} holds no conversation", path.display());
    }
    Ok(conversations)
}

/// The conversations of JSONL `text`.
pub fn parse(text: &str) -> Result<Vec<Numbered>> {
    let mut conversations = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let messages = conversation(line).with_context(|| format!("line {}", n + 1))?;
        conversations.push((n + 1, messages));
    }
    Ok(conversations)
}

/// The conversation on one line of JSONL.
pub fn conversation(line: &str) -> Result<Vec<Message>> {
    let parsed: Line = serde_json::from_str(line).map_err(|_| {
        anyhow!(
            "not a conversation: expected {{\"messages\": [{{\"role\": …, \"content\": …}}, …]}} \
             or {{\"prompt\": …, \"completion\": …}}"
        )
    })?;
    let messages: Vec<Message> = match parsed {
        Line::Messages { messages } => messages
            .into_iter()
            .map(|m| Message {
                role: m.role,
                content: m.content,
            })
            .collect(),
        Line::Pair { prompt, completion } => vec![
            Message {
                role: "user".into(),
                content: prompt,
            },
            Message {
                role: "assistant".into(),
                content: completion,
            },
        ],
    };
    if let Some(m) = messages.iter().find(|m| !ROLES.contains(&m.role.as_str())) {
        bail!("unknown role {:?}: use one of {}", m.role, ROLES.join(", "));
    }
    if !messages.iter().any(|m| m.role == "assistant") {
        bail!("no assistant message: nothing to learn from");
    }
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_shapes_read_and_bad_lines_are_named() {
        let text = "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n\n{\"prompt\": \"p\", \"completion\": \"c\"}\n";
        let read = parse(text).unwrap();
        assert_eq!((read.len(), read[0].0, read[1].0), (2, 1, 3));
        assert_eq!(read[0].1.len(), 3);
        let pair = &read[1].1;
        assert_eq!(
            (&*pair[0].role, &*pair[1].role, &*pair[1].content),
            ("user", "assistant", "c")
        );
        for (bad, says) in [
            ("{\"prompt\": \"p\"}", "not a conversation"),
            ("[1, 2]", "not a conversation"),
            (
                "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}]}",
                "no assistant",
            ),
            (
                "{\"messages\": [{\"role\": \"robot\", \"content\": \"u\"}]}",
                "unknown role \"robot\"",
            ),
        ] {
            let err = format!("{:#}", parse(&format!("{text}{bad}\n")).unwrap_err());
            assert!(err.starts_with("line 4: ") && err.contains(says), "{err}");
        }
    }
}
