//! [`Params`] and Burn's [`Gpt`]: a model's values read into the buffers, written back, lent
//! to it and taken back (a frozen base held once), and the buffers as its gradients.

use std::collections::HashMap;
use std::sync::Arc;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};

use super::{BlockParams, Buffer, Params};
use crate::arch::Slot;
use crate::nn::Gpt;
use crate::nn::by_path::parameters_by_path;
use crate::optim::ParamLayout;

impl Params {
    /// `gpt` with these values as its parameters (ids, devices and `require_grad` kept). `gpt`
    /// may be any model of the same architecture: its parameters are matched by slot.
    pub(crate) fn write(&self, gpt: Gpt) -> Gpt {
        // Each parameter's values are copied when it is replaced, so that the model's old
        // tensor is dropped before the next is made: never a second copy of the whole model.
        struct Write<'a>(&'a Params, HashMap<ParamId, Slot>);
        impl ModuleMapper for Write<'_> {
            fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
                let Some(slot) = self.1.remove(&param.id) else {
                    return param;
                };
                with_values(param, self.0.values(slot))
            }
        }
        let slots = ParamLayout::of(&gpt)
            .entries()
            .iter()
            .map(|e| (e.id, e.slot))
            .collect();
        gpt.map(&mut Write(self, slots))
    }

    /// `gpt` with the values of the parameters that train ([`ParamLayout::trains`]) copied in,
    /// and every frozen one an empty placeholder of its id (no values: nothing reads them; a
    /// reader that walks every parameter, as a checkpoint's writer does before it filters,
    /// finds nothing to make).
    pub(crate) fn write_trained(&self, gpt: Gpt) -> Gpt {
        struct Trained<'a>(&'a Params, HashMap<ParamId, (Slot, bool)>);
        impl ModuleMapper for Trained<'_> {
            fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
                match self.1.remove(&param.id) {
                    Some((slot, true)) => with_values(param, self.0.values(slot)),
                    Some((_, false)) => {
                        let (id, device) = (param.id, param.lazy_device());
                        Param::initialized(id, Tensor::<D>::empty([0; D], &device))
                    }
                    None => param,
                }
            }
        }
        let slots = slots_of(&gpt);
        gpt.map(&mut Trained(self, slots))
    }

    /// `gpt` with these values as its parameters, as [`write`](Self::write) makes it, but a
    /// frozen parameter's (LoRA's base, [`ParamLayout::trains`]) moved into it rather than
    /// copied: its buffer here is [`Buffer::Elsewhere`] until [`reclaim`](Self::reclaim) takes
    /// it back.
    /// On the CPU backends the values then exist once, in the model.
    pub(crate) fn lend(&mut self, gpt: Gpt) -> Gpt {
        struct Lend<'a>(&'a mut Params, HashMap<ParamId, (Slot, bool)>);
        impl ModuleMapper for Lend<'_> {
            fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
                let Some((slot, trains)) = self.1.remove(&param.id) else {
                    return param;
                };
                let values = match trains {
                    true => self.0.slot(slot).values().to_vec(),
                    false => self.0.take_values(slot),
                };
                with_values(param, values)
            }
        }
        let slots = slots_of(&gpt);
        gpt.map(&mut Lend(self, slots))
    }

    /// Takes back from `gpt` the values [`lend`](Self::lend) moved into it, and returns it
    /// hollow: every float parameter a lazy one of the same id, shape, device and gradient
    /// requirement, zeros if ever read (the buffers hold the values).
    pub(crate) fn reclaim(&mut self, gpt: Gpt) -> Gpt {
        let slots = slots_of(&gpt);
        let hollow = gpt.map(&mut Reclaim(self, slots));
        self.hold_base(self.base);
        hollow
    }

    /// The values of `gpt`'s parameters moved into buffers that follow its layout (not copied
    /// where the backend allows it: on the CPU the values then exist once), and `gpt` hollow, as
    /// [`reclaim`](Self::reclaim) leaves it.
    pub(crate) fn take(gpt: Gpt) -> (Self, Gpt) {
        let layout = Arc::new(ParamLayout::of(&gpt));
        let mut params = Self {
            blocks: vec![BlockParams::default(); gpt.h.len()],
            layout: layout.clone(),
            ..Self::default()
        };
        params.set_lora_scale(&gpt);
        // Every parameter counts as lent: `reclaim` moves each one's values in (a frozen
        // block matrix quantised as it comes, where the base is).
        params.base = gpt.lora_base();
        let slots = layout.entries().iter().map(|e| (e.id, (e.slot, false)));
        let hollow = gpt.map(&mut Reclaim(&mut params, slots.collect()));
        params.hold_base(hollow.lora_base());
        (params, hollow)
    }

    /// Every block's adapter scale and dropout, `gpt`'s (0 without adapters).
    fn set_lora_scale(&mut self, gpt: &Gpt) {
        let scale = gpt.lora_scale().unwrap_or(0.0) as f32;
        let dropout = gpt.lora_dropout() as f32;
        for block in &mut self.blocks {
            block.lora.scale = scale;
            block.lora.dropout = dropout;
        }
    }

    /// Copies the values of `gpt` (one host read per parameter) into buffers that follow
    /// `layout`, the layout of a model of the same architecture: parameters are matched by slot.
    pub(crate) fn read(gpt: &Gpt, layout: Arc<ParamLayout>) -> Self {
        Self::read_where(gpt, layout, |_| true)
    }

    /// As [`read`](Self::read), but only the slots `reads` keeps: the others are left
    /// [`Buffer::Elsewhere`], their tensors never read (a parameter a loader left unmade stays
    /// so: a decoder that takes those values from a file's blocks).
    pub(crate) fn read_where(
        gpt: &Gpt,
        layout: Arc<ParamLayout>,
        reads: impl Fn(Slot) -> bool,
    ) -> Self {
        struct Read<'a, F> {
            params: &'a mut Params,
            slots: HashMap<ParamId, Slot>,
            reads: F,
        }
        impl<F: Fn(Slot) -> bool> ModuleVisitor for Read<'_, F> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                let Some(slot) = self.slots.remove(&param.id) else {
                    return;
                };
                *self.params.slot_mut(slot) = match (self.reads)(slot) {
                    true => {
                        let values = param.val().into_data().try_into_vec::<f32>();
                        Buffer::Held(values.expect("parameters are f32"))
                    }
                    false => Buffer::Elsewhere,
                };
            }
        }
        let mut params = Self {
            blocks: vec![BlockParams::default(); gpt.h.len()],
            ..Self::default()
        };
        let own = ParamLayout::of(gpt);
        let slots = |l: &ParamLayout| l.entries().iter().map(|e| e.slot).collect::<Vec<_>>();
        assert_eq!(
            slots(&own),
            slots(&layout),
            "a model of another architecture"
        );
        let slots = own.entries().iter().map(|e| (e.id, e.slot)).collect();
        let mut read = Read {
            params: &mut params,
            slots,
            reads,
        };
        gpt.visit(&mut read);
        assert!(
            read.slots.is_empty(),
            "the layout names a parameter the model lacks"
        );
        params.set_lora_scale(gpt);
        params.layout = layout;
        params.hold_base(gpt.lora_base());
        params
    }

    /// These values as the gradients of `gpt`'s parameters (a model of the same architecture,
    /// matched by slot), on the device the optimizer reads gradients from (the backend under
    /// autodiff).
    pub(crate) fn to_gradients(&self, gpt: &Gpt) -> GradientsParams {
        let mut grads = GradientsParams::new();
        let mut by_id: HashMap<ParamId, Tensor<1>> = parameters_by_path(gpt)
            .into_values()
            .map(|e| (e.id, e.values))
            .collect();
        let layout = ParamLayout::of(gpt);
        // A frozen parameter (LoRA's base) has no gradient.
        for entry in layout.entries().iter().filter(|e| layout.trains(e)) {
            let Some(param) = by_id.remove(&entry.id) else {
                continue;
            };
            let values = self.slot(entry.slot).values();
            let device: Device = param.device().inner();
            let flat =
                Tensor::<1>::from_data(TensorData::new(values.to_vec(), [values.len()]), &device);
            match entry.shape[..] {
                [n] => grads.register(entry.id, flat.reshape([n])),
                [a, b] => grads.register(entry.id, flat.reshape([a, b])),
                _ => unreachable!("GPT parameters are 1-D or 2-D"),
            }
        }
        grads
    }
}

