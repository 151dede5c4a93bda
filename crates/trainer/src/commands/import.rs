//! `tinygpt import`: a run directory from a nanoGPT checkpoint, a Hugging Face GPT-2
//! directory, or tinygpt's own export.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use tinygpt::interop::{self, ImportOptions};

/// Build a run directory from a model trained elsewhere.
///
/// FROM is nanoGPT's ckpt.pt (with --meta for char vocabularies, or --tokenizer for GPT-2's
/// BPE), a Hugging Face GPT-2 directory (config.json, model.safetensors or pytorch_model.bin,
/// tokenizer.json), a Hugging Face Llama-family directory (LlamaForCausalLM: SmolLM2, TinyLlama;
/// model.safetensors or its shards), a GGUF file of llama.cpp's gpt2, llama, qwen3 or arcee
/// architecture (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K, dequantised
/// to f32, each quantised matrix also kept in its own blocks for --weights file; byte-level
/// BPE tokenizers, or --tokenizer), a .safetensors file written by `tinygpt export --format
/// nanogpt`, or a PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors)
/// with --base, the run of the model it was trained on (a LoRA run: sampled, served and exported merged, or as PEFT
/// again). The run can then be sampled, evaluated, exported, or fine-tuned with `train
/// --init-from`.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    tinygpt import --from out-shakespeare-char/ckpt.pt --meta data/shakespeare_char/meta.pkl --out runs/nanogpt\n  \
    tinygpt import --from ./gpt2 --out runs/gpt2\n  \
    tinygpt import --from ./SmolLM2-135M --block-size 1024 --out runs/smollm2\n  \
    tinygpt import --from model-q8_0.gguf --out runs/from-gguf\n  \
    tinygpt import --from model.safetensors --out runs/imported\n  \
    tinygpt import --from ./my-lora-adapter --base runs/smollm2 --out runs/smollm2-lora")]
pub struct Args {
    /// nanoGPT's ckpt.pt, a Hugging Face GPT-2 or Llama directory, a .gguf file, or an
    /// exported .safetensors file.
    #[arg(long, value_name = "FILE|DIR")]
    from: PathBuf,
    /// nanoGPT's meta.pkl (its char vocabulary), for a ckpt.pt.
    #[arg(long, value_name = "FILE")]
    meta: Option<PathBuf>,
    /// A Hugging Face tokenizer.json: for a ckpt.pt trained on GPT-2's BPE, or to replace a
    /// directory's or GGUF file's own.
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// The context of a Llama-family model (directory or GGUF), in tokens (default: its own, up
    /// to 2048).
    #[arg(long, value_name = "N")]
    block_size: Option<usize>,
    /// With a PEFT adapter directory: the run of the model it adapts.
    #[arg(long, value_name = "RUN")]
    base: Option<PathBuf>,
    /// The run directory to create.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let options = ImportOptions {
        from: args.from.clone(),
        meta: args.meta,
        tokenizer: args.tokenizer,
        block_size: args.block_size,
        base: args.base,
    };
    let imported = interop::import(&options, &args.out)?;
    let m = &imported.config.model;
    println!(
        "wrote run {} from {} ({}): {} layers x {} heads, n_embd {}, block {}, vocab {}, {} tokenizer",
        args.out.display(),
        args.from.display(),
        imported.format,
        m.n_layer,
        m.n_head,
        m.n_embd,
        m.block_size,
        imported.vocab_size,
        imported.config.data.tokenizer.name(),
    );
    for note in imported.notes {
        println!("note: {note}");
    }
    Ok(ExitCode::SUCCESS)
}
