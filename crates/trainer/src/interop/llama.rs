//! Hugging Face Llama-family directories (`LlamaForCausalLM`: SmolLM2, TinyLlama, …)
//! in and out: `config.json`, `model.safetensors` or shards listed in
//! `model.safetensors.index.json` (f32, f16 or bf16, stored as f32), `tokenizer.json`.
//!
//! A Llama block is tinygpt's block with these parts: rotary positions in the `rotate_half`
//! layout (θ `rope_theta`), RMSNorm with a gain (ε `rms_norm_eps`), a SwiGLU MLP of
//! `intermediate_size`, `num_key_value_heads` key/value heads, biases as `attention_bias` says.
//! Its projections are separate `nn.Linear`s (`[out, in]`); tinygpt packs them: `q_proj`,
//! `k_proj`, `v_proj` are the columns of `c_attn` (q | k | v), `gate_proj` and `up_proj` those
//! of the MLP's `c_fc` (gate | up). Anything in the config that would compute another function
//! is refused by name, never ignored.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use tinygpt_model::parts::{Mlp, Norm, Position, ProjInit};
use tinygpt_model::{GptConfig, names::BlockSlot, names::Slot, names::parameter_table};

use super::foreign::{NamedTensor, transpose, transposed};
use super::hf_dir;
use super::run::{Imported, create_run_streamed, hf_run_config};
use crate::data::tokenizer::Tokenizer;
use crate::run::streamed::Deferred;

/// The `LlamaConfig` fields that shape the computation, with transformers' defaults.
#[derive(Deserialize)]
pub(super) struct LlamaConfig {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "silu")]
    hidden_act: String,
    #[serde(default = "max_positions")]
    max_position_embeddings: usize,
    #[serde(default = "rms_eps")]
    rms_norm_eps: f64,
    /// Where transformers before 5 wrote the rotary base and any scaling of it.
    rope_theta: Option<f64>,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    /// Where transformers 5 writes both: `{"rope_theta": …, "rope_type": "default"}`.
    #[serde(default)]
    rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default = "one")]
    pretraining_tp: usize,
}

fn silu() -> String {
    "silu".into()
}
fn max_positions() -> usize {
    2048
}
fn rms_eps() -> f64 {
    1e-6
}
fn one() -> usize {
    1
}

/// The context an import takes when `--block-size` is not given and the model allows more:
/// what a laptop can fine-tune at (the memory check says if even that is too much).
pub(crate) const DEFAULT_BLOCK: usize = 2048;

/// Whether `config.json` (already read) describes a Llama-family model.
pub(crate) fn is_llama(config: &serde_json::Value) -> bool {
    let named = |key: &str, value: &str| {
        config.get(key).and_then(|v| v.as_str()) == Some(value)
            || config
                .get(key)
                .and_then(|v| v.as_array())
                .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(value)))
    };
    named("model_type", "llama") || named("architectures", "LlamaForCausalLM")
}

/// The rotary base of a Llama config, or the scaling it asks for that tinygpt does not do.
fn rope_base(hf: &LlamaConfig) -> Result<f64> {
    let parameters = hf.rope_parameters.as_ref().filter(|v| !v.is_null());
    for (key, settings) in [
        (
            "rope_scaling",
            hf.rope_scaling.as_ref().filter(|v| !v.is_null()),
        ),
        ("rope_parameters", parameters),
    ] {
        let Some(settings) = settings else { continue };
        let kind = settings
            .get("rope_type")
            .or_else(|| settings.get("type"))
            .and_then(|v| v.as_str());
        match (kind, key) {
            (Some("default"), _) | (None, "rope_parameters") => {}
            (kind, _) => bail!(
                "{key} ({}) is not supported: tinygpt rotates by rope_theta alone",
                kind.unwrap_or("unnamed")
            ),
        }
    }
    let theta = parameters
        .and_then(|p| p.get("rope_theta"))
        .and_then(|v| v.as_f64())
        .or(hf.rope_theta);
    Ok(theta.unwrap_or(10_000.0))
}

