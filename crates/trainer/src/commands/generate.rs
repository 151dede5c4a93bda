//! `tinygpt generate`: sample text from a run, streamed to stdout.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use tinygpt::backend::Backend;
use tinygpt::backend::EngineKind;
use tinygpt::chat::{ChatSection, ChatTemplate, Message};
use tinygpt::data::tokenizer::{TextStream, Tokenizer};
use tinygpt::decoder::{Weights, decoder_for, fused_decoder, return_freed_memory, sampling_engine};
use tinygpt::run::checkpoint::Which;
use tinygpt_model::{GenerateOptions, generate};

/// Sample text from a trained run, streamed to stdout.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  tinygpt generate --checkpoint runs/default --prompt \"Of Man's first\" --max-new-tokens 300 --temperature 0.8"
)]
pub struct Args {
    /// Run directory written by `tinygpt train`.
    #[arg(long, value_name = "DIR")]
    checkpoint: PathBuf,
    /// Which weights: the best validation loss, or the latest.
    #[arg(long, value_enum, default_value_t = Which::Best)]
    which: Which,
    /// Text to continue (default: a newline); with --chat, the user's message.
    #[arg(long, default_value = "\n")]
    prompt: String,
    /// Chat: write --prompt as a user's message through the run's chat template (as `serve`'s
    /// /v1/chat/completions does), print only the assistant's reply, and stop at the end of
    /// its turn.
    #[arg(long)]
    chat: bool,
    /// With --chat, a system message before the user's.
    #[arg(long, value_name = "TEXT", requires = "chat")]
    system: Option<String>,
    #[arg(long, default_value_t = 500)]
    max_new_tokens: usize,
    /// Sharpness of sampling: < 1 more conservative, > 1 more random, 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Sample only among the K most likely tokens (0 = all).
    #[arg(long, default_value_t = 200)]
    top_k: usize,
    /// Nucleus sampling: the most likely tokens covering probability P (1 = off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Only tokens at least P times as likely as the most likely one (0 = off).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Penalise tokens already in the context (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Lower a token's logit by this much per time it was generated so far (-2..2; OpenAI's).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Lower the logit of every token generated so far by this much (-2..2; OpenAI's).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    /// Add BIAS (-100..100) to token ID's logit: -100 bans it, 100 forces it (repeatable).
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_bias)]
    logit_bias: Vec<(u32, f32)>,
    /// Stop when this text is generated (repeatable; not printed).
    #[arg(long, value_name = "STR")]
    stop: Vec<String>,
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// Recompute the whole context at every token instead of using the KV cache.
    #[arg(long)]
    no_cache: bool,
    /// Past block_size, refill the cache from the last half block once it is full instead of
    /// sliding the window by one token (nanoGPT's exact rule) and rebuilding it every token:
    /// much faster for long texts, slightly different ones.
    #[arg(long, conflicts_with = "no_cache")]
    context_shift: bool,
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// How the model's matrices are kept while sampling: f32 as trained; bf16 or f16 on a GPU
    /// (half the bytes a token reads, summed in f32); q8_0 on the CPU (int8 in blocks of 32,
    /// GGUF's Q8_0: about a quarter of the bytes); q5_0 and q4_0 there (five and four bits in
    /// blocks of 32, GGUF's Q5_0 and Q4_0: about a sixth and an eighth, for more accuracy lost);
    /// q4_k there (GGUF's Q4_K, by ggml's own quantiser as the model loads); file: each matrix
    /// in the GGUF file the run was imported from, from its own blocks.
    /// [default: file for a run imported from a quantised GGUF file, where the fused CPU
    /// decoder runs; f32 otherwise]
    #[arg(long, value_enum)]
    weights: Option<Weights>,
}

