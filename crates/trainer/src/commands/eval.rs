//! `tinygpt eval`: loss, bits per character (or byte) and perplexity of a run's weights.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use tinygpt::backend::{Backend, describe};
use tinygpt::chat::{ChatTemplate, jsonl};
use tinygpt::data::{self, Split, read_corpus};
use tinygpt::data::{conversations, corpus};
use tinygpt::decoder::{Weights, fused_matrices};
use tinygpt::eval::{evaluate, evaluate_decoded};
use tinygpt::run::checkpoint::{Run, Which};

/// Loss, bits per character (bits per byte for BPE) and perplexity.
///
/// On the run's validation split, or on every token of --data (a .jsonl file of conversations:
/// on the tokens of their replies, as fine-tuning teaches them).
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  tinygpt eval --checkpoint runs/default\n  tinygpt eval --checkpoint runs/baby --data input.txt --which last\n  tinygpt eval --checkpoint runs/smollm2 --weights q8_0        # what int8 matrices cost"
)]
pub struct Args {
    #[arg(long, value_name = "DIR")]
    checkpoint: PathBuf,
    /// Evaluate on this text (or .jsonl conversations) instead of the validation split.
    #[arg(long, value_name = "FILE")]
    data: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Which::Best)]
    which: Which,
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// Score with the model's matrices as sampling keeps them with `--weights` (q8_0: int8 on
    /// the fused CPU decoder, q5_0, q4_0 and q4_k: five and four bits there; file: the GGUF
    /// file's own blocks; bf16, f16: half precision on a GPU or flex), to measure what they
    /// cost; f32 scores with the model as trained.
    /// [default: file for a run imported from a quantised GGUF file, where the fused CPU
    /// decoder runs; f32 otherwise]
    #[arg(long, value_enum)]
    weights: Option<Weights>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let load = super::load::for_scoring(&args.checkpoint, args.which, args.backend, args.weights)?;
    let weights = load.weights.weights;
    let (run, placement, model, state) = (load.run, load.placement, load.model, load.state);
    let file = load.matrices;
    let device = placement.device.clone();
    let (split, source) = split(&run, args.data.as_ref())?;
    let block_size = run.config.model.block_size;
    let (result, on) = match weights {
        Weights::F32 => (
            evaluate(&model, &run.tokenizer, &split, block_size, &device)?,
            describe(&device),
        ),
        Weights::Bf16 | Weights::F16 => (
            evaluate(
                &weights.cast(model)?,
                &run.tokenizer,
                &split,
                block_size,
                &device,
            )?,
            format!("{} with {} matrices", describe(&device), weights.name()),
        ),
        Weights::Q8_0 | Weights::Q4_0 | Weights::Q5_0 | Weights::Q4K | Weights::File => {
            let matrices = match file {
                Some(matrices) => matrices,
                None => fused_matrices(weights, &run.dir, &placement)?,
            };
            let result = evaluate_decoded(&model, &run.tokenizer, &split, block_size, matrices)?;
            let kept = match weights {
                Weights::File => "the GGUF file's".to_string(),
                _ => weights.name().to_string(),
            };
            (
                result,
                format!("the fused CPU decoder with {kept} matrices"),
            )
        }
    };
    println!(
        "{source} | {} weights (step {}) on {} | {} tokens | loss {:.4} | {:.4} bits per {} | perplexity {:.3}",
        match args.which {
            Which::Best => "best",
            Which::Last => "last",
        },
        state.step,
        on,
        result.tokens,
        result.loss,
        result.bits_per_unit,
        run.tokenizer.unit(),
        result.perplexity
    );
    Ok(ExitCode::SUCCESS)
}

/// The text to evaluate on and its description: all of `data`, or the run's validation split.
fn split(run: &Run, data: Option<&PathBuf>) -> Result<(Split, String)> {
    let config = &run.config;
    let block_size = config.model.block_size;
    if let Some(path) = data
        && jsonl::is_jsonl(path)
    {
        let read = jsonl::read(path)?;
        let template = ChatTemplate::new(None, &config.chat)?;
        let all = conversations::whole(&read, &template, &run.tokenizer, block_size)
            .with_context(|| format!("--data {}", path.display()))?;
        let source = format!(
            "{} conversations of {} (their replies' tokens)",
            all.len(),
            path.display()
        );
        return Ok((Split::Conversations(all), source));
    }
    if let Some(path) = data {
        let text = read_corpus(path)?;
        let split = data::whole_split(&text, &run.tokenizer, &config.data, block_size)
            .with_context(|| format!("--data {}", path.display()))?;
        return Ok((split, path.display().to_string()));
    }
    let dataset = corpus::for_run(&run.dir, config, &run.tokenizer, false)
        .context("the run's corpus is needed for its validation split (or pass --data)")?;
    let source = format!("validation split of {}", config.data.path.display());
    Ok((dataset.val, source))
}
