//! A model's weights as checkpoint bytes (safetensors, Burn's parameter paths as names), copied
//! between models, and the parameter ids an optimizer state is keyed by.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::store::{ModuleSnapshot, SafetensorsStore};
use burn::tensor::{Tensor, TensorData};
use tinygpt_model::Gpt;

use crate::checksum::sha256_hex;

/// SHA-256 of each tensor's bytes in a weights file, by tensor name (a checkpoint's
/// [`TrainState::tensors`](super::TrainState::tensors)).
pub(crate) type TensorSums = std::collections::BTreeMap<String, String>;

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

/// SHA-256 of `model`'s weights: every float parameter's values in f32, in module order. Not
/// of [`weights_bytes`], whose header Burn writes in an order of its own (equal weights, other
/// bytes).
pub fn weights_checksum(model: &Gpt) -> [u8; 32] {
    use sha2::Digest;
    struct Hash(sha2::Sha256);
    impl ModuleVisitor for Hash {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let values = param.val().into_data().convert::<f32>();
            let values = values.try_into_vec::<f32>().expect("f32 values");
            hash_values(&mut self.0, &values);
        }
    }
    let mut hash = Hash(sha2::Sha256::new());
    model.visit(&mut hash);
    hash.0.finalize().into()
}

/// Adds `values` to `hash` as their little-endian bytes: how [`weights_checksum`] and the fused
/// engine's own checksum read a buffer.
pub(crate) fn hash_values(hash: &mut sha2::Sha256, values: &[f32]) {
    use sha2::Digest;
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    hash.update(&bytes);
}

/// Writes `model`'s weights to `path` as [`weights_bytes`] would make them, a tensor at a
/// time (no copy of the whole model in memory), and syncs the file.
pub(crate) fn write_weights(model: &Gpt, path: &std::path::Path) -> Result<()> {
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

/// A fine-tune's base: the safetensors file at `path` into `model` a tensor at a time (each
/// parameter's bytes read from the file as it is made, so the file is never held whole beside
/// the model: a fine-tune of a large model peaks at one copy of it, not two), or `lazily`: each
/// parameter's bytes read only when it is first used (a lazy parameter that reads its tensor
/// from the open file), for a LoRA run's frozen base, which the fused engine takes a parameter
/// at a time and rounds each block matrix to its blocks as it comes, so that a four-bit base
/// never exists in f32 whole (1.3 GB at SmolLM2-360M's shape). Every tensor must be present,
/// f32, of its parameter's shape, and the file must hold no other; but the model's context may
/// be shorter than the base's: a learned position table then takes the file's first rows, as
/// nanoGPT's `crop_block_size` does (rotary positions have no table).
pub(crate) fn load_base_weights(model: Gpt, path: &Path, lazily: bool) -> Result<Gpt> {
    let reading = Reading {
        lazily,
        positions_cropped: true,
    };
    load(model, path, &HashSet::new(), reading)
}

/// The safetensors file at `path` into `model` a tensor at a time, every tensor present, f32
/// and of its parameter's shape, the file holding no other; but the parameters named in
/// `unread` (Burn paths) are neither read nor made: the file must still hold each, of its
/// shape, and the model keeps it unmade, so that only a reader that takes its values from
/// elsewhere may use the model (reading one is a bug, said by name).
pub(crate) fn load_weights_file_without(
    model: Gpt,
    path: &Path,
    unread: &HashSet<String>,
) -> Result<Gpt> {
    load(model, path, unread, Reading::default())
}

/// How [`load`] reads a file's tensors.
#[derive(Debug, Clone, Copy, Default)]
struct Reading {
    /// Each when its parameter is first used, not now.
    lazily: bool,
    /// The position table (`wpe.weight`) may have more rows in the file than the model: its
    /// first rows are read.
    positions_cropped: bool,
}

/// The Burn path of the learned position table.
const POSITIONS: &str = "wpe.weight";

/// [`load_weights_file_without`], each parameter read as `reading` says.
fn load(model: Gpt, path: &Path, unread: &HashSet<String>, reading: Reading) -> Result<Gpt> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (start, tensors) = read_header(&file)
        .with_context(|| format!("{} is not a safetensors file", path.display()))?;
    let file = Arc::new(file);
    let mut load = Load {
        file: &file,
        start,
        tensors,
        unread,
        lazily: reading.lazily.then(|| (file.clone(), path.to_path_buf())),
        positions_cropped: reading.positions_cropped,
        path: Vec::new(),
        error: None,
    };
    let model = model.map(&mut load);
    if let Some(error) = load.error {
        return Err(error);
    }
    if let Some(name) = load.tensors.keys().next() {
        bail!("unexpected tensor `{name}` (another architecture?)");
    }
    model.check_config()?;
    Ok(model)
}

