//! `tinygpt export`: a run's weights for PyTorch, Hugging Face or llama.cpp.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use tinygpt::interop::{self, gguf};
use tinygpt::run::checkpoint::{Run, Which};
use tinygpt_model::BaseWeights;

/// Write a run's weights for other tools.
///
/// --format nanogpt writes FILE.safetensors (nanoGPT's parameter names, PyTorch's [out, in]
/// layout) and FILE.json (nanoGPT's config and tokenizer maps). --format hf writes a directory
/// that transformers loads with GPT2LMHeadModel.from_pretrained and AutoTokenizer.from_pretrained
/// (char vocabularies included). --format gguf writes FILE.gguf for llama.cpp, Ollama and LM
/// Studio (GPT-2-shaped models as llama.cpp's gpt2 architecture, rotary + RMSNorm + SwiGLU
/// models as its llama, with QK-norm as its qwen3, with ReLU² as its arcee, with the tokenizer
/// and chat template), its matrices as --dtype says; it
/// prints what the file changes (an exact GELU computed with tanh's approximation, f16 or
/// quantised matrices), measured on the run's validation text.
/// --format peft writes a LoRA run's adapters alone as a PEFT adapter directory, for
/// PeftModel.from_pretrained on the base's --format hf export. Every other format merges a LoRA
/// run's adapters into its base.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    tinygpt export --checkpoint runs/default --format nanogpt --out model.safetensors\n  \
    tinygpt export --checkpoint runs/default --format hf --out hf-model\n  \
    tinygpt export --checkpoint runs/default --format gguf --dtype q4_k_m --out model.gguf\n  \
    tinygpt export --checkpoint runs/smollm2-lora --format peft --out my-lora-adapter")]
pub struct Args {
    #[arg(long, value_name = "DIR")]
    checkpoint: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Nanogpt)]
    format: Format,
    /// The file (nanogpt, gguf) or directory (hf, peft) to write.
    #[arg(long, value_name = "PATH")]
    out: PathBuf,
    /// With --format gguf: how the matrices are stored (vectors stay f32). q8_0, q5_0 and q4_0
    /// are llama.cpp's 8-, 5- and 4-bit blocks (about a quarter, a sixth and an eighth of f32's
    /// bytes), written as llama.cpp's own quantiser writes them (q5_0 and q4_0 with the head in
    /// Q6_K, as its files keep it; see --pure); matrices whose rows are not a multiple of 32
    /// long stay f16. q4_k and q6_k: llama.cpp's k-quants for every matrix;
    /// q4_k_m and q5_k_m: llama.cpp's mixes (the usual downloads), each tensor in the type
    /// llama.cpp's quantiser chooses for it and in its bytes. [default: f32]
    #[arg(long, value_enum)]
    dtype: Option<gguf::Dtype>,
    /// With --dtype: every matrix in that type, as llama.cpp's quantiser writes with --pure.
    /// Without it, as llama.cpp's quantiser chooses by default: q4_0 and q5_0 keep the head in
    /// Q6_K (Q8_0 where its rows are not a multiple of 256 long); q4_k_m and q5_k_m keep the
    /// head and a third of the value and down projections in Q6_K.
    #[arg(long)]
    pure: bool,
    #[arg(long, value_enum, default_value_t = Which::Best)]
    which: Which,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    /// nanoGPT's parameter names in safetensors, with a JSON sidecar.
    Nanogpt,
    /// A Hugging Face directory: GPT-2 (`GPT2LMHeadModel`) for GPT-2's parts, Llama
    /// (`LlamaForCausalLM`) for rotary positions, RMSNorm and SwiGLU.
    Hf,
    /// GGUF for llama.cpp, Ollama and LM Studio.
    Gguf,
    /// A LoRA run's adapters as a PEFT adapter directory.
    Peft,
}

pub fn run(args: Args) -> Result<ExitCode> {
    if args.dtype.is_some() && !matches!(args.format, Format::Gguf) {
        bail!("--dtype goes with --format gguf (the other formats keep f32)");
    }
    if args.pure && args.dtype.is_none() {
        bail!("--pure goes with --dtype (it keeps every matrix in that type)");
    }
    let run = Run::open(&args.checkpoint)?;
    match args.format {
        Format::Nanogpt => {
            interop::export(&run, args.which, &args.out)?;
            println!(
                "wrote {} and {} (nanoGPT names, PyTorch [out, in] layout)",
                args.out.display(),
                interop::sidecar_path(&args.out).display()
            );
        }
        Format::Hf => {
            let architecture = interop::hf::export(&run, args.which, &args.out)?;
            println!(
                "wrote {} (Hugging Face {architecture}: config.json, model.safetensors, \
                 tokenizer.json)",
                args.out.display()
            );
        }
        Format::Gguf => {
            let dtype = args.dtype.unwrap_or(gguf::Dtype::F32);
            let written = gguf::export(&run, args.which, (dtype, args.pure), &args.out)?;
            println!(
                "wrote {} (GGUF, llama.cpp's {}: {} tensors, matrices {}, {:.1} MB); run it with \
                 llama.cpp: llama-completion -m {} -c {} -p \"...\" -n N (prompt and N within \
                 {} tokens)",
                args.out.display(),
                written.architecture,
                written.tensors,
                written.matrices,
                written.bytes as f64 / 1e6,
                args.out.display(),
                run.config.model.block_size,
                run.config.model.block_size,
            );
            println!("{}", written.report.line());
        }
        Format::Peft => {
            let (rank, tensors) = interop::peft::export(&run, args.which, &args.out)?;
            println!(
                "wrote {} (PEFT LoRA adapter: rank {rank}, {tensors} tensors); load it onto the \
                 base's Hugging Face export (tinygpt export --checkpoint BASE --format hf) with \
                 PeftModel.from_pretrained",
                args.out.display()
            );
            let base = run
                .config
                .lora
                .as_ref()
                .map_or(BaseWeights::F32, |l| l.base);
            if base != BaseWeights::F32 {
                println!(
                    "note: these adapters were trained on the base's matrices rounded to {}; \
                     onto its f32 export they compute a little differently (--format hf \
                     exports the run merged, as trained)",
                    base.name()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
