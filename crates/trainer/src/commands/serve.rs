//! `tinygpt serve`: the OpenAI-compatible HTTP API and the browser playground.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use tinygpt::backend::Backend;
use tinygpt::chat::{ChatTemplate, TemplateFile};
use tinygpt::decoder::Weights;
use tinygpt::run::checkpoint::Which;
use tinygpt::serve::{ConnectionLimits, Model, ServeOptions, serve};

/// Serve a trained run over HTTP: an OpenAI-compatible completions API and a playground.
///
/// Routes: POST /v1/completions and /v1/chat/completions (OpenAI's requests and responses,
/// `stream: true` for server-sent events, `logprobs`, `echo`, penalties, `logit_bias`, `n`;
/// `top_k`, `repetition_penalty` and `context_shift` as extensions), POST /v1/tokenize and
/// /v1/detokenize, GET /v1/models, POST /v1/attention (the attention weights of a prompt), GET
/// /health, and the playground at /. Ctrl-C finishes the requests in flight (up to
/// --shutdown-timeout), then stops.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  tinygpt serve --checkpoint runs/default\n  curl http://127.0.0.1:8080/v1/completions -H 'Content-Type: application/json' \\\n    -d '{\"prompt\": \"Of Man'\\''s first\", \"max_tokens\": 100, \"temperature\": 0.8}'"
)]
pub struct Args {
    /// Run directory written by `tinygpt train`.
    #[arg(long, value_name = "DIR")]
    checkpoint: PathBuf,
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
    /// Address to listen on. Anything but loopback needs --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port (0 = any free port; the one chosen is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every /v1 route (default: the environment
    /// variable TINYGPT_API_KEY, which other users of the machine cannot read from `ps`).
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Worker threads (default: one per core on the CPU, one on a GPU), each decoding up to
    /// --max-batch requests at once in one batch.
    #[arg(long, value_name = "N")]
    max_concurrent: Option<usize>,
    /// Requests each worker decodes together, a row each, one token a step (each row needs a
    /// KV cache of the model's block_size where the model runs, checked at start).
    #[arg(long, value_name = "N", default_value_t = 16)]
    max_batch: usize,
    /// Requests that may wait for a free generation slot; beyond them, 429.
    #[arg(long, value_name = "N", default_value_t = 64)]
    queue: usize,
    /// The largest `max_tokens` a request may ask for.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    max_tokens: usize,
    /// The longest prompt in tokens (default: the model's block_size).
    #[arg(long, value_name = "N")]
    max_prompt_tokens: Option<usize>,
    /// The largest request body in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// The most attention weights one POST /v1/attention may make (layers × heads × tokens²,
    /// 4 bytes each while it is answered): a request beyond gets a 400 that says how to ask
    /// for less (one layer, a shorter prompt). The default, 2^26, is 256 MiB.
    #[arg(long, value_name = "N", default_value_t = 1 << 26)]
    max_attention_weights: usize,
    /// Default for requests that do not say: past block_size, refill the KV cache from the last
    /// half block instead of nanoGPT's exact sliding window (see `generate --context-shift`).
    #[arg(long)]
    context_shift: bool,
    /// How /v1/chat/completions writes a conversation for the model, instead of the run's own
    /// chat template: a Jinja chat template as Hugging Face writes them (any file name), or a
    /// plain transcript's texts in TOML (FILE.toml: `message` ("{role}: {content}\n"),
    /// `assistant` ("assistant: ") and `stop` (["\nuser:"]); absent keys keep these).
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// After Ctrl-C or SIGTERM, how long the requests in flight may take (e.g. 30s, 2m) before
    /// their connections are closed; a second Ctrl-C closes them at once.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    shutdown_timeout: Duration,
    /// Connections open at once; one more is answered 503 and closed. Lowered, with a note,
    /// to what the open-files limit (ulimit -n) allows.
    #[arg(long, value_name = "N", default_value_t = ConnectionLimits::default().max_connections)]
    max_connections: usize,
    /// How long a client may take to send a request's head (request line and headers), from
    /// connecting or from its last answer: idle keep-alive connections close after it too.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    header_timeout: Duration,
    /// How long a client may take to send a request's body (408 beyond).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    body_timeout: Duration,
    /// How long a client may go without reading any of its answer before it is cut off (and
    /// the generation for it stopped, freeing its worker).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    write_timeout: Duration,
    #[arg(long, value_enum, default_value_t = Which::Best)]
    which: Which,
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
}

pub fn run(args: Args) -> Result<ExitCode> {
    // Flag mistakes first: loading a large model takes a while.
    let template_file = args
        .chat_template
        .as_deref()
        .map(TemplateFile::read)
        .transpose()?;
    let mut options = ServeOptions {
        addr: SocketAddr::new(args.host, args.port),
        api_key: args.api_key.or_else(|| {
            std::env::var("TINYGPT_API_KEY")
                .ok()
                .filter(|k| !k.is_empty())
        }),
        max_concurrent: args.max_concurrent.unwrap_or(1),
        max_batch: args.max_batch,
        queue: args.queue,
        max_tokens: args.max_tokens,
        max_prompt_tokens: args.max_prompt_tokens,
        max_body_bytes: args.max_body_bytes,
        max_attention_weights: args.max_attention_weights,
        context_shift: args.context_shift,
        shutdown_timeout: args.shutdown_timeout,
        connections: ConnectionLimits {
            max_connections: args.max_connections,
            header_timeout: args.header_timeout,
            body_timeout: args.body_timeout,
            write_timeout: args.write_timeout,
        },
        chat_template: ChatTemplate::Transcript(Default::default()),
    };
    options.validate()?;
    let load = super::load::for_sampling(&args.checkpoint, args.which, args.backend, args.weights)?;
    let (run, placement, gpt) = (load.run, load.placement, load.model);
    // On the CPU a worker a core; a GPU takes one batch, from one worker.
    if args.max_concurrent.is_none() && placement.on_host() {
        options.max_concurrent = std::thread::available_parallelism().map_or(1, |n| n.get());
    }
    options.chat_template = ChatTemplate::new(template_file, &run.config.chat)?;
    let name = run
        .dir
        .file_name()
        .map_or_else(|| "tinygpt".into(), |n| n.to_string_lossy().into_owned());
    let model = Model::new(gpt, placement, run.tokenizer, (load.weights, load.matrices))?;
    let workers = options.max_concurrent;
    let at_once = match workers {
        1 => format!("1 worker, a batch of up to {}", options.max_batch),
        n => format!("{n} workers, each a batch of up to {}", options.max_batch),
    };
    let chat = options.chat_template.describe();
    serve(name.clone(), model, options, |addr| {
        println!(
            "tinygpt: serving {name} on http://{addr} ({at_once}, chat as a {chat}); \
             playground at http://{addr}/"
        );
    })?;
    Ok(ExitCode::SUCCESS)
}
