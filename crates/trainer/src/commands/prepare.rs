//! `tinygpt prepare`: a corpus tokenized once into token files that `train --data DIR` maps.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Result, bail};
use tinygpt::chat::jsonl;
use tinygpt::config::TokenizerKind;
use tinygpt::data::corpus::BPE_SAMPLE_BYTES;
use tinygpt::data::prepare::{
    self, DEFAULT_INCLUDE, Phases, PrepareOptions, Prepared, TokenizerSource, ValSplit,
};
use tinygpt::data::tokenizer::Tokenizer;
use tinygpt::data::tokens::Width;

/// Tokenize a corpus once into train.bin / val.bin (nanoGPT's layout), for corpora of any size.
///
/// Inputs are files, folders (recursive; files matching --include) or - for standard input. The
/// text is streamed: memory stays flat whatever the corpus size. `tinygpt train --data DIR`
/// then maps the token files instead of reading the text.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  tinygpt prepare --data input.txt --out data/shakespeare\n  \
    tinygpt prepare --data books/ --tokenizer bpe --bpe-vocab-size 8192 --out data/books\n  \
    tinygpt train --config baby --data data/shakespeare\n  \
    tinygpt prepare --verify data/shakespeare"
)]
pub struct Args {
    /// Text files, folders, or - (standard input).
    #[arg(long, value_name = "PATH", required_unless_present = "verify", num_args = 1..)]
    data: Vec<PathBuf>,
    /// The directory to write (must not exist, or be empty).
    #[arg(long, value_name = "DIR", required_unless_present = "verify")]
    out: Option<PathBuf>,
    /// Check a prepared directory instead: its token files against the SHA-256 and counts in
    /// its meta.json, every token id inside the vocabulary, document offsets in order.
    /// (`train` checks a prepared directory it is given the same way, while it starts.)
    #[arg(long, value_name = "DIR", conflicts_with_all = ["data", "out"])]
    verify: Option<PathBuf>,
    /// char: one token per distinct character; bpe: byte-level BPE learned from the corpus.
    #[arg(long, value_enum, default_value_t = Kind::Char)]
    tokenizer: Kind,
    /// Vocabulary size for --tokenizer bpe.
    #[arg(long, default_value_t = 512, value_name = "N")]
    bpe_vocab_size: usize,
    /// BPE learns from evenly spaced chunks of the corpus adding up to this many megabytes.
    #[arg(long, default_value_t = BPE_SAMPLE_BYTES >> 20, value_name = "MB")]
    bpe_sample_mb: u64,
    /// Use the tokenizer of a run (or a prepared directory) instead of learning one, e.g. to
    /// fine-tune that run on this corpus.
    #[arg(long, value_name = "DIR", conflicts_with = "tokenizer")]
    tokenizer_from: Option<PathBuf>,
    /// The last fraction of the token stream held out for validation.
    #[arg(long, default_value_t = 0.1, value_name = "F")]
    val_fraction: f64,
    /// Files or folders held out whole for validation (instead of --val-fraction).
    #[arg(long, value_name = "PATH", num_args = 1.., conflicts_with = "val_fraction")]
    val_files: Vec<PathBuf>,
    /// File name patterns taken from folders, comma-separated (`*` = anything).
    #[arg(long, default_value = DEFAULT_INCLUDE, value_name = "PATTERNS")]
    include: String,
    /// Leave out (and list) files that are not UTF-8 text (or hold NUL bytes) instead of
    /// stopping at the first.
    #[arg(long)]
    skip_invalid: bool,
    /// Documents are separated by SEP (`\n` and `\t` stand for a newline and a tab, so
    /// '\n\n' is a blank line). Each document is encoded on its own, without the separator,
    /// and where each starts is written, for `data.batching = "documents"` (the same setting
    /// as `data.separator`). With --val-fraction, validation starts at a document.
    #[arg(long, value_name = "SEP", value_parser = unescape)]
    separator: Option<String>,
}

/// `\n`, `\t`, `\r` and `\\` as the characters they stand for; a separator cannot be empty.
fn unescape(text: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        out.push(match (c, c == '\\') {
            (_, false) => c,
            (_, true) => match chars.next() {
                Some('n') => '\n',
                Some('t') => '\t',
                Some('r') => '\r',
                Some('\\') => '\\',
                other => return Err(format!("unknown escape \\{}", other.unwrap_or(' '))),
            },
        });
    }
    if out.is_empty() {
        return Err("the separator must not be empty".into());
    }
    Ok(out)
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Kind {
    Char,
    Bpe,
}

