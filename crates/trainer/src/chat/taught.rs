//! A conversation as supervised fine-tuning sees it: the tokens its chat template writes, and
//! which of them the model is taught to write — each assistant reply and the end of its turn,
//! never the system's or user's words, nor the marker that opens the assistant's turn. The
//! others become `ignore_index` targets (nanochat's `targets[mask[1:] == 0] = -1`).
//!
//! The template is asked for the conversation one assistant turn at a time: the text up to the
//! turn with the generation prompt, then with the turn. What the second adds to the first is the
//! reply, as the template writes it (with its end-of-turn marker); this works for any template
//! that writes a conversation's turns one after another, as chat templates do.

use anyhow::{Result, bail};

use super::message::Message;
use super::template::ChatTemplate;
use crate::data::tokenizer::Tokenizer;

/// A rendered conversation: `ids[i]`, and whether training is taught to write it.
#[derive(Debug, Clone, PartialEq)]
pub struct Taught {
    pub ids: Vec<u32>,
    pub taught: Vec<bool>,
}

impl Taught {
    /// Tokens the model is taught to write.
    pub fn taught_tokens(&self) -> usize {
        self.taught.iter().filter(|&&t| t).count()
    }
}

impl ChatTemplate {
    /// `messages` (with at least one assistant reply) as token ids, each marked taught or not.
    /// Each piece of text is encoded on its own, so a reply's tokens never straddle the prompt.
    pub(crate) fn render_taught(
        &self,
        messages: &[Message],
        tokenizer: &Tokenizer,
    ) -> Result<Taught> {
        let mut pieces: Vec<(String, bool)> = Vec::new();
        let mut done = String::new();
        for (i, m) in messages.iter().enumerate() {
            if m.role != "assistant" {
                continue;
            }
            let prompt = self.render_with(&messages[..i], true)?;
            let with_reply = self.render_with(&messages[..=i], false)?;
            let (Some(before), Some(reply)) = (
                prompt.strip_prefix(done.as_str()),
                with_reply.strip_prefix(prompt.as_str()),
            ) else {
                bail!(
                    "the chat template does not write this conversation's turns one after \
                     another, so the assistant's words cannot be told apart"
                );
            };
            pieces.push((before.to_owned(), false));
            pieces.push((reply.to_owned(), true));
            done = with_reply;
        }
        if done.is_empty() {
            bail!("the conversation has no assistant message to learn from");
        }
        let whole = self.render_with(messages, false)?;
        let Some(rest) = whole.strip_prefix(done.as_str()) else {
            bail!("the chat template writes the whole conversation unlike its turns");
        };
        pieces.push((rest.to_owned(), false));
        if rest.is_empty() {
            pieces.push((self.end_of_reply(&done), true));
        }
        let mut out = Taught {
            ids: Vec::new(),
            taught: Vec::new(),
        };
        for (text, taught) in pieces.iter().filter(|(t, _)| !t.is_empty()) {
            let ids = tokenizer.encode_with_specials(text)?;
            out.taught.extend(std::iter::repeat_n(*taught, ids.len()));
            out.ids.extend(ids);
        }
        Ok(out)
    }
}

impl ChatTemplate {
    /// What a conversation ending on a reply (`text`) must still be taught for the model to end
    /// its turn where serving stops it. A Jinja template's reply carries its end-of-turn marker;
    /// the transcript's reply stops at the start of the next user line (`"\nuser:"`), so the rest
    /// of that text after what `text` ends with is taught too.
    fn end_of_reply(&self, text: &str) -> String {
        let Self::Transcript(t) = self else {
            return String::new();
        };
        let Some(stop) = t.stop.first() else {
            return String::new();
        };
        let written = (0..=stop.len())
            .rev()
            .find(|&n| stop.is_char_boundary(n) && text.ends_with(&stop[..n]))
            .unwrap_or(0);
        stop[written..].to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatSection, TemplateFile, Transcript};
    use crate::data::tokenizer::TokenizerKind;

