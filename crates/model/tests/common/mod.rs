//! What the model crate's test files share.

use burn::module::Param;
use burn::tensor::{Device, Distribution, Tensor};
use tinygpt_model::GptConfig;
use tinygpt_model::parts::{Mlp, Norm, Position};
use tinygpt_model::{Decoder, ModelError, decoding::Pick, decoding::Picked};

/// Weights and inputs are drawn from the CPU backends' generators, which every test thread
/// shares (and Burn draws weights lazily, at first use): each test holds this lock and seeds the
/// generators first, so its numbers are the same on every run.
pub fn seeded() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    #[allow(deprecated)]
    let ndarray = Device::ndarray();
    for device in [Device::flex(), ndarray] {
        device.seed(20261122);
    }
    guard
}

/// `config`'s model, its weights drawn now on flex under the [`seeded`] lock (a lazy parameter
/// moved first would be drawn on wgpu, from another generator, and the test would differ run to
/// run). A wgpu test that draws nothing after this can run its minutes on wgpu beside the other
/// tests, on [`wgpu_device_of_two`].
#[allow(dead_code)] // Not every test file runs on wgpu.
pub fn drawn_on_flex(config: &GptConfig) -> tinygpt_model::Gpt {
    let _seeded = seeded();
    init(config, &Device::flex()).copied_here()
}

/// `config`'s model on `device`, a bigram table's rows (which start at zero, so that a pair
/// adds nothing until training teaches it) drawn like the token embedding's: a test of the
/// gradients or the decoders then reads rows that differ, and a wrong row shows.
#[allow(dead_code)] // Not every test file builds a model.
pub fn init(config: &GptConfig, device: &Device) -> tinygpt_model::Gpt {
    let mut gpt = config.init(device).unwrap();
    if let Some(bigram) = &mut gpt.bigram {
        let drawn =
            Tensor::<2>::random(bigram.weight.dims(), Distribution::Normal(0.0, 0.5), device);
        bigram.weight = Param::from_tensor(drawn);
    }
    gpt
}

pub mod lora;

/// The last position's logits of `Gpt::forward` over `context`, `[vocab]`.
#[allow(dead_code)] // Not every test file decodes.
pub fn last_logits(gpt: &tinygpt_model::Gpt, context: &[u32]) -> Vec<f32> {
    use burn::tensor::{Int, TensorData};
    let ids: Vec<i64> = context.iter().map(|&t| t.into()).collect();
    let ids = Tensor::<2, Int>::from_data(
        TensorData::new(ids, [1, context.len()]),
        &gpt.wte.weight.device(),
    );
    let logits = gpt.forward(ids, tinygpt_model::Pass::Infer).unwrap();
    let [_, seq, vocab] = logits.dims();
    let last = logits.slice([0..1, seq - 1..seq, 0..vocab]);
    last.into_data().try_to_vec::<f32>().unwrap()
}
#[path = "../../../attention/tests/support/wgpu.rs"]
mod support_wgpu;
#[allow(unused_imports)] // Not every test file runs on wgpu.
pub use support_wgpu::{wgpu_device, wgpu_device_of_two};

/// A decoder that counts what is asked of it: tokens fed, cache clears, logits read back to the
/// host, tokens picked on the device.
#[allow(dead_code)] // Not every test file counts.
pub struct Counted<D> {
    pub inner: D,
    pub fed: usize,
    pub clears: usize,
    pub logits_read: usize,
    pub picked_on_device: usize,
}

#[allow(dead_code)]
impl<D: Decoder> Counted<D> {
    pub fn new(inner: D) -> Self {
        Self {
            inner,
            fed: 0,
            clears: 0,
            logits_read: 0,
            picked_on_device: 0,
        }
    }
}

