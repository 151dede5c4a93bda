//! What a GGUF file changes in what a model computes, measured: a part llama.cpp approximates
//! ([`Approximation`]) and matrices stored in f16 or a quantised type each move the logits. The
//! export scores the model as trained and the model as the file holds it (its quantised
//! matrices the file's own blocks, on the fused CPU decoder) on the same windows of the run's
//! validation text, by the code `eval` scores with (`--weights f16|q8_0|q5_0|q4_0|q4_k`: the
//! same figures where they quantise the same way; the embedding's rows looked up in f32, where
//! llama.cpp reads them from the file's blocks), and says how far apart they are.

use std::borrow::Cow;
use std::path::Path;

use anyhow::Result;
use burn::tensor::Device;
use tinygpt_model::parts::Mlp;
use tinygpt_model::{FusedDecoder, Gpt, GptConfig, Matrices};

use super::file::Gguf;
use super::kept::{FileTypes, rotary_heads};
use super::store::Dtype;
use crate::data::Split;
use crate::data::corpus;
use crate::data::tokens::Tokens;
use crate::decoder::Weights;
use crate::eval::{Comparison, Scorer, compare};
use crate::run::checkpoint::Run;
use crate::run::weights::copy_weights;

/// A part of a model that llama.cpp computes only approximately: the export writes it, and
/// says what the file changes, measured (below).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approximation {
    /// An exact GELU (erf) computed with tanh's approximation (`|erf − tanh|` GELU ≤ ~5e-4
    /// per activation).
    TanhGelu,
}

impl Approximation {
    /// What the file computes instead, for the export's report.
    pub fn describe(self) -> &'static str {
        match self {
            Approximation::TanhGelu => {
                "GELU with tanh's approximation (llama.cpp's gpt2 has no exact one)"
            }
        }
    }
}

/// Targets scored at most: enough for a loss to four decimals, quick for a small model.
const SAMPLE_TOKENS: usize = 8192;

/// Targets times parameters scored at most (8,192 targets up to 160M parameters), so that a
/// large model's export measures in about the time a small one's does: 766 targets at 1.7B.
const SAMPLE_WORK: usize = SAMPLE_TOKENS * 160_000_000;

/// Targets scored for a model of `params` parameters: [`SAMPLE_WORK`]'s share, 256 at least.
fn sample_tokens(params: usize) -> usize {
    (SAMPLE_WORK / params.max(1)).clamp(256, SAMPLE_TOKENS)
}

/// What the export reports.
pub enum Report {
    /// The file computes what the model computes (f32, no approximation).
    Exact,
    /// What changes, and by how much on the run's validation text.
    Measured {
        changes: Vec<String>,
        comparison: Comparison,
    },
    /// What changes; the run has no validation text to measure it on (an imported run).
    Unmeasured { changes: Vec<String>, why: String },
}

impl Report {
    /// One line for the user.
    pub fn line(&self) -> String {
        match self {
            Report::Exact => "the file computes what the model computes (f32)".into(),
            Report::Measured {
                changes,
                comparison: c,
            } => format!(
                "the file computes {}: on {} tokens of the run's validation text its logits \
                 differ by at most {:.1e} (largest {:.2}); loss {:.4} here, {:.4} in the file \
                 ({:+.1e})",
                changes.join(" and "),
                c.reference.tokens,
                c.max_logit_difference,
                c.max_logit,
                c.reference.loss,
                c.other.loss,
                c.other.loss - c.reference.loss
            ),
            Report::Unmeasured { changes, why } => {
                format!(
                    "the file computes {} (not measured: {why})",
                    changes.join(" and ")
                )
            }
        }
    }
}

/// What the file `file` of `model` (of `config`, the run's) changes when written with
/// `approximations`, measured on the run's validation text. A measurement that fails is
/// reported as not measured, saying why: the file is written either way.
pub fn measure(
    run: &Run,
    model: &Gpt,
    config: &GptConfig,
    approximations: &[Approximation],
    file: FileAs<'_>,
) -> Report {
    let dtype = file.dtype;
    let mut changes: Vec<String> = approximations.iter().map(|a| a.describe().into()).collect();
    if dtype != Dtype::F32 {
        changes.push(format!("with {} matrices", dtype.name()));
    }
    if changes.is_empty() {
        return Report::Exact;
    }
    let dataset = match validation(run) {
        Ok(dataset) => dataset,
        Err(why) => return Report::Unmeasured { changes, why },
    };
    let tokens = sample_tokens(model.num_params());
    let split = sample(dataset.val, tokens);
    match compare_file(run, model, config, approximations, file, (&split, tokens)) {
        Ok(comparison) => Report::Measured {
            changes,
            comparison,
        },
        Err(e) => Report::Unmeasured {
            changes,
            why: format!("{e:#}"),
        },
    }
}

