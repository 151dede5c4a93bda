//! A sample from the weights the fused engine holds, without Burn's model: what a LoRA run's
//! snapshots decode. Lending the weights to Burn's model and making a decoder of it would hold
//! a base kept quantised three times over in f32 (the model's, the merged copy's, the
//! decoder's: 4.3 GiB at SmolLM2-360M's shape); here the decoder is made of the engine's own
//! buffers, moved in and back out, the base's matrices from their own blocks.

use super::fused::FusedCpu;
use crate::arch::{BlockType, GptConfig, LoraConfig, LoraTarget};
use crate::cpu::decode::{FusedDecoder, RowWeights};
use crate::cpu::dims::Dims;

impl FusedCpu {
    /// Runs `sample` on a decoder of the weights held here (the same forward as
    /// [`FusedDecoder::new`] of the model, the LoRA adapters beside their matrices rather than
    /// merged into them), its products split over `threads` threads, and gives back what it
    /// returns.
    ///
    /// A base held quantised (`[lora] base = "q8_0"` or `"q4_k"`) is multiplied from its own
    /// blocks, as `generate` multiplies a file's (its activations quantised per block as
    /// ggml's are), not in f32 as a step multiplies it; the decoder's copy of a type of blocks
    /// of 32 in its own layout is the one thing held twice while it runs. The steps'
    /// activations are released first (the next step makes them again), so the decoder takes
    /// their room. The weights come back as they went: a step after gives the same loss as
    /// one without the sample.
    pub fn sample_with<R>(
        &mut self,
        threads: usize,
        sample: impl FnOnce(&mut FusedDecoder) -> R,
    ) -> R {
        self.release_buffers();
        let mut weights = std::mem::take(&mut self.weights);
        let matrices = RowWeights::of_base(&mut weights, &self.dims);
        let mut decoder = FusedDecoder::holding(self.dims, weights, matrices).with_threads(threads);
        let out = sample(&mut decoder);
        let (mut weights, matrices) = decoder.into_weights();
        matrices.give_back(&mut weights);
        self.weights = weights;
        out
    }
}

impl FusedCpu {
    /// What [`sample_with`](Self::sample_with)'s decoder holds beside the engine's weights for
    /// a model of `config` with `lora`'s adapters, from the sizes alone (the trainer's memory
    /// estimate): its copy of the base's matrices held in blocks of 32 (`Q8_0`, `Q5_0`; a
    /// k-quant's blocks are shared, not copied) and its keys and values of a whole block.
    pub fn sample_bytes_for(config: &GptConfig, lora: Option<&LoraConfig>) -> u64 {
        let copied = lora.map_or(0, |lora| {
            let matrices = LoraTarget::all().filter_map(|t| t.shape(config));
            let copies = matrices.filter_map(|(n_in, n_out)| match lora.base.held_as(n_in)? {
                kind @ (BlockType::Q8_0 | BlockType::Q5_0 | BlockType::Q4_0) => {
                    Some(n_in * n_out / kind.values() * kind.block_bytes())
                }
                BlockType::Q4_1
                | BlockType::Q5_1
                | BlockType::Q4_K
                | BlockType::Q5_K
                | BlockType::Q6_K => None,
            });
            copies.sum::<usize>() * config.n_layer
        });
        let d = Dims::from_config(config);
        let cache = 2 * config.n_layer * d.block_size * d.kv_width();
        (copied + 4 * cache) as u64
    }
}