impl<D: Decoder> Decoder for Counted<D> {
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn cached(&self) -> usize {
        self.inner.cached()
    }
    fn clear(&mut self) {
        self.clears += 1;
        self.inner.clear()
    }
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.fed += tokens.len();
        self.logits_read += 1;
        self.inner.feed(tokens)
    }
    fn picks_on_device(&self) -> bool {
        self.inner.picks_on_device()
    }
    fn feed_and_pick(&mut self, tokens: &[u32], pick: &Pick) -> Result<Picked, ModelError> {
        self.fed += tokens.len();
        self.picked_on_device += 1;
        self.inner.feed_and_pick(tokens, pick)
    }
}

/// `len` token ids below `vocab`, scattered.
#[allow(dead_code)]
pub fn tokens(len: usize, vocab: usize) -> Vec<u32> {
    (0..len as u64)
        .map(|i| ((i * 2654435761) >> 7) as u32 % vocab as u32)
        .collect()
}

/// A small model of the classic parts (GPT-2's): 2 layers, 3 heads, 30 wide, block 24, vocab 13.
#[allow(dead_code)] // Not every test file decodes.
pub fn small() -> GptConfig {
    GptConfig::new(13)
        .with_block_size(24)
        .with_n_layer(2)
        .with_n_head(3)
        .with_n_embd(30)
}

/// [`small`] with the `modern` preset's parts: rotary positions, RMSNorm, QK-norm, its MLP,
/// no biases, an untied head, soft-capped logits.
#[allow(dead_code)] // Not every test file decodes.
pub fn modern_parts() -> GptConfig {
    let modern = GptConfig::modern(13);
    small()
        .with_position(modern.position)
        .with_norm(modern.norm)
        .with_qk_norm(true)
        .with_mlp(modern.mlp)
        .with_bias(false)
        .with_tie_embeddings(false)
        .with_logit_softcap(modern.logit_softcap)
}

/// Every config the decoder must cover: every variant of every part (from the types, so a new
/// one is decoded too), each part's variants paired differently with the others', then biases
/// on and off, tied and untied heads, head sizes under and over the 16-lane dot product, widths
/// that are not a multiple of 4, a soft-cap, QK-norm, grouped and multi-query heads, and
/// Llama's and nanochat's combinations.
#[allow(dead_code)] // Not every test file decodes.
pub fn configs() -> Vec<GptConfig> {
    let (norms, mlps, positions): (Vec<Norm>, Vec<Mlp>, Vec<Position>) = (
        Norm::all().collect(),
        Mlp::all().collect(),
        Position::all().collect(),
    );
    let every = norms.len().max(mlps.len()).max(positions.len());
    let each_part = (0..every).map(|i| {
        small()
            .with_norm(norms[i % norms.len()])
            .with_mlp(mlps[i % mlps.len()])
            .with_position(positions[i % positions.len()])
    });
    each_part
        .chain([
            GptConfig::minimal(13).with_block_size(24),
            small().with_norm(Norm::None).with_logit_softcap(2.0),
            small().with_position(Position::Rope).with_qk_norm(true),
            small().with_mlp(Mlp::SwiGlu).with_n_kv_head(Some(1)),
            GptConfig::new(13)
                .with_block_size(24)
                .with_n_layer(2)
                .with_n_head(6)
                .with_n_kv_head(Some(2))
                .with_n_embd(48)
                .with_position(Position::Rope)
                .with_norm(Norm::Rms)
                .with_mlp(Mlp::SwiGlu)
                .with_bias(false),
            modern_parts(),
            // A bigram table: each token's row is its pair with the token before it, which
            // every decoder must carry across feeds, chunks and steps.
            modern_parts().with_bigram(true),
            GptConfig::new(13)
                .with_block_size(24)
                .with_n_layer(2)
                .with_n_head(2)
                .with_n_embd(72)
                .with_bias(false)
                .with_tie_embeddings(false),
        ])
        .collect()
}

/// A small model: 13 tokens, a 16-token window (so generations slide past it), 2 layers of 2
/// heads, `n_embd` 32.
#[allow(dead_code)] // Not every test file builds it.
pub fn sliding() -> GptConfig {
    GptConfig::new(13)
        .with_block_size(16)
        .with_n_layer(2)
        .with_n_head(2)
        .with_n_embd(32)
}
