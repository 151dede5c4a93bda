//! `tinygpt logits`: the logits of given tokens as JSON, to compare with another implementation.

use std::path::PathBuf;
use std::process::ExitCode;
use tinygpt_model::Pass;

use anyhow::Result;
use burn::tensor::{Int, Tensor, TensorData};
use tinygpt::backend::Backend;
use tinygpt::run::checkpoint::Which;

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
}

pub fn run(args: Args) -> Result<ExitCode> {
    let (_, placement, model, _) = super::load::load(&args.checkpoint, args.which, args.backend)?;
    let device = placement.device;
    let ids: Vec<i64> = args.tokens.iter().map(|&t| t.into()).collect();
    model.check_tokens(&ids)?;
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
