//! Sampling from a trained model, for `generate`, `serve` and `bench`: the decoder a
//! placement's engine calls for (the fused CPU decoder, or Burn's on the model's device), and
//! the guard that keeps a padded vocabulary's extra rows from ever being sampled.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Result, bail};
use burn::tensor::FloatDType;
use tinygpt_model::{
    BatchDecoder, BlockType, Decoder, FusedBatch, FusedDecoder, Gpt, GptBatch, Matrices,
    ModelError, WeightFormat, decoding::Pick, decoding::Picked, decoding::Replay,
};

use crate::backend::{EngineKind, Placement};
use crate::config::{OptimizerKind, TrainDType};
use crate::interop::gguf::kept::FileTypes;

/// `--weights`: how sampling keeps the model's matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Weights {
    /// As trained: 4 bytes a weight.
    #[default]
    F32,
    /// bfloat16 on a GPU (Burn's decoder: cuda, or flex): half the bytes a token reads. The
    /// products sum in f32; embeddings, the residual stream, norms, the softmax and the logits
    /// stay f32 (a mixed-precision step's split).
    Bf16,
    /// float16, as `bf16` (cuda, flex, and wgpu where the GPU has f16).
    F16,
    /// int8 in blocks of 32 with a scale each (GGUF's Q8_0): about a quarter of the bytes a
    /// token reads, for a little accuracy (see `eval --weights q8_0`); CPU only (the fused
    /// decoder).
    #[value(name = "q8_0")]
    Q8_0,
    /// four bits in blocks of 32 with a scale each (GGUF's Q4_0): about an eighth of the bytes
    /// a token reads, for more accuracy lost than q8_0; CPU only (the fused decoder).
    #[value(name = "q4_0")]
    Q4_0,
    /// five bits in blocks of 32 with a scale each (GGUF's Q5_0, what llama.cpp's Q4_K_M files
    /// hold at widths that are not a multiple of 256): between q4_0 and q8_0 in bytes and in
    /// accuracy; CPU only (the fused decoder).
    #[value(name = "q5_0")]
    Q5_0,
    /// four bits in super-blocks of 256 with a scale and a minimum per 32 (GGUF's Q4_K, by
    /// ggml's own quantiser: the blocks `export --dtype q4_k` writes; a matrix whose rows are
    /// not a multiple of 256 long in Q5_0, as llama.cpp falls back); quantised as the model
    /// loads (seconds); CPU only (the fused decoder).
    #[value(name = "q4_k")]
    Q4K,
    /// each matrix in the type the GGUF file the run was imported from stores it, from the
    /// file's own blocks (Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, Q4_K, Q5_K, Q6_K; f32 for the float
    /// types); CPU only (the fused decoder).
    File,
}

