//! A weights file written a tensor at a time, each tensor's values made only as it is written
//! ([`Deferred`]): an import holds one tensor in f32 beside its source, not the whole model (a
//! 1 GB Q4_K_M file of SmolLM2-1.7B is 6.8 GB in f32, and the import held that three times).

use std::borrow::Cow;
use std::cell::RefCell;
use std::path::Path;

use anyhow::{Context, Result, anyhow, ensure};
use safetensors::Dtype;

use super::weights::TensorSums;
use crate::checksum::sha256_hex;

/// How a [`Deferred`] tensor's values are made.
type Make<'a> = Box<dyn FnOnce() -> Result<Vec<f32>> + 'a>;

/// A tensor of `shape` whose f32 values are made when they are first needed, once (a quantised
/// file's tensor dequantised, several concatenated, a matrix transposed).
pub(crate) struct Deferred<'a> {
    pub shape: Vec<usize>,
    make: Make<'a>,
}

impl<'a> Deferred<'a> {
    /// A tensor of `shape` that `make` makes.
    pub(crate) fn new(shape: Vec<usize>, make: impl FnOnce() -> Result<Vec<f32>> + 'a) -> Self {
        Self {
            shape,
            make: Box::new(make),
        }
    }

    /// A tensor already made.
    pub(crate) fn ready(shape: Vec<usize>, values: Vec<f32>) -> Self {
        Self::new(shape, move || Ok(values))
    }

    /// How many values its shape holds.
    pub(crate) fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Its values, made now; an error if they do not fill its shape.
    pub(crate) fn values(self) -> Result<Vec<f32>> {
        let (want, shape) = (self.len(), self.shape.clone());
        let values = (self.make)()?;
        ensure!(
            values.len() == want,
            "{} values for a tensor of shape {shape:?}",
            values.len()
        );
        Ok(values)
    }
}

impl std::fmt::Debug for Deferred<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shape = &self.shape;
        f.debug_struct("Deferred")
            .field("shape", shape)
            .finish_non_exhaustive()
    }
}

/// One tensor as the safetensors writer asks for it: its bytes made when it writes them; a
/// failure is kept in `failed` (the writer's `data` cannot fail) and skips the tensors after it.
struct View<'a, 'f> {
    name: String,
    shape: Vec<usize>,
    tensor: RefCell<Option<Deferred<'a>>>,
    failed: &'f RefCell<Option<anyhow::Error>>,
    /// Each written tensor's SHA-256.
    sums: &'f RefCell<TensorSums>,
}

impl safetensors::View for View<'_, '_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * 4
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let tensor = self.tensor.borrow_mut().take();
        let Some(tensor) = tensor.filter(|_| self.failed.borrow().is_none()) else {
            return Cow::Borrowed(&[]);
        };
        match tensor.values() {
            Ok(values) => {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                let sum = sha256_hex(&bytes);
                self.sums.borrow_mut().insert(self.name.clone(), sum);
                Cow::Owned(bytes)
            }
            Err(e) => {
                let e = e.context(format!("tensor `{}`", self.name));
                *self.failed.borrow_mut() = Some(e);
                Cow::Borrowed(&[])
            }
        }
    }
}

/// Writes `tensors` (name, values) to `path` as a safetensors file of f32 tensors, each made as
/// it is written and dropped after, and syncs it; if one cannot be made, nothing is left at
/// `path` and the error names the tensor. Returns each tensor's SHA-256.
pub(crate) fn write(path: &Path, tensors: Vec<(String, Deferred<'_>)>) -> Result<TensorSums> {
    let (failed, sums) = (RefCell::new(None), RefCell::new(TensorSums::new()));
    let views = tensors.into_iter().map(|(name, tensor)| {
        let view = View {
            name: name.clone(),
            shape: tensor.shape.clone(),
            tensor: RefCell::new(Some(tensor)),
            failed: &failed,
            sums: &sums,
        };
        (name, view)
    });
    let written = safetensors::serialize_to_file(views, None, path);
    if let Some(error) = failed.into_inner() {
        let _ = std::fs::remove_file(path);
        return Err(error);
    }
    written.map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
    std::fs::File::open(path)
        .and_then(|file| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(sums.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &Path) -> Vec<(String, Vec<usize>, Vec<f32>)> {
        let bytes = std::fs::read(path).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut out: Vec<_> = file
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                assert_eq!(view.dtype(), Dtype::F32);
                let values = view
                    .data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect();
                (name, view.shape().to_vec(), values)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    #[test]
    fn each_tensor_is_made_once_as_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let made = std::cell::Cell::new(0);
        let counted = |values: Vec<f32>| {
            let made = &made;
            move || {
                made.set(made.get() + 1);
                Ok(values)
            }
        };
        let tensors = vec![
            (
                "b".to_string(),
                Deferred::new(vec![2, 3], counted(vec![1., 2., 3., 4., 5., 6.])),
            ),
            ("a".to_string(), Deferred::ready(vec![1], vec![-0.5])),
            (
                "c".to_string(),
                Deferred::new(vec![2], counted(vec![7., 8.])),
            ),
        ];
        assert_eq!(made.get(), 0, "nothing is made before it is written");
        write(&path, tensors).unwrap();
        assert_eq!(made.get(), 2);
        assert_eq!(
            read(&path),
            vec![
                ("a".to_string(), vec![1], vec![-0.5]),
                ("b".to_string(), vec![2, 3], vec![1., 2., 3., 4., 5., 6.]),
                ("c".to_string(), vec![2], vec![7., 8.]),
            ]
        );
    }

    #[test]
    fn a_tensor_that_cannot_be_made_leaves_no_file_and_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.safetensors");
        let later = std::cell::Cell::new(false);
        let tensors = vec![
            ("a".to_string(), Deferred::ready(vec![2], vec![1., 2.])),
            (
                "b".to_string(),
                Deferred::new(vec![2], || Err(anyhow!("block 3 is damaged"))),
            ),
            (
                "c".to_string(),
                Deferred::new(vec![1], || {
                    later.set(true);
                    Ok(vec![0.])
                }),
            ),
        ];
        let error = format!("{:#}", write(&path, tensors).unwrap_err());
        assert_eq!(error, "tensor `b`: block 3 is damaged");
        assert!(!later.get(), "the tensors after a failure are not made");
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

        let short = vec![("a".to_string(), Deferred::ready(vec![3], vec![1., 2.]))];
        let error = format!("{:#}", write(&path, short).unwrap_err());
        assert_eq!(error, "tensor `a`: 2 values for a tensor of shape [3]");
        assert!(!path.exists());
    }
}
