//! Hugging Face GPT-2 directories, in and out: `config.json` (`GPT2Config`),
//! `model.safetensors` (or `pytorch_model.bin` on import), `tokenizer.json`, and on export
//! `tokenizer_config.json`, so that `GPT2LMHeadModel.from_pretrained(DIR)` and
//! `AutoTokenizer.from_pretrained(DIR)` load it as it is.
//!
//! GPT-2's blocks use `Conv1D`, whose weights are `[in, out]` (Burn's layout); its LM head is
//! tied unless `tie_word_embeddings` is false, and `save_pretrained` leaves a tied head out. Its
//! `gelu_new` is the tanh approximation (`model.mlp = "gelu_tanh"`). GPT-2 always has
//! biases, so a model without them is exported with zero biases, which computes the same.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use tinygpt_model::parts::{Mlp, Norm, Position};
use tinygpt_model::{GptConfig, names::Slot, names::parameter_table};

use super::chat_files;
use super::foreign::{
    ForeignTensors, LM_HEAD, Layout, NamedTensor, TensorTable, burn_tensors, transpose,
    write_safetensors,
};
use super::hf_dir;
use super::run::{Imported, create_run, hf_run_config};
use crate::data::tokenizer::Tokenizer;
use crate::fs::temp_beside;
use crate::run::checkpoint::{Run, Which, refuse_existing};

/// The `GPT2Config` fields that shape the computation. Anything that would change it in a way
/// tinygpt does not compute is refused rather than ignored.
#[derive(Deserialize)]
struct Gpt2Config {
    model_type: Option<String>,
    vocab_size: usize,
    n_positions: usize,
    n_embd: usize,
    n_layer: usize,
    n_head: usize,
    n_inner: Option<usize>,
    #[serde(default = "gelu_new")]
    activation_function: String,
    #[serde(default)]
    resid_pdrop: f64,
    #[serde(default = "layer_norm_epsilon")]
    layer_norm_epsilon: f64,
    #[serde(default = "yes")]
    tie_word_embeddings: bool,
    #[serde(default = "yes")]
    scale_attn_weights: bool,
    #[serde(default)]
    scale_attn_by_inverse_layer_idx: bool,
    #[serde(default)]
    reorder_and_upcast_attn: bool,
}

fn gelu_new() -> String {
    "gelu_new".into()
}
fn layer_norm_epsilon() -> f64 {
    1e-5
}
fn yes() -> bool {
    true
}

/// Imports the Hugging Face GPT-2 directory `dir`, whose `config.json` is `config`, into the
/// run directory `out`; `tokenizer` replaces the directory's own `tokenizer.json`.
pub fn import(
    dir: &Path,
    config: serde_json::Value,
    tokenizer: Option<&Path>,
    out: &Path,
) -> Result<Imported> {
    let hf: Gpt2Config = hf_dir::config(dir, config.clone(), "GPT-2")?;
    let model = architecture(&hf).with_context(|| dir.join("config.json").display().to_string())?;
    let tokenizer = hf_dir::tokenizer(dir, tokenizer)?;
    let weights = hf_dir::weights(dir)?;
    let source = weights.source.clone();
    let weights = ForeignTensors::named(&source, weights.made()?)?;
    let (config, notes) = hf_run_config(model, &tokenizer, hf.vocab_size, dir, &config)?;
    if !hf.tie_word_embeddings && !weights.tensors.contains_key(LM_HEAD) {
        bail!(
            "{}: tensor `{LM_HEAD}` is missing (config.json unties it)",
            weights.file.display()
        );
    }
    let model = weights.model(&config, hf.vocab_size, Layout::Conv1D)?;
    create_run(out, config.clone(), tokenizer, &model)?;
    Ok(Imported {
        format: "Hugging Face GPT-2 directory",
        config,
        vocab_size: hf.vocab_size,
        notes,
    })
}