/// `param` holding `values` (its shape), its id, device and gradient requirement kept; the old
/// tensor is dropped before the new one is made, so that a model written a parameter at a time
/// never holds a second copy of itself.
fn with_values<const D: usize>(param: Param<Tensor<D>>, values: Vec<f32>) -> Param<Tensor<D>> {
    param.map(|tensor| {
        let (shape, device) = (tensor.shape(), tensor.device());
        let require_grad = tensor.is_require_grad();
        drop(tensor);
        Tensor::from_data(TensorData::new(values, shape), &device).set_require_grad(require_grad)
    })
}

/// Each parameter of `gpt` by id: its slot, and whether it trains ([`ParamLayout::trains`]).
fn slots_of(gpt: &Gpt) -> HashMap<ParamId, (Slot, bool)> {
    let layout = ParamLayout::of(gpt);
    let entries = layout.entries().iter();
    entries
        .map(|e| (e.id, (e.slot, layout.trains(e))))
        .collect()
}

/// Moves the values of the parameters marked frozen (`false`) whose values are not here (lent,
/// or never read: [`Params::take`]) into their buffers, and leaves every parameter a lazy one
/// of zeros.
struct Reclaim<'a>(&'a mut Params, HashMap<ParamId, (Slot, bool)>);
impl ModuleMapper for Reclaim<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, _) = param.consume();
        let (device, shape) = (tensor.device(), tensor.shape());
        let require_grad = tensor.is_require_grad();
        match self.1.remove(&id) {
            Some((slot, false)) if !self.0.slot(slot).is_held() => {
                let values = tensor.into_data().try_into_vec::<f32>();
                *self.0.slot_mut(slot) = Buffer::Held(values.expect("parameters are f32"));
                if let &[n_in, _] = shape.as_slice() {
                    self.0.hold_matrix(slot, n_in);
                }
            }
            _ => drop(tensor),
        }
        let size = shape.clone();
        let zeros = move |device: &Device, require_grad: bool| {
            Tensor::<D>::zeros(size, device).set_require_grad(require_grad)
        };
        Param::uninitialized(id, zeros, device, require_grad, shape)
    }
}
