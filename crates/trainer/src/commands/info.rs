//! `tinygpt info`: what a run is and where its training stands.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use tinygpt::config::UpdateKind;
use tinygpt::interop::gguf::kept::FileTypes;
use tinygpt::run::checkpoint::{self, Checkpoint, Run, Which};
use tinygpt::train::memory;
use tinygpt_model::names::Slot;
use tinygpt_model::{GptConfig, WeightFormat, decoding::weight_bytes_per_token};

/// Describe a run: config, parameters, tokenizer, steps done, best validation loss.
#[derive(clap::Args)]
#[command(after_help = "Example:\n  tinygpt info --checkpoint runs/default")]
pub struct Args {
    #[arg(long, value_name = "DIR")]
    checkpoint: PathBuf,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let run = Run::open(&args.checkpoint)?;
    // Counted from the config, the checkpoints checked by reading them through: describing a
    // run never builds nor loads its model (at SmolLM2-1.7B's shape, gigabytes).
    let gpt = run.config.gpt(run.tokenizer.vocab_size());
    println!("run {}", run.dir.display());
    print_model(&run, &gpt);
    print_training(&run);
    print_costs(&run, &gpt)?;
    println!("config ({}):", run.dir.join(checkpoint::CONFIG).display());
    print!("{}", run.config.to_toml());
    Ok(ExitCode::SUCCESS)
}

/// The architecture, its size, LoRA's adapters and the tokenizer.
fn print_model(run: &Run, gpt: &GptConfig) {
    let wpe = Slot::PositionEmbedding;
    let wpe: usize = match wpe.present(gpt) {
        true => wpe.shape(gpt).iter().product(),
        false => 0,
    };
    println!(
        "model: {} layers, {} heads, n_embd {}, block {}, vocab {} | {} parameters ({:.2}M without wpe)",
        gpt.n_layer,
        gpt.n_head,
        gpt.n_embd,
        gpt.block_size,
        gpt.vocab_size,
        gpt.num_params(),
        (gpt.num_params() as usize - wpe) as f64 / 1e6
    );
    println!("parts: {}", gpt.parts());
    if let Some(lora) = &run.config.lora {
        println!("lora: {}", lora.describe(gpt));
    }
    println!(
        "tokenizer: {}, {} tokens",
        run.tokenizer.kind(),
        run.tokenizer.vocab_size()
    );
    match FileTypes::read(&run.dir) {
        Ok(Some(types)) => {
            println!(
                "imported from {}: matrices {} (--weights file decodes each in its type)",
                types.file,
                types.summary()
            );
            let (kept, bytes) = types.kept();
            if kept > 0 {
                println!(
                    "kept blocks: {kept} matrices, {:.1} MB as the file stores them \
                     (checksummed, in {})",
                    bytes as f64 / 1e6,
                    tinygpt::interop::gguf::kept::BLOCKS
                );
            }
        }
        Ok(None) => {}
        Err(e) => println!("imported file's types: unreadable ({e:#})"),
    }
}

/// Where training stands (the last checkpoint's state) and whether both checkpoints are whole.
fn print_training(run: &Run) {
    let last = run.verified(Which::Last);
    match &last {
        Ok(last) => {
            let state = &last.state;
            println!(
                "trained: {} of {} steps, {} tokens, {:.1}s{} | last train loss {} val loss {} \
                 | best val loss {}",
                state.step,
                run.config.train.max_iters,
                state.tokens,
                state.elapsed_s,
                match state.skipped_steps {
                    0 => String::new(),
                    n => format!(", {n} skipped (not finite)"),
                },
                fmt_loss(state.train_loss),
                fmt_loss(state.val_loss),
                match (state.best_val_loss, state.best_step) {
                    (Some(v), Some(s)) => format!("{v:.4} at step {s}"),
                    _ => "-".into(),
                }
            );
            if let Some(backend) = &state.backend {
                println!("backend: {backend} (what `train --resume` continues on)");
            }
        }
        Err(_) => println!("trained: no readable checkpoint"),
    }
    let best = run.verified(Which::Best);
    println!(
        "checkpoints: best {} | last {}",
        integrity(&best),
        integrity(&last)
    );
}

/// What training and sampling it cost on this machine's CPU: the engine, the memory, the
/// bytes a sampled token reads.
fn print_costs(run: &Run, gpt: &GptConfig) -> Result<()> {
    // Where `auto` trains it on a machine without a GPU.
    let (engine, _) = tinygpt::backend::Placement::cpu()
        .engine_for(run.config.train.dtype, UpdateKind::of(&run.config))?;
    let estimate = memory::Estimate::training(&run.config, gpt.vocab_size, engine);
    let on = engine.on_the_cpu();
    println!(
        "engine: {} on flex (how auto trains it without a GPU)",
        engine.name()
    );
    println!(
        "memory to train on the CPU ({on}): ~{}{}",
        estimate.describe(),
        tinygpt::backend::host::available_bytes().map_or(String::new(), |a| format!(
            " ({} available now)",
            memory::human(a)
        ))
    );
    // What a sampled token reads on the CPU: the decoding cost `--weights` changes.
    let bytes = |format| memory::human(weight_bytes_per_token(gpt, format) as u64);
    let (f32s, int8) = (bytes(WeightFormat::F32), bytes(WeightFormat::Q8_0));
    println!("sampling on the CPU reads {f32s} of matrices a token ({int8} with --weights q8_0)");
    Ok(())
}

/// A checkpoint's state in a few words: verified, unverifiable (older runs), or what is wrong.
fn integrity(checkpoint: &Result<Checkpoint>) -> String {
    match checkpoint {
        Ok(Checkpoint {
            warning: Some(w), ..
        }) => format!("DAMAGED: {w}"),
        Ok(c) if c.state.checksum.is_none() => {
            format!(
                "step {} (no checksums: written by an older tinygpt)",
                c.state.step
            )
        }
        Ok(c) => format!("step {}, checksums verified", c.state.step),
        Err(e) => format!("{e:#}"),
    }
}

fn fmt_loss(loss: Option<f64>) -> String {
    loss.map_or("-".into(), |l| format!("{l:.4}"))
}
