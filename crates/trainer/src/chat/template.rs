//! The run's `[chat]` section ([`ChatSection`]), a template given on the command line
//! ([`TemplateFile`]), and [`ChatTemplate`], the one renderer everything uses.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::jinja::Jinja;
use super::message::Message;
use super::transcript::Transcript;
use crate::data::tokenizer::{Tokenizer, special};

/// `[chat]`: how this model's conversations are written. All empty (the default) is the plain
/// transcript.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChatSection {
    /// A chat template in Hugging Face's Jinja (its `chat_template`): it sees `messages` (each
    /// a `role` and `content`), `add_generation_prompt`, `bos_token` and `eos_token`. Empty:
    /// the plain transcript.
    pub template: String,
    /// What the template's `bos_token` stands for (empty: undefined in the template).
    pub bos_token: String,
    /// What the template's `eos_token` stands for (empty: undefined in the template).
    pub eos_token: String,
    /// Texts that end the assistant's turn, usually its end-of-turn special tokens (each then
    /// matched as its one id); not returned. Empty: `eos_token`.
    pub stop: Vec<String>,
}

/// tinygpt's own chat format, in the special tokens its tokenizers have: the end of text, then
/// each turn as `<|role|>content<|end|>`; the assistant's turn opens with `<|assistant|>`.
/// (`developer`, OpenAI's newer name for the system, is written as the system.)
const OWN_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
{% set role = 'system' if message['role'] == 'developer' else message['role'] %}\
{% if role not in ['system', 'user', 'assistant'] %}\
{{ raise_exception('this chat format has system, user and assistant messages, not ' ~ role) }}\
{% endif %}{{ '<|' ~ role ~ '|>' ~ message['content'] ~ '<|end|>' }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}";

/// The most texts that may end a turn (a request's own stop sequences come on top).
const MAX_STOPS: usize = 8;

impl ChatSection {
    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// tinygpt's own chat format ([`OWN_TEMPLATE`]): a reply ends at `<|end|>`, or at the end
    /// of text.
    pub fn own() -> Self {
        Self {
            template: OWN_TEMPLATE.into(),
            bos_token: special::END_OF_TEXT.into(),
            eos_token: special::END_OF_TEXT.into(),
            stop: vec![special::END.into(), special::END_OF_TEXT.into()],
        }
    }

    /// The section a new run keeps: `self` when set; else tinygpt's own format when
    /// `tokenizer` has its special tokens, the plain transcript when not (runs made before
    /// them, models imported without a template).
    pub fn for_new_run(self, tokenizer: &Tokenizer) -> Self {
        let own = special::OWN
            .iter()
            .all(|s| tokenizer.special_id(s).is_some());
        match self.is_default() && own {
            true => Self::own(),
            false => self,
        }
    }

    /// Refuses a template that does not compile, and empty or too many stop texts.
    pub fn validate(&self) -> Result<()> {
        if self.stop.iter().any(String::is_empty) {
            bail!("chat.stop: a stop text is empty");
        }
        if self.stop.len() > MAX_STOPS {
            bail!("chat.stop: at most {MAX_STOPS} texts");
        }
        if !self.template.is_empty() {
            Jinja::new(&self.template, &self.bos_token, &self.eos_token)
                .context("chat.template")?;
        }
        Ok(())
    }

    /// The texts that end a turn of the Jinja template: `stop`, else `eos_token`.
    pub fn stops(&self) -> Vec<String> {
        match (self.stop.is_empty(), self.eos_token.is_empty()) {
            (false, _) => self.stop.clone(),
            (true, false) => vec![self.eos_token.clone()],
            (true, true) => Vec::new(),
        }
    }
}

/// A template the user gives in a file (`serve --chat-template`): a transcript's texts in TOML
/// (`.toml`), or a Jinja chat template (any other name), checked as it is read.
#[derive(Debug)]
pub enum TemplateFile {
    Transcript(Transcript),
    Jinja(String),
}