impl Weights {
    /// The name `--weights` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::Q5_0 => "q5_0",
            Self::Q4K => "q4_k",
            Self::File => "file",
        }
    }

    /// The dtype Burn's decoder computes its products in (q8_0 is the fused decoder's own).
    fn dtype(self) -> FloatDType {
        match self {
            Self::F32 | Self::Q8_0 | Self::Q4_0 | Self::Q5_0 | Self::Q4K | Self::File => {
                FloatDType::F32
            }
            Self::Bf16 => FloatDType::BF16,
            Self::F16 => FloatDType::F16,
        }
    }

    /// The fused decoder's format, on the engine `kind` (only the fused decoder quantises, only
    /// Burn's keeps half-precision matrices: asked of the other, either is an error, never a
    /// silent f32).
    pub fn format(self, kind: EngineKind) -> Result<WeightFormat> {
        Ok(match (self, kind) {
            (Self::F32, _) => WeightFormat::F32,
            (Self::Q8_0, EngineKind::Fused) => WeightFormat::Q8_0,
            (Self::Q4_0, EngineKind::Fused) => WeightFormat::Q4_0,
            (Self::Q5_0, EngineKind::Fused) => WeightFormat::Q5_0,
            (Self::File, EngineKind::Fused) => bail!(
                "--weights file decodes a run imported from a GGUF file, each matrix in the \
                 file's type: it needs that run (generate, eval, serve)"
            ),
            (Self::Q4K, EngineKind::Fused) => bail!(
                "--weights q4_k stores matrices of several types (Q4_K, and Q5_0 where rows are \
                 not whole super-blocks): generate, eval, serve and logits take it; this \
                 takes f32, q8_0, q5_0 or q4_0"
            ),
            (
                Self::Q8_0 | Self::Q4_0 | Self::Q5_0 | Self::Q4K | Self::File,
                EngineKind::Autodiff | EngineKind::Device,
            ) => {
                bail!(
                    "--weights {} runs on the fused CPU decoder only (--backend fused, or auto on a \
                 machine without a GPU); this backend samples with f32, bf16 or f16 weights",
                    self.name()
                )
            }
            (Self::Bf16 | Self::F16, EngineKind::Autodiff | EngineKind::Device) => {
                WeightFormat::F32
            }
            (Self::Bf16 | Self::F16, EngineKind::Fused) => bail!(
                "--weights {} samples on a GPU (--backend cuda; f16 also on wgpu where the GPU \
                 has it) or on flex; the fused CPU decoder keeps f32, q8_0, q5_0, q4_0 or q4_k weights",
                self.name()
            ),
        })
    }

    /// `gpt` with its matrices as these weights keep them on Burn's decoder: cast to bf16 or
    /// f16 ([`Gpt::autocast`]; the f32 matrices are freed with `gpt`), as it is otherwise.
    /// A device without the dtype's arithmetic is an error that names what has it.
    pub fn cast(self, gpt: Gpt) -> Result<Gpt> {
        let dtype = self.dtype();
        if dtype == FloatDType::F32 {
            return Ok(gpt);
        }
        let device = gpt.wte.weight.device();
        if !device.supports_dtype(dtype) {
            bail!(
                "--weights {} is not supported on {device:?}: bf16 on cuda and flex, f16 on \
                 cuda, flex and wgpu where the GPU has it",
                self.name()
            );
        }
        Ok(gpt.autocast(dtype))
    }

    /// Whether `gpt`'s matrices are what these weights say (Burn's decoders), so that a
    /// forgotten [`cast`](Self::cast) fails loudly instead of sampling in f32.
    fn check(self, gpt: &Gpt) -> Result<()> {
        let want: burn::tensor::DType = self.dtype().into();
        if gpt.dtype() != want {
            bail!(
                "internal error: --weights {} asked of a model in {:?}",
                self.name(),
                gpt.dtype()
            );
        }
        Ok(())
    }
}

/// `--weights` for one run: `file` read as the run's imported types ([`FileTypes`]) in its
/// directory. Their plan (and the kept blocks it reads) is made for each decoder, so that a
/// block the decoder rearranges into its own layout is not held twice.
#[derive(Debug, Clone)]
pub struct DecodeWeights {
    pub weights: Weights,
    file: Option<Arc<(FileTypes, PathBuf)>>,
}

impl From<Weights> for DecodeWeights {
    fn from(weights: Weights) -> Self {
        Self {
            weights,
            file: None,
        }
    }
}

impl DecodeWeights {
    /// `weights` for the run in `dir`, and a line for the user where `file` decodes a type in
    /// Q8_0 (a run imported before its blocks were kept). `file` on a run that was not imported
    /// from a GGUF file is an error.
    pub fn for_run(weights: Weights, dir: &Path) -> Result<(Self, Option<String>)> {
        if weights != Weights::File {
            return Ok((weights.into(), None));
        }
        let Some(types) = FileTypes::read(dir)? else {
            bail!(
                "--weights file decodes each matrix in the type of the GGUF file a run was \
                 imported from; {} was not imported from one (q8_0, q5_0, q4_0 or q4_k quantise it)",
                dir.display()
            );
        };
        let note = types.note();
        let weights = Self {
            weights,
            file: Some(Arc::new((types, dir.to_path_buf()))),
        };
        Ok((weights, note))
    }

    /// The fused decoder's matrices on the engine `kind` ([`Weights::format`], or the run's
    /// file types, their kept blocks read and checked now).
    pub fn matrices(&self, kind: EngineKind) -> Result<Matrices> {
        match (&self.file, self.weights, kind) {
            (Some(file), _, EngineKind::Fused) => Ok(Matrices::Planned(file.0.plan(&file.1)?)),
            (_, Weights::Q4K, EngineKind::Fused) => Ok(Matrices::Encoded(BlockType::Q4_K)),
            _ => Ok(self.weights.format(kind)?.into()),
        }
    }
}

/// The decoder that samples from `model` where `placement` runs it: the fused CPU decoder when
/// [`Placement::engine_for`] picks the fused engine, Burn on the model's device otherwise. A model whose vocabulary is
/// padded past the tokenizer's `tokens` ids only ever gives logits (and so samples) of real
/// tokens.
pub fn decoder<'a>(
    placement: &Placement,
    model: &'a Gpt,
    tokens: usize,
    weights: &DecodeWeights,
) -> Result<Box<dyn Decoder + 'a>> {
    decoder_for(sampling_engine(placement)?, model, tokens, weights)
}

