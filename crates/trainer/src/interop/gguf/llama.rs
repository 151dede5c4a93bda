//! Rotary + RMSNorm + SwiGLU models (grouped-query attention included) as llama.cpp's `llama`
//! architecture (its `llm_build_llama`): Hugging Face's `LlamaForCausalLM` tensors
//! ([`hf_llama::tensors`]) under llama.cpp's names, with the query and key rows reordered for
//! llama.cpp's rotary layout, as its converter reorders them. With QK-norm (the `modern`
//! preset's), as llama.cpp's `qwen3`: the same tensors and an RMSNorm of each query and key head
//! before rotation (`attn_q_norm`, `attn_k_norm`: tinygpt's has no gains, so gains of one), in
//! Qwen's rotary layout, which is tinygpt's (`rotate_half`): no reorder. With a ReLU² MLP (and
//! neither QK-norm nor biases), as llama.cpp's `arcee`: `llama`'s tensors without `ffn_gate`.
//!
//! Why the reorder: tinygpt (like Hugging Face) rotates the pairs `(i, i + d/2)` of each head
//! (`rotate_half`); llama.cpp's `llama` rotates the neighbours `(2i, 2i + 1)`. Moving row
//! `i` of each head's half `h` to `2i + h` makes llama.cpp's pairs the rows tinygpt paired, so
//! the scores `q·k` (sums over all rows) are the same numbers.

use anyhow::{Result, anyhow};
use tinygpt_model::parts::Mlp;
use tinygpt_model::{Gpt, GptConfig};

use super::file::{Tensor, TensorType, Value};
use super::quant;
use super::store::{Types, tensor};
use crate::interop::foreign::burn_tensors;
use crate::interop::llama as hf_llama;

/// The llama.cpp architectures written from Hugging Face's Llama tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// `llama`: no QK-norm, query and key rows in neighbouring pairs.
    Llama,
    /// `qwen3`: QK-norm, rows in halves as tinygpt keeps them; no biases.
    Qwen3,
    /// `arcee`: `llama` with a ReLU² MLP (`ffn_up`, `relu(x)²`, `ffn_down`: no gate); no
    /// biases, no QK-norm.
    Arcee,
}

impl Flavour {
    pub fn name(self) -> &'static str {
        match self {
            Flavour::Llama => "llama",
            Flavour::Qwen3 => "qwen3",
            Flavour::Arcee => "arcee",
        }
    }

    /// Whether the file's query and key rows are in neighbouring pairs (llama.cpp's
    /// `LLAMA_ROPE_TYPE_NORM`), which tinygpt's halves are reordered into.
    pub(crate) fn interleaves(self) -> bool {
        match self {
            Flavour::Llama | Flavour::Arcee => true,
            Flavour::Qwen3 => false,
        }
    }
}

/// The flavour that computes what a model of `config` computes; else the part `llama` lacks
/// (`qwen3`'s when the model has QK-norm) and the settings a model it computes is trained with.
pub(crate) fn expressible(config: &GptConfig) -> Result<Flavour, String> {
    let exportable = "train with Llama's parts (--set model.position=\"rope\" --set \
                      model.norm=\"rms\" --set model.mlp=\"swiglu\", no logit soft-cap; \
                      from the modern preset: --set model.mlp=\"swiglu\" --set \
                      model.logit_softcap=0)";
    if config.mlp == Mlp::Relu2 {
        return arcee(config, exportable);
    }
    if !config.qk_norm {
        return hf_llama::expressible(config)
            .map(|()| Flavour::Llama)
            .map_err(|part| format!("{part}: {exportable}"));
    }
    let without = GptConfig {
        qk_norm: false,
        ..config.clone()
    };
    match hf_llama::expressible(&without) {
        Err(part) => Err(format!("{part}: {exportable}")),
        // llama.cpp's qwen3 adds no bias to its MLP.
        Ok(()) if config.bias => Err("with QK-norm and biases (llama.cpp's qwen3 has QK-norm \
                                      but no biases): train with --set model.bias=false"
            .to_string()),
        Ok(()) => Ok(Flavour::Qwen3),
    }
}

