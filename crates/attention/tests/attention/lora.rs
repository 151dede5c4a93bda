//! LoRA's dropout ([`tinygpt_attention::lora`]): while training, a projection carrying an
//! adapter computes `x·W₀ + s·(drop(x)·A)·B + b`, the frozen matrix reading the whole input and
//! the adapter a dropped one; outside training, `x·(W₀ + s·A·B) + b`, as without dropout.

use burn::module::{Lora, Module, ModuleMapper, Param};
use burn::nn::{DropoutConfig, Linear};
use burn::tensor::{Device, Tensor};
use tinygpt_attention::Pass;
use tinygpt_attention::lora::project;

use super::draws::random;
use super::{assert_close, values};

/// Replaces an adapter's `B` (zero when attached, where the adapter changes nothing) by a
/// drawn one.
struct DrawB(Vec<String>);

impl ModuleMapper for DrawB {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.0.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.0.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        if self.0.last().map(String::as_str) != Some("b") {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let shape: [usize; D] = tensor.dims();
        let drawn = random(shape, &tensor.device()).mul_scalar(0.3);
        Param::from_mapped_value(id, drawn.require_grad(), mapper)
    }
}

/// A `[6, 5]` layer with a bias and an adapter of rank 2 (scale 1.5) whose factors are both
/// drawn, on `device`.
fn adapted(device: &Device) -> Linear {
    let layer = Linear {
        weight: Param::from_tensor(random([6, 5], device)),
        bias: Some(Param::from_tensor(random([5], device))),
    };
    layer
        .apply_lora(Lora::new(2, 3.0))
        .map(&mut DrawB(Vec::new()))
}

pub(super) fn adapter_dropout_drops_the_adapters_input_only(device: &Device) {
    let ad = device.clone().autodiff();
    let layer = adapted(&ad);
    let adapter = layer.weight.adapter().expect("an adapter");
    let x = random([2, 3, 6], &ad);
    let dropout = DropoutConfig::new(0.5).init();
    let seed = 7;
    ad.seed(seed);
    let y = project(&layer, x.clone(), &dropout, Pass::Train);
    // The same draw again: the mask the product used (0 or 1/(1-p) = 2).
    ad.seed(seed);
    let mask = dropout.forward(x.ones_like());
    let m = values(mask.clone());
    assert!(m.iter().all(|&v| v == 0.0 || v == 2.0), "{m:?}");
    assert!(m.contains(&0.0) && m.contains(&2.0), "{m:?}");
    let inner = |t: Tensor<2>| t.inner().unsqueeze::<3>();
    let (x0, mask) = (x.clone().inner(), mask.inner());
    let frozen = x0.clone().matmul(inner(layer.weight.base()));
    let low_rank = (x0 * mask)
        .matmul(inner(adapter.a.val()))
        .matmul(inner(adapter.b.val()));
    let bias = layer.bias.as_ref().unwrap().val().inner().unsqueeze::<3>();
    let want = frozen + low_rank.mul_scalar(adapter.scale) + bias;
    assert_close(&values(y.clone()), &values(want), 1e-5, "the two paths");
    // Without the mask it would be the merged product: the dropout changed something.
    let merged = values(layer.forward(x.clone()));
    assert_ne!(values(y.clone()), merged);
    // The factors learn; the frozen matrix gets no gradient.
    let grads = y.sum().backward();
    assert!(adapter.a.val().grad(&grads).is_some());
    assert!(adapter.b.val().grad(&grads).is_some());
    assert!(layer.weight.base().grad(&grads).is_none());
    // On an inference pass dropout is the identity: the merged product, whether the device
    // tracks gradients or not.
    let got = values(project(&layer, x.clone(), &dropout, Pass::Infer));
    assert_eq!(got, merged, "an inference pass under autodiff");
    let eval = layer.valid();
    let x = x.inner();
    let got = values(project(&eval, x.clone(), &dropout, Pass::Infer));
    assert_close(&got, &values(eval.forward(x)), 1e-5, "inference");
}