/// The fused decoder's matrices for `weights` (a quantised format, or `file`) of the run in
/// `dir` where `placement` runs, the line [`DecodeWeights::for_run`] has for the user printed
/// to standard error.
pub fn fused_matrices(weights: Weights, dir: &Path, placement: &Placement) -> Result<Matrices> {
    let (weights, note) = DecodeWeights::for_run(weights, dir)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    weights.matrices(sampling_engine(placement)?)
}

/// The engine [`decoder`] samples on where `placement` runs.
pub fn sampling_engine(placement: &Placement) -> Result<EngineKind> {
    Ok(placement
        .engine_for(TrainDType::F32, OptimizerKind::AdamW)?
        .0)
}

/// Hands the memory freed so far back to the system. Loading a model reads its file, builds
/// Burn's tensors and then the decoder's own layout, freeing buffers of hundreds of megabytes on
/// the way, which the C allocator otherwise keeps for later allocations of its heap: a sampler
/// of SmolLM2-135M in int8 stayed at ~1 GB resident where it needs ~0.33 GB (docs/perf.md).
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free pages of the allocator's heap.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The fused CPU decoder of `model` with `matrices` ([`DecodeWeights::matrices`]), as
/// [`decoder_for`] makes it on the fused engine. It keeps the weights it needs in its own
/// layout (rows of f32 or int8), so the caller can free `model`'s tensors once it is made and
/// sample holding one copy of the weights, not two.
pub fn fused_decoder(model: &Gpt, tokens: usize, matrices: Matrices) -> Result<Box<dyn Decoder>> {
    // One sequence's products split over every core (the same logits on any count).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let fused = FusedDecoder::with_weights(model, matrices)?.with_threads(threads);
    Ok(unpadded(Box::new(fused), tokens))
}

/// [`decoder`], for the engine `kind` already decided.
pub fn decoder_for<'a>(
    kind: EngineKind,
    model: &'a Gpt,
    tokens: usize,
    weights: &DecodeWeights,
) -> Result<Box<dyn Decoder + 'a>> {
    match kind {
        EngineKind::Fused => fused_decoder(model, tokens, weights.matrices(kind)?),
        EngineKind::Autodiff | EngineKind::Device => {
            // Int8 asked of this engine is an error here, never a silent f32.
            weights.weights.format(kind)?;
            weights.weights.check(model)?;
            Ok(unpadded(Box::new(model.decoder()), tokens))
        }
    }
}

/// A decoder of `streams` sequences at once (a server's requests) for `model` on the engine
/// `kind`: the fused CPU decoder's batch, or Burn's on the model's device.
pub(crate) fn batch_decoder<'a>(
    kind: EngineKind,
    model: &'a Gpt,
    streams: usize,
    weights: &DecodeWeights,
) -> Result<Box<dyn BatchDecoder + 'a>> {
    let matrices = weights.matrices(kind)?;
    Ok(match kind {
        EngineKind::Fused => Box::new(FusedBatch::with_weights(model, streams, matrices)?),
        EngineKind::Autodiff | EngineKind::Device => {
            weights.weights.check(model)?;
            Box::new(GptBatch::new(model, streams))
        }
    })
}

/// `inner`, giving logits of the tokenizer's `tokens` ids only (a padded vocabulary's extra
/// rows are no tokens).
pub(crate) fn unpadded<'a>(inner: Box<dyn Decoder + 'a>, tokens: usize) -> Box<dyn Decoder + 'a> {
    match tokens < inner.vocab_size() {
        true => Box::new(Unpadded { inner, tokens }),
        false => inner,
    }
}

/// A decoder whose logits stop at the tokenizer's last id: a padded vocabulary's extra rows
/// are no tokens.
struct Unpadded<'a> {
    inner: Box<dyn Decoder + 'a>,
    tokens: usize,
}

impl Decoder for Unpadded<'_> {
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn vocab_size(&self) -> usize {
        self.tokens
    }
    fn cached(&self) -> usize {
        self.inner.cached()
    }
    fn clear(&mut self) {
        self.inner.clear()
    }
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut logits = self.inner.feed(tokens)?;
        logits.truncate(self.tokens);
        Ok(logits)
    }
    fn picks_on_device(&self) -> bool {
        self.inner.picks_on_device()
    }
    /// `pick.vocab` is this decoder's `vocab_size`: the padding rows are never candidates.
    fn feed_and_pick(&mut self, tokens: &[u32], pick: &Pick) -> Result<Picked, ModelError> {
        self.inner.feed_and_pick(tokens, pick)
    }
    fn replays(&self) -> Option<Replay> {
        self.inner.replays()
    }
}