/// tinygpt's architecture for a GPT-2 config, or why it cannot compute that model.
fn architecture(hf: &Gpt2Config) -> Result<GptConfig> {
    if let Some(kind) = hf.model_type.as_deref().filter(|k| *k != "gpt2") {
        bail!(
            "model_type \"{kind}\" is not GPT-2 or Llama; tinygpt imports those architectures only"
        );
    }
    let mlp = match hf.activation_function.as_str() {
        "gelu_new" | "gelu_pytorch_tanh" => Mlp::GeluTanh,
        "gelu" => Mlp::Gelu,
        other => bail!("activation_function \"{other}\" is not one of gelu, gelu_new"),
    };
    if !hf.scale_attn_weights || hf.scale_attn_by_inverse_layer_idx || hf.reorder_and_upcast_attn {
        bail!(
            "scale_attn_weights must be true and scale_attn_by_inverse_layer_idx and \
             reorder_and_upcast_attn false: tinygpt scales attention by 1/sqrt(head size) only"
        );
    }
    let model = GptConfig {
        block_size: hf.n_positions,
        n_layer: hf.n_layer,
        n_head: hf.n_head,
        n_embd: hf.n_embd,
        dropout: hf.resid_pdrop,
        bias: true,
        tie_embeddings: hf.tie_word_embeddings,
        mlp,
        layer_norm_eps: hf.layer_norm_epsilon,
        // `null` is 4 x n_embd, as it is here.
        mlp_hidden: hf.n_inner.filter(|&n| n != hf.n_embd.saturating_mul(4)),
        ..GptConfig::default()
    };
    Ok(model)
}

/// Writes the run's `which` weights as a Hugging Face directory `out` (which must not exist, or
/// be empty): `GPT2LMHeadModel` for GPT-2's parts, `LlamaForCausalLM` for Llama's. It appears
/// complete or not at all. Returns the architecture written.
pub fn export(run: &Run, which: Which, out: &Path) -> Result<&'static str> {
    let gpt = run.config.gpt(run.tokenizer.vocab_size());
    // GPT-2's activation name, or `None` for the Llama format.
    let gpt2 = match (expressible(&gpt), super::llama::expressible(&gpt)) {
        (Ok(activation), _) => Some(activation),
        (Err(_), Ok(())) => None,
        (Err(gpt2), Err(llama)) => bail!(
            "the Hugging Face GPT-2 format cannot express a model {gpt2}, nor the Llama format \
             one {llama}; export it with --format nanogpt (tinygpt's safetensors + sidecar), \
             which keeps every part"
        ),
    };
    refuse_existing(out)?;
    let temp = temp_beside(out, "export")?;
    let (model, _) = run.load_model(which, &burn::tensor::Device::flex())?;
    let tensors = burn_tensors(&model)?;
    let (exported, config_json) = match gpt2 {
        Some(activation) => (
            gpt2_tensors(&gpt, &tensors),
            config_json(&gpt, activation, &run.tokenizer)?,
        ),
        None => (
            super::llama::tensors(&gpt, tensors)?,
            super::llama::config_json(&gpt, &run.tokenizer)?,
        ),
    };
    write_dir(&temp, &exported, &config_json, run)?;
    std::fs::rename(temp.keep(), out)
        .with_context(|| format!("cannot create {}", out.display()))?;
    Ok(match gpt2 {
        Some(_) => "GPT2LMHeadModel",
        None => "LlamaForCausalLM",
    })
}

/// GPT-2's tensors of a model of `gpt` (whose Burn tensors are `tensors`): `Conv1D` layout,
/// absent biases as zeros.
fn gpt2_tensors(gpt: &GptConfig, tensors: &TensorTable) -> Vec<NamedTensor> {
    let mut exported = Vec::new();
    // The bias slots follow their weight's: an absent bias is zeros of the weight's output size.
    let mut outputs = 0;
    for name in parameter_table(gpt) {
        if !name.present {
            // A tied head is `wte`; no GPT-2 has a bigram table; every other absent slot is a
            // bias.
            if !matches!(name.slot, Slot::LmHead | Slot::BigramEmbedding) {
                exported.push((name.nanogpt, vec![outputs], vec![0u8; outputs * 4]));
            }
            continue;
        }
        let (shape, bytes) = &tensors[&name.burn];
        outputs = *shape.last().unwrap_or(&0);
        let (shape, bytes) = match Layout::Conv1D.transposed(&name) {
            true => transpose(shape, bytes),
            false => (shape.clone(), bytes.clone()),
        };
        exported.push((name.nanogpt, shape, bytes));
    }
    exported
}