impl Args {
    /// The sampler's settings; `chat_stop` (the template's end of turn) ends it too.
    fn options(&self, tokenizer: &Tokenizer, chat_stop: &[String]) -> Result<GenerateOptions> {
        let stop = self
            .stop
            .iter()
            .chain(chat_stop)
            .map(|s| tokenizer.encode_with_specials(s).context("--stop"))
            .collect::<Result<Vec<_>>>()?;
        Ok(GenerateOptions {
            max_new_tokens: self.max_new_tokens,
            temperature: self.temperature,
            top_k: (self.top_k > 0).then_some(self.top_k),
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: self.logit_bias.clone(),
            top_logprobs: 0,
            seed: self.seed,
            stop,
            use_cache: !self.no_cache,
            context_shift: self.context_shift,
        })
    }
}

/// `ID=BIAS`, e.g. `10=-100`.
fn parse_bias(text: &str) -> Result<(u32, f32), String> {
    let bad = || format!("{text:?} is not ID=BIAS (a token id and a number, e.g. 10=-100)");
    let (id, bias) = text.split_once('=').ok_or_else(bad)?;
    Ok((
        id.trim().parse().map_err(|_| bad())?,
        bias.trim().parse().map_err(|_| bad())?,
    ))
}

/// The text the model continues, what is printed before its continuation, and the texts that
/// end a chat reply: the prompt itself, or with `--chat` the conversation as the run's chat
/// template writes it (printed: nothing).
fn prompt(args: &Args, chat: &ChatSection) -> Result<(String, String, Vec<String>)> {
    if !args.chat {
        return Ok((args.prompt.clone(), args.prompt.clone(), Vec::new()));
    }
    let template = ChatTemplate::new(None, chat)?;
    let mut messages: Vec<Message> = args
        .system
        .iter()
        .map(|s| Message::new("system", s))
        .collect();
    messages.push(Message::new("user", &args.prompt));
    let text = template.render(&messages).context("--chat")?;
    Ok((text, String::new(), template.stop().to_vec()))
}

pub fn run(args: Args) -> Result<ExitCode> {
    let load = super::load::for_sampling(&args.checkpoint, args.which, args.backend, args.weights)?;
    let weights = load.weights.weights;
    let (run, model) = (load.run, load.model);
    let tokenizer = &run.tokenizer;
    let (prompt, echo, chat_stop) = prompt(&args, &run.config.chat)?;
    // A chat template writes the conversation's start itself (transformers adds nothing to a
    // rendered conversation); a plain prompt starts as the model's tokenizer starts a text.
    let prompt_ids = match args.chat {
        true => tokenizer.encode_with_specials(&prompt),
        false => tokenizer.encode_prompt(&prompt),
    }
    .context("--prompt")?;
    let options = args.options(tokenizer, &chat_stop)?;
    let mut out = std::io::stdout().lock();
    let mut text = TextStream::after(tokenizer, &prompt_ids);
    let (vocab, kind) = (tokenizer.vocab_size(), sampling_engine(&load.placement)?);
    let on_device;
    let mut decoder = match (kind, load.matrices) {
        // The fused decoder keeps its own copy of the weights: the model's is freed here.
        (EngineKind::Fused, Some(matrices)) => {
            let fused = fused_decoder(&model, vocab, matrices)?;
            drop(model);
            return_freed_memory();
            fused
        }
        _ => {
            on_device = weights.cast(model)?;
            decoder_for(kind, &on_device, vocab, &load.weights)?
        }
    };
    // Shown before the prompt is read, not with the first new token.
    let written = write!(out, "{echo}").and_then(|_| out.flush());
    let mut write_error = written.err();
    generate(&mut *decoder, &prompt_ids, &options, |id| {
        if let Some(piece) = text.push(id)
            && write_error.is_none()
            && let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush())
        {
            write_error = Some(e);
        }
    })?;
    // Tokens that never completed a character (the sample stopped inside one) are printed as
    // U+FFFD, as a decoder shows them, not dropped.
    if let Some(rest) = text.finish()
        && write_error.is_none()
    {
        write_error = out.write_all(rest.as_bytes()).err();
    }
    match write_error {
        // A closed pipe (`| head`) ends the output quietly, as Unix tools do.
        Some(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => {
            let _ = writeln!(out);
            Ok(ExitCode::SUCCESS)
        }
    }
}
