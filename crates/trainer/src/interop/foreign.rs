//! A foreign file's tensors under nanoGPT's names, and the `Gpt` they make.
//!
//! nanoGPT and Hugging Face's GPT-2 use the same parameter names (`transformer.h.0.attn.c_attn.weight`,
//! …) with three differences this module irons out: `torch.compile` prefixes names with
//! `_orig_mod.`, the original GPT-2 files drop the `transformer.` prefix, and older files carry
//! the causal mask as a buffer (`attn.bias`, `attn.masked_bias`), which is not a parameter.
//! The layouts differ too: see [`Layout`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use burn::store::ModuleSnapshot;
use burn::tensor::{DType, Device};
use safetensors::{Dtype, tensor::TensorView};
use tinygpt_model::{Gpt, names::ParamName, names::parameter_table};

use crate::config::RunConfig;
use crate::run::streamed::Deferred;
use crate::run::weights::read_header;

/// How a file stores the model's matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// nanoGPT: every linear layer is an `nn.Linear`, `[out, in]`.
    Linear,
    /// Hugging Face GPT-2: the blocks' layers are `Conv1D`, `[in, out]` (Burn's own layout);
    /// only `lm_head` is an `nn.Linear`.
    Conv1D,
}

impl Layout {
    /// Whether `name` is stored transposed relative to Burn's `[in, out]`.
    pub(crate) fn transposed(self, name: &ParamName) -> bool {
        name.transposed && (self == Layout::Linear || name.nanogpt == LM_HEAD)
    }
}

pub(crate) const LM_HEAD: &str = "lm_head.weight";
pub(crate) const WTE: &str = "transformer.wte.weight";

/// One tensor, as f32 values.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Foreign {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// The tensors of one file by nanoGPT name.
pub(crate) struct ForeignTensors {
    pub file: PathBuf,
    pub tensors: BTreeMap<String, Foreign>,
}

/// Element types a checkpoint's weights may come in; all are widened to f32.
#[derive(Debug, Clone, Copy)]
enum Elem {
    F32,
    F16,
    BF16,
    F64,
}

impl Elem {
    /// Bytes a value.
    fn size(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::F16 | Elem::BF16 => 2,
            Elem::F64 => 8,
        }
    }
}

impl ForeignTensors {
    /// `tensors` (a file's, under their own names) under nanoGPT's names; `file` is what
    /// errors name.
    pub fn named(file: &Path, tensors: BTreeMap<String, Foreign>) -> Result<Self> {
        let mut out = Self {
            file: file.to_path_buf(),
            tensors: BTreeMap::new(),
        };
        for (raw, tensor) in tensors {
            let Some(name) = normalise(&raw) else {
                continue;
            };
            if out.tensors.insert(name.clone(), tensor).is_some() {
                bail!(
                    "{}: tensor `{name}` appears twice (with and without a prefix)",
                    file.display()
                );
            }
        }
        Ok(out)
    }

    /// The tensors of a safetensors file.
    pub(crate) fn from_safetensors(path: &Path) -> Result<Self> {
        Self::named(path, read_safetensors(path)?)
    }

    /// The tensors of a PyTorch file (`torch.save`), under `key` of its top-level dict.
    pub(crate) fn from_pytorch(path: &Path, key: Option<&str>) -> Result<Self> {
        Self::named(path, read_pytorch(path, key)?)
    }

    /// Whether the LM head is the token embedding: absent (Hugging Face leaves a tied head out)
    /// or equal to it (nanoGPT saves both names of its one tensor).
    pub fn tied(&self) -> bool {
        match (self.tensors.get(LM_HEAD), self.tensors.get(WTE)) {
            (Some(head), Some(wte)) => head == wte,
            _ => true,
        }
    }

    /// A model of `config` (vocabulary `vocab_size`) holding these tensors: every parameter
    /// present with its shape, and nothing else. Errors name the file and the tensor.
    pub fn model(&self, config: &RunConfig, vocab_size: usize, layout: Layout) -> Result<Gpt> {
        self.build(config, vocab_size, layout)
            .map_err(|e| anyhow!("{}: {e:#}", self.file.display()))
    }

