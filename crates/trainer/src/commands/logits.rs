//! `tinygpt logits`: the logits of given tokens as JSON, to compare with another implementation.

use std::path::PathBuf;
use std::process::ExitCode;
use tinygpt_model::Pass;

use anyhow::Result;
use burn::tensor::{Int, Tensor, TensorData};
use tinygpt::backend::Backend;
use tinygpt::decoder::{Weights, fused_matrices};
use tinygpt::run::checkpoint::Which;
use tinygpt_model::FusedDecoder;

/// Print the logits for given tokens as JSON: {"phase": "logits", "shape", "logits", "loss"}.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  tinygpt logits --checkpoint runs/baby --tokens 14,53,1        # to compare with another implementation"
)]
pub struct Args {
    #[arg(long, value_name = "DIR")]
    checkpoint: PathBuf,
    /// Comma-separated token ids, e.g. 14,53,1.
    #[arg(long, value_delimiter = ',', required = true)]
    tokens: Vec<u32>,
    #[arg(long, value_enum, default_value_t = Which::Best)]
    which: Which,
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// The matrices as sampling keeps them (q8_0, q5_0, q4_0, q4_k: the fused CPU decoder's blocks;
    /// file: each in the type of the GGUF file the run was imported from; bf16, f16: half
    /// precision), every row computed as a sampled token's is; f32: the model as trained.
    /// [default: file for a run imported from a quantised GGUF file, where the fused CPU
    /// decoder runs; f32 otherwise]
    #[arg(long, value_enum)]
    weights: Option<Weights>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let load = super::load::for_scoring(&args.checkpoint, args.which, args.backend, args.weights)?;
    let weights = load.weights.weights;
    let (run, placement, model, file) = (load.run, load.placement, load.model, load.matrices);
    let ids: Vec<i64> = args.tokens.iter().map(|&t| t.into()).collect();
    model.check_tokens(&ids)?;
    let model = match weights {
        Weights::F32 => model,
        Weights::Bf16 | Weights::F16 => weights.cast(model)?,
        Weights::Q8_0 | Weights::Q4_0 | Weights::Q5_0 | Weights::Q4K | Weights::File => {
            let matrices = match file {
                Some(matrices) => matrices,
                None => fused_matrices(weights, &run.dir, &placement)?,
            };
            let mut decoder = FusedDecoder::with_weights(&model, matrices)?;
            let mut values = Vec::new();
            decoder.window_logits(&args.tokens, |_, row| values.extend_from_slice(row))?;
            let loss = next_token_loss(&values, model.vocab_size(), &args.tokens);
            return print(values, model.vocab_size(), ids.len(), loss);
        }
    };
    let device = placement.device;
    let seq = ids.len();
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [1, seq]), &device);
    let logits = model.forward(input, Pass::Infer)?;
    let vocab = model.vocab_size();
    let loss = (seq > 1)
        .then(|| {
            let targets =
                Tensor::<1, Int>::from_data(TensorData::new(ids[1..].to_vec(), [seq - 1]), &device);
            let head = logits
                .clone()
                .slice([0..1, 0..seq - 1])
                .reshape([seq - 1, vocab]);
            // Every target is a token (none ignored): `seq - 1` of them.
            tinygpt_model::step::cross_entropy_counted(head, targets, seq - 1, model.kernels())
                .map(|l| l.into_scalar::<f32>())
        })
        .transpose()?;
    let values = logits
        .into_data()
        .try_to_vec_as::<f32>()
        .map_err(|e| anyhow::anyhow!("logits: {e:?}"))?;
    print(values, vocab, seq, loss)
}

/// The mean next-token cross-entropy of `logits [seq, vocab]` for `tokens` (`None`: one token).
fn next_token_loss(logits: &[f32], vocab: usize, tokens: &[u32]) -> Option<f32> {
    let rows = logits.chunks_exact(vocab).zip(&tokens[1..]);
    let nats = rows.map(|(row, &target)| {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let total: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
        max + total.ln() - row[target as usize] as f64
    });
    (tokens.len() > 1).then(|| (nats.sum::<f64>() / (tokens.len() - 1) as f64) as f32)
}

/// The logits `values [seq, vocab]` and `loss` as one line of JSON; logits that are not finite
/// are an error.
fn print(values: Vec<f32>, vocab: usize, seq: usize, loss: Option<f32>) -> Result<ExitCode> {
    if let Some(at) = values.iter().position(|v| !v.is_finite()) {
        anyhow::bail!(
            "the logits are not finite at position {} (its weights are damaged or training \
             diverged)",
            at / vocab
        );
    }
    let rows: Vec<&[f32]> = values.chunks(vocab).collect();
    println!(
        "{}",
        serde_json::json!({"phase": "logits", "shape": [1, seq, vocab], "logits": rows, "loss": loss})
    );
    Ok(ExitCode::SUCCESS)
}