/// tinygpt's architecture for a Llama config with a context of `block_size` tokens (`None`: the
/// smaller of `max_position_embeddings` and [`DEFAULT_BLOCK`]), or the part it cannot compute.
pub(super) fn architecture(hf: &LlamaConfig, block_size: Option<usize>) -> Result<GptConfig> {
    let rope_theta = rope_base(hf)?;
    if hf.hidden_act != "silu" {
        bail!(
            "hidden_act \"{}\" is not supported: tinygpt's SwiGLU gates with silu",
            hf.hidden_act
        );
    }
    if hf.attention_bias != hf.mlp_bias {
        bail!(
            "attention_bias = {} and mlp_bias = {}: tinygpt's `bias` is one setting for both",
            hf.attention_bias,
            hf.mlp_bias
        );
    }
    if hf.pretraining_tp != 1 {
        bail!(
            "pretraining_tp = {} is not supported (1 only)",
            hf.pretraining_tp
        );
    }
    let heads = hf.num_attention_heads.max(1);
    if let Some(head_dim) = hf.head_dim.filter(|&d| d * heads != hf.hidden_size) {
        bail!(
            "head_dim = {head_dim} is not hidden_size / num_attention_heads = {}: tinygpt's \
             heads split the width",
            hf.hidden_size / heads
        );
    }
    let max = hf.max_position_embeddings;
    let block_size = match block_size {
        Some(b) if b > max => bail!("--block-size {b} is longer than the model's {max} positions"),
        Some(b) => b,
        None => max.min(DEFAULT_BLOCK),
    };
    Ok(GptConfig {
        block_size,
        n_layer: hf.num_hidden_layers,
        n_head: hf.num_attention_heads,
        n_embd: hf.hidden_size,
        dropout: 0.0,
        bias: hf.attention_bias,
        tie_embeddings: hf.tie_word_embeddings,
        position: Position::Rope,
        norm: Norm::Rms,
        mlp: Mlp::SwiGlu,
        layer_norm_eps: hf.rms_norm_eps,
        // Filled in from the tokenizer and the embedding's rows by `imported_config`.
        vocab_size: 0,
        logit_softcap: 0.0,
        rope_theta,
        n_kv_head: hf
            .num_key_value_heads
            .filter(|&kv| kv != hf.num_attention_heads),
        qk_norm: false,
        mlp_hidden: Some(hf.intermediate_size),
        proj_init: ProjInit::Scaled,
        bigram: false,
    })
}

/// Imports the Llama directory `dir` into the run directory `out`; `tokenizer` replaces the
/// directory's own `tokenizer.json`.
pub fn import(
    dir: &Path,
    config: serde_json::Value,
    tokenizer: Option<&Path>,
    block_size: Option<usize>,
    out: &Path,
) -> Result<Imported> {
    let hf: LlamaConfig = hf_dir::config(dir, config.clone(), "Llama")?;
    let model = architecture(&hf, block_size)
        .with_context(|| dir.join("config.json").display().to_string())?;
    let tokenizer = hf_dir::tokenizer(dir, tokenizer)?;
    let (config, mut notes) = hf_run_config(model, &tokenizer, hf.vocab_size, dir, &config)?;
    if config.model.block_size < hf.max_position_embeddings {
        notes.push(format!(
            "context {} of the model's {} positions (--block-size to change it)",
            config.model.block_size, hf.max_position_embeddings
        ));
    }
    let weights = hf_dir::weights(dir)?;
    let gpt = config.gpt(hf.vocab_size);
    // Each slot read and widened as it is written: the model is never whole in f32.
    let tensors =
        build(&gpt, weights.tensors).map_err(|e| anyhow!("{}: {e:#}", weights.source.display()))?;
    create_run_streamed(out, config.clone(), tokenizer, &gpt, tensors)?;
    Ok(Imported {
        format: "Hugging Face Llama directory",
        config,
        vocab_size: hf.vocab_size,
        notes,
    })
}

