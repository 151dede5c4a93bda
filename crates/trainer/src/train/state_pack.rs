//! The optimizer's state as Burn serialises an optimizer's record (`optimizer.bpk`: what
//! `optim::load_optimizer` reads): from states in memory, or from the fused engine's AdamW
//! moments shared with a writer that copies one tensor at a time into the file, so that a
//! checkpoint needs no copy of the whole state.

use std::path::Path;

use anyhow::Result;
use burn::tensor::{Bytes, TensorData};
use tinygpt_model::{MomentState, VelocityState, step::SharedMoments};

/// An optimizer's state per parameter: AdamW's moments, and Muon's momentum for its matrices.
#[derive(Debug, Default)]
pub struct States {
    pub adamw: Vec<MomentState>,
    pub muon: Vec<VelocityState>,
}

/// Tensors and scalars of a pack, in the order [`states_pack`] and [`write_shared`] both use.
#[derive(Default)]
struct Pack {
    tensors: Vec<burn_pack::Tensor>,
    scalars: Vec<(String, u64)>,
}

/// A tensor's values: in hand, or a moment of a shared state (`entry`, `second`).
enum Values {
    Owned(Vec<f32>),
    Shared(SharedMoments, usize, bool),
}

fn f32_bytes(values: Vec<f32>, shape: &[usize]) -> Bytes {
    TensorData::new(values, shape.to_vec()).into_parts().0
}

impl Pack {
    fn tensor(&mut self, name: String, id: u64, values: Values, shape: &[usize]) {
        let tensor = match values {
            Values::Owned(values) => {
                let (bytes, shape, dtype) = TensorData::new(values, shape.to_vec()).into_parts();
                burn_pack::Tensor::new(name, dtype, shape, Some(id), bytes)
            }
            Values::Shared(shared, entry, second) => {
                let dims = shape.to_vec();
                let len = 4 * dims.iter().product::<usize>();
                let dtype = burn::tensor::DType::F32;
                burn_pack::Tensor::deferred(name, dtype, dims.clone(), Some(id), len, move || {
                    let values = match second {
                        false => shared.moment_1(entry),
                        true => shared.moment_2(entry),
                    };
                    Ok(f32_bytes(values.to_vec(), &dims))
                })
            }
        };
        self.tensors.push(tensor);
    }

    /// One parameter's AdamW state: its two moments and steps taken.
    fn adamw(&mut self, id: u64, shape: &[usize], time: usize, moments: [Values; 2]) {
        for (leaf, values) in ["moment_1", "moment_2"].into_iter().zip(moments) {
            self.tensor(format!("{id}.momentum.{leaf}"), id, values, shape);
        }
        self.scalars
            .push((format!("{id}.__rank"), shape.len() as u64));
        self.scalars
            .push((format!("{id}.momentum.time"), time as u64));
    }

    /// Muon's momentum of its matrices.
    fn muon(&mut self, muon: Vec<VelocityState>) {
        for state in muon {
            let id = state.id.val();
            let values = Values::Owned(state.velocity);
            self.tensor(format!("{id}.velocity"), id, values, &state.shape);
            self.scalars
                .push((format!("{id}.__rank"), state.shape.len() as u64));
            self.scalars.push((format!("{id}.step"), state.step));
        }
    }

    fn writer(self) -> burn_pack::Writer {
        let mut writer = burn_pack::Writer::new(self.tensors).auto_extension(false);
        for (key, value) in &self.scalars {
            writer = writer.with_scalar(key, burn_pack::Scalar::UInt(*value));
        }
        writer
    }
}

/// `states` as the pack's bytes, written straight into one buffer: the state is held twice
/// at most (`states` and the buffer), never as a Burn record besides.
pub(crate) fn states_pack(states: States) -> Result<Vec<u8>> {
    let mut pack = Pack::default();
    for state in states.adamw {
        let moments = [state.moment_1, state.moment_2].map(Values::Owned);
        pack.adamw(state.id.val(), &state.shape, state.time, moments);
    }
    pack.muon(states.muon);
    let writer = pack.writer();
    let mut bytes = vec![0; writer.size()?];
    writer.write_into(&mut bytes)?;
    Ok(bytes)
}

/// Writes the pack of AdamW's `shared` state (none before the first step) and Muon's `muon`
/// to `path` (atomically, synced), one tensor at a time: the same bytes [`states_pack`] makes
/// of the same state.
pub(crate) fn write_shared(
    path: &Path,
    shared: Option<SharedMoments>,
    muon: Vec<VelocityState>,
) -> Result<()> {
    let mut pack = Pack::default();
    if let Some(shared) = shared {
        for (i, entry) in shared.entries().iter().enumerate() {
            let moments = [false, true].map(|second| Values::Shared(shared.clone(), i, second));
            pack.adamw(entry.id.val(), &entry.shape, entry.time, moments);
        }
    }
    pack.muon(muon);
    pack.writer().write_to_file(path)?;
    Ok(())
}