/// `arcee` for a ReLU² model whose other parts are Llama's, without QK-norm or biases (which
/// `arcee` lacks); else what it lacks.
fn arcee(config: &GptConfig, exportable: &str) -> Result<Flavour, String> {
    let gated = GptConfig {
        mlp: Mlp::SwiGlu,
        qk_norm: false,
        ..config.clone()
    };
    match hf_llama::expressible(&gated) {
        Err(part) => Err(format!("{part}: {exportable}")),
        Ok(()) if config.qk_norm => Err("with ReLU² and QK-norm (llama.cpp's arcee computes \
                                          ReLU² without QK-norm; its qwen3 has QK-norm with \
                                          SwiGLU): train with --set model.qk_norm=false, or \
                                          --set model.mlp=\"swiglu\""
            .to_string()),
        Ok(()) if config.bias => Err("with ReLU² and biases (llama.cpp's arcee has no biases): \
                                      train with --set model.bias=false"
            .to_string()),
        Ok(()) => Ok(Flavour::Arcee),
    }
}

/// `llama.*` (or `qwen3.*`, `arcee.*`) metadata of a model of `config`.
pub(crate) fn hparams(config: &GptConfig, flavour: Flavour) -> Vec<(String, Value)> {
    let u32_of = |n: usize| Value::U32(u32::try_from(n).unwrap_or(u32::MAX));
    let entries: Vec<(String, Value)> = vec![
        ("llama.vocab_size".into(), u32_of(config.vocab_size)),
        ("llama.context_length".into(), u32_of(config.block_size)),
        ("llama.embedding_length".into(), u32_of(config.n_embd)),
        (
            "llama.feed_forward_length".into(),
            u32_of(config.mlp_width()),
        ),
        ("llama.block_count".into(), u32_of(config.n_layer)),
        ("llama.attention.head_count".into(), u32_of(config.n_head)),
        (
            "llama.attention.head_count_kv".into(),
            u32_of(config.kv_heads()),
        ),
        (
            "llama.rope.dimension_count".into(),
            u32_of(config.head_size()),
        ),
        (
            "llama.rope.freq_base".into(),
            Value::F32(config.rope_theta as f32),
        ),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            Value::F32(config.layer_norm_eps as f32),
        ),
    ];
    // The same keys under the architecture's own name.
    let prefix = flavour.name();
    entries
        .into_iter()
        .map(|(key, value)| (key.replacen("llama", prefix, 1), value))
        .collect()
}

