//! LoRA test helpers: a model with adapters whose `B` factors are drawn, and the fused
//! engine's loss and adapter gradients checked against Burn's autodiff.
#![allow(dead_code)] // Not every test file uses every helper.

use burn::module::{Module, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Distribution, Int, Tensor, TensorData};
use tinygpt_model::{
    FusedCpu, Gpt, GptConfig, LoraConfig, ParamLayout, Pass, TokenBatch, cross_entropy,
};

/// `config`'s model with `lora`'s adapters, its `B` factors drawn (they start at zero, where
/// `A`'s gradient is zero too: drawn, both are tested).
pub fn adapted(config: &GptConfig, lora: &LoraConfig) -> Gpt {
    let device = Device::flex().autodiff();
    let gpt = super::init(config, &device).with_lora(lora).unwrap();
    gpt.map(&mut SetB(Vec::new(), B::Drawn))
}

/// `gpt` without what its adapters add: every `B` factor zero.
pub fn without_adapters(gpt: Gpt) -> Gpt {
    gpt.map(&mut SetB(Vec::new(), B::Zero))
}

/// What [`SetB`] makes each adapter's `B` factor.
#[derive(Clone, Copy)]
enum B {
    /// Drawn from N(0, 0.02).
    Drawn,
    Zero,
}

/// Sets every adapter's `B` factor as its [`B`] says (the module path kept to find them).
struct SetB(Vec<String>, B);

impl ModuleMapper for SetB {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.0.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.0.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        if !self.0.ends_with(&["lora".to_string(), "b".to_string()]) {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let (shape, device) = (tensor.shape(), tensor.device());
        let made = match self.1 {
            B::Drawn => Tensor::<D>::random(shape, Distribution::Normal(0.0, 0.02), &device),
            B::Zero => tensor.zeros_like(),
        };
        Param::from_mapped_value(id, made.require_grad(), mapper)
    }
}

pub fn batch(vocab: usize) -> (Vec<i64>, Vec<i64>) {
    let ids: Vec<i64> = super::tokens(3 * 12 + 1, vocab)
        .into_iter()
        .map(i64::from)
        .collect();
    (ids[..3 * 12].to_vec(), ids[1..].to_vec())
}

/// Burn's loss for the batch, through `Gpt::forward` and `cross_entropy`, without a backward:
/// an inference pass.
pub fn burn_loss(gpt: &Gpt, batch: &TokenBatch<'_>) -> f64 {
    let loss = burn_loss_tensor(gpt, batch, Pass::Infer);
    loss.into_scalar::<f32>() as f64
}

/// [`burn_loss`] on a training pass (dropout acts), without a backward.
pub fn burn_training_loss(gpt: &Gpt, batch: &TokenBatch<'_>) -> f64 {
    let loss = burn_loss_tensor(gpt, batch, Pass::Train);
    loss.into_scalar::<f32>() as f64
}

fn burn_loss_tensor(gpt: &Gpt, batch: &TokenBatch<'_>, pass: Pass) -> Tensor<1> {
    let device = gpt.wte.weight.device();
    let shape = [batch.batch, batch.seq];
    let inputs =
        Tensor::<2, Int>::from_data(TensorData::new(batch.inputs.to_vec(), shape), &device);
    let targets = TensorData::new(batch.targets.to_vec(), [batch.batch * batch.seq]);
    let targets = Tensor::<1, Int>::from_data(targets, &device);
    let logits = gpt.forward(inputs, pass).unwrap();
    let [b, s, v] = logits.dims();
    cross_entropy(logits.reshape([b * s, v]), targets).unwrap()
}

/// Burn's loss and gradients for the batch, through `Gpt::forward` and `cross_entropy`.
pub fn burn_reference(gpt: &Gpt, batch: &TokenBatch<'_>) -> (f64, GradientsParams) {
    let loss = burn_loss_tensor(gpt, batch, Pass::Train);
    let value = loss.clone().into_scalar::<f32>() as f64;
    (value, GradientsParams::from_grads(loss.backward(), gpt))
}

pub fn values<const D: usize>(g: &GradientsParams, id: burn::module::ParamId) -> Option<Vec<f32>> {
    g.get::<D>(id)
        .map(|t| t.into_data().try_to_vec::<f32>().unwrap())
}

/// The fused engine's loss and adapter gradients against Burn's for `gpt`; returns how many
/// factors were compared.
pub fn check(gpt: &Gpt, threads: usize) -> usize {
    let (inputs, targets) = batch(gpt.config().vocab_size);
    let tokens = TokenBatch {
        inputs: &inputs,
        targets: &targets,
        batch: 3,
        seq: 12,
    };
    let (want_loss, want) = burn_reference(gpt, &tokens);
    let mut fused = FusedCpu::new(gpt, threads).unwrap();
    let loss = fused.accumulate(tokens, 1.0, None).unwrap();
    assert!(
        ((loss - want_loss) / want_loss).abs() < 1e-5,
        "loss {loss} vs Burn {want_loss}"
    );
    let got = fused.take_gradients(gpt);
    let layout = ParamLayout::of(gpt);
    let mut compared = 0;
    for entry in layout.entries() {
        let (a, b) = (values::<2>(&got, entry.id), values::<2>(&want, entry.id));
        if !layout.trains(entry) {
            // The frozen base: no gradient from either.
            let (a, b) = (a.or(values::<1>(&got, entry.id)), b);
            assert!(
                a.is_none() && b.is_none(),
                "{:?} has a gradient",
                entry.slot
            );
            continue;
        }
        let (a, b) = (a.expect("fused gradient"), b.expect("Burn gradient"));
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
        let diff = a
            .iter()
            .zip(&b)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            diff / scale < 1e-4,
            "{:?}: relative error {}",
            entry.slot,
            diff / scale
        );
        compared += 1;
    }
    compared
}
