//! GPT-2-shaped models as llama.cpp's `gpt2` architecture (its `llm_build_gpt2`): learned
//! positions, LayerNorm, a fused QKV projection, GELU with tanh's approximation, every bias
//! (llama.cpp requires them: a bias-free model writes zeros), and `output.weight` also when the
//! head is tied, as llama.cpp's converter writes it.

use anyhow::{Result, anyhow};
use tinygpt_model::parts::{Mlp, Norm, Position};
use tinygpt_model::{BlockSlot, Gpt, GptConfig, Slot, parameter_table};

use super::file::{Tensor, Value};
use super::store::{Dtype, tensor};
use crate::interop::foreign::{burn_tensors, transpose};

/// Whether llama.cpp's `gpt2` computes what a model of `config` computes; else the part it
/// lacks and the setting that a model it computes is trained with. An exhaustive
/// destructuring: a new part of the architecture does not compile until this says what it
/// does with it.
pub fn expressible(config: &GptConfig) -> Result<(), String> {
    let GptConfig {
        vocab_size: _,
        block_size: _,
        n_layer: _,
        n_head: _,
        n_embd: _,
        dropout: _,
        // Absent biases are written as zeros; a tied head as a copy of the embedding.
        bias: _,
        tie_embeddings: _,
        position,
        norm,
        mlp,
        layer_norm_eps: _,
        logit_softcap,
        mlp_hidden: _,
        // How the weights started, not what they compute.
        proj_init: _,
        // Read only with rotary positions, refused below.
        rope_theta: _,
        n_kv_head,
        qk_norm,
    } = config;
    let refuse = |part: &str| Err(part.to_string());
    match position {
        Position::Learned => {}
        Position::Rope => {
            return refuse(
                "with rotary positions (gpt2's are learned; --format hf writes this model as \
                 Llama)",
            );
        }
        Position::None => return refuse("without positions (`model.position = \"none\"`)"),
    }
    if n_kv_head.is_some_and(|kv| kv != config.n_head) {
        return refuse("with grouped-query attention (`model.n_kv_head`)");
    }
    if *qk_norm {
        return refuse("with QK-norm (`model.qk_norm`; train with --set model.qk_norm=false)");
    }
    if *logit_softcap > 0.0 {
        return refuse(&format!(
            "with soft-capped logits (`model.logit_softcap = {logit_softcap}`; train with --set \
             model.logit_softcap=0)"
        ));
    }
    match norm {
        Norm::Layer => {}
        Norm::Rms | Norm::RmsUnit => {
            return refuse(
                "with RMSNorm (gpt2 normalises with LayerNorm; train with --set \
                 model.norm=\"layer\")",
            );
        }
        Norm::None => return refuse("without normalisation (`model.norm = \"none\"`)"),
    }
    match mlp {
        Mlp::GeluTanh => Ok(()),
        Mlp::Gelu => refuse(
            "whose GELU is exact (erf): llama.cpp computes it with tanh's approximation; \
             train with --set model.mlp=\"gelu_tanh\" for a model it computes exactly",
        ),
        Mlp::Relu2 => refuse("with a ReLU² MLP (train with --set model.mlp=\"gelu_tanh\")"),
        Mlp::SwiGlu => refuse("with a SwiGLU MLP (train with --set model.mlp=\"gelu_tanh\")"),
        Mlp::None => refuse("without the MLP (`model.mlp = \"none\"`)"),
    }
}

/// `general.*` and `gpt2.*` metadata of a model of `config` called `name`.
pub fn hparams(config: &GptConfig, name: &str, dtype: Dtype) -> Vec<(String, Value)> {
    let u32_of = |n: usize| Value::U32(u32::try_from(n).unwrap_or(u32::MAX));
    vec![
        ("general.architecture".into(), Value::Str("gpt2".into())),
        ("general.name".into(), Value::Str(name.into())),
        ("general.file_type".into(), Value::U32(dtype.file_type())),
        ("general.quantization_version".into(), Value::U32(2)),
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
fn name(slot: Slot) -> String {
    match slot {
        Slot::TokenEmbedding => "token_embd.weight".into(),
        Slot::PositionEmbedding => "position_embd.weight".into(),
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
    }
}

/// The model's tensors in llama.cpp's names and PyTorch's `[out, in]` order, in the order of
/// the parameter table; absent biases as zeros, and `output.weight` last when tied.
pub fn tensors(config: &GptConfig, model: &Gpt, dtype: Dtype) -> Result<Vec<Tensor>> {
    let table = burn_tensors(model)?;
    let mut out = Vec::new();
    for param in parameter_table(config) {
        if !param.present {
            // A tied head is written after the loop; every other absent slot is a bias (or a
            // LayerNorm shift), zeros as wide as that layer's output.
            if param.slot != Slot::LmHead {
                let width = param.slot.shape(config)[0];
                out.push(tensor(name(param.slot), &[width], &vec![0.0; width], dtype));
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
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.push(tensor(name(param.slot), &shape, &values, dtype));
    }
    if config.tie_embeddings {
        let mut head = out[0].clone();
        head.name = name(Slot::LmHead);
        out.push(head);
    }
    Ok(out)
}