/// Whole-model tensors: (llama.cpp's name, Hugging Face's).
const WHOLE: [(&str, &str); 3] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// A block's modules: (llama.cpp's name, Hugging Face's under `model.layers.N.`).
const BLOCK: [(&str, &str); 9] = [
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// The heads whose rows a module's rotary layout reorders (queries and keys), if any.
fn rotary_heads(module: &str, config: &GptConfig) -> Option<usize> {
    match module {
        "attn_q" => Some(config.n_head),
        "attn_k" => Some(config.kv_heads()),
        _ => None,
    }
}

/// llama.cpp's name for a `LlamaForCausalLM` tensor, and the heads to reorder its rows by.
fn name(hf: &str, config: &GptConfig) -> Option<(String, Option<usize>)> {
    if let Some((ours, _)) = WHOLE.iter().find(|(_, theirs)| *theirs == hf) {
        return Some((ours.to_string(), None));
    }
    let (layer, part) = hf.strip_prefix("model.layers.")?.split_once('.')?;
    let (module, kind) = part.rsplit_once('.')?;
    let (ours, _) = BLOCK.iter().find(|(_, theirs)| *theirs == module)?;
    Some((
        format!("blk.{layer}.{ours}.{kind}"),
        rotary_heads(ours, config),
    ))
}

/// Hugging Face's name for a tensor of llama.cpp's `llama`, and the heads whose rows to put
/// back in tinygpt's rotary layout; `None` for a tensor tinygpt has no place for.
pub(crate) fn hf_name(gguf: &str, config: &GptConfig) -> Option<(String, Option<usize>)> {
    if let Some((_, theirs)) = WHOLE.iter().find(|(ours, _)| *ours == gguf) {
        return Some((theirs.to_string(), None));
    }
    let (layer, part) = gguf.strip_prefix("blk.")?.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let (module, kind) = part.rsplit_once('.')?;
    let (ours, theirs) = BLOCK.iter().find(|(ours, _)| *ours == module)?;
    let name = format!("model.layers.{layer}.{theirs}.{kind}");
    Some((name, rotary_heads(ours, config)))
}

/// The rows of a query or key projection (`[heads * d, ...]`, each row `width` values) in
/// llama.cpp's rotary layout: within each head, row `h * d/2 + i` moves to `2i + h`.
fn interleave(values: &[f32], heads: usize, width: usize) -> Vec<f32> {
    let d = values.len() / width / heads;
    let mut out = vec![0.0; values.len()];
    for head in 0..heads {
        for half in 0..2 {
            for i in 0..d / 2 {
                let from = (head * d + half * d / 2 + i) * width;
                let to = (head * d + 2 * i + half) * width;
                out[to..to + width].copy_from_slice(&values[from..from + width]);
            }
        }
    }
    out
}

/// [`interleave`] undone: row `2i + h` of each head back to `h * d/2 + i`.
pub(crate) fn deinterleave(values: &[f32], heads: usize, width: usize) -> Vec<f32> {
    let d = values.len() / width / heads;
    let mut out = vec![0.0; values.len()];
    for head in 0..heads {
        for half in 0..2 {
            for i in 0..d / 2 {
                let from = (head * d + 2 * i + half) * width;
                let to = (head * d + half * d / 2 + i) * width;
                out[to..to + width].copy_from_slice(&values[from..from + width]);
            }
        }
    }
    out
}

/// The model's tensors in llama.cpp's names and PyTorch's `[out, in]` order; a tied head is
/// left out (llama.cpp then reads `token_embd.weight` for it). For `qwen3`, each block's
/// query and key norms too (gains of one: tinygpt's QK-norm has none), rows as they are.
pub fn tensors(
    config: &GptConfig,
    model: &Gpt,
    types: &Types,
    flavour: Flavour,
) -> Result<Vec<Tensor>> {
    let mut out = Vec::new();
    let hf = hf_llama::tensors(config, burn_tensors(model)?)?;
    for (hf, shape, bytes) in hf {
        let (name, heads) =
            name(&hf, config).ok_or_else(|| anyhow!("no llama.cpp name for `{hf}`"))?;
        let mut values = quant::decode(&bytes, TensorType::F32)?;
        if let (Some(heads), true) = (heads, flavour.interleaves()) {
            let width = shape.iter().skip(1).product::<usize>().max(1);
            values = interleave(&values, heads, width);
        }
        out.push(tensor(name, &shape, &values, types)?);
    }
    if flavour == Flavour::Qwen3 {
        let ones = vec![1.0; config.head_size()];
        for layer in 0..config.n_layer {
            for norm in ["attn_q_norm", "attn_k_norm"] {
                let name = format!("blk.{layer}.{norm}.weight");
                out.push(tensor(name, &[ones.len()], &ones, types)?);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rotating neighbours of the reordered rows is rotating tinygpt's `(i, i + d/2)` pairs.
    #[test]
    fn interleave_pairs_each_heads_halves_as_neighbours() {
        // Two heads of d = 4, one value per row: head 0 rows 0..4, head 1 rows 4..8.
        let rows: Vec<f32> = (0..8).map(|r| r as f32).collect();
        assert_eq!(
            interleave(&rows, 2, 1),
            [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]
        );
        // Rows of two values move whole.
        let rows: Vec<f32> = (0..8).map(|r| r as f32).collect();
        assert_eq!(
            interleave(&rows, 1, 2),
            [0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]
        );
    }
}
