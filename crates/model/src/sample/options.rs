//! [`GenerateOptions`]: how [`generate`](crate::generate()) picks each next token, checked
//! before it starts.

use crate::error::{GenerateError, ModelError};

/// How [`Gpt::generate`](crate::Gpt::generate) picks each next token.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// Tokens to sample (fewer if a stop sequence appears).
    pub max_new_tokens: usize,
    /// Divides the logits: < 1 sharper, > 1 flatter; 0 = greedy (always the most likely token).
    pub temperature: f32,
    /// Sample only among the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Nucleus sampling: only among the most likely tokens whose probabilities add up to `top_p`
    /// (1 = off).
    pub top_p: f32,
    /// Min-p sampling (llama.cpp, vLLM, Hugging Face's `min_p`): only among the tokens whose
    /// probability is at least `min_p` times the most likely one's, so the cut follows the
    /// model's confidence (0 = off).
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of tokens already in the context, as in
    /// CTRL and Hugging Face; 1 = off.
    pub repetition_penalty: f32,
    /// OpenAI's: subtracted from a token's logit once per time it was generated so far
    /// (-2..=2; 0 = off; the prompt does not count).
    pub frequency_penalty: f32,
    /// OpenAI's: subtracted once from the logit of every token generated so far (-2..=2).
    pub presence_penalty: f32,
    /// Added to the logits of these tokens before sampling (-100..=100; -100 bans a token in
    /// practice, 100 forces it).
    pub logit_bias: Vec<(u32, f32)>,
    /// With each token, report the log-probabilities of this many most likely tokens
    /// ([`Sampled::top`](crate::Sampled::top); 0 = only the token's own).
    pub top_logprobs: usize,
    /// Seed of the sampler: same seed, same model, same backend → same text.
    pub seed: u64,
    /// Token sequences that end generation; they are not returned or streamed.
    pub stop: Vec<Vec<u32>>,
    /// Reuse keys/values across steps (a [`KvCache`](tinygpt_attention::KvCache) per layer). Off recomputes the whole
    /// context at every step, as nanoGPT's `generate` does; both give the same tokens.
    pub use_cache: bool,
    /// Once the context fills `block_size`, keep only its last half and feed on through the
    /// cache, instead of sliding the window by one token and rebuilding the cache at every
    /// step. Much faster past `block_size`, but no longer nanoGPT's exact rule (the model sees
    /// between half a block and a whole block of context), so it is off by default.
    pub context_shift: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_new_tokens: 500,
            temperature: 0.8,
            top_k: Some(200),
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            top_logprobs: 0,
            seed: 1337,
            stop: Vec::new(),
            use_cache: true,
            context_shift: false,
        }
    }
}

impl GenerateOptions {
    /// Checks every option; the error names the bad one.
    pub fn validate(&self) -> Result<(), GenerateError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(GenerateError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(GenerateError::TopP(self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(GenerateError::MinP(self.min_p));
        }
        if self.top_k == Some(0) {
            return Err(GenerateError::TopK);
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(GenerateError::RepetitionPenalty(self.repetition_penalty));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(GenerateError::FrequencyPenalty(self.frequency_penalty));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(GenerateError::PresencePenalty(self.presence_penalty));
        }
        if let Some(&(id, bias)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(b))
        {
            return Err(GenerateError::LogitBias { id, bias });
        }
        if self.stop.iter().any(Vec::is_empty) {
            return Err(GenerateError::EmptyStop);
        }
        Ok(())
    }

    /// [`Self::validate`], and every token id named (prompt, logit bias) inside `vocab_size`.
    pub(crate) fn check(&self, prompt: &[u32], vocab_size: usize) -> Result<(), GenerateError> {
        self.validate()?;
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        let ids = prompt
            .iter()
            .chain(self.logit_bias.iter().map(|(id, _)| id));
        if let Some(&id) = ids.into_iter().find(|&&id| id as usize >= vocab_size) {
            return Err(ModelError::TokenOutOfRange {
                id: id.into(),
                vocab_size,
            }
            .into());
        }
        Ok(())
    }
}
