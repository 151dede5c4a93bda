//! Hugging Face chat templates: Jinja, rendered as transformers renders them
//! (`apply_chat_template`): `trim_blocks` and `lstrip_blocks` on, loop controls, Python's string
//! and dict methods (`.strip()`, `.items()`, …), `raise_exception`, and the variables
//! `messages`, `add_generation_prompt`, `tools` and `documents` (none), `bos_token`, `eos_token`.

use std::collections::BTreeMap;

use anyhow::{Result, anyhow};
use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value, context};

use super::message::Message;

const NAME: &str = "chat_template";

/// A compiled chat template with the special tokens it may name.
#[derive(Debug, Clone)]
pub struct Jinja {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl Jinja {
    /// Compiles `source`; a syntax error is one line naming where it is.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| anyhow!("{e}"))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| anyhow!("the chat template does not compile: {}", one_line(&e)))?;
        let given = |t: &str| (!t.is_empty()).then(|| t.to_owned());
        Ok(Self {
            env,
            bos_token: given(bos_token),
            eos_token: given(eos_token),
        })
    }

    /// `messages` as the template writes them, ending where the assistant's reply begins when
    /// `add_generation_prompt`. A template that refuses the conversation (`raise_exception`,
    /// say for roles that do not alternate) is an error with its message.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| context! { role => m.role.as_str(), content => m.content.as_str() })
            .collect();
        let mut variables: BTreeMap<String, Value> = BTreeMap::from([
            ("messages".into(), Value::from(messages)),
            (
                "add_generation_prompt".into(),
                Value::from(add_generation_prompt),
            ),
            // transformers passes these as None when a request has none.
            ("tools".into(), Value::from(())),
            ("documents".into(), Value::from(())),
        ]);
        // A special token the tokenizer does not name stays undefined, as in transformers.
        for (name, token) in [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
        ] {
            if let Some(token) = token {
                variables.insert(name.into(), Value::from(token.as_str()));
            }
        }
        let template = self.env.get_template(NAME).map_err(|e| anyhow!("{e}"))?;
        template
            .render(Value::from(variables))
            .map_err(|e| anyhow!("{}", one_line(&e)))
    }
}

/// A template error as one line: what `raise_exception` said, or the error and its place.
fn one_line(e: &Error) -> String {
    match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) => detail.to_owned(),
        _ => e.to_string().replace('\n', " "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(role: &str, content: &str) -> Message {
        Message::new(role, content)
    }

    /// SmolLM2-Instruct's template, as its tokenizer_config.json holds it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_renders_as_transformers_does() {
        let t = Jinja::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        assert_eq!(
            t.render(&[m("user", "Hi")], true).unwrap(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
             Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let no_prompt = t.render(&[m("system", "Be brief."), m("user", "Hi")], false);
        assert_eq!(
            no_prompt.unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn blocks_trim_their_newlines_and_python_methods_work() {
        // Without trim_blocks/lstrip_blocks the block tags' lines would leave newlines and
        // indentation; `.strip()` and `bos_token` are what Llama-style templates use.
        let source = "{{ bos_token }}\n{% for m in messages %}\n  {% if m.role == 'user' %}\n[INST] {{ m.content.strip() }} [/INST]\n  {% else %}\n{{ m.content }}{{ eos_token }}\n  {% endif %}\n{% endfor %}";
        let t = Jinja::new(source, "<s>", "</s>").unwrap();
        let text = t
            .render(&[m("user", "  Hi "), m("assistant", "Hello")], true)
            .unwrap();
        assert_eq!(text, "<s>\n[INST] Hi [/INST]\nHello</s>\n");
    }

    #[test]
    fn refusals_and_mistakes_are_one_line() {
        let source = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user message') }}{% endif %}ok";
        let t = Jinja::new(source, "", "").unwrap();
        assert_eq!(t.render(&[m("user", "x")], true).unwrap(), "ok");
        let err = t.render(&[m("assistant", "x")], true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Conversations must start with a user message"
        );
        let err = Jinja::new("{% for m in messages %}", "", "").unwrap_err();
        assert!(
            err.to_string().contains("does not compile") && !err.to_string().contains('\n'),
            "{err}"
        );
    }

    #[test]
    fn unset_special_tokens_are_undefined() {
        let t = Jinja::new("{% if bos_token is defined %}B{% endif %}x", "", "").unwrap();
        assert_eq!(t.render(&[], true).unwrap(), "x");
    }
}