pub fn run(args: Args) -> Result<ExitCode> {
    if let Some(dir) = &args.verify {
        return verify(dir);
    }
    if !(args.val_fraction > 0.0 && args.val_fraction < 1.0) {
        bail!(
            "--val-fraction must be in (0, 1), got {}",
            args.val_fraction
        );
    }
    if let Some(jsonl) = args.data.iter().find(|p| jsonl::is_jsonl(p)) {
        bail!(
            "{} holds conversations: `tinygpt train --data {0}` reads them as they are (prepare \
             writes text into token files)",
            jsonl.display()
        );
    }
    if !(262..=65536).contains(&args.bpe_vocab_size) {
        bail!(
            "--bpe-vocab-size must be in 262..=65536 (256 byte tokens, 5 special tokens, merges), got {}",
            args.bpe_vocab_size
        );
    }
    let tokenizer = match &args.tokenizer_from {
        Some(dir) => TokenizerSource::Given(tokenizer_of(dir)?),
        None => TokenizerSource::Learn {
            kind: match args.tokenizer {
                Kind::Char => TokenizerKind::Char,
                Kind::Bpe => TokenizerKind::Bpe,
            },
            bpe_vocab_size: args.bpe_vocab_size,
            bpe_sample_bytes: args.bpe_sample_mb.max(1) << 20,
        },
    };
    let options = PrepareOptions {
        inputs: args.data,
        include: args
            .include
            .split(',')
            .map(|p| p.trim().to_string())
            .collect(),
        tokenizer,
        val: match args.val_files.is_empty() {
            true => ValSplit::Fraction(args.val_fraction),
            false => ValSplit::Files(args.val_files),
        },
        skip_invalid: args.skip_invalid,
        separator: args.separator,
        progress: std::io::stderr().is_terminal(),
        exit_on_signal: true,
    };
    let start = Instant::now();
    let out = args.out.expect("clap requires --out without --verify");
    let (prepared, phases) = prepare::prepare(options, &out)?;
    report(&prepared, start.elapsed().as_secs_f64(), &phases);
    Ok(ExitCode::SUCCESS)
}

/// `--verify DIR`: every file of a prepared directory read and checked.
fn verify(dir: &std::path::Path) -> Result<ExitCode> {
    if !Prepared::is_prepared(dir) {
        bail!(
            "{} is not a prepared directory (it has no meta.json)",
            dir.display()
        );
    }
    let prepared = Prepared::open(dir)?;
    let meta = &prepared.meta;
    let verified = prepare::verify(dir, meta)?;
    let what = match verified.checksums {
        true => "SHA-256, sizes and token ids match meta.json",
        false => {
            "sizes and token ids are right; no checksums to compare (an older tinygpt prepared \
             it: prepare it again to have them)"
        }
    };
    println!(
        "{}: {} train + {} val tokens: {what}",
        dir.display(),
        meta.train_tokens,
        meta.val_tokens
    );
    Ok(ExitCode::SUCCESS)
}

/// The tokenizer of a run directory or a prepared directory.
fn tokenizer_of(dir: &std::path::Path) -> Result<Tokenizer> {
    if Prepared::is_prepared(dir) {
        return Ok(Prepared::open(dir)?.tokenizer);
    }
    Ok(tinygpt::run::checkpoint::Run::open(dir)?.tokenizer)
}

fn report(prepared: &Prepared, seconds: f64, phases: &Phases) {
    let meta = &prepared.meta;
    let bytes: u64 = meta.inputs.iter().map(|i| i.bytes).sum();
    let mb = bytes as f64 / 1e6;
    let width = match meta.width {
        Width::U16 => "u16",
        Width::U32 => "u32",
    };
    let kind = meta.tokenizer.name();
    println!(
        "prepared {}: {} train + {} val tokens ({width}), {kind} tokenizer with {} tokens | {} \
         input file(s), {mb:.1} MB in {seconds:.1}s ({:.1} MB/s)",
        prepared.dir.display(),
        meta.train_tokens,
        meta.val_tokens,
        meta.vocab_size,
        meta.inputs.len(),
        mb / seconds.max(1e-9),
    );
    let encode = phases.encode.as_secs_f64();
    println!(
        "scan {:.1}s, {kind} learning {:.1}s, encoding {encode:.1}s ({:.1} MB/s)",
        phases.scan.as_secs_f64(),
        phases.learn.as_secs_f64(),
        mb / encode.max(1e-9),
    );
    if let Some(sample) = meta.bpe_sample_bytes {
        println!(
            "BPE learned from {:.1} MB of the corpus (evenly spaced chunks; --bpe-sample-mb sets it)",
            sample as f64 / 1e6
        );
    }
    if let (Some(separator), Some(train), Some(val)) =
        (&meta.separator, meta.train_documents, meta.val_documents)
    {
        println!("{train} train + {val} val documents separated by {separator:?}");
    }
    for (path, why) in &meta.skipped {
        println!("skipped {path}: {why}");
    }
}