/// Where a Llama checkpoint keeps what a tinygpt slot holds: its tensor names (several are
/// concatenated along the output axis), and whether they are `nn.Linear` weights (`[out, in]`,
/// transposed into Burn's `[in, out]`). The MLP's input is SwiGLU's gate and up, or with a
/// single-matrix MLP (ReLU², as llama.cpp's `arcee` has it) the up projection alone. An
/// exhaustive match: a slot added to the table does not compile until it says.
fn sources(slot: Slot, mlp: Mlp) -> (Vec<String>, bool) {
    let gated = match mlp {
        Mlp::SwiGlu => true,
        Mlp::Gelu | Mlp::GeluTanh | Mlp::Relu2 | Mlp::None => false,
    };
    let layer = |l: usize, names: &[&str]| -> Vec<String> {
        names
            .iter()
            .map(|n| format!("model.layers.{l}.{n}"))
            .collect()
    };
    match slot {
        Slot::TokenEmbedding => (vec!["model.embed_tokens.weight".into()], false),
        // Rotary positions have no table; the model is built without one. Nor has Llama a
        // bigram table.
        Slot::PositionEmbedding | Slot::BigramEmbedding => (vec![], false),
        Slot::FinalNormGain => (vec!["model.norm.weight".into()], false),
        // RMSNorm has no shift.
        Slot::FinalNormBias => (vec![], false),
        Slot::LmHead => (vec!["lm_head.weight".into()], true),
        Slot::Block(l, slot) => match slot {
            BlockSlot::Ln1Gain => (layer(l, &["input_layernorm.weight"]), false),
            BlockSlot::Ln2Gain => (layer(l, &["post_attention_layernorm.weight"]), false),
            BlockSlot::Ln1Bias | BlockSlot::Ln2Bias => (vec![], false),
            BlockSlot::AttnWeight => (
                layer(
                    l,
                    &[
                        "self_attn.q_proj.weight",
                        "self_attn.k_proj.weight",
                        "self_attn.v_proj.weight",
                    ],
                ),
                true,
            ),
            BlockSlot::AttnBias => (
                layer(
                    l,
                    &[
                        "self_attn.q_proj.bias",
                        "self_attn.k_proj.bias",
                        "self_attn.v_proj.bias",
                    ],
                ),
                false,
            ),
            BlockSlot::AttnProjWeight => (layer(l, &["self_attn.o_proj.weight"]), true),
            BlockSlot::AttnProjBias => (layer(l, &["self_attn.o_proj.bias"]), false),
            BlockSlot::FcWeight if gated => (
                layer(l, &["mlp.gate_proj.weight", "mlp.up_proj.weight"]),
                true,
            ),
            BlockSlot::FcWeight => (layer(l, &["mlp.up_proj.weight"]), true),
            BlockSlot::FcBias if gated => {
                (layer(l, &["mlp.gate_proj.bias", "mlp.up_proj.bias"]), false)
            }
            BlockSlot::FcBias => (layer(l, &["mlp.up_proj.bias"]), false),
            BlockSlot::MlpProjWeight => (layer(l, &["mlp.down_proj.weight"]), true),
            BlockSlot::MlpProjBias => (layer(l, &["mlp.down_proj.bias"]), false),
        },
        // A base checkpoint has no adapters (PEFT keeps them in files of their own).
        Slot::Adapter { .. } => (vec![], false),
    }
}

