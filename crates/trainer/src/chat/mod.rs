//! How a conversation becomes the text a model continues, and where the assistant's turn ends.
//!
//! ```text
//! template.rs    the run's `[chat]` section and the one renderer everything uses
//! message.rs     one message of a conversation
//! jinja.rs       Hugging Face chat templates (Jinja), rendered as transformers renders them
//! transcript.rs  the plain transcript ("user: …\nassistant: ") for models taught no format
//! taught.rs      a conversation as fine-tuning sees it: tokens, and which ones are taught
//! jsonl.rs       conversations read from JSONL (OpenAI `messages`, or prompt/completion)
//! ```
//!
//! A run's template is part of the run (`[chat]` in its config.toml): an imported model brings
//! its own, a fine-tuned run keeps its source's, and `serve --chat-template FILE` overrides it.

mod jinja;
pub mod jsonl;
mod message;
mod taught;
mod template;
mod transcript;

pub use jinja::Jinja;
pub use message::Message;
pub use taught::Taught;
pub use template::{ChatSection, ChatTemplate, TemplateFile};
pub use transcript::Transcript;