/// A tensor of a safetensors file: its dtype's name, shape, and byte range after the header.
pub(crate) struct FileTensor {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub offsets: (u64, u64),
}

/// A safetensors file's header: where the data starts, and each tensor by name.
pub(crate) fn read_header(file: &std::fs::File) -> Result<(u64, HashMap<String, FileTensor>)> {
    let mut reader = std::io::BufReader::new(file);
    let mut len = [0u8; 8];
    reader.read_exact(&mut len)?;
    let header_len = usize::try_from(u64::from_le_bytes(len))?;
    if header_len > 100 << 20 {
        bail!("a header of {header_len} bytes");
    }
    let mut header = vec![0u8; header_len];
    reader.read_exact(&mut header)?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)?;
    let mut tensors = HashMap::new();
    for (name, info) in header.into_iter().filter(|(n, _)| n != "__metadata__") {
        let field = |key: &str| info.get(key).cloned().unwrap_or_default();
        let tensor = FileTensor {
            dtype: field("dtype").as_str().unwrap_or_default().to_string(),
            shape: serde_json::from_value(field("shape"))
                .with_context(|| format!("tensor `{name}`'s shape"))?,
            offsets: serde_json::from_value(field("data_offsets"))
                .with_context(|| format!("tensor `{name}`'s offsets"))?,
        };
        tensors.insert(name, tensor);
    }
    Ok((8 + header_len as u64, tensors))
}

/// Checks each tensor of the safetensors file at `path` but those in `skip` against its
/// SHA-256 in `sums` (a checkpoint's [`TensorSums`]), reading only those: a load that leaves
/// the others unread (a quantised file's run, decoding from its kept blocks) never reads the
/// whole file through. A tensor without a sum is refused as damaged.
pub(crate) fn check_tensors(path: &Path, sums: &TensorSums, skip: &HashSet<String>) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (start, tensors) = read_header(&file)
        .with_context(|| format!("{} is not a safetensors file", path.display()))?;
    let damaged = |name: &str| {
        anyhow::anyhow!(
            "{} is damaged: tensor `{name}`'s checksum does not match the one in state.json",
            path.display()
        )
    };
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    for (name, tensor) in tensors.iter().filter(|(name, _)| !skip.contains(*name)) {
        let (from, to) = tensor.offsets;
        // A damaged header's range is refused before anything is allocated for it.
        let len = (to.checked_sub(from))
            .filter(|_| start.checked_add(to).is_some_and(|end| end <= size))
            .ok_or_else(|| damaged(name))?;
        let mut bytes = vec![0u8; usize::try_from(len)?];
        (file.read_exact_at(&mut bytes, start + from)).map_err(|_| damaged(name))?;
        if sums.get(name) != Some(&sha256_hex(&bytes)) {
            return Err(damaged(name));
        }
    }
    Ok(())
}

/// Replaces each parameter by its tensor of the file, by Burn path; the first problem is kept.
struct Load<'a> {
    file: &'a Arc<std::fs::File>,
    start: u64,
    tensors: HashMap<String, FileTensor>,
    /// The parameters left unmade ([`load_weights_file_without`]).
    unread: &'a HashSet<String>,
    /// The file (and its name, for a failed read) each parameter reads itself from when first
    /// used ([`load_base_weights`]).
    lazily: Option<(Arc<std::fs::File>, PathBuf)>,
    /// [`Reading::positions_cropped`].
    positions_cropped: bool,
    path: Vec<String>,
    error: Option<anyhow::Error>,
}

impl Load<'_> {
    /// Tensor `name` of the file, taken from the table: it must be F32 of shape `want` (or,
    /// the position table cropped, of more rows: its offsets are then its first rows').
    fn tensor(&mut self, name: &str, want: &[usize]) -> Result<FileTensor> {
        let tensor = self.tensors.remove(name);
        let mut tensor = tensor.with_context(|| format!("tensor `{name}` is missing"))?;
        let (from, to) = tensor.offsets;
        let bytes = |shape: &[usize]| 4 * shape.iter().product::<usize>() as u64;
        let cropped = self.positions_cropped
            && name == POSITIONS
            && matches!((&tensor.shape[..], want), ([rows, c], [fewer, w]) if fewer <= rows && c == w);
        let same = tensor.shape == want || cropped;
        if tensor.dtype != "F32" || !same || to.checked_sub(from) != Some(bytes(&tensor.shape)) {
            let (dtype, shape) = (&tensor.dtype, &tensor.shape);
            bail!("tensor `{name}` is {dtype} {shape:?}, the model's is F32 {want:?}");
        }
        tensor.offsets.1 = from + bytes(want);
        Ok(tensor)
    }

    /// The values of tensor `name`, of shape `want`.
    fn values(&mut self, name: &str, want: &[usize]) -> Result<Vec<f32>> {
        let tensor = self.tensor(name, want)?;
        let (from, to) = tensor.offsets;
        let len = usize::try_from((to - from) / 4)?;
        read_f32s(self.file, self.start + from, len)
            .with_context(|| format!("cannot read tensor `{name}`"))
    }
}