    fn build(&self, config: &RunConfig, vocab_size: usize, layout: Layout) -> Result<Gpt> {
        let gpt = config.gpt(vocab_size);
        let mut model = gpt.init(&Device::flex())?;
        let expected = burn_tensors(&model)?;
        let mut tensors = Vec::new();
        let mut used = vec![LM_HEAD.to_string()];
        for name in present(config, vocab_size) {
            let tensor = self
                .tensors
                .get(&name.nanogpt)
                .ok_or_else(|| anyhow!("tensor `{}` is missing", name.nanogpt))?;
            let (burn_shape, _) = &expected[&name.burn];
            let transposed = layout.transposed(&name);
            let want: Vec<usize> = match transposed {
                true => vec![burn_shape[1], burn_shape[0]],
                false => burn_shape.clone(),
            };
            if tensor.shape != want {
                bail!(
                    "tensor `{}` has shape {:?}, expected {want:?}",
                    name.nanogpt,
                    tensor.shape
                );
            }
            let bytes = f32_bytes(&tensor.values);
            let (shape, data) = match transposed {
                true => transpose(&want, &bytes),
                false => (want, bytes),
            };
            tensors.push((name.burn, shape, data));
            used.push(name.nanogpt);
        }
        if let Some(extra) = self.tensors.keys().find(|n| !used.contains(n)) {
            bail!("unexpected tensor `{extra}` (another architecture?)");
        }
        crate::run::weights::load_weights(&mut model, write_safetensors(&tensors)?)?;
        Ok(model)
    }
}

/// Every tensor of the safetensors file `path` under its own name, widened to f32 now
/// ([`deferred_safetensors`], each made); non-float tensors are errors naming the file and the
/// tensor.
pub(crate) fn read_safetensors(path: &Path) -> Result<BTreeMap<String, Foreign>> {
    made(deferred_safetensors(path)?)
}

/// Every tensor of `tensors`, made now.
pub(crate) fn made(tensors: BTreeMap<String, Deferred<'_>>) -> Result<BTreeMap<String, Foreign>> {
    let made = tensors.into_iter().map(|(name, t)| {
        let shape = t.shape.clone();
        Ok((
            name,
            Foreign {
                shape,
                values: t.values()?,
            },
        ))
    });
    made.collect()
}

/// Every tensor of the safetensors file `path` under its own name, each read and widened to f32
/// only when it is made (an import writes a tensor at a time: neither the file nor the model is
/// held whole). What needs no values is checked now: float tensors whose bytes lie within the
/// file and fill their shapes.
pub(crate) fn deferred_safetensors(path: &Path) -> Result<BTreeMap<String, Deferred<'static>>> {
    use std::os::unix::fs::FileExt;
    let invalid = |e: &dyn std::fmt::Display| {
        anyhow!("{} is not a valid safetensors file ({e})", path.display())
    };
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (start, header) = read_header(&file).map_err(|e| invalid(&format!("{e:#}")))?;
    let end = file.metadata()?.len();
    let file = Arc::new(file);
    let mut out = BTreeMap::new();
    for (name, t) in header {
        let elem = match t.dtype.as_str() {
            "F32" => Elem::F32,
            "F16" => Elem::F16,
            "BF16" => Elem::BF16,
            "F64" => Elem::F64,
            other => bail!(
                "{}: tensor `{name}` is {other}; weights must be floating point",
                path.display()
            ),
        };
        let (from, to) = t.offsets;
        let bytes = t.shape.iter().product::<usize>() * elem.size();
        if from > to || start.saturating_add(to) > end || (to - from) as usize != bytes {
            let why = format!(
                "tensor `{name}`'s bytes {from}..{to} do not hold {:?}",
                t.shape
            );
            return Err(invalid(&why));
        }
        let (file, path) = (file.clone(), path.to_path_buf());
        let make = move || {
            let mut raw = vec![0u8; bytes];
            file.read_exact_at(&mut raw, start + from)
                .with_context(|| format!("cannot read {}", path.display()))?;
            Ok(widen(elem, &raw))
        };
        out.insert(name, Deferred::new(t.shape, make));
    }
    Ok(out)
}

/// Every tensor of the PyTorch file (`torch.save`) `path`, under `key` of its top-level dict,
/// under its own name, widened to f32; non-float tensors are errors naming the file and the
/// tensor.
pub(crate) fn read_pytorch(path: &Path, key: Option<&str>) -> Result<BTreeMap<String, Foreign>> {
    use pytorch_reader::{DType as T, PytorchReader};
    let reader = match key {
        Some(key) => PytorchReader::with_top_level_key(path, key),
        None => PytorchReader::new(path),
    }
    .map_err(|e| anyhow!("{} cannot be read as a PyTorch file: {e}", path.display()))?;
    let mut out = BTreeMap::new();
    for (name, tensor) in reader.tensors() {
        let elem = match tensor.dtype() {
            T::F32 => Elem::F32,
            T::F16 => Elem::F16,
            T::BF16 => Elem::BF16,
            T::F64 => Elem::F64,
            other => bail!(
                "{}: tensor `{name}` is {other:?}; weights must be floating point",
                path.display()
            ),
        };
        let bytes = tensor
            .read()
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let tensor = foreign(path, name, tensor.shape().to_vec(), elem, &bytes)?;
        out.insert(name.clone(), tensor);
    }
    Ok(out)
}

