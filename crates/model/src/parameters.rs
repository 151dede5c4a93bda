//! The GPT's parameters under both namings, in one table: Burn's module paths (`h.0.ln_1.gamma`,
//! `[in, out]` linear weights) and nanoGPT's / GPT-2's `state_dict` names
//! (`transformer.h.0.ln_1.weight`, `[out, in]`). The fused CPU engine stores its buffers in this
//! order, and export and import walk it; nothing else lists the parameters.

use std::collections::HashMap;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;

use crate::config::GptConfig;
use crate::gpt::Gpt;

/// One parameter slot of a GPT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamName {
    /// Burn's module path, e.g. `h.0.attn.c_attn.weight`.
    pub burn: String,
    /// nanoGPT's `state_dict` name, e.g. `transformer.h.0.attn.c_attn.weight`.
    pub nanogpt: String,
    /// A linear layer's weight: `[in, out]` in Burn, `[out, in]` in PyTorch.
    pub transposed: bool,
    /// Whether a model of this config has it: biases only with `bias`, `lm_head` only untied.
    pub present: bool,
}

/// Every slot of a model of `config`'s shape, in nanoGPT's order: `wte`, `wpe`, per block
/// `ln_1`, `attn.c_attn`, `attn.c_proj`, `ln_2`, `mlp.c_fc`, `mlp.c_proj` (weight, then bias),
/// `ln_f`, `lm_head`. Slots the model lacks are kept with `present: false`, so the positions
/// do not depend on the config. (Models without LayerNorms or MLP have no table: see
/// [`GptConfig::minimal`].)
pub fn parameter_table(config: &GptConfig) -> Vec<ParamName> {
    let mut table = Vec::new();
    let mut slot = |burn: String, nanogpt: String, transposed: bool, present: bool| {
        table.push(ParamName {
            burn,
            nanogpt,
            transposed,
            present,
        })
    };
    slot(
        "wte.weight".into(),
        "transformer.wte.weight".into(),
        false,
        true,
    );
    slot(
        "wpe.weight".into(),
        "transformer.wpe.weight".into(),
        false,
        true,
    );
    let bias = config.bias;
    // (Burn's path, nanoGPT's name, whether it is a linear layer).
    let layers = |i: usize| {
        let (b, t) = (format!("h.{i}"), format!("transformer.h.{i}"));
        [
            (format!("{b}.ln_1"), format!("{t}.ln_1"), false),
            (format!("{b}.attn.c_attn"), format!("{t}.attn.c_attn"), true),
            (format!("{b}.attn.c_proj"), format!("{t}.attn.c_proj"), true),
            (format!("{b}.ln_2"), format!("{t}.ln_2"), false),
            (format!("{b}.mlp.c_fc"), format!("{t}.mlp.c_fc"), true),
            (format!("{b}.mlp.c_proj"), format!("{t}.mlp.c_proj"), true),
        ]
    };
    let ln_f = ("ln_f".to_string(), "transformer.ln_f".to_string(), false);
    for (burn, torch, linear) in (0..config.n_layer).flat_map(layers).chain([ln_f]) {
        // Burn's LayerNorm calls its scale and shift `gamma` and `beta`.
        let (w, b) = if linear {
            ("weight", "bias")
        } else {
            ("gamma", "beta")
        };
        slot(
            format!("{burn}.{w}"),
            format!("{torch}.weight"),
            linear,
            true,
        );
        slot(format!("{burn}.{b}"), format!("{torch}.bias"), false, bias);
    }
    let untied = !config.tie_embeddings;
    slot(
        "lm_head.weight".into(),
        "lm_head.weight".into(),
        true,
        untied,
    );
    table
}

/// A parameter of a model: its id, its values flattened, and its shape.
pub(crate) struct Entry {
    pub id: ParamId,
    pub values: Tensor<1>,
    pub shape: Vec<usize>,
}

/// Every float parameter of `gpt` by its Burn module path (the table's `burn` names).
pub(crate) fn parameters_by_path(gpt: &Gpt) -> HashMap<String, Entry> {
    struct ByPath(HashMap<String, Entry>, Vec<String>);
    impl ModuleVisitor for ByPath {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.1.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.1.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let values = param.val();
            let shape = values.dims().to_vec();
            let len: usize = shape.iter().product();
            let entry = Entry {
                id: param.id,
                values: values.reshape([len]),
                shape,
            };
            self.0.insert(self.1.join("."), entry);
        }
    }
    let mut by_path = ByPath(HashMap::new(), Vec::new());
    gpt.visit(&mut by_path);
    by_path.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    /// The present slots are exactly the model's parameters, with Burn's paths.
    #[test]
    fn the_table_names_every_parameter_once() {
        for (bias, tied) in [(true, true), (false, false)] {
            let config = GptConfig::new(11)
                .with_n_layer(2)
                .with_bias(bias)
                .with_tie_embeddings(tied);
            let model = config.init(&Device::flex()).unwrap();
            let mut paths: Vec<String> = parameters_by_path(&model).into_keys().collect();
            let mut expected: Vec<String> = parameter_table(&config)
                .into_iter()
                .filter(|p| p.present)
                .map(|p| p.burn)
                .collect();
            paths.sort();
            expected.sort();
            assert_eq!(paths, expected);
        }
    }
}
