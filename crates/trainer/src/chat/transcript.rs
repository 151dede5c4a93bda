//! The plain-transcript template, for models that were never taught a chat format: each message
//! as a line `role: content`, the reply after `assistant: `, ended where the model starts a
//! user's line. A TOML file given with `--chat-template` changes its texts:
//!
//! ```toml
//! message = "{role}: {content}\n"   # each message; {role} and {content} are replaced
//! assistant = "assistant: "         # after the last message: the model writes from here
//! stop = ["\nuser:"]                # the reply ends at any of these (not returned)
//! ```

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::message::Message;

/// How a conversation becomes a prompt. The defaults are a plain transcript.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Transcript {
    /// Each message; `{role}` and `{content}` are replaced. Default `"{role}: {content}\n"`.
    pub message: String,
    /// Written after the last message: the model continues from here as the assistant.
    /// Default `"assistant: "`.
    pub assistant: String,
    /// The assistant's reply ends where the model writes one of these (they are not returned;
    /// a request's own `stop` adds to them). Default `["\nuser:"]`.
    pub stop: Vec<String>,
}

impl Default for Transcript {
    fn default() -> Self {
        Self {
            message: "{role}: {content}\n".into(),
            assistant: "assistant: ".into(),
            stop: vec!["\nuser:".into()],
        }
    }
}

impl Transcript {
    /// The template in `path` (whose `text` is read already), checked.
    pub fn parse(path: &Path, text: &str) -> Result<Self> {
        let template: Self = toml::from_str(text)
            .map_err(|e| anyhow::anyhow!("{}", e.message()))
            .with_context(|| format!("--chat-template {}", path.display()))?;
        template
            .validate()
            .with_context(|| format!("--chat-template {}", path.display()))?;
        Ok(template)
    }

    /// Refuses a template that would lose the messages or stop on nothing.
    pub fn validate(&self) -> Result<()> {
        if !self.message.contains("{content}") {
            bail!("`message` must contain {{content}}, or every message would be lost");
        }
        if self.stop.iter().any(String::is_empty) {
            bail!("a `stop` text is empty");
        }
        if self.stop.len() > 4 {
            bail!("at most 4 `stop` texts");
        }
        Ok(())
    }

    /// The conversation as the prompt text, ending where the assistant's reply begins.
    pub fn render(&self, messages: &[Message]) -> String {
        self.render_with(messages, true)
    }

    /// The conversation, and the assistant's opening after it when `add_generation_prompt`.
    pub(crate) fn render_with(&self, messages: &[Message], add_generation_prompt: bool) -> String {
        let mut text = String::new();
        for m in messages {
            // {content} last, so a message that mentions "{role}" stays as written.
            let with_role = self.message.replace("{role}", &m.role);
            text.push_str(&with_role.replacen("{content}", &m.content, 1));
        }
        if add_generation_prompt {
            text.push_str(&self.assistant);
        }
        text
    }
}

#[cfg(test)]
impl Transcript {
    fn load(path: &Path) -> Result<Self> {
        Self::parse(path, &std::fs::read_to_string(path)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn the_default_is_a_plain_transcript() {
        let text = Transcript::default().render(&[
            message("system", "Speak as Hamlet."),
            message("user", "To be?"),
        ]);
        assert_eq!(text, "system: Speak as Hamlet.\nuser: To be?\nassistant: ");
    }

    #[test]
    fn a_message_that_mentions_the_placeholders_is_kept_as_written() {
        let text = Transcript::default().render(&[message("user", "say {role} or {content}")]);
        assert_eq!(text, "user: say {role} or {content}\nassistant: ");
    }

    #[test]
    fn templates_load_from_toml_with_defaults_and_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, "message = \"<{role}>{content}</{role}>\"\n").unwrap();
        let loaded = Transcript::load(&path).unwrap();
        assert_eq!(loaded.message, "<{role}>{content}</{role}>");
        assert_eq!(loaded.assistant, Transcript::default().assistant);
        for (bad, says) in [
            ("message = \"{role}\"\n", "{content}"),
            ("stop = [\"\"]\n", "empty"),
            ("colour = \"red\"\n", "unknown field"),
        ] {
            std::fs::write(&path, bad).unwrap();
            let err = format!("{:#}", Transcript::load(&path).unwrap_err());
            assert!(
                err.contains(says) && err.contains("--chat-template"),
                "{err}"
            );
        }
    }
}