/// A tensor of `path` widened to f32, its values as many as its shape says.
fn foreign(
    path: &Path,
    name: &str,
    shape: Vec<usize>,
    elem: Elem,
    bytes: &[u8],
) -> Result<Foreign> {
    let values = widen(elem, bytes);
    if values.len() != shape.iter().product::<usize>() {
        bail!(
            "{}: tensor `{name}` holds {} values for shape {shape:?}",
            path.display(),
            values.len()
        );
    }
    Ok(Foreign { shape, values })
}

/// nanoGPT's name for a file's tensor name; `None` for the causal-mask buffers.
fn normalise(raw: &str) -> Option<String> {
    let name = raw.strip_prefix("_orig_mod.").unwrap_or(raw);
    let name = name.strip_prefix("module.").unwrap_or(name);
    if name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") {
        return None;
    }
    let bare = ["h.", "wte.", "wpe.", "ln_f."]
        .iter()
        .any(|p| name.starts_with(p));
    Some(match bare {
        true => format!("transformer.{name}"),
        false => name.to_string(),
    })
}

fn widen(elem: Elem, bytes: &[u8]) -> Vec<f32> {
    match elem {
        Elem::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        Elem::F64 => bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()) as f32)
            .collect(),
        Elem::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Elem::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The present parameters of a model of `config`'s shape, in nanoGPT's order (the model
/// crate's one table of names).
pub(crate) fn present(config: &RunConfig, vocab_size: usize) -> Vec<ParamName> {
    parameter_table(&config.gpt(vocab_size))
        .into_iter()
        .filter(|p| p.present)
        .collect()
}

/// A tensor to write: its name, shape and little-endian f32 bytes.
pub(crate) type NamedTensor = (String, Vec<usize>, Vec<u8>);

/// Shape and little-endian f32 bytes of each tensor, by Burn path.
pub(crate) type TensorTable = HashMap<String, (Vec<usize>, Vec<u8>)>;

pub(crate) fn burn_tensors(model: &Gpt) -> Result<TensorTable> {
    model
        .collect(None, None, false)
        .into_iter()
        .map(|t| {
            if t.dtype != DType::F32 {
                bail!("tensor `{}` is {:?}, not F32", t.name, t.dtype);
            }
            let name = t.name.clone();
            let shape = t.shape.to_vec();
            let bytes = t
                .to_bytes()
                .map_err(|e| anyhow!("tensor `{name}`: {e:?}"))?;
            Ok((name, (shape, bytes.to_vec())))
        })
        .collect()
}

/// `[rows, cols]` f32 bytes → `[cols, rows]`.
pub fn transpose(shape: &[usize], bytes: &[u8]) -> (Vec<usize>, Vec<u8>) {
    let (rows, cols) = (shape[0], shape[1]);
    let mut out = vec![0u8; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = ((r * cols + c) * 4, (c * rows + r) * 4);
            out[to..to + 4].copy_from_slice(&bytes[from..from + 4]);
        }
    }
    (vec![cols, rows], out)
}

/// `[rows, cols]` values → `[cols, rows]`.
pub(crate) fn transposed(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    for (r, row) in values.chunks_exact(cols).enumerate().take(rows) {
        for (c, &v) in row.iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
    out
}

/// F32 tensors as a safetensors file; deterministic (sorted names, fixed metadata).
pub(crate) fn write_safetensors(tensors: &[NamedTensor]) -> Result<Vec<u8>> {
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            Ok((
                name.clone(),
                TensorView::new(Dtype::F32, shape.clone(), bytes)?,
            ))
        })
        .collect::<Result<BTreeMap<_, _>, safetensors::SafeTensorError>>()
        .map_err(|e| anyhow!("cannot build the safetensors file: {e}"))?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, Some(metadata))
        .map_err(|e| anyhow!("cannot write safetensors: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_lose_compile_prefixes_and_mask_buffers_and_gain_transformer() {
        assert_eq!(
            normalise("_orig_mod.transformer.h.0.attn.c_attn.weight").as_deref(),
            Some("transformer.h.0.attn.c_attn.weight")
        );
        assert_eq!(
            normalise("h.3.mlp.c_fc.bias").as_deref(),
            Some("transformer.h.3.mlp.c_fc.bias")
        );
        assert_eq!(normalise("lm_head.weight").as_deref(), Some(LM_HEAD));
        assert_eq!(normalise("transformer.h.0.attn.bias"), None);
        assert_eq!(normalise("h.0.attn.masked_bias"), None);
        // The attention projections' biases are parameters.
        assert!(normalise("h.0.attn.c_attn.bias").is_some());
    }

    #[test]
    fn half_precision_widens_exactly() {
        let f16 = half::f16::from_f32(-1.5).to_le_bytes();
        let bf16 = half::bf16::from_f32(0.25).to_le_bytes();
        assert_eq!(widen(Elem::F16, &f16), vec![-1.5]);
        assert_eq!(widen(Elem::BF16, &bf16), vec![0.25]);
        assert_eq!(widen(Elem::F64, &2.5f64.to_le_bytes()), vec![2.5]);
    }
}
