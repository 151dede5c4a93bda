//! [`ParamLayout`]: every parameter a model has, end to end in [`parameter_table`]'s order, the
//! one flat layout the optimizers work on.
//!
//! The fused CPU engine's AdamW walks its entries (each a buffer of its own there); the device
//! engine's flat buffers (the AdamW kernel and its tensor-op twin) put parameter `i` at
//! `offset..offset + len`; and the optimizer's state moves between that flat form and Burn's
//! per-parameter record ([`MomentState`]) through [`ParamLayout::split`] and
//! [`ParamLayout::gather`]. One order, from the table, for all of them. A built model's layout
//! is [`ParamLayout::of`] (with the Burn modules, `nn/by_path.rs`).

use std::collections::HashMap;

use burn::module::ParamId;

use super::state::MomentState;
use crate::arch::{ParamName, Slot};

/// One parameter's place in the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutEntry {
    /// Which parameter of the architecture it is.
    pub slot: Slot,
    /// The model's id for it (what Burn's optimizer record is keyed by).
    pub id: ParamId,
    /// Its shape in the model (`[in, out]` for a linear weight).
    pub shape: Vec<usize>,
    /// Where it starts in the flat buffers.
    pub offset: usize,
    /// How many values it has.
    pub len: usize,
}

impl LayoutEntry {
    /// Its range in the flat buffers.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// The parameters a model has (absent slots left out: no biases without `bias`, no head when
/// tied), in [`parameter_table`]'s order, end to end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParamLayout {
    entries: Vec<LayoutEntry>,
    len: usize,
    /// Whether LoRA adapters are among the entries: then only they train, and the base's
    /// slots in `trained_base` (`[lora] also_train`).
    adapted: bool,
    trained_base: Vec<Slot>,
}

/// Why a saved optimizer state does not fit a layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("no state for parameter {0}")]
    Missing(ParamId),
    #[error("state for parameter {0}, which the model does not have")]
    Unknown(ParamId),
    #[error("parameter {id} has {want} values, its state {got}")]
    Size {
        id: ParamId,
        want: usize,
        got: usize,
    },
}

impl ParamLayout {
    /// The present slots of `table`, in its order, end to end: `find` gives the id and shape of
    /// a slot's tensor by its Burn path (`None`: the model lacks it).
    pub(crate) fn from_present(
        table: Vec<ParamName>,
        mut find: impl FnMut(&str) -> Option<(ParamId, Vec<usize>)>,
    ) -> Self {
        let mut entries = Vec::new();
        let mut len = 0;
        for name in table {
            let Some((id, shape)) = find(&name.burn) else {
                continue;
            };
            let n = shape.iter().product();
            entries.push(LayoutEntry {
                slot: name.slot,
                id,
                shape,
                offset: len,
                len: n,
            });
            len += n;
        }
        Self {
            entries,
            len,
            adapted: false,
            trained_base: Vec::new(),
        }
    }

    /// Appends the parameter in `slot`, of `id` and `shape`, after those there are.
    pub(crate) fn push(&mut self, slot: Slot, id: ParamId, shape: Vec<usize>) {
        let n = shape.iter().product();
        self.adapted |= matches!(slot, Slot::Adapter { .. });
        self.entries.push(LayoutEntry {
            slot,
            id,
            shape,
            offset: self.len,
            len: n,
        });
        self.len += n;
    }

    /// Whether the optimizers update `entry`: every parameter, or in a model with LoRA
    /// adapters only the adapters' factors and the parts of the base that train beside them
    /// (`[lora] also_train`; the rest of the base is frozen).
    pub fn trains(&self, entry: &LayoutEntry) -> bool {
        !self.adapted
            || matches!(entry.slot, Slot::Adapter { .. })
            || self.trained_base.contains(&entry.slot)
    }

    /// Marks the base's `slots` as trained beside the adapters.
    pub(crate) fn train_base(&mut self, slots: impl IntoIterator<Item = Slot>) {
        self.trained_base.extend(slots);
    }

    /// Whether the model has LoRA adapters attached (its base frozen).
    pub fn adapted(&self) -> bool {
        self.adapted
    }

    /// The parameters, in order.
    pub fn entries(&self) -> &[LayoutEntry] {
        &self.entries
    }

    /// Values of all parameters together.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the model has no parameters.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entry of parameter `id`.
    pub fn find(&self, id: ParamId) -> Option<&LayoutEntry> {
        self.entries.iter().find(|e| e.id == id)
    }

    /// Flat moments (`[len]` each, stepped `time` times) as Burn's per-parameter record keeps
    /// them, sorted by id; empty before the first step (`time` 0), as Burn's record is.
    pub fn split(&self, moment_1: &[f32], moment_2: &[f32], time: usize) -> Vec<MomentState> {
        if time == 0 {
            return Vec::new();
        }
        let mut states: Vec<MomentState> = self
            .entries
            .iter()
            .map(|e| MomentState {
                id: e.id,
                shape: e.shape.clone(),
                time,
                moment_1: moment_1[e.range()].to_vec(),
                moment_2: moment_2[e.range()].to_vec(),
            })
            .collect();
        states.sort_by_key(|s| s.id.val());
        states
    }

