//! GPT-2-shaped models as llama.cpp's `gpt2` architecture (its `llm_build_gpt2`): learned
//! positions, LayerNorm, a fused QKV projection, GELU with tanh's approximation, every bias
//! (llama.cpp requires them: a bias-free model writes zeros), and `output.weight` also when the
//! head is tied, as llama.cpp's converter writes it.

use anyhow::{Result, anyhow};
use tinygpt_model::{Gpt, GptConfig, names::BlockSlot, names::Slot, names::parameter_table};

use super::difference::Approximation;
use super::file::{Tensor, TensorType, Value};
use super::quant;
use super::store::{Types, tensor};
use crate::interop::foreign::{burn_tensors, transpose};
use crate::interop::hf;

/// Whether llama.cpp's `gpt2` computes what a model of `config` computes, and what it
/// approximates; else the part it lacks and the setting a model it computes is trained with.
/// What Hugging Face's GPT-2 holds ([`hf::expressible`], which matches on every part of the
/// architecture); an exact GELU (erf) is computed with tanh's approximation, the only GELU
/// llama.cpp's `gpt2` has (none of its architectures computes erf's).
pub(crate) fn expressible(config: &GptConfig) -> Result<Vec<Approximation>, String> {
    let hint = "train with GPT-2's parts (learned positions, LayerNorm, GELU)";
    match hf::expressible(config) {
        Ok("gelu_new") => Ok(vec![]),
        Ok(_) => Ok(vec![Approximation::TanhGelu]),
        Err(part) => Err(format!("{part}: {hint}")),
    }
}

/// `gpt2.*` metadata of a model of `config`.
pub(crate) fn hparams(config: &GptConfig) -> Vec<(String, Value)> {
    let u32_of = |n: usize| Value::U32(u32::try_from(n).unwrap_or(u32::MAX));
    vec![
        ("gpt2.context_length".into(), u32_of(config.block_size)),
        ("gpt2.embedding_length".into(), u32_of(config.n_embd)),
        ("gpt2.feed_forward_length".into(), u32_of(config.fc_width())),
        ("gpt2.block_count".into(), u32_of(config.n_layer)),
        ("gpt2.attention.head_count".into(), u32_of(config.n_head)),
        (
            "gpt2.attention.layer_norm_epsilon".into(),
            Value::F32(config.layer_norm_eps as f32),
        ),
    ]
}

/// llama.cpp's name for the tensor in `slot`.
pub fn name(slot: Slot) -> String {
    match slot {
        Slot::TokenEmbedding => "token_embd.weight".into(),
        Slot::PositionEmbedding => "position_embd.weight".into(),
        // No llama.cpp architecture has one: `expressible` refuses such a model first.
        Slot::BigramEmbedding => "bigram_embd.weight".into(),
        Slot::FinalNormGain => "output_norm.weight".into(),
        Slot::FinalNormBias => "output_norm.bias".into(),
        Slot::LmHead => "output.weight".into(),
        Slot::Block(l, slot) => {
            let part = match slot {
                BlockSlot::Ln1Gain => "attn_norm.weight",
                BlockSlot::Ln1Bias => "attn_norm.bias",
                BlockSlot::AttnWeight => "attn_qkv.weight",
                BlockSlot::AttnBias => "attn_qkv.bias",
                BlockSlot::AttnProjWeight => "attn_output.weight",
                BlockSlot::AttnProjBias => "attn_output.bias",
                BlockSlot::Ln2Gain => "ffn_norm.weight",
                BlockSlot::Ln2Bias => "ffn_norm.bias",
                BlockSlot::FcWeight => "ffn_up.weight",
                BlockSlot::FcBias => "ffn_up.bias",
                BlockSlot::MlpProjWeight => "ffn_down.weight",
                BlockSlot::MlpProjBias => "ffn_down.bias",
            };
            format!("blk.{l}.{part}")
        }
        // llama.cpp's LoRA files (`convert_lora_to_gguf.py`) name a factor after its matrix.
        Slot::Adapter {
            layer,
            target,
            factor,
            ..
        } => format!(
            "{}.lora_{}",
            name(Slot::Block(layer, target.weight())),
            factor.name()
        ),
    }
}

/// The model's tensors in llama.cpp's names and PyTorch's `[out, in]` order, in the order of
/// the parameter table; absent biases as zeros, and `output.weight` last when tied.
pub fn tensors(config: &GptConfig, model: &Gpt, types: &Types) -> Result<Vec<Tensor>> {
    let table = burn_tensors(model)?;
    let mut out = Vec::new();
    let mut embedding = None;
    for param in parameter_table(config) {
        if !param.present {
            // A tied head is written after the loop; a model without a bigram table has no
            // such tensor in any format; every other absent slot is a bias (or a LayerNorm
            // shift), zeros as wide as that layer's output.
            if !matches!(param.slot, Slot::LmHead | Slot::BigramEmbedding) {
                let width = param.slot.shape(config)[0];
                out.push(tensor(
                    name(param.slot),
                    &[width],
                    &vec![0.0; width],
                    types,
                )?);
            }
            continue;
        }
        let (shape, bytes) = table
            .get(&param.burn)
            .ok_or_else(|| anyhow!("the model has no tensor `{}`", param.burn))?;
        let (shape, bytes) = match param.transposed {
            true => transpose(shape, bytes),
            false => (shape.clone(), bytes.clone()),
        };
        let values = quant::decode(&bytes, TensorType::F32)?;
        out.push(tensor(name(param.slot), &shape, &values, types)?);
        if param.slot == Slot::TokenEmbedding {
            embedding = Some((shape, values));
        }
    }
    // The tied head's values are the embedding's; its type is the head's own (llama.cpp's
    // quantiser gives the two different types).
    if let (true, Some((shape, values))) = (config.tie_embeddings, embedding) {
        out.push(tensor(name(Slot::LmHead), &shape, &values, types)?);
    }
    Ok(out)
}