/// The tensors of a model of `gpt` (under Burn's paths, in its shapes) made from the Llama
/// tensors `tensors`: every present slot filled from its sources (each shape checked now, the
/// values made when the tensor is written: a quantised file's are dequantised one slot at a
/// time), and no tensor left over.
pub(super) fn build<'a>(
    gpt: &GptConfig,
    mut tensors: BTreeMap<String, Deferred<'a>>,
) -> Result<Vec<(String, Deferred<'a>)>> {
    let mut out = Vec::new();
    for name in parameter_table(gpt).into_iter().filter(|p| p.present) {
        let want = name.slot.shape(gpt);
        let (names, linear) = sources(name.slot, gpt.mlp);
        if names.is_empty() {
            bail!("tinygpt's `{}` has no Llama counterpart", name.burn);
        }
        // Stored `[out, in]` for a linear layer: the pieces stack along `out`.
        let (rows, cols) = match linear {
            true => (want[1], want[0]),
            false => (want[0], want.get(1).copied().unwrap_or(1)),
        };
        let (mut pieces, mut filled) = (Vec::new(), 0);
        for source in &names {
            let t = tensors
                .remove(source)
                .ok_or_else(|| anyhow!("tensor `{source}` is missing"))?;
            let width: usize = t.shape.iter().skip(1).product();
            if t.shape.is_empty() || width != cols || filled + t.len() > rows * cols {
                bail!(
                    "tensor `{source}` has shape {:?}, which does not fit tinygpt's `{}` {want:?}",
                    t.shape,
                    name.burn
                );
            }
            filled += t.len();
            pieces.push(t);
        }
        if filled != rows * cols {
            bail!(
                "the tensors of tinygpt's `{}` do not fill {want:?}",
                name.burn
            );
        }
        let slot = Deferred::new(want, move || {
            let mut values = Vec::with_capacity(rows * cols);
            for piece in pieces {
                values.extend(piece.values()?);
            }
            Ok(match linear {
                true => transposed(&values, rows, cols),
                false => values,
            })
        });
        out.push((name.burn, slot));
    }
    // A tied checkpoint may still carry `lm_head.weight` equal to the embedding; older ones
    // carry the rotary frequencies as a buffer.
    if gpt.tie_embeddings {
        tensors.remove("lm_head.weight");
    }
    tensors.retain(|name, _| !name.ends_with("rotary_emb.inv_freq"));
    if let Some(extra) = tensors.keys().next() {
        bail!("unexpected tensor `{extra}` (a part tinygpt does not have?)");
    }
    Ok(out)
}

/// Whether `LlamaForCausalLM` computes what a model of `config` computes, or the part it lacks
/// (`"with LayerNorm (…)"`). An exhaustive destructuring, so a new part of the architecture does
/// not compile until this format says what it does with it.
pub(super) fn expressible(config: &GptConfig) -> Result<(), String> {
    let GptConfig {
        vocab_size: _,
        block_size: _,
        n_layer: _,
        n_head: _,
        n_embd: _,
        dropout: _,
        // `attention_bias` and `mlp_bias` both.
        bias: _,
        tie_embeddings: _,
        position,
        norm,
        mlp,
        layer_norm_eps: _,
        logit_softcap,
        mlp_hidden: _,
        proj_init: _,
        rope_theta: _,
        n_kv_head: _,
        qk_norm,
        bigram,
    } = config;
    let refuse = |part: &str| Err(part.to_string());
    if *bigram {
        return refuse("with a bigram embedding (`model.bigram`; Llama has no such table)");
    }
    match position {
        Position::Rope => {}
        Position::Learned => return refuse("with learned positions (Llama's are rotary)"),
        Position::None => return refuse("without positions (`model.position = \"none\"`)"),
    }
    match norm {
        // A gain-less RMSNorm is Llama's with gains of one (written so).
        Norm::Rms | Norm::RmsUnit => {}
        Norm::Layer => return refuse("with LayerNorm (Llama normalises with RMSNorm)"),
        Norm::None => return refuse("without normalisation (`model.norm = \"none\"`)"),
    }
    match mlp {
        Mlp::SwiGlu => {}
        Mlp::Gelu | Mlp::GeluTanh => return refuse("with a GELU MLP (Llama's is SwiGLU)"),
        Mlp::Relu2 => return refuse("with a ReLU² MLP (Llama's is SwiGLU)"),
        Mlp::None => return refuse("without the MLP (`model.mlp = \"none\"`)"),
    }
    if *qk_norm {
        return refuse("with QK-norm (`model.qk_norm`)");
    }
    if *logit_softcap > 0.0 {
        return refuse("with soft-capped logits (`model.logit_softcap`)");
    }
    Ok(())
}