/// The run's own prepared splits, else its corpus read again; or why there is none.
fn validation(run: &Run) -> Result<crate::data::Dataset, String> {
    let (dir, config, tokenizer) = (&run.dir, &run.config, &run.tokenizer);
    match corpus::prepared_in_run(dir, config, tokenizer) {
        Ok(Some(dataset)) => return Ok(dataset),
        Ok(None) => {}
        Err(e) => return Err(format!("the run's prepared data cannot be read: {e:#}")),
    }
    corpus::for_run(dir, config, tokenizer, false).map_err(|e| {
        format!(
            "the run has no validation text here ({e:#}); `tinygpt eval --data FILE` on the \
             file imported back measures it"
        )
    })
}

/// The file written: its tensors, in `dtype`; `fused_qkv` where it stores the queries, keys
/// and values as one matrix (llama.cpp's `gpt2`), `interleaved` where it stores their rows in
/// llama.cpp's rotary layout (its `llama`).
pub struct FileAs<'a> {
    pub gguf: &'a Gguf,
    pub dtype: Dtype,
    pub fused_qkv: bool,
    pub interleaved: bool,
}

/// `model` against the model the file holds, on `split`.
fn compare_file(
    run: &Run,
    model: &Gpt,
    config: &GptConfig,
    approximations: &[Approximation],
    file: FileAs<'_>,
    (split, tokens): (&Split, usize),
) -> Result<Comparison> {
    let file_model = as_file_computes(model, config, approximations, &Device::flex())?;
    let file_model = file_model.as_ref();
    let cast;
    let other = match file.dtype {
        Dtype::F32 => Scorer::Forward(file_model),
        Dtype::F16 => {
            cast = Weights::F16.cast(file_model.clone())?;
            Scorer::Forward(&cast)
        }
        Dtype::Q8_0
        | Dtype::Q5_0
        | Dtype::Q4_0
        | Dtype::Q4_K
        | Dtype::Q4_K_M
        | Dtype::Q5_K_M
        | Dtype::Q6_K => {
            // The file's own blocks, each matrix in the type it stores it in.
            let heads = rotary_heads(file.interleaved, config);
            let types = FileTypes::of(file.gguf, config, file.fused_qkv, Path::new(""), heads)?;
            let matrices = Matrices::Planned(types.plan_held(file.gguf)?);
            Scorer::Decoded(Box::new(FusedDecoder::with_weights(file_model, matrices)?))
        }
    };
    let block_size = run.config.model.block_size;
    compare(
        Scorer::Forward(model),
        other,
        &run.tokenizer,
        split,
        block_size,
        tokens,
    )
}

/// The first `n` tokens or so of a packed split (others whole).
fn sample(split: Split, n: usize) -> Split {
    match split {
        Split::Packed(tokens) if tokens.len() > n + 1 => {
            Split::Packed(Tokens::from_vec(tokens.slice(0, n + 1)))
        }
        other => other,
    }
}

/// `model` computing as the file has it computed: the same weights, each approximated part
/// replaced by what llama.cpp computes (`model` itself, not a copy, where nothing is
/// approximated). An exhaustive match: a new approximation does not compile until it says
/// what it computes.
fn as_file_computes<'a>(
    model: &'a Gpt,
    config: &GptConfig,
    approximations: &[Approximation],
    device: &Device,
) -> Result<Cow<'a, Gpt>> {
    if approximations.is_empty() {
        return Ok(Cow::Borrowed(model));
    }
    let mut config = config.clone();
    for approximation in approximations {
        match approximation {
            Approximation::TanhGelu => config.mlp = Mlp::GeluTanh,
        }
    }
    let mut file_model = config.init(device)?;
    copy_weights(model, &mut file_model)?;
    Ok(Cow::Owned(file_model))
}
