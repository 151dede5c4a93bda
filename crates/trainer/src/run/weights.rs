//! A model's weights as checkpoint bytes (safetensors, Burn's parameter paths as names), copied
//! between models, and the parameter ids an optimizer state is keyed by.

use anyhow::{Result, bail};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::store::{ModuleSnapshot, SafetensorsStore};
use burn::tensor::Tensor;
use tinygpt_model::Gpt;

/// `model` as safetensors bytes (Burn's store; parameter paths as tensor names).
pub fn weights_bytes(model: &Gpt) -> Result<Vec<u8>> {
    let mut store = SafetensorsStore::from_bytes(None);
    model
        .save_into(&mut store)
        .map_err(|e| anyhow::anyhow!("cannot serialise the weights: {e}"))?;
    store
        .get_bytes()
        .map_err(|e| anyhow::anyhow!("cannot serialise the weights: {e}"))
}

/// Writes `model`'s weights to `path` as [`weights_bytes`] would make them, a tensor at a
/// time (no copy of the whole model in memory), and syncs the file.
pub fn write_weights(model: &Gpt, path: &std::path::Path) -> Result<()> {
    let mut store = SafetensorsStore::from_file(path).overwrite(true);
    model
        .save_into(&mut store)
        .map_err(|e| anyhow::anyhow!("cannot write the weights to {}: {e}", path.display()))?;
    std::fs::File::open(path)
        .and_then(|file| file.sync_all())
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

/// Loads safetensors `bytes` into `model`; every tensor must be present, with the shape the
/// model's config gives it.
pub fn load_weights(model: &mut Gpt, bytes: Vec<u8>) -> Result<()> {
    let mut store = SafetensorsStore::from_bytes(Some(bytes))
        .allow_partial(true)
        .validate(false);
    let result = model
        .load_from(&mut store)
        .map_err(|e| anyhow::anyhow!("the file is not valid safetensors ({e})"))?;
    check_applied(result)?;
    // The store loads without checking shapes: the model's config must still describe it.
    Ok(model.check_config()?)
}

/// `from`'s weights into `to` (same architecture), wherever each lives: the values are read on
/// `from`'s device (so a seeded CPU initialisation happens there) and created on `to`'s, with
/// `to`'s parameter ids and gradient tracking.
pub fn copy_weights(from: &Gpt, to: &mut Gpt) -> Result<()> {
    check_applied(to.apply(from.collect(None, None, false), None, None, false))
}

/// Every tensor applied, none missing, none left over.
fn check_applied(result: burn::store::ApplyResult) -> Result<()> {
    if let Some(error) = result.errors.first() {
        bail!("{error}");
    }
    if let Some((path, _)) = result.missing.first() {
        bail!("tensor `{path}` is missing");
    }
    if let Some(path) = result.unused.first() {
        bail!("unexpected tensor `{path}` (another architecture?)");
    }
    Ok(())
}

/// Parameter ids in module order.
pub fn param_ids(model: &Gpt) -> Vec<u64> {
    struct Ids(Vec<u64>);
    impl ModuleVisitor for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.id.val());
        }
    }
    let mut ids = Ids(Vec::new());
    model.visit(&mut ids);
    ids.0
}

/// Gives `model`'s parameters the ids they had when saved, so the optimizer state applies.
pub fn restore_param_ids(model: Gpt, ids: &[u64]) -> Result<Gpt> {
    struct Assign<'a>(std::slice::Iter<'a, u64>, bool);
    impl ModuleMapper for Assign<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let Some(&id) = self.0.next() else {
                self.1 = false;
                return param;
            };
            let (_, value, mapper) = param.consume();
            Param::from_mapped_value(ParamId::from(id), value, mapper)
        }
    }
    let mut assign = Assign(ids.iter(), true);
    let model = model.map(&mut assign);
    if !assign.1 || assign.0.next().is_some() {
        bail!("the checkpoint's parameter list does not match the model");
    }
    Ok(model)
}
