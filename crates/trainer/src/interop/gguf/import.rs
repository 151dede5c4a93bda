//! `tinygpt import --from FILE.gguf`: llama.cpp's `gpt2` and `llama` files as a run directory,
//! every tensor dequantised to f32 (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
//! Q6_K; a `llama` file's a slot at a time, as the checkpoint is written), the tokenizer, chat
//! template and end-of-turn token from the metadata.
//!
//! A `llama` file goes through the Hugging Face Llama import's own checks and builder
//! ([`hf_llama::architecture`], [`hf_llama::build`]): its hyperparameters as a `config.json`
//! would give them, its tensors under Hugging Face's names with the query and key rows back
//! in tinygpt's rotary layout.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value as Json, json};
use tinygpt_model::parts::Mlp;
use tinygpt_model::{GptConfig, names::Slot, names::parameter_table};

use super::architecture::Architecture;
use super::file::{Gguf, Tensor, Value};
use super::kept::{self, FileTypes};
use super::llama::Flavour;
use super::{gpt2, llama, quant, vocabulary};
use crate::data::tokenizer::Tokenizer;
use crate::interop::chat_files;
use crate::interop::foreign::{Foreign, ForeignTensors, Layout};
use crate::interop::llama as hf_llama;
use crate::interop::run::{
    ImportOptions, Imported, create_run, create_run_streamed, imported_config,
};
use crate::run::streamed::Deferred;

/// Imports the GGUF file `path` into the run directory `out`.
pub fn import(path: &Path, options: &ImportOptions, out: &Path) -> Result<Imported> {
    if options.meta.is_some() {
        bail!("--meta goes with a nanoGPT ckpt.pt, not a GGUF file");
    }
    let gguf = Gguf::read(path)?;
    let named = |e: anyhow::Error| anyhow!("{}: {e:#}", path.display());
    let tokenizer = match &options.tokenizer {
        Some(file) => Tokenizer::from_hf_file(file)?,
        None => vocabulary::read(&gguf).map_err(named)?,
    };
    let architecture = gguf
        .get("general.architecture")
        .and_then(Value::as_str)
        .unwrap_or("");
    let embedding = tensor(&gguf, "token_embd.weight").map_err(named)?;
    let rows = usize::try_from(*embedding.ne.get(1).unwrap_or(&0))?;
    let architecture = Architecture::named(architecture).ok_or_else(|| {
        anyhow!(
            "{}: architecture \"{architecture}\" is not one tinygpt imports (gpt2, llama, qwen3)",
            path.display()
        )
    })?;
    let model = match architecture {
        Architecture::Gpt2 => gpt2_architecture(&gguf),
        Architecture::Llama(flavour) => llama_architecture(&gguf, options.block_size, flavour),
    }
    .map_err(named)?;
    if architecture == Architecture::Gpt2 && options.block_size.is_some() {
        bail!("--block-size goes with a llama file (gpt2's positions are a table)");
    }
    let (mut config, note) = imported_config(model, &tokenizer, rows, path)?;
    let (chat, mut notes) = chat(&gguf, &tokenizer);
    config.chat = chat;
    notes.splice(0..0, note);
    let gpt = config.gpt(rows);
    let fused_qkv = architecture == Architecture::Gpt2;
    let heads = kept::rotary_heads(architecture.interleaves(), &gpt);
    let types = FileTypes::of(&gguf, &gpt, fused_qkv, path, heads).map_err(named)?;
    match architecture {
        Architecture::Gpt2 => {
            let model = gpt2_tensors(&gguf, &gpt)
                .and_then(|tensors| {
                    let file = path.to_path_buf();
                    ForeignTensors { file, tensors }.model(&config, rows, Layout::Linear)
                })
                .map_err(named)?;
            create_run(out, config.clone(), tokenizer, &model)?;
        }
        // Each slot dequantised as it is written: the model is never whole in f32.
        Architecture::Llama(flavour) => {
            let tensors = llama_tensors(&gguf, &gpt, flavour, path)
                .and_then(|tensors| hf_llama::build(&gpt, tensors))
                .map_err(named)?;
            create_run_streamed(out, config.clone(), tokenizer, &gpt, tensors)?;
        }
    }
    types.write(out, &gguf)?;
    notes.push(format!(
        "its matrices' types kept for --weights file: {}",
        types.summary()
    ));
    let (kept, bytes) = types.kept();
    if kept > 0 {
        notes.push(format!(
            "{kept} matrices kept in the file's own blocks ({:.1} MB, checksummed): generate, \
             serve, eval and logits decode them as the file stores them on the CPU \
             (--weights f32: their values in f32)",
            bytes as f64 / 1e6
        ));
    }
    Ok(Imported {
        format: match architecture {
            Architecture::Gpt2 => "GGUF, llama.cpp's gpt2",
            Architecture::Llama(Flavour::Llama) => "GGUF, llama.cpp's llama",
            Architecture::Llama(Flavour::Qwen3) => "GGUF, llama.cpp's qwen3",
            Architecture::Llama(Flavour::Arcee) => "GGUF, llama.cpp's arcee",
        },
        config,
        vocab_size: rows,
        notes,
    })
}