impl ModuleMapper for Load<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        if self.error.is_some() {
            return param;
        }
        let want: Vec<usize> = param.lazy_shape().iter().copied().collect();
        let name = self.path.join(".");
        if self.unread.contains(&name) {
            if let Err(e) = self.tensor(&name, &want) {
                self.error = Some(e);
            }
            return unmade(param, name);
        }
        if let Some((file, path)) = self.lazily.clone() {
            return match self.tensor(&name, &want) {
                Ok(tensor) => {
                    let at = self.start + tensor.offsets.0;
                    deferred(param, (file, path, at), name)
                }
                Err(e) => {
                    self.error = Some(e);
                    param
                }
            };
        }
        let values = match self.values(&name, &want) {
            Ok(values) => values,
            Err(e) => {
                self.error = Some(e);
                return param;
            }
        };
        param.map(|tensor| {
            let (shape, device) = (tensor.shape(), tensor.device());
            let require_grad = tensor.is_require_grad();
            drop(tensor);
            Tensor::from_data(TensorData::new(values, shape), &device)
                .set_require_grad(require_grad)
        })
    }
}

/// `param` unmade ([`load_weights_file_without`]): its id, shape and device, and no values.
fn unmade<const D: usize>(param: Param<Tensor<D>>, name: String) -> Param<Tensor<D>> {
    let (id, device, shape) = (param.id, param.lazy_device(), param.lazy_shape());
    drop(param);
    let unread = move |_: &burn::tensor::Device, _: bool| -> Tensor<D> {
        panic!("internal error: `{name}` was left unread by the loader, then read")
    };
    Param::uninitialized(id, unread, device, false, shape)
}

/// `len` little-endian f32 values of `file` from byte `at` (the eager and the lazy loads' one
/// read).
fn read_f32s(file: &std::fs::File, at: u64, len: usize) -> std::io::Result<Vec<f32>> {
    use std::os::unix::fs::FileExt;
    let mut bytes = vec![0u8; 4 * len];
    file.read_exact_at(&mut bytes, at)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("four bytes")))
        .collect())
}

/// `param` read from `file` at byte `at` when first used ([`load_base_weights`]; its
/// dtype and shape checked already). A read that fails then (the disk failing mid-run) cannot
/// be returned as an error: it stops the program, naming the file.
fn deferred<const D: usize>(
    param: Param<Tensor<D>>,
    (file, path, at): (Arc<std::fs::File>, PathBuf, u64),
    name: String,
) -> Param<Tensor<D>> {
    let (id, device, shape) = (param.id, param.lazy_device(), param.lazy_shape());
    drop(param);
    let size = shape.clone();
    let read = move |device: &burn::tensor::Device, require_grad: bool| -> Tensor<D> {
        let values = match read_f32s(&file, at, size.num_elements()) {
            Ok(values) => values,
            Err(e) => panic!("cannot read tensor `{name}` of {}: {e}", path.display()),
        };
        Tensor::from_data(TensorData::new(values, size), device).set_require_grad(require_grad)
    };
    // Trainable, as a model's own initialisation makes it (LoRA freezes its base after).
    Param::uninitialized(id, read, device, true, shape)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::streamed::{Deferred, write};

    /// The tensors read are checked against their sums, the skipped ones not read; a damaged
    /// tensor, or a header whose range runs past the file, is refused as damaged.
    #[test]
    fn check_tensors_reads_only_what_it_checks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let tensors = vec![
            (
                "a".to_string(),
                Deferred::ready(vec![4], vec![1.0, 2.0, 3.0, 4.0]),
            ),
            ("b".to_string(), Deferred::ready(vec![2], vec![5.0, 6.0])),
        ];
        let sums = write(&path, tensors).unwrap();
        let none = HashSet::new();
        check_tensors(&path, &sums, &none).unwrap();
        // `b`'s last byte changed: refused, unless it is skipped.
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let error = check_tensors(&path, &sums, &none).unwrap_err().to_string();
        assert!(
            error.contains("is damaged: tensor `b`'s checksum"),
            "{error}"
        );
        check_tensors(&path, &sums, &HashSet::from(["b".to_string()])).unwrap();
        // A header whose range runs far past the file: refused, nothing allocated for it.
        let header = br#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8000000000000]}}"#;
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header);
        file.extend_from_slice(&[0; 8]);
        std::fs::write(&path, &file).unwrap();
        let error = check_tensors(&path, &sums, &none).unwrap_err().to_string();
        assert!(
            error.contains("is damaged: tensor `a`'s checksum"),
            "{error}"
        );
    }
}
