//! How a prompt starts: imported Llama-family tokenizers begin every text with their BOS token
//! (a Hugging Face post-processor, or GGUF's `tokenizer.ggml.add_bos_token`), as transformers'
//! `tokenizer(prompt)` and llama.cpp do; such models were trained so and write worse text
//! without it. tinygpt's own tokenizers add nothing: their documents' start is part of the
//! data.

use anyhow::Result;

use super::Tokenizer;

impl Tokenizer {
    /// The token every prompt starts with, if this tokenizer puts one before a text (read
    /// once, when the tokenizer is made).
    pub(crate) fn prompt_start(&self) -> Option<u32> {
        match self {
            Self::Bpe(t) => t.prompt_start,
            Self::Char { .. } => None,
        }
    }

    /// A prompt's token ids: [`Tokenizer::encode_with_specials`], after the
    /// [`prompt_start`](Self::prompt_start) token unless the text starts with it already.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode_with_specials(text)?;
        if let Some(start) = self.prompt_start()
            && ids.first() != Some(&start)
        {
            ids.insert(0, start);
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// tinygpt's own tokenizers start a prompt with nothing.
    #[test]
    fn own_tokenizers_add_nothing() {
        let text = "To be, or not to be: that is the question.\n".repeat(20);
        for t in [
            Tokenizer::train(super::super::TokenizerKind::Char, &text, 0).unwrap(),
            Tokenizer::train(super::super::TokenizerKind::Bpe, &text, 300).unwrap(),
        ] {
            assert_eq!(t.prompt_start(), None);
            assert_eq!(
                t.encode_prompt("to be").unwrap(),
                t.encode("to be").unwrap()
            );
        }
    }
}