/// A Hugging Face directory's files in `dir`: the weights, `config.json`, and the run's
/// tokenizer as `tokenizer.json` and `tokenizer_config.json`.
fn write_dir(
    dir: &tempfile::TempDir,
    tensors: &[NamedTensor],
    config_json: &str,
    run: &Run,
) -> Result<()> {
    let dir = dir.path();
    let write = |name: &str, bytes: &[u8]| {
        std::fs::write(dir.join(name), bytes)
            .with_context(|| format!("cannot write {}", dir.join(name).display()))
    };
    write("model.safetensors", &write_safetensors(tensors)?)?;
    write("config.json", config_json.as_bytes())?;
    write("tokenizer.json", run.tokenizer.to_hf_json()?.as_bytes())?;
    let (mut tokenizer_config, generation) =
        chat_files::for_export(&run.config.chat, &run.tokenizer);
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast".into();
    tokenizer_config["model_max_length"] = run.config.model.block_size.into();
    tokenizer_config["clean_up_tokenization_spaces"] = false.into();
    write(
        "tokenizer_config.json",
        serde_json::to_string_pretty(&tokenizer_config)?.as_bytes(),
    )?;
    match generation.as_object().is_some_and(|g| g.is_empty()) {
        true => Ok(()),
        false => write(
            "generation_config.json",
            serde_json::to_string_pretty(&generation)?.as_bytes(),
        ),
    }
}

/// Whether `GPT2LMHeadModel` computes what a model of `config` computes: its
/// `activation_function` (`gelu`, `gelu_new`) if so, else the part it lacks
/// (`"with RMSNorm (…)"`). An exhaustive destructuring, so a new part of the architecture does
/// not compile until this format says what it does with it.
pub(crate) fn expressible(config: &GptConfig) -> Result<&'static str, String> {
    let GptConfig {
        vocab_size: _,
        block_size: _,
        n_layer: _,
        n_head: _,
        n_embd: _,
        dropout: _,
        // Absent biases are written as zeros; an untied head as `lm_head.weight`.
        bias: _,
        tie_embeddings: _,
        position,
        norm,
        mlp,
        layer_norm_eps: _,
        logit_softcap,
        // `n_inner`.
        mlp_hidden: _,
        // How the weights started, not what they compute.
        proj_init: _,
        // Read only with rotary positions, refused below.
        rope_theta: _,
        n_kv_head,
        qk_norm,
        bigram,
    } = config;
    let refuse = |part: &str| Err(part.to_string());
    if *bigram {
        return refuse("with a bigram embedding (`model.bigram`; GPT-2 has no such table)");
    }
    match position {
        Position::Learned => {}
        Position::Rope => return refuse("with rotary positions (GPT-2's are learned)"),
        Position::None => return refuse("without positions (`model.position = \"none\"`)"),
    }
    if n_kv_head.is_some_and(|kv| kv != config.n_head) {
        return refuse("with grouped-query attention (`model.n_kv_head`)");
    }
    if *qk_norm {
        return refuse("with QK-norm (`model.qk_norm`)");
    }
    if *logit_softcap > 0.0 {
        return refuse(&format!(
            "with soft-capped logits (`model.logit_softcap = {logit_softcap}`)"
        ));
    }
    match norm {
        Norm::Layer => {}
        Norm::Rms | Norm::RmsUnit => {
            return refuse("with RMSNorm (GPT-2 normalises with LayerNorm)");
        }
        Norm::None => return refuse("without normalisation (`model.norm = \"none\"`)"),
    }
    match mlp {
        // GPT-2's `activation_function`.
        Mlp::Gelu => Ok("gelu"),
        Mlp::GeluTanh => Ok("gelu_new"),
        Mlp::Relu2 => refuse("with a ReLU² MLP (GPT-2's is GELU)"),
        Mlp::SwiGlu => refuse("with a SwiGLU MLP (GPT-2's is GELU)"),
        Mlp::None => refuse("without the MLP (`model.mlp = \"none\"`)"),
    }
}

/// `config.json` for `GPT2LMHeadModel`, of the model `m` (its `vocab_size` resolved) whose
/// MLP is GPT-2's `activation` ([`expressible`] said which).
fn config_json(m: &GptConfig, activation: &str, tokenizer: &Tokenizer) -> Result<String> {
    // GPT-2's end-of-text token (char runs made before special tokens have none).
    let eos = tokenizer.end_of_text();
    let config = serde_json::json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": m.vocab_size,
        "n_positions": m.block_size,
        "n_ctx": m.block_size,
        "n_embd": m.n_embd,
        "n_layer": m.n_layer,
        "n_head": m.n_head,
        "n_inner": m.mlp_hidden,
        "activation_function": activation,
        "resid_pdrop": m.dropout,
        "embd_pdrop": m.dropout,
        "attn_pdrop": m.dropout,
        "layer_norm_epsilon": m.layer_norm_eps,
        "initializer_range": 0.02,
        "scale_attn_weights": true,
        "tie_word_embeddings": m.tie_embeddings,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "use_cache": true,
        "torch_dtype": "float32",
    });
    Ok(serde_json::to_string_pretty(&config)?)
}
