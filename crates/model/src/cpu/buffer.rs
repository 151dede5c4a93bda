//! One parameter's buffer in [`Params`](super::params::Params): its values, or why it has none.
//! Weights, gradients and AdamW's moments share the type, so a kernel skips a bias the model
//! lacks or a gradient nobody trains by matching on a name, never by finding a vector empty.

/// A parameter's values in f32, or the reason there are none here.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) enum Buffer {
    /// The model has no such parameter: no biases, no gain for `rms_unit`, no shift for
    /// RMSNorm, no MLP for `mlp = "none"`, no position table with rotary positions, no bigram
    /// table, no head of its own when tied, no adapter on that matrix. Every slot outside the
    /// model's [`ParamLayout`](crate::optim::ParamLayout) is absent.
    #[default]
    Absent,
    /// A gradient or optimizer moment of a parameter that does not train (LoRA's frozen base,
    /// [`ParamLayout::trains`](crate::optim::ParamLayout::trains)): none is computed or kept.
    Frozen,
    /// Weights whose values are somewhere else for now: in int8 (`[lora] base = "q8_0"`,
    /// [`BlockParams::base_held`](super::params::BlockParams)), in the decoder's rows
    /// (`decode/quant.rs`), or moved into Burn's model while it holds them
    /// ([`Params::lend`](super::params::Params::lend)).
    Elsewhere,
    /// The values, `[in, out]` for a matrix (Burn's layout).
    Held(Vec<f32>),
}

impl Buffer {
    /// The values, if they are here.
    pub(crate) fn get(&self) -> Option<&[f32]> {
        match self {
            Buffer::Held(values) => Some(values),
            Buffer::Absent | Buffer::Frozen | Buffer::Elsewhere => None,
        }
    }

    /// The values to change, if they are here.
    pub(crate) fn get_mut(&mut self) -> Option<&mut [f32]> {
        match self {
            Buffer::Held(values) => Some(values),
            Buffer::Absent | Buffer::Frozen | Buffer::Elsewhere => None,
        }
    }

    /// The values of a parameter the caller knows is held (an embedding, a matrix the step
    /// multiplies by in f32).
    ///
    /// # Panics
    /// When it is not: a layout and its buffers out of step, a bug.
    pub(crate) fn values(&self) -> &[f32] {
        match self {
            Buffer::Held(values) => values,
            other => panic!("a parameter read as held is {other:?}"),
        }
    }

    /// As [`values`](Self::values), to change.
    pub(crate) fn values_mut(&mut self) -> &mut [f32] {
        match self {
            Buffer::Held(values) => values,
            other => panic!("a parameter written as held is {other:?}"),
        }
    }

    /// An optional input of a kernel (a bias, a gain): its values, or empty when it is not
    /// held, which the numeric kernels read as "none" (as llm.c's kernels read a null bias).
    pub(crate) fn or_none(&self) -> &[f32] {
        self.get().unwrap_or(&[])
    }

    /// Floats held here.
    pub(crate) fn len(&self) -> usize {
        self.get().map_or(0, <[f32]>::len)
    }

    /// Whether the values are here.
    pub(crate) fn is_held(&self) -> bool {
        matches!(self, Buffer::Held(_))
    }

    /// The values moved out, `now` left in their place; `None` (and `self` unchanged) when
    /// they are not here.
    pub(crate) fn take(&mut self, now: Buffer) -> Option<Vec<f32>> {
        match self {
            Buffer::Held(_) => match std::mem::replace(self, now) {
                Buffer::Held(values) => Some(values),
                _ => unreachable!("matched as held"),
            },
            Buffer::Absent | Buffer::Frozen | Buffer::Elsewhere => None,
        }
    }

    /// `len` zeros, the allocation kept where there is one (gradients, moments).
    pub(crate) fn zero(&mut self, len: usize) {
        match self {
            Buffer::Held(values) => {
                values.clear();
                values.resize(len, 0.0);
            }
            _ => *self = Buffer::Held(vec![0.0; len]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Buffer;

    #[test]
    fn only_held_values_are_read_and_taking_leaves_the_reason() {
        let mut b = Buffer::Held(vec![1.0, 2.0]);
        assert_eq!(b.get(), Some(&[1.0, 2.0][..]));
        assert_eq!(b.take(Buffer::Elsewhere), Some(vec![1.0, 2.0]));
        assert_eq!(b, Buffer::Elsewhere);
        assert_eq!(b.take(Buffer::Frozen), None, "nothing to take");
        assert_eq!(b, Buffer::Elsewhere, "left as it was");
        assert_eq!((b.len(), b.or_none()), (0, &[][..]));
        b.zero(3);
        assert_eq!(b.values(), &[0.0; 3]);
    }

    #[test]
    #[should_panic(expected = "read as held is Frozen")]
    fn reading_a_frozen_gradient_as_held_is_a_bug_said_by_name() {
        Buffer::Frozen.values();
    }
}
