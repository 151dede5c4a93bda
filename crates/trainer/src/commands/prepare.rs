//! `tinygpt prepare`: a corpus tokenized once into token files that `train --data DIR` maps.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Result, bail};
use tinygpt::chat::{ChatSection, jsonl};
use tinygpt::data::corpus::BPE_SAMPLE_BYTES;
use tinygpt::data::prepare::{
    self, ConversationOptions, DEFAULT_INCLUDE, Phases, PrepareOptions, Prepared, TokenizerSource,
    ValSplit,
};
use tinygpt::data::tokenizer::Tokenizer;
use tinygpt::data::tokenizer::TokenizerKind;
use tinygpt::data::tokens::Width;

/// Tokenize a corpus once into train.bin / val.bin (nanoGPT's layout), for corpora of any size.
///
/// Inputs are files, folders (recursive; files matching --include) or - for standard input. The
/// text is streamed: memory stays flat whatever the corpus size. `tinygpt train --data DIR`
/// then maps the token files instead of reading the text.
///
/// .jsonl files of conversations (for fine-tuning) are rendered through a chat template once:
/// tokens, which of them are taught (the replies), and where each conversation starts. With
/// --tokenizer-from RUN, in that run's tokenizer and chat template (to fine-tune it with
/// `train --init-from RUN --data DIR`); else a tokenizer is learnt, in tinygpt's own chat format.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  tinygpt prepare --data input.txt --out data/shakespeare\n  \
    tinygpt prepare --data books/ --tokenizer bpe --bpe-vocab-size 8192 --out data/books\n  \
    tinygpt train --config baby --data data/shakespeare\n  \
    tinygpt prepare --data chats.jsonl --tokenizer-from runs/base --out data/chats\n  \
    tinygpt prepare --verify data/shakespeare"
)]
pub struct Args {
    /// Text files, folders, or - (standard input); or .jsonl files of conversations.
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
    /// The last fraction of the token stream (of conversations: of the conversations) held out
    /// for validation.
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
    if !(262..=65536).contains(&args.bpe_vocab_size) {
        bail!(
            "--bpe-vocab-size must be in 262..=65536 (256 byte tokens, 5 special tokens, merges), got {}",
            args.bpe_vocab_size
        );
    }
    if args
        .data
        .iter()
        .chain(&args.val_files)
        .any(|p| jsonl::is_jsonl(p))
    {
        return conversations(args);
    }
    let tokenizer = match &args.tokenizer_from {
        Some(dir) => TokenizerSource::Given(tokenizer_of(dir)?.0),
        None => learn(&args),
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

/// The tokenizer `args` ask to learn.
fn learn(args: &Args) -> TokenizerSource {
    TokenizerSource::Learn {
        kind: match args.tokenizer {
            Kind::Char => TokenizerKind::Char,
            Kind::Bpe => TokenizerKind::Bpe,
        },
        bpe_vocab_size: args.bpe_vocab_size,
        bpe_sample_bytes: args.bpe_sample_mb.max(1) << 20,
    }
}

/// `.jsonl` inputs: conversations rendered into token files, taught marks and offsets.
fn conversations(args: Args) -> Result<ExitCode> {
    if args.separator.is_some() {
        bail!("--separator is for text: conversations are one per line");
    }
    if args.skip_invalid {
        bail!("--skip-invalid is for text files: a bad line of conversations is an error");
    }
    let (tokenizer, chat) = match &args.tokenizer_from {
        Some(dir) => {
            let (tokenizer, chat) = tokenizer_of(dir)?;
            (TokenizerSource::Given(tokenizer), chat)
        }
        None => (learn(&args), ChatSection::own()),
    };
    let options = ConversationOptions {
        inputs: args.data,
        val: match args.val_files.is_empty() {
            true => ValSplit::Fraction(args.val_fraction),
            false => ValSplit::Files(args.val_files),
        },
        tokenizer,
        chat,
        progress: std::io::stderr().is_terminal(),
    };
    let start = Instant::now();
    let out = args.out.expect("clap requires --out without --verify");
    let (prepared, phases) = prepare::prepare_conversations(options, &out)?;
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
    let conversations = match &meta.conversations {
        Some(c) => format!(" ({} + {} conversations)", c.train, c.val),
        None => String::new(),
    };
    println!(
        "{}: {} train + {} val tokens{conversations}: {what}",
        dir.display(),
        meta.train_tokens,
        meta.val_tokens
    );
    Ok(ExitCode::SUCCESS)
}

/// The tokenizer of a run directory or a prepared directory, and the chat template its
/// conversations are written in.
fn tokenizer_of(dir: &std::path::Path) -> Result<(Tokenizer, ChatSection)> {
    if Prepared::is_prepared(dir) {
        let prepared = Prepared::open(dir)?;
        let chat = match prepared.meta.conversations {
            Some(conversations) => conversations.chat,
            None => ChatSection::default().for_new_run(&prepared.tokenizer),
        };
        return Ok((prepared.tokenizer, chat));
    }
    let run = tinygpt::run::checkpoint::Run::open(dir)?;
    let chat = run.config.chat.clone().for_new_run(&run.tokenizer);
    Ok((run.tokenizer, chat))
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
    let what = match &meta.conversations {
        None => String::new(),
        Some(c) => format!(
            "{} train + {} val conversations ({} + {} taught tokens): ",
            c.train, c.val, c.train_taught, c.val_taught
        ),
    };
    println!(
        "prepared {}: {what}{} train + {} val tokens ({width}), {kind} tokenizer with {} tokens \
         | {} input file(s), {mb:.1} MB in {seconds:.1}s ({:.1} MB/s)",
        prepared.dir.display(),
        meta.train_tokens,
        meta.val_tokens,
        meta.vocab_size,
        meta.inputs.len(),
        mb / seconds.max(1e-9),
    );
    let encode = phases.encode.as_secs_f64();
    let encoding = match meta.conversations {
        Some(_) => "rendering and encoding",
        None => "encoding",
    };
    println!(
        "scan {:.1}s, {kind} learning {:.1}s, {encoding} {encode:.1}s ({:.1} MB/s)",
        phases.scan.as_secs_f64(),
        phases.learn.as_secs_f64(),
        mb / encode.max(1e-9),
    );
    if let Some(sample) = meta.bpe_sample_bytes {
        let pieces = match meta.conversations {
            Some(_) => "conversations",
            None => "chunks",
        };
        println!(
            "BPE learned from {:.3} MB of the corpus (evenly spaced {pieces}; --bpe-sample-mb \
             sets it)",
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