/// The `LlamaForCausalLM` tensors of a model of `gpt` whose Burn tensors are `burn`: each
/// slot's tensor transposed to `[out, in]` where it is a linear weight and split into its
/// sources (`c_attn` into q, k, v; `c_fc` into gate, up). A tied head is left out, as
/// `save_pretrained` does. Each of `burn`'s tensors is dropped once used, so that the model is
/// held twice at most, not three times (a 1.7B model's export fits in 23 GiB).
pub(super) fn tensors(
    gpt: &GptConfig,
    mut burn: super::foreign::TensorTable,
) -> Result<Vec<NamedTensor>> {
    let mut out = Vec::new();
    for name in parameter_table(gpt) {
        let gain = matches!(
            name.slot,
            Slot::FinalNormGain | Slot::Block(_, BlockSlot::Ln1Gain | BlockSlot::Ln2Gain)
        );
        if !name.present {
            // A gain-less RMSNorm's gains, ones: the same norm in Llama's form.
            if gain && gpt.norm == Norm::RmsUnit {
                let ones = 1f32.to_le_bytes().repeat(gpt.n_embd);
                out.extend(
                    sources(name.slot, gpt.mlp)
                        .0
                        .into_iter()
                        .map(|n| (n, vec![gpt.n_embd], ones.clone())),
                );
            }
            continue;
        }
        let (shape, bytes) = burn
            .remove(&name.burn)
            .ok_or_else(|| anyhow!("the model has no tensor `{}`", name.burn))?;
        let (names, linear) = sources(name.slot, gpt.mlp);
        let (shape, bytes) = match linear {
            true => transpose(&shape, &bytes),
            false => (shape, bytes),
        };
        // Rows of each source along the output axis: q, k, v are `n_head` and `kv_heads`
        // heads wide; gate and up are equal halves.
        let rows = shape[0];
        let cols: usize = shape.iter().skip(1).product();
        let kv = gpt.kv_heads() * gpt.head_size();
        let split = match names.len() {
            3 => vec![rows - 2 * kv, kv, kv],
            n => vec![rows / n.max(1); n],
        };
        let mut at = 0;
        for (source, n) in names.into_iter().zip(split) {
            let piece = bytes[at * cols * 4..(at + n) * cols * 4].to_vec();
            let piece_shape = match shape.len() {
                1 => vec![n],
                _ => vec![n, cols],
            };
            out.push((source, piece_shape, piece));
            at += n;
        }
    }
    Ok(out)
}