    fn m(role: &str, content: &str) -> Message {
        Message::new(role, content)
    }

    fn taught_text(t: &Taught, tokenizer: &Tokenizer, taught: bool) -> Vec<String> {
        // Runs of consecutive tokens with the same mark, as text.
        let mut runs = Vec::new();
        let mut run = Vec::new();
        for (i, (&id, &mark)) in t.ids.iter().zip(&t.taught).enumerate() {
            if mark == taught {
                run.push(id);
            }
            let ends = i + 1 == t.ids.len() || t.taught[i + 1] != mark;
            if ends && !run.is_empty() {
                runs.push(tokenizer.decode(&run).unwrap());
                run.clear();
            }
        }
        runs
    }

    #[test]
    fn only_the_replies_and_their_end_are_taught() {
        let conversation = [
            m("system", "Be brief."),
            m("user", "Who fell?"),
            m("assistant", "Man."),
            m("user", "Why?"),
            m("assistant", "Fruit."),
        ];
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let section = ChatSection {
            template: chatml.into(),
            ..ChatSection::default()
        };
        let template = ChatTemplate::new(None, &section).unwrap();
        let text = template.render_with(&conversation, false).unwrap();
        let tokenizer = Tokenizer::train(TokenizerKind::Char, &text, 0).unwrap();
        let t = template.render_taught(&conversation, &tokenizer).unwrap();
        assert_eq!(
            tokenizer.decode(&t.ids).unwrap(),
            text,
            "the whole conversation"
        );
        assert_eq!(
            taught_text(&t, &tokenizer, true),
            ["Man.<|im_end|>\n", "Fruit.<|im_end|>\n"]
        );
        let untaught = taught_text(&t, &tokenizer, false);
        assert!(untaught[0].ends_with("Who fell?<|im_end|>\n<|im_start|>assistant\n"));
        assert_eq!(
            t.taught_tokens(),
            "Man.<|im_end|>\nFruit.<|im_end|>\n".len()
        );
    }

    #[test]
    fn the_transcript_teaches_each_reply_and_the_stop_after_the_last() {
        let template = ChatTemplate::Transcript(Transcript::default());
        let conversation = [m("user", "2+2?"), m("assistant", "4")];
        let tokenizer = Tokenizer::train(TokenizerKind::Char, "user: 2+?\nassistant4", 0).unwrap();
        let t = template.render_taught(&conversation, &tokenizer).unwrap();
        // The reply, then the rest of the stop text "\nuser:" that ends it when served.
        assert_eq!(taught_text(&t, &tokenizer, true), ["4\nuser:"]);
        assert_eq!(
            taught_text(&t, &tokenizer, false),
            ["user: 2+2?\nassistant: "]
        );
    }

    #[test]
    fn conversations_without_a_reply_or_with_templates_that_reorder_are_refused() {
        let template = ChatTemplate::Transcript(Transcript::default());
        let tokenizer = Tokenizer::train(TokenizerKind::Char, "user: hi\n", 0).unwrap();
        let err = template.render_taught(&[m("user", "hi")], &tokenizer);
        assert!(
            err.unwrap_err()
                .to_string()
                .contains("no assistant message")
        );
        // Newest message first: a turn's text is not the start of the next one's.
        let reversed = TemplateFile::Jinja(
            "{% for m in messages|reverse %}{{ m.content }};{% endfor %}".into(),
        );
        let template = ChatTemplate::new(Some(reversed), &ChatSection::default()).unwrap();
        let tokenizer = Tokenizer::train(TokenizerKind::Char, "ab;", 0).unwrap();
        let err = template.render_taught(&[m("user", "a"), m("assistant", "b")], &tokenizer);
        assert!(
            err.unwrap_err().to_string().contains("one after"),
            "a reordering template"
        );
    }
}
