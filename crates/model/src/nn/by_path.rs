//! Every float parameter of a built [`Gpt`] by its Burn module path, the names
//! [`parameter_table`](crate::parameter_table) gives under `burn`: how the optimizer's
//! [`ParamLayout`] and the CPU engine find a slot's tensor in a model, and how
//! [`Gpt::check_config`] holds a model's tensors to its config.

use std::collections::HashMap;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;

use super::gpt::Gpt;
use super::lora::adapter_path;
use crate::arch::{Factor, GptConfig, LoraTarget, Slot, parameter_table, trained_beside};
use crate::error::ModelError;
use crate::optim::ParamLayout;

/// A parameter of a model: its id and its values flattened.
pub(crate) struct Entry {
    pub id: ParamId,
    pub values: Tensor<1>,
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
            let len: usize = values.dims().iter().product();
            let entry = Entry {
                id: param.id,
                values: values.reshape([len]),
            };
            self.0.insert(self.1.join("."), entry);
        }
    }
    let mut by_path = ByPath(HashMap::new(), Vec::new());
    gpt.visit(&mut by_path);
    by_path.0
}

/// Every float parameter of `gpt` by its Burn path: its id and shape, its values not read (a
/// lazy parameter, as the fused engine's hollow model holds, stays unallocated).
pub(crate) fn shapes_by_path(gpt: &Gpt) -> HashMap<String, (ParamId, Vec<usize>)> {
    struct ByPath(HashMap<String, (ParamId, Vec<usize>)>, Vec<String>);
    impl ModuleVisitor for ByPath {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.1.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.1.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let shape = param.lazy_shape().iter().copied().collect();
            self.0.insert(self.1.join("."), (param.id, shape));
        }
    }
    let mut by_path = ByPath(HashMap::new(), Vec::new());
    gpt.visit(&mut by_path);
    by_path.0
}

impl Gpt {
    /// Whether the weights are those of a model of [`Gpt::config`]: every parameter the
    /// parameter table lists for it, of the shape it gives, and no other (a record loaded with
    /// Burn's `load_record` is not checked against the config).
    pub fn check_config(&self) -> Result<(), ModelError> {
        let mismatch = |what: String| Err(ModelError::ConfigMismatch(what));
        let mut by_path = shapes_by_path(self);
        for name in parameter_table(self.config()) {
            match (by_path.remove(&name.burn), name.present) {
                (Some((_, shape)), true) => {
                    let want = name.slot.shape(self.config());
                    if shape != want {
                        let (path, got) = (&name.burn, &shape);
                        return mismatch(format!("`{path}` is {got:?}, the config says {want:?}"));
                    }
                }
                (Some(_), false) => return mismatch(format!("`{}` is not in it", name.burn)),
                (None, true) => return mismatch(format!("`{}` is missing", name.burn)),
                (None, false) => {}
            }
        }
        // LoRA adapters: of the shapes their matrices and one rank give.
        let mut rank = None;
        for (path, adapter) in adapters(self.config()) {
            let Some((_, shape)) = by_path.remove(&path) else {
                continue;
            };
            let r = *rank.get_or_insert(adapter.rank_of(&shape));
            let want = adapter.slot(r).shape(self.config());
            if shape != want {
                let got = &shape;
                return mismatch(format!("`{path}` is {got:?}, the config says {want:?}"));
            }
        }
        match by_path.into_keys().next() {
            Some(path) => mismatch(format!("`{path}` is not in it")),
            None => Ok(()),
        }
    }
}

/// One adapter factor's place: block, matrix, factor.
#[derive(Clone, Copy)]
struct AdapterAt {
    layer: usize,
    target: LoraTarget,
    factor: Factor,
}

impl AdapterAt {
    fn slot(self, rank: usize) -> Slot {
        let Self {
            layer,
            target,
            factor,
        } = self;
        Slot::Adapter {
            layer,
            target,
            factor,
            rank,
        }
    }

    /// The rank a factor of `shape` has (`A [d_in, rank]`, `B [rank, d_out]`).
    fn rank_of(self, shape: &[usize]) -> usize {
        let side = match self.factor {
            Factor::A => shape.get(1),
            Factor::B => shape.first(),
        };
        side.copied().unwrap_or(0)
    }
}