/// `config.json` for `LlamaForCausalLM`, of the model `m` (its `vocab_size` resolved).
pub(super) fn config_json(m: &GptConfig, tokenizer: &Tokenizer) -> Result<String> {
    let bos = tokenizer.start_of_text();
    let eos = tokenizer.end_of_text();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": m.vocab_size,
        "hidden_size": m.n_embd,
        "intermediate_size": m.mlp_width(),
        "num_hidden_layers": m.n_layer,
        "num_attention_heads": m.n_head,
        "num_key_value_heads": m.kv_heads(),
        "head_dim": m.head_size(),
        "hidden_act": "silu",
        "max_position_embeddings": m.block_size,
        "rms_norm_eps": m.layer_norm_eps,
        "rope_theta": m.rope_theta,
        "rope_scaling": null,
        "tie_word_embeddings": m.tie_embeddings,
        "attention_bias": m.bias,
        "mlp_bias": m.bias,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "use_cache": true,
        "torch_dtype": "float32",
    });
    Ok(serde_json::to_string_pretty(&config)?)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A Llama of one block, 2 heads of 4, SwiGLU of 12, untied.
    fn small() -> GptConfig {
        GptConfig {
            vocab_size: 10,
            block_size: 8,
            n_layer: 1,
            n_head: 2,
            n_embd: 8,
            tie_embeddings: false,
            position: Position::Rope,
            norm: Norm::Rms,
            mlp: Mlp::SwiGlu,
            mlp_hidden: Some(12),
            bias: false,
            ..GptConfig::default()
        }
    }

    /// Every Llama tensor of `gpt` (a slot's rows split evenly among its sources), values
    /// counting from each tensor's first; each counts in `made` when made.
    fn llama<'a>(gpt: &GptConfig, made: &'a Cell<usize>) -> BTreeMap<String, Deferred<'a>> {
        let mut out = BTreeMap::new();
        for name in parameter_table(gpt).into_iter().filter(|p| p.present) {
            let want = name.slot.shape(gpt);
            let (names, linear) = sources(name.slot, gpt.mlp);
            let (rows, cols) = match linear {
                true => (want[1] / names.len(), want[0]),
                false => (want[0], want.get(1).copied().unwrap_or(1)),
            };
            for (i, source) in names.into_iter().enumerate() {
                let shape = if want.len() == 1 {
                    vec![rows]
                } else {
                    vec![rows, cols]
                };
                let start = 1000.0 * i as f32;
                let values = (0..rows * cols).map(|v| start + v as f32).collect();
                let make = move || {
                    made.set(made.get() + 1);
                    Ok(values)
                };
                out.insert(source, Deferred::new(shape, make));
            }
        }
        out
    }

    #[test]
    fn slots_are_checked_at_once_and_made_as_they_are_written() {
        let (gpt, made) = (small(), Cell::new(0));
        let built = build(&gpt, llama(&gpt, &made)).unwrap();
        assert_eq!(made.get(), 0, "no values are made before they are written");
        let (_, attn) = built
            .into_iter()
            .find(|(name, _)| name == "h.0.attn.c_attn.weight")
            .unwrap();
        assert_eq!(attn.shape, vec![8, 24]);
        let values = attn.values().unwrap();
        assert_eq!(made.get(), 3, "q, k and v, once each");
        // Burn's `[in, out]`: column j of input row i is q's, k's or v's row j % 8, column i.
        for (i, row) in values.chunks_exact(24).enumerate() {
            for (j, &v) in row.iter().enumerate() {
                assert_eq!(v, 1000.0 * (j / 8) as f32 + ((j % 8) * 8 + i) as f32);
            }
        }

        let mut tensors = llama(&gpt, &made);
        tensors.insert(
            "model.layers.0.mlp.up_proj.weight".into(),
            Deferred::ready(vec![13, 8], vec![0.0; 104]),
        );
        let error = format!("{:#}", build(&gpt, tensors).unwrap_err());
        assert!(
            error.contains("`model.layers.0.mlp.up_proj.weight` has shape [13, 8]"),
            "{error}"
        );
        let mut tensors = llama(&gpt, &made);
        tensors.remove("model.norm.weight");
        let error = format!("{:#}", build(&gpt, tensors).unwrap_err());
        assert_eq!(error, "tensor `model.norm.weight` is missing");
        let mut tensors = llama(&gpt, &made);
        tensors.insert(
            "model.layers.0.extra".into(),
            Deferred::ready(vec![1], vec![0.0]),
        );
        let error = format!("{:#}", build(&gpt, tensors).unwrap_err());
        assert!(
            error.starts_with("unexpected tensor `model.layers.0.extra`"),
            "{error}"
        );
        assert_eq!(made.get(), 3, "a refused model makes nothing");
    }
}
