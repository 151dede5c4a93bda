//! `tinygpt attention`: a trained model's attention weights for a prompt, printed and drawn.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use tinygpt::attention_maps::AttentionMaps;
use tinygpt::backend::Backend;
use tinygpt::run::checkpoint::Which;

/// Print and draw a trained model's attention weights for a prompt.
///
/// Each selected head's matrix is printed (rows = query tokens, columns = key tokens; the
/// causal mask makes everything above the diagonal 0) and drawn as an SVG heatmap, with one
/// overview image of all layers and heads.
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  tinygpt attention --checkpoint runs/default --prompt \"Of Man's first\" --layer 0 --head 1"
)]
pub struct Args {
    #[arg(long, value_name = "DIR")]
    checkpoint: PathBuf,
    /// Text whose attention to show (at most block_size tokens).
    #[arg(long)]
    prompt: String,
    /// Only this layer (default: all).
    #[arg(long)]
    layer: Option<usize>,
    /// Only this head (default: all).
    #[arg(long)]
    head: Option<usize>,
    /// Decimal places in the printed matrices.
    #[arg(long, default_value_t = 2)]
    decimals: usize,
    /// Where to write the SVG heatmaps (default: CHECKPOINT/attention).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Which::Best)]
    which: Which,
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let (run, placement, model, _) = super::load::load(&args.checkpoint, args.which, args.backend)?;
    let maps = AttentionMaps::compute(&model, &run.tokenizer, &args.prompt, &placement.device)?;
    let (layers, heads) = (run.config.model.n_layer, run.config.model.n_head);
    for (what, value, count) in [
        ("--layer", args.layer, layers),
        ("--head", args.head, heads),
    ] {
        if let Some(v) = value
            && v >= count
        {
            bail!(
                "{what} {v} does not exist: the model has {count} (0..{})",
                count - 1
            );
        }
    }
    let selected: Vec<(usize, usize)> = (0..layers)
        .filter(|l| args.layer.is_none_or(|x| x == *l))
        .flat_map(|l| {
            (0..heads)
                .filter(|h| args.head.is_none_or(|x| x == *h))
                .map(move |h| (l, h))
        })
        .collect();
    for &(l, h) in &selected {
        println!("{}", maps.format(l, h, args.decimals));
    }
    let dir = args.out.unwrap_or_else(|| run.dir.join("attention"));
    for path in maps.write(&dir, &selected)? {
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