fn tensor<'a>(gguf: &'a Gguf, name: &str) -> Result<&'a Tensor> {
    gguf.tensor(name)
        .ok_or_else(|| anyhow!("tensor {name} is missing"))
}

/// A tensor's values as f32, in PyTorch's row-major shape (GGUF's `ne` reversed).
fn foreign(t: &Tensor) -> Result<Foreign> {
    let values = quant::decode(&t.data, t.kind).with_context(|| format!("tensor {}", t.name))?;
    let shape = t.ne.iter().rev().map(|&d| d as usize).collect();
    Ok(Foreign { shape, values })
}

/// A whole number of the metadata.
fn count(gguf: &Gguf, key: &str) -> Result<usize> {
    let value = gguf.get(key).ok_or_else(|| anyhow!("{key} is missing"))?;
    value
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| anyhow!("{key} is not a whole number ({value:?})"))
}

/// A real number of the metadata, if present; an f32 as the shortest decimal that reads back
/// as it (1e-5, not 0.000009999999747), which the run's config then shows.
fn real(gguf: &Gguf, key: &str) -> Option<f64> {
    match gguf.get(key)? {
        Value::F32(v) => v.to_string().parse().ok(),
        Value::F64(v) => Some(*v),
        other => other.as_u64().map(|n| n as f64),
    }
}

/// llama.cpp's `gpt2`: learned positions, LayerNorm, GELU (tanh), every bias.
fn gpt2_architecture(gguf: &Gguf) -> Result<GptConfig> {
    let n = |key: &str| count(gguf, &format!("gpt2.{key}"));
    let n_embd = n("embedding_length")?;
    let hidden = n("feed_forward_length")?;
    let tied = match gguf.tensor("output.weight") {
        None => true,
        Some(head) => head.data == tensor(gguf, "token_embd.weight")?.data,
    };
    Ok(GptConfig {
        block_size: n("context_length")?,
        n_layer: n("block_count")?,
        n_head: n("attention.head_count")?,
        n_embd,
        dropout: 0.0,
        bias: true,
        tie_embeddings: tied,
        mlp: Mlp::GeluTanh,
        layer_norm_eps: real(gguf, "gpt2.attention.layer_norm_epsilon").unwrap_or(1e-5),
        mlp_hidden: Some(hidden).filter(|&h| h != n_embd.saturating_mul(4)),
        ..GptConfig::default()
    })
}

/// A `gpt2` file's tensors under nanoGPT's names; one tinygpt has no place for is an error.
fn gpt2_tensors(gguf: &Gguf, gpt: &GptConfig) -> Result<BTreeMap<String, Foreign>> {
    let mut tensors = BTreeMap::new();
    let mut used = Vec::new();
    for param in parameter_table(gpt).into_iter().filter(|p| p.present) {
        let name = gpt2::name(param.slot);
        tensors.insert(param.nanogpt, foreign(tensor(gguf, &name)?)?);
        used.push(name);
    }
    if gpt.tie_embeddings {
        used.push(gpt2::name(Slot::LmHead));
    }
    if let Some(extra) = gguf.tensors.iter().find(|t| !used.contains(&t.name)) {
        bail!(
            "unexpected tensor {} (a part tinygpt's gpt2 does not have)",
            extra.name
        );
    }
    Ok(tensors)
}