impl TemplateFile {
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--chat-template {}", path.display()))?;
        if path.extension().is_some_and(|e| e == "toml") {
            return Ok(Self::Transcript(Transcript::parse(path, &text)?));
        }
        Jinja::new(&text, "", "").with_context(|| format!("--chat-template {}", path.display()))?;
        Ok(Self::Jinja(text))
    }
}

/// The one renderer of conversations: serve's chat, and everything else that writes one.
#[derive(Debug, Clone)]
pub enum ChatTemplate {
    Transcript(Transcript),
    Jinja {
        template: Box<Jinja>,
        stop: Vec<String>,
    },
}

impl ChatTemplate {
    /// The template `file` when given, else the run's own `[chat]`; a Jinja template uses the
    /// run's special tokens and end-of-turn texts.
    pub fn new(file: Option<TemplateFile>, chat: &ChatSection) -> Result<Self> {
        let jinja = |source: &str| -> Result<Self> {
            Ok(Self::Jinja {
                template: Box::new(Jinja::new(source, &chat.bos_token, &chat.eos_token)?),
                stop: chat.stops(),
            })
        };
        match file {
            Some(TemplateFile::Transcript(t)) => Ok(Self::Transcript(t)),
            Some(TemplateFile::Jinja(source)) => jinja(&source),
            None if chat.template.is_empty() => Ok(Self::Transcript(Transcript::default())),
            None => jinja(&chat.template).context("chat.template"),
        }
    }

    /// The conversation as the prompt text, ending where the assistant's reply begins.
    pub fn render(&self, messages: &[Message]) -> Result<String> {
        self.render_with(messages, true)
    }

    /// The conversation as text, followed by the opening of the assistant's turn when
    /// `add_generation_prompt`.
    pub(crate) fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String> {
        match self {
            Self::Transcript(t) => Ok(t.render_with(messages, add_generation_prompt)),
            Self::Jinja { template, .. } => template.render(messages, add_generation_prompt),
        }
    }

    /// Texts whose appearance ends the reply (they are not returned).
    pub fn stop(&self) -> &[String] {
        match self {
            Self::Transcript(t) => &t.stop,
            Self::Jinja { stop, .. } => stop,
        }
    }

    /// What a user sees in a log line: which kind of template this is.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Transcript(_) => "plain transcript",
            Self::Jinja { .. } => "Jinja chat template",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_without_a_template_writes_a_transcript_and_one_with_uses_its_tokens() {
        let plain = ChatTemplate::new(None, &ChatSection::default()).unwrap();
        assert_eq!(plain.stop(), ["\nuser:"]);
        let chat = ChatSection {
            template: "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}".into(),
            bos_token: "<s>".into(),
            eos_token: "</s>".into(),
            stop: Vec::new(),
        };
        let run = ChatTemplate::new(None, &chat).unwrap();
        let hi = [Message::new("user", "hi")];
        assert_eq!(run.render(&hi).unwrap(), "<s>hi");
        assert_eq!(run.stop(), ["</s>"]);
        let given = ChatTemplate::new(Some(TemplateFile::Jinja("[{{ m }}]".into())), &chat);
        assert_eq!(given.unwrap().stop(), ["</s>"]);
    }

    #[test]
    fn the_section_is_checked() {
        let bad = |chat: ChatSection| chat.validate().unwrap_err().to_string();
        let template = |t: &str| ChatSection {
            template: t.into(),
            ..ChatSection::default()
        };
        assert!(bad(template("{% if %}")).contains("chat.template"));
        let empty = ChatSection {
            stop: vec![String::new()],
            ..ChatSection::default()
        };
        assert!(bad(empty).contains("empty"));
        let many = ChatSection {
            stop: vec!["x".into(); 9],
            ..ChatSection::default()
        };
        assert!(bad(many).contains("at most"));
        template("{{ messages | length }}").validate().unwrap();
    }
}