/// Every adapter factor a model of `config` may have, with its path, in the layout's order
/// (block by block, each matrix's `A` then `B`).
fn adapters(config: &GptConfig) -> impl Iterator<Item = (String, AdapterAt)> {
    let targets: Vec<LoraTarget> = LoraTarget::all()
        .filter(|t| t.shape(config).is_some())
        .collect();
    (0..config.n_layer).flat_map(move |layer| {
        let targets = targets.clone().into_iter();
        targets.flat_map(move |target| {
            Factor::all().map(move |factor| {
                let at = AdapterAt {
                    layer,
                    target,
                    factor,
                };
                (adapter_path(layer, target, factor), at)
            })
        })
    })
}

impl ParamLayout {
    /// The layout of `gpt`'s parameters (read without reading their values).
    pub fn of(gpt: &Gpt) -> Self {
        let mut by_path = shapes_by_path(gpt);
        let mut layout =
            Self::from_present(parameter_table(gpt.config()), |burn| by_path.remove(burn));
        // LoRA adapters after the base, block by block.
        for (path, adapter) in adapters(gpt.config()) {
            if let Some((id, shape)) = by_path.remove(&path) {
                let slot = adapter.slot(adapter.rank_of(&shape));
                layout.push(slot, id, shape);
            }
        }
        let trained = trained_beside(gpt.config(), gpt.lora_also_train());
        layout.train_base(trained.into_iter().map(|p| p.slot));
        layout
    }

    /// `gpt`'s parameter values end to end in this layout, `[len]`, on its device without
    /// autodiff.
    pub fn flatten(&self, gpt: &Gpt) -> Tensor<1> {
        let mut by_id: HashMap<ParamId, Tensor<1>> = parameters_by_path(gpt)
            .into_values()
            .map(|e| (e.id, e.values.inner()))
            .collect();
        let parts = self
            .entries()
            .iter()
            .filter_map(|e| by_id.remove(&e.id))
            .collect();
        Tensor::cat(parts, 0)
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    use super::*;
    use crate::arch::{GptConfig, Mlp, Norm, ParamName, Position, parameter_table};

    /// For every combination of the parts that add or drop parameters (every norm and MLP, with
    /// and without biases and tying), the present slots are exactly the model's parameters, with
    /// Burn's paths and the shapes `Slot::shape` gives; the attention's parts (positions,
    /// key/value heads, QK-norm) and the bigram table take turns across them.
    #[test]
    fn the_table_names_every_parameter_once() {
        let positions: Vec<Position> = Position::all().collect();
        let parts = Norm::all().flat_map(|n| Mlp::all().map(move |m| (n, m)));
        let all = (0..4u8).flat_map(|bits| parts.clone().map(move |p| (bits, p)));
        for (i, (bits, (norm, mlp))) in all.enumerate() {
            let [bias, tied] = [1, 2].map(|b| bits & b != 0);
            let config = GptConfig::new(11)
                .with_n_layer(2)
                .with_bias(bias)
                .with_tie_embeddings(tied)
                .with_mlp(mlp)
                .with_norm(norm)
                .with_position(positions[i % positions.len()])
                .with_n_kv_head([None, Some(2), Some(1), Some(4)][i % 4])
                .with_qk_norm(i % 2 == 0)
                .with_mlp_hidden([None, Some(40)][i / 2 % 2])
                .with_bigram(i % 3 == 0);
            let model = config.init(&Device::flex()).unwrap();
            let by_path = parameters_by_path(&model);
            let mut paths: Vec<&String> = by_path.keys().collect();
            let present: Vec<ParamName> = parameter_table(&config)
                .into_iter()
                .filter(|p| p.present)
                .collect();
            let mut expected: Vec<&String> = present.iter().map(|p| &p.burn).collect();
            paths.sort();
            expected.sort();
            assert_eq!(paths, expected, "{config:?}");
            for p in &present {
                let shape = &shapes_by_path(&model)[&p.burn].1;
                assert_eq!(shape, &p.slot.shape(&config), "{}", p.burn);
            }
            assert_eq!(model.check_config(), Ok(()), "{config:?}");
            assert_eq!(config.num_params(), model.num_params() as u64, "{config:?}");
        }
    }
}