/// llama.cpp's `llama` hyperparameters as the `config.json` of a Hugging Face Llama, read by
/// that import (which refuses what tinygpt does not compute: rope scaling, another head size);
/// `qwen3`'s the same keys under its name, with QK-norm.
fn llama_architecture(
    gguf: &Gguf,
    block_size: Option<usize>,
    flavour: Flavour,
) -> Result<GptConfig> {
    let prefix = flavour.name();
    let key = |key: &str| format!("{prefix}.{key}");
    let n = |name: &str| count(gguf, &key(name));
    let (n_embd, heads) = (n("embedding_length")?, n("attention.head_count")?);
    let kv_heads = match gguf.get(&key("attention.head_count_kv")) {
        Some(_) => n("attention.head_count_kv")?,
        None => heads,
    };
    if gguf
        .get(&key("expert_count"))
        .and_then(Value::as_u64)
        .unwrap_or(0)
        > 0
    {
        bail!("it is a mixture of experts (llama.expert_count), which tinygpt does not compute");
    }
    let head_dim = match gguf.get(&key("attention.key_length")) {
        Some(_) => n("attention.key_length")?,
        None => n_embd / heads.max(1),
    };
    let rotated = match gguf.get(&key("rope.dimension_count")) {
        Some(_) => n("rope.dimension_count")?,
        None => head_dim,
    };
    if rotated != head_dim {
        bail!(
            "{} = {rotated} rotates part of each head of {head_dim}: tinygpt rotates whole \
             heads",
            key("rope.dimension_count")
        );
    }
    let scaling = gguf.get(&key("rope.scaling.type")).and_then(Value::as_str);
    let ffn = n("feed_forward_length")?;
    let config = json!({
        "vocab_size": tensor(gguf, "token_embd.weight")?.ne.get(1).copied().unwrap_or(0),
        "hidden_size": n_embd,
        "intermediate_size": ffn,
        "num_hidden_layers": n("block_count")?,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": n("context_length")?,
        "rms_norm_eps": real(gguf, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
        "rope_theta": real(gguf, &key("rope.freq_base")).unwrap_or(10_000.0),
        "rope_scaling": scaling.filter(|s| *s != "none").map(|s| json!({"rope_type": s})),
        "tie_word_embeddings": gguf.tensor("output.weight").is_none(),
        "attention_bias": gguf.tensor("blk.0.attn_q.bias").is_some(),
        "mlp_bias": gguf.tensor("blk.0.ffn_up.bias").is_some(),
    });
    let config: hf_llama::LlamaConfig = serde_json::from_value(config)?;
    let gpt = hf_llama::architecture(&config, block_size)?;
    // Read as Llama's, whose MLP is SwiGLU: arcee's is ReLU² of `feed_forward_length`.
    let relu2 = flavour == Flavour::Arcee;
    let mlp_hidden = match relu2 {
        true => Some(ffn).filter(|&h| h != 4 * gpt.n_embd),
        false => gpt.mlp_hidden,
    };
    Ok(GptConfig {
        qk_norm: flavour == Flavour::Qwen3,
        mlp: if relu2 { Mlp::Relu2 } else { gpt.mlp },
        mlp_hidden,
        ..gpt
    })
}

/// A `llama` file's tensors under Hugging Face's names, queries and keys in tinygpt's rotary
/// layout, each dequantised when it is written (a failure names `path`); a `qwen3` file's
/// QK-norm gains, which must be ones (tinygpt's QK-norm has none).
fn llama_tensors<'g>(
    gguf: &'g Gguf,
    gpt: &GptConfig,
    flavour: Flavour,
    path: &'g Path,
) -> Result<BTreeMap<String, Deferred<'g>>> {
    let mut tensors = BTreeMap::new();
    for t in &gguf.tensors {
        let qk_norm =
            t.name.ends_with(".attn_q_norm.weight") || t.name.ends_with(".attn_k_norm.weight");
        if flavour == Flavour::Qwen3 && qk_norm {
            if foreign(t)?.values.iter().any(|&g| g != 1.0) {
                bail!(
                    "{} holds learned QK-norm gains, which tinygpt's QK-norm does not have",
                    t.name
                );
            }
            continue;
        }
        let (name, heads) = llama::hf_name(&t.name, gpt).ok_or_else(|| {
            anyhow!(
                "unexpected tensor {} (a part tinygpt's llama does not have)",
                t.name
            )
        })?;
        let heads = heads.filter(|_| flavour.interleaves());
        let shape = t.ne.iter().rev().map(|&d| d as usize).collect();
        let values = move || {
            let f = foreign(t).map_err(|e| anyhow!("{}: {e:#}", path.display()))?;
            let width = f.shape.iter().skip(1).product::<usize>().max(1);
            Ok(match heads {
                Some(heads) => llama::deinterleave(&f.values, heads, width),
                None => f.values,
            })
        };
        tensors.insert(name, Deferred::new(shape, values));
    }
    Ok(tensors)
}

/// The texts of the tokens llama.cpp ends a generation at, whatever the file's ids say
/// (`llama_vocab::impl::load`, llama.cpp's `src/llama-vocab.cpp`, its `special_eog_ids`).
const END_TEXTS: [&str; 22] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
];

/// The run's `[chat]` from `tokenizer.chat_template`, its BOS and EOS tokens, and the
/// end-of-turn ids (`eot_token_id` and `eos_token_id`); notes for the user.
fn chat(gguf: &Gguf, tokenizer: &Tokenizer) -> (crate::chat::ChatSection, Vec<String>) {
    let template = gguf
        .get("tokenizer.chat_template")
        .and_then(Value::as_str)
        .unwrap_or("");
    if template.is_empty() {
        return Default::default();
    }
    let id = |key: &str| gguf.get(key).and_then(Value::as_u64);
    let text = |key: &str| {
        id(key)
            .and_then(|id| u32::try_from(id).ok())
            .and_then(|id| tokenizer.decode(&[id]).ok())
            .map_or(Json::Null, Json::String)
    };
    let tokenizer_config = json!({
        "bos_token": text("tokenizer.ggml.bos_token_id"),
        "eos_token": text("tokenizer.ggml.eos_token_id"),
    });
    // A reply ends where llama.cpp ends a generation: at the end-of-turn token, at EOS, and at
    // any special token whose text llama.cpp takes for an end (a converter writes no
    // `eot_token_id` where Hugging Face's files name none).
    let mut ends: Vec<u64> = Vec::new();
    let named = ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eos_token_id"].map(id);
    let by_text = END_TEXTS
        .iter()
        .filter_map(|text| tokenizer.special_id(text).map(u64::from));
    for end in named.into_iter().flatten().chain(by_text) {
        if !ends.contains(&end) {
            ends.push(end);
        }
    }
    let eos = Json::from(ends);
    chat_files::section(template.into(), &tokenizer_config, &eos, tokenizer)
}
