//! `tinygpt`: train a tiny GPT on any text file, sample from it, evaluate it.

mod backend;
mod bench;
mod checkpoint;
mod config;
mod data;
mod engine;
mod eval;
mod inspect;
mod interop;
mod metrics;
mod tokenizer;
mod train;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use burn::tensor::{Device, Int, Tensor, TensorData};
use clap::{Parser, Subcommand, ValueEnum};
use tinygpt_model::{GenerateOptions, Gpt, GptConfig, generate};

use crate::backend::{Backend, describe};
use crate::checkpoint::{Run, TrainState, Which};
use crate::data::{Dataset, read_corpus};

#[derive(Parser)]
#[command(
    name = "tinygpt",
    version,
    about = "Train and sample a tiny GPT on any text file",
    after_help = "Examples:\n  tinygpt train                                   # configs/default.toml on data/paradise-lost.txt\n  tinygpt train --config configs/baby.toml --data ../shared/data/tinyshakespeare.txt\n  tinygpt generate --checkpoint runs/default --prompt \"Of Man's first\"\n  tinygpt eval --checkpoint runs/default\n  tinygpt info --checkpoint runs/default"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a GPT on a text file; writes a run directory (weights, tokenizer, metrics, plot).
    ///
    /// With no arguments: configs/default.toml on data/paradise-lost.txt into runs/default.
    /// Ctrl-C (or --max-time) saves the run; --resume continues it exactly.
    #[command(
        after_help = "Examples:\n  tinygpt train\n  tinygpt train --config configs/baby.toml --data ../shared/data/tinyshakespeare.txt --out runs/baby\n  tinygpt train --set model.n_layer=2 --set data.tokenizer=bpe --max-time 5m\n  tinygpt train --resume --out runs/baby --max-iters 4000"
    )]
    Train(train::TrainArgs),
    /// Sample text from a trained run, streamed to stdout.
    #[command(
        after_help = "Example:\n  tinygpt generate --checkpoint runs/default --prompt \"Of Man's first\" --max-new-tokens 300 --temperature 0.8"
    )]
    Generate {
        /// Run directory written by `tinygpt train`.
        #[arg(long, value_name = "DIR")]
        checkpoint: PathBuf,
        /// Which weights: the best validation loss, or the latest.
        #[arg(long, value_enum, default_value_t = Which::Best)]
        which: Which,
        /// Text to continue (default: a newline).
        #[arg(long, default_value = "\n")]
        prompt: String,
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
        /// Penalise tokens already in the context (1 = off).
        #[arg(long, default_value_t = 1.0)]
        repetition_penalty: f32,
        /// Stop when this text is generated (repeatable; not printed).
        #[arg(long, value_name = "STR")]
        stop: Vec<String>,
        #[arg(long, default_value_t = 1337)]
        seed: u64,
        /// Recompute the whole context at every token instead of using the KV cache.
        #[arg(long)]
        no_cache: bool,
        #[arg(long, value_enum, default_value_t = Backend::Auto)]
        backend: Backend,
    },
    /// Loss, bits per character (bits per byte for BPE) and perplexity.
    ///
    /// On the run's validation split, or on every token of --data.
    Eval {
        #[arg(long, value_name = "DIR")]
        checkpoint: PathBuf,
        /// Evaluate on this text instead of the validation split.
        #[arg(long, value_name = "FILE")]
        data: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = Which::Best)]
        which: Which,
        #[arg(long, value_enum, default_value_t = Backend::Auto)]
        backend: Backend,
    },
    /// Describe a run: config, parameters, tokenizer, steps done, best validation loss.
    Info {
        #[arg(long, value_name = "DIR")]
        checkpoint: PathBuf,
    },
    /// Print and draw a trained model's attention weights for a prompt.
    ///
    /// Each selected head's matrix is printed (rows = query tokens, columns = key tokens; the
    /// causal mask makes everything above the diagonal 0) and drawn as an SVG heatmap, with one
    /// overview image of all layers and heads.
    #[command(
        after_help = "Example:\n  tinygpt attention --checkpoint runs/default --prompt \"Of Man's first\" --layer 0 --head 1"
    )]
    Attention {
        #[arg(long, value_name = "DIR")]
        checkpoint: PathBuf,
        /// Text whose attention to show (at most block_size tokens).
        #[arg(long)]
        prompt: String,
        /// Only this layer (default: all).
        #[arg(long)]
        layer: Option<usize>,
        /// Only this head (default: all).
        #[arg(long)]
        head: Option<usize>,
        /// Decimal places in the printed matrices.
        #[arg(long, default_value_t = 2)]
        decimals: usize,
        /// Where to write the SVG heatmaps (default: CHECKPOINT/attention).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = Which::Best)]
        which: Which,
        #[arg(long, value_enum, default_value_t = Backend::Auto)]
        backend: Backend,
    },
    /// Write a run's weights for PyTorch: nanoGPT's parameter names and [out, in] layout.
    ///
    /// Writes FILE.safetensors and FILE.json (nanoGPT's config and tokenizer maps).
    #[command(
        after_help = "Example:\n  tinygpt export --checkpoint runs/default --format nanogpt --out model.safetensors"
    )]
    Export {
        #[arg(long, value_name = "DIR")]
        checkpoint: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Nanogpt)]
        format: Format,
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        #[arg(long, value_enum, default_value_t = Which::Best)]
        which: Which,
    },
    /// Build a run directory from nanoGPT-named weights (and their .json sidecar).
    #[command(
        after_help = "Example:\n  tinygpt import --from model.safetensors --out runs/imported"
    )]
    Import {
        #[arg(long, value_name = "FILE")]
        from: PathBuf,
        /// The run directory to create.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Measure training and sampling speed and peak memory (table, or JSON lines).
    ///
    /// Training: the median of --iters real training steps (forward, backward, clipping, AdamW)
    /// after --warmup, on random tokens. Sampling: --sample-tokens from a one-token prompt with
    /// the KV cache. Run nothing else meanwhile: on a small machine contention distorts timings.
    #[command(
        after_help = "Examples:\n  tinygpt bench\n  tinygpt bench --config baby --config shakespeare-char --backend flex --backend ndarray --json"
    )]
    Bench {
        /// Configs to measure: baby, shakespeare-char (the files in configs/).
        #[arg(long = "config", default_values_t = ["baby".to_string()])]
        configs: Vec<String>,
        /// Backends to measure.
        #[arg(long = "backend", value_enum, default_values_t = [Backend::Fused])]
        backends: Vec<Backend>,
        #[arg(long, default_value_t = 20)]
        iters: usize,
        #[arg(long, default_value_t = 3)]
        warmup: usize,
        #[arg(long, default_value_t = 500)]
        sample_tokens: usize,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print the logits for given tokens as JSON (the format of torch_gpt.py's `logits`).
    Logits {
        #[arg(long, value_name = "DIR")]
        checkpoint: PathBuf,
        /// Comma-separated token ids, e.g. 14,53,1.
        #[arg(long, value_delimiter = ',', required = true)]
        tokens: Vec<u32>,
        #[arg(long, value_enum, default_value_t = Which::Best)]
        which: Which,
        #[arg(long, value_enum, default_value_t = Backend::Auto)]
        backend: Backend,
    },
    /// Print a preset's architecture and parameter count.
    ///
    /// Example: tinygpt params --preset shakespeare-char --vocab-size 65
    Params {
        /// Which preset.
        #[arg(long, value_enum, default_value_t = Preset::Baby)]
        preset: Preset,
        /// Vocabulary size (65 for tiny-shakespeare's characters).
        #[arg(long, default_value_t = 65)]
        vocab_size: usize,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// nanoGPT / Hugging Face GPT-2 parameter names, PyTorch layouts.
    Nanogpt,
}

#[derive(Clone, Copy, ValueEnum)]
enum Preset {
    /// nanoGPT's CPU baby model: 4 layers, 4 heads, 128 wide, block 64.
    Baby,
    /// nanoGPT's shakespeare-char model: 6 layers, 6 heads, 384 wide, block 256.
    ShakespeareChar,
    /// The seeds' bare model: embeddings, one attention head, linear head.
    Minimal,
}

fn main() -> ExitCode {
    // Burn creates a loaded optimizer state on its default device, which is wgpu when compiled
    // in: resuming a CPU run would start a GPU driver (~90 MiB) or fail without one. Flex as the
    // default avoids that; Burn moves the state to the model's device at its first step.
    if std::env::var_os("BURN_DEVICE").is_none() {
        // SAFETY: no other thread exists yet to read the environment concurrently.
        unsafe { std::env::set_var("BURN_DEVICE", "flex") };
    }
    // A bug must still end in one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("unknown panic");
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "tinygpt: internal error{at}: {}",
            message.replace('\n', " ")
        );
    }));
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // Mesa's Vulkan drivers print an error per adapter probe without it (headless boxes,
        // CI); a temp dir is what they would fall back to. Set before any thread starts.
        // SAFETY: single-threaded here, nothing else reads the environment concurrently.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
    }
    let cli = Cli::parse();
    match std::panic::catch_unwind(|| run(cli)) {
        Ok(Ok(code)) => code,
        Ok(Err(err)) => {
            eprintln!("tinygpt: error: {}", format!("{err:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
        Err(_) => ExitCode::from(101),
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Train(mut args) => {
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            ctrlc::set_handler(move || {
                if flag.swap(true, Ordering::SeqCst) {
                    // Second Ctrl-C: leave now. Checkpoints are written atomically.
                    std::process::exit(130);
                }
                eprintln!(
                    "\ntinygpt: stopping after this step and saving (Ctrl-C again to quit now)"
                );
            })
            .context("cannot install the Ctrl-C handler")?;
            if args.config.is_none() && !args.resume {
                args.config = Some(PathBuf::from("configs/default.toml")).filter(|p| p.exists());
            }
            let outcome = train::train(args, stop)?;
            if outcome.interrupted {
                return Ok(ExitCode::from(130));
            }
            println!(
                "sample with: tinygpt generate --checkpoint {}",
                outcome.dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Generate {
            checkpoint,
            which,
            prompt,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            repetition_penalty,
            stop,
            seed,
            no_cache,
            backend,
        } => {
            let (run, _, model, _) = load(&checkpoint, which, backend)?;
            let tokenizer = &run.tokenizer;
            let prompt_ids = tokenizer.encode(&prompt).context("--prompt")?;
            let stop = stop
                .iter()
                .map(|s| tokenizer.encode(s).context("--stop"))
                .collect::<Result<Vec<_>>>()?;
            let options = GenerateOptions {
                max_new_tokens,
                temperature,
                top_k: (top_k > 0).then_some(top_k),
                top_p,
                repetition_penalty,
                seed,
                stop,
                use_cache: !no_cache,
            };
            let mut out = std::io::stdout().lock();
            write!(out, "{prompt}")?;
            // Byte-level BPE tokens can end inside a character: hold tokens back until they
            // decode cleanly. Only the held-back tail is decoded per token, not the whole text.
            let mut pending = Vec::new();
            let mut write_error = None;
            let explicit = backend == Backend::Fused;
            let mut decoder = engine::decoder(backend.resolve(), explicit, &model)?;
            generate(&mut *decoder, &prompt_ids, &options, |id| {
                pending.push(id);
                if let Ok(text) = tokenizer.decode(&pending)
                    && !text.ends_with('\u{FFFD}')
                {
                    pending.clear();
                    if let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
                        write_error.get_or_insert(e);
                    }
                }
            })?;
            if let Some(e) = write_error
                && e.kind() != std::io::ErrorKind::BrokenPipe
            {
                return Err(e.into());
            }
            let _ = writeln!(out);
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval {
            checkpoint,
            data,
            which,
            backend,
        } => {
            let (run, device, model, state) = load(&checkpoint, which, backend)?;
            let config = &run.config;
            let (split, source) = match data {
                Some(path) => {
                    let text = read_corpus(&path)?;
                    let split = data::whole_split(
                        &text,
                        &run.tokenizer,
                        &config.data,
                        config.model.block_size,
                    )
                    .with_context(|| format!("--data {}", path.display()))?;
                    (split, path.display().to_string())
                }
                None => {
                    let text = read_corpus(&config.data.path).context(
                        "the run's corpus is needed for its validation split (or pass --data)",
                    )?;
                    let dataset =
                        Dataset::new(&text, &run.tokenizer, &config.data, config.model.block_size)?;
                    (
                        dataset.val,
                        format!("validation split of {}", config.data.path.display()),
                    )
                }
            };
            let result = eval::evaluate(
                &model,
                &run.tokenizer,
                &split,
                config.model.block_size,
                &device,
            )?;
            println!(
                "{source} | {} weights (step {}) on {} | {} tokens | loss {:.4} | {:.4} bits per {} | perplexity {:.3}",
                match which {
                    Which::Best => "best",
                    Which::Last => "last",
                },
                state.step,
                describe(&device),
                result.tokens,
                result.loss,
                result.bits_per_unit,
                run.tokenizer.unit(),
                result.perplexity
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Info { checkpoint } => {
            let run = Run::open(&checkpoint)?;
            let gpt = run.config.gpt(run.tokenizer.vocab_size());
            let model = gpt.init(&Device::flex())?;
            println!("run {}", run.dir.display());
            println!(
                "model: {} layers, {} heads, n_embd {}, block {}, vocab {} | {} parameters ({:.2}M without wpe)",
                gpt.n_layer,
                gpt.n_head,
                gpt.n_embd,
                gpt.block_size,
                gpt.vocab_size,
                model.num_params(),
                model.num_params_non_embedding() as f64 / 1e6
            );
            println!(
                "tokenizer: {}, {} tokens",
                run.tokenizer.kind(),
                run.tokenizer.vocab_size()
            );
            match run.state(Which::Last) {
                Ok(state) => println!(
                    "trained: {} of {} steps, {} tokens, {:.1}s | last train loss {} val loss {} | best val loss {}",
                    state.step,
                    run.config.train.max_iters,
                    state.tokens,
                    state.elapsed_s,
                    fmt_loss(state.train_loss),
                    fmt_loss(state.val_loss),
                    match (state.best_val_loss, state.best_step) {
                        (Some(v), Some(s)) => format!("{v:.4} at step {s}"),
                        _ => "-".into(),
                    }
                ),
                Err(_) => println!("trained: no checkpoint saved yet"),
            }
            println!("config ({}):", run.dir.join(checkpoint::CONFIG).display());
            print!("{}", run.config.to_toml());
            Ok(ExitCode::SUCCESS)
        }
        Command::Attention {
            checkpoint,
            prompt,
            layer,
            head,
            decimals,
            out,
            which,
            backend,
        } => {
            let (run, device, model, _) = load(&checkpoint, which, backend)?;
            let maps = inspect::AttentionMaps::compute(&model, &run.tokenizer, &prompt, &device)?;
            let (layers, heads) = (run.config.model.n_layer, run.config.model.n_head);
            for (what, value, count) in [("--layer", layer, layers), ("--head", head, heads)] {
                if let Some(v) = value
                    && v >= count
                {
                    anyhow::bail!(
                        "{what} {v} does not exist: the model has {count} (0..{})",
                        count - 1
                    );
                }
            }
            let selected: Vec<(usize, usize)> = (0..layers)
                .filter(|l| layer.is_none_or(|x| x == *l))
                .flat_map(|l| {
                    (0..heads)
                        .filter(|h| head.is_none_or(|x| x == *h))
                        .map(move |h| (l, h))
                })
                .collect();
            for &(l, h) in &selected {
                println!("{}", maps.format(l, h, decimals));
            }
            let dir = out.unwrap_or_else(|| run.dir.join("attention"));
            for path in maps.write(&dir, &selected)? {
                println!("wrote {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Export {
            checkpoint,
            format: Format::Nanogpt,
            out,
            which,
        } => {
            let run = Run::open(&checkpoint)?;
            interop::export(&run, which, &out)?;
            println!(
                "wrote {} and {} (nanoGPT names, PyTorch [out, in] layout)",
                out.display(),
                interop::sidecar_path(&out).display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Import { from, out } => {
            interop::import(&from, &out)?;
            println!("wrote run {} from {}", out.display(), from.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            configs,
            backends,
            iters,
            warmup,
            sample_tokens,
            json,
        } => {
            if iters == 0 {
                anyhow::bail!("--iters must be at least 1");
            }
            if !json {
                println!("{}", bench::header());
            }
            let args = bench::BenchArgs {
                configs,
                backends,
                iters,
                warmup,
                sample_tokens,
            };
            bench::bench(&args, |result| {
                if json {
                    println!("{}", serde_json::to_string(result).expect("serialisable"));
                } else {
                    println!("{}", bench::row(result));
                }
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Logits {
            checkpoint,
            tokens,
            which,
            backend,
        } => {
            let (_, device, model, _) = load(&checkpoint, which, backend)?;
            let seq = tokens.len();
            let input = Tensor::<2, Int>::from_data(
                TensorData::new(tokens.iter().map(|&t| t as i64).collect(), [1, seq]),
                &device,
            );
            let logits = model.forward(input)?;
            let vocab = model.vocab_size;
            let loss = (seq > 1)
                .then(|| {
                    let targets = Tensor::<1, Int>::from_data(
                        TensorData::new(tokens[1..].iter().map(|&t| t as i64).collect(), [seq - 1]),
                        &device,
                    );
                    let head = logits
                        .clone()
                        .slice([0..1, 0..seq - 1])
                        .reshape([seq - 1, vocab]);
                    tinygpt_model::cross_entropy(head, targets).map(|l| l.into_scalar::<f32>())
                })
                .transpose()?;
            let values = logits
                .into_data()
                .try_to_vec_as::<f32>()
                .expect("f32 logits");
            let rows: Vec<&[f32]> = values.chunks(vocab).collect();
            println!(
                "{}",
                serde_json::json!({"phase": "logits", "shape": [1, seq, vocab], "logits": rows, "loss": loss})
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Params { preset, vocab_size } => {
            let config = match preset {
                Preset::Baby => GptConfig::baby(vocab_size),
                Preset::ShakespeareChar => GptConfig::shakespeare_char(vocab_size),
                Preset::Minimal => GptConfig::minimal(vocab_size),
            };
            let model = config.init(&Device::flex())?;
            println!(
                "{} layers, {} heads, n_embd {}, block {}, vocab {}, bias {}, tied head {}",
                config.n_layer,
                config.n_head,
                config.n_embd,
                config.block_size,
                config.vocab_size,
                config.bias,
                config.tie_embeddings
            );
            println!(
                "{} parameters ({:.2}M without the position embedding, as nanoGPT counts)",
                model.num_params(),
                model.num_params_non_embedding() as f64 / 1e6
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The run in `checkpoint`, the device of `backend`, and the `which` weights on it.
fn load(
    checkpoint: &Path,
    which: Which,
    backend: Backend,
) -> Result<(Run, Device, Gpt, TrainState)> {
    let run = Run::open(checkpoint)?;
    let device = backend.device()?;
    let (model, state) = run.load_model(which, &device)?;
    Ok((run, device, model, state))
}

fn fmt_loss(loss: Option<f64>) -> String {
    loss.map_or("-".into(), |l| format!("{l:.4}"))
}