    /// Burn's per-parameter record (`states`, empty before the first step) as one state per
    /// entry, in order: every parameter's, or none, each of its parameter's size.
    pub fn gather(&self, states: Vec<MomentState>) -> Result<Vec<MomentState>, LayoutError> {
        let ordered = self.gather_where(states, |_| true)?;
        Ok(ordered.into_iter().flatten().collect())
    }

    /// [`gather`](Self::gather) where only the entries `holds` marks (by index) keep such a
    /// state (another optimizer keeps the others'): `None` for the others, and all `None` for
    /// an empty record.
    pub fn gather_where(
        &self,
        states: Vec<MomentState>,
        holds: impl Fn(usize) -> bool,
    ) -> Result<Vec<Option<MomentState>>, LayoutError> {
        if states.is_empty() {
            return Ok(Vec::new());
        }
        let mut by_id: HashMap<ParamId, MomentState> =
            states.into_iter().map(|s| (s.id, s)).collect();
        let mut ordered = Vec::with_capacity(self.entries.len());
        for (i, e) in self.entries.iter().enumerate() {
            if !holds(i) {
                ordered.push(None);
                continue;
            }
            let state = by_id.remove(&e.id).ok_or(LayoutError::Missing(e.id))?;
            for got in [state.moment_1.len(), state.moment_2.len()] {
                if got != e.len {
                    let (id, want) = (e.id, e.len);
                    return Err(LayoutError::Size { id, want, got });
                }
            }
            ordered.push(Some(state));
        }
        match by_id.into_keys().next() {
            Some(id) => Err(LayoutError::Unknown(id)),
            None => Ok(ordered),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    use super::*;
    use crate::arch::{GptConfig, parameter_table};
    use crate::nn::Gpt;
    use crate::nn::by_path::parameters_by_path;

    fn layout(bias: bool, tied: bool) -> (Gpt, ParamLayout) {
        let config = GptConfig::new(11)
            .with_n_layer(2)
            .with_n_embd(8)
            .with_n_head(2)
            .with_block_size(4)
            .with_bias(bias)
            .with_tie_embeddings(tied);
        let gpt = config.init(&Device::flex()).unwrap();
        let layout = ParamLayout::of(&gpt);
        (gpt, layout)
    }

    /// The present table slots, in order, end to end, each with the model's own id and shape;
    /// the flat values are each parameter's at its offset.
    #[test]
    fn the_layout_is_the_tables_present_slots_end_to_end() {
        for (bias, tied) in [(true, true), (false, false)] {
            let (gpt, layout) = layout(bias, tied);
            let present: Vec<Slot> = parameter_table(gpt.config())
                .into_iter()
                .filter(|p| p.present)
                .map(|p| p.slot)
                .collect();
            let slots: Vec<Slot> = layout.entries().iter().map(|e| e.slot).collect();
            assert_eq!(slots, present);
            assert_eq!(layout.len(), gpt.num_params());
            let flat: Vec<f32> = layout
                .flatten(&gpt)
                .into_data()
                .try_to_vec::<f32>()
                .unwrap();
            let by_path = parameters_by_path(&gpt);
            let mut end = 0;
            for e in layout.entries() {
                assert_eq!(e.offset, end);
                end += e.len;
                let param = by_path.values().find(|p| p.id == e.id).unwrap();
                assert_eq!(param.values.dims()[0], e.shape.iter().product::<usize>());
                let values: Vec<f32> = param
                    .values
                    .clone()
                    .into_data()
                    .try_to_vec::<f32>()
                    .unwrap();
                assert_eq!(&flat[e.range()], &values[..], "{:?}", e.slot);
            }
        }
    }

    /// Split then gathered, a state comes back entry by entry; a state missing a parameter,
    /// with one the model lacks, or of the wrong size is refused by name.
    #[test]
    fn moments_round_trip_and_misfits_are_named() {
        let (_, layout) = layout(true, false);
        let m: Vec<f32> = (0..layout.len()).map(|i| i as f32).collect();
        let v: Vec<f32> = m.iter().map(|x| x * 2.0).collect();
        assert!(layout.split(&m, &v, 0).is_empty());
        let states = layout.split(&m, &v, 3);
        let gathered = layout.gather(states.clone()).unwrap();
        for (e, s) in layout.entries().iter().zip(&gathered) {
            assert_eq!((s.id, s.time), (e.id, 3));
            assert_eq!(s.moment_1, m[e.range()]);
            assert_eq!(s.moment_2, v[e.range()]);
        }
        let mut missing = states.clone();
        let gone = missing.remove(0).id;
        assert_eq!(layout.gather(missing), Err(LayoutError::Missing(gone)));
        let mut short = states.clone();
        short[0].moment_2.pop();
        assert!(matches!(
            layout.gather(short),
            Err(LayoutError::Size { .. })
        ));
        let (_, other) = self::layout(false, true);
        let foreign = other.split(&m[..other.len()], &v[..other.len()], 1);
        assert!(layout.gather(foreign).is_err());
    }
}
