//! Conversations (`.jsonl` inputs) prepared once, for sets too large to read and render each
//! time a run starts: the token files, the taught marks beside them and where each conversation
//! starts (`format.rs`), rendered through the chat template recorded in `meta.json`.
//!
//! Two passes, as for text: a scan (UTF-8, checksums, the conversations counted, and the text
//! a new tokenizer learns from), then the rendering, batches of lines on every core, written
//! in order: the last `--val-fraction` of the conversations (or `--val-files`) to the val files.
//! Memory stays flat but for eight bytes of offset per conversation.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::encode::TokenWriter;
use super::format::{
    ConversationsMeta, InputMeta, Meta, TOKENIZER, TRAIN, TRAIN_DOCS, TRAIN_TAUGHT, VAL, VAL_DOCS,
    VAL_TAUGHT,
};
use super::hold_out::ValSplit;
use super::options::TokenizerSource;
use super::phases::{Phases, bar, finish};
use super::verify;
use crate::chat::jsonl::{self, Numbered};
use crate::chat::{ChatSection, ChatTemplate};
use crate::checksum::hex;
use crate::data::conversations::render::{self, Rendered};
use crate::data::conversations::val_count;
use crate::data::tokenizer::Tokenizer;
use crate::data::tokenizer::TokenizerKind;
use crate::data::tokens::Width;

/// What to prepare.
pub struct ConversationOptions {
    /// JSONL files.
    pub inputs: Vec<PathBuf>,
    pub val: ValSplit,
    pub tokenizer: TokenizerSource,
    /// The chat template to render with: that of the run whose tokenizer is given; tinygpt's
    /// own format for a tokenizer learnt here.
    pub chat: ChatSection,
    pub progress: bool,
}

/// Lines read, rendered and written per batch (on every core).
const BATCH_LINES: usize = 4096;

/// One JSONL input.
struct Source {
    name: String,
    path: PathBuf,
    bytes: u64,
    val: bool,
}

/// Prepares the conversations of `options` into `dir`, an existing empty directory.
pub(crate) fn prepare_into(options: ConversationOptions, dir: &Path) -> Result<(Meta, Phases)> {
    let started = Instant::now();
    let sources = sources(&options)?;
    let template = ChatTemplate::new(None, &options.chat)?;
    let learning = match &options.tokenizer {
        TokenizerSource::Learn { kind, .. } => Some(*kind),
        TokenizerSource::Given(_) => None,
    };
    let mut scan = scan(&sources, &template, learning, &options)?;
    let scanned = Instant::now();
    let tokenizer = match options.tokenizer {
        TokenizerSource::Given(tokenizer) => tokenizer,
        TokenizerSource::Learn {
            kind,
            bpe_vocab_size,
            ..
        } => {
            let pieces = match kind {
                TokenizerKind::Char => vec![scan.chars.iter().collect()],
                TokenizerKind::Bpe => std::mem::take(&mut scan.sample),
            };
            render::learn(kind, &pieces, bpe_vocab_size)?
        }
    };
    let learned = Instant::now();
    let train_count = match options.val {
        ValSplit::Fraction(f) => scan.train - val_count(scan.train as usize, f) as u64,
        ValSplit::Files(_) => scan.train,
    };
    let mut out = Outputs::create(dir, Width::for_vocab(tokenizer.vocab_size()))?;
    let mut pass = Pass {
        template: &template,
        tokenizer: &tokenizer,
        train_count,
        written: 0,
        bar: bar(options.progress, scan.bytes, "rendering"),
    };
    for (source, sha256) in sources.iter().zip(&scan.sha256) {
        pass.source(source, sha256, &mut out)?;
    }
    pass.bar.finish_and_clear();
    let (train, val) = out.finish(dir)?;
    for (name, split) in [("train", &train), ("val", &val)] {
        if split.len() == 0 {
            bail!("the {name} split has no conversation (give more, or another --val-fraction)");
        }
    }
    crate::fs::write_atomic(&dir.join(TOKENIZER), tokenizer.to_json()?.as_bytes())?;
    let split = (&options.chat, &options.val);
    let meta = meta(split, &tokenizer, &sources, scan, [train, val], dir)?;
    finish(dir, meta, [started, scanned, learned])
}

/// `meta.json` for the conversations of `sources` rendered with `chat`, split by `val` into
/// what was `written`.
fn meta(
    (chat, val_split): (&ChatSection, &ValSplit),
    tokenizer: &Tokenizer,
    sources: &[Source],
    scan: Scan,
    [train, val]: [Written; 2],
    dir: &Path,
) -> Result<Meta> {
    let conversations = ConversationsMeta {
        chat: chat.clone(),
        train: train.len(),
        val: val.len(),
        train_taught: train.taught,
        val_taught: val.taught,
    };
    let names = [TRAIN, VAL, TRAIN_DOCS, VAL_DOCS, TRAIN_TAUGHT, VAL_TAUGHT];
    Ok(Meta {
        format: 1,
        tokenizer: tokenizer.kind_setting(),
        vocab_size: tokenizer.vocab_size(),
        width: Width::for_vocab(tokenizer.vocab_size()),
        train_tokens: train.tokens,
        val_tokens: val.tokens,
        val_fraction: val_split.fraction(),
        val_files: (val_split.files().iter())
            .map(|f| f.display().to_string())
            .collect(),
        bpe_sample_bytes: scan.sample_bytes,
        inputs: inputs(sources, scan.sha256),
        skipped: Vec::new(),
        separator: None,
        train_documents: None,
        val_documents: None,
        conversations: Some(conversations),
        sha256: verify::checksums(dir, &names)?,
    })
}

/// The inputs, train files then held-out ones; each must be a readable `.jsonl` file.
fn sources(options: &ConversationOptions) -> Result<Vec<Source>> {
    let train = options.inputs.iter().map(|p| (p, false));
    let val = options.val.files().iter().map(|p| (p, true));
    let mut sources = Vec::new();
    for (path, val) in train.chain(val) {
        if !jsonl::is_jsonl(path) {
            bail!(
                "{} is not a .jsonl file: conversations and text are prepared separately",
                path.display()
            );
        }
        let cannot = || format!("cannot read conversations {}", path.display());
        let meta = std::fs::metadata(path).with_context(cannot)?;
        if !meta.is_file() {
            bail!("{}: not a file", cannot());
        }
        let bytes = meta.len();
        sources.push(Source {
            name: path.display().to_string(),
            path: path.clone(),
            bytes,
            val,
        });
    }
    Ok(sources)
}

fn inputs(sources: &[Source], sha256: Vec<String>) -> Vec<InputMeta> {
    sources
        .iter()
        .zip(sha256)
        .map(|(s, sha256)| InputMeta {
            path: s.name.clone(),
            bytes: s.bytes,
            sha256,
            split: if s.val { "val" } else { "train" }.into(),
        })
        .collect()
}

/// The lines of one JSONL file, hashed as they are read.
struct Lines<'a> {
    source: &'a Source,
    reader: BufReader<File>,
    hasher: Sha256,
    line: usize,
    buf: Vec<u8>,
}

impl<'a> Lines<'a> {
    fn open(source: &'a Source) -> Result<Self> {
        let file = File::open(&source.path)
            .with_context(|| format!("cannot read conversations {}", source.name))?;
        Ok(Self {
            source,
            reader: BufReader::with_capacity(1 << 20, file),
            hasher: Sha256::new(),
            line: 0,
            buf: Vec::new(),
        })
    }

    /// Up to `BATCH_LINES` non-blank lines with their numbers (from 1), and the bytes read for
    /// them; none at the end of the file.
    fn batch(&mut self) -> Result<(Vec<(usize, String)>, u64)> {
        let (mut lines, mut bytes) = (Vec::new(), 0);
        while lines.len() < BATCH_LINES {
            self.buf.clear();
            let n = self
                .reader
                .read_until(b'\n', &mut self.buf)
                .with_context(|| format!("cannot read conversations {}", self.source.name))?;
            if n == 0 {
                break;
            }
            self.hasher.update(&self.buf);
            self.line += 1;
            bytes += n as u64;
            let Ok(text) = std::str::from_utf8(&self.buf) else {
                bail!("{}: line {}: not UTF-8 text", self.source.name, self.line);
            };
            if !text.trim().is_empty() {
                lines.push((self.line, text.to_owned()));
            }
        }
        Ok((lines, bytes))
    }

    fn sha256(self) -> String {
        hex(&self.hasher.finalize())
    }
}

/// The conversations on `lines`, read as JSONL, on every core.
fn parse(source: &Source, lines: &[(usize, String)]) -> Result<Vec<Numbered>> {
    let parts = render::par_chunks(lines, |part| {
        part.iter()
            .map(|(n, line)| {
                let messages = jsonl::conversation(line)
                    .with_context(|| format!("{}: line {n}", source.name))?;
                Ok((*n, messages))
            })
            .collect::<Result<Vec<_>>>()
    });
    let mut all = Vec::with_capacity(lines.len());
    for part in parts {
        all.extend(part?);
    }
    Ok(all)
}

/// What the first pass found.
struct Scan {
    /// Per source, in order.
    sha256: Vec<String>,
    /// Conversations in the train inputs (held-out files' are not needed before writing).
    train: u64,
    bytes: u64,
    chars: BTreeSet<char>,
    sample: Vec<String>,
    sample_bytes: Option<u64>,
}

/// The first pass: every input read and hashed, the train conversations counted; when a
/// tokenizer of `learning`'s kind is to be learnt, every conversation rendered for the text it
/// learns from (all characters for char; for BPE, whole conversations evenly spread over the
/// inputs adding up to about the sample size).
fn scan(
    sources: &[Source],
    template: &ChatTemplate,
    learning: Option<TokenizerKind>,
    options: &ConversationOptions,
) -> Result<Scan> {
    let bytes: u64 = sources.iter().map(|s| s.bytes).sum();
    let sample_limit = match options.tokenizer {
        TokenizerSource::Learn {
            bpe_sample_bytes, ..
        } => bpe_sample_bytes,
        TokenizerSource::Given(_) => 0,
    };
    // Of each conversation's text, this share is taken into the BPE sample (by a running credit,
    // so what is taken is spread evenly).
    let share = (sample_limit as f64 / bytes.max(1) as f64).min(1.0);
    let mut scan = Scan {
        sha256: Vec::new(),
        train: 0,
        bytes,
        chars: BTreeSet::new(),
        sample: Vec::new(),
        sample_bytes: None,
    };
    let (mut credit, mut sampled) = (0.0, 0u64);
    let bar = bar(options.progress, bytes, "scanning");
    for source in sources {
        let mut lines = Lines::open(source)?;
        loop {
            let (batch, read) = lines.batch()?;
            if batch.is_empty() {
                break;
            }
            bar.inc(read);
            if !source.val {
                scan.train += batch.len() as u64;
            }
            let Some(kind) = learning else { continue };
            let conversations = parse(source, &batch)?;
            let pieces = render::par_chunks(&conversations, |part| {
                let pieces = part.iter().map(|c| render::learning_pieces(template, c));
                pieces.collect::<Result<Vec<_>>>()
            });
            for part in pieces {
                let part = part.with_context(|| source.name.clone())?;
                for conversation in part {
                    match kind {
                        TokenizerKind::Char => scan
                            .chars
                            .extend(conversation.iter().flat_map(|p| p.chars())),
                        TokenizerKind::Bpe => {
                            let len = conversation.iter().map(|p| p.len()).sum::<usize>() as f64;
                            credit += len * share;
                            if credit >= len {
                                credit -= len;
                                sampled += len as u64;
                                scan.sample.extend(conversation);
                            }
                        }
                    }
                }
            }
        }
        scan.sha256.push(lines.sha256());
    }
    bar.finish_and_clear();
    if learning == Some(TokenizerKind::Bpe) {
        scan.sample_bytes = Some(sampled);
    }
    if scan.train < 2 && options.val.fraction().is_some() {
        bail!(
            "{} conversation(s): at least 2 are needed (one to train on, one to validate)",
            scan.train
        );
    }
    Ok(scan)
}

/// The second pass over the inputs.
struct Pass<'a> {
    template: &'a ChatTemplate,
    tokenizer: &'a Tokenizer,
    /// Train conversations: those after go to the val files.
    train_count: u64,
    /// Train-input conversations written so far.
    written: u64,
    bar: indicatif::ProgressBar,
}

impl Pass<'_> {
    /// Renders and writes every conversation of `source`, whose scan read `scanned` (SHA-256).
    fn source(&mut self, source: &Source, scanned: &str, out: &mut Outputs) -> Result<()> {
        let mut lines = Lines::open(source)?;
        loop {
            let (batch, read) = lines.batch()?;
            if batch.is_empty() {
                break;
            }
            let conversations = parse(source, &batch)?;
            let mut rendered = render::render_all(&conversations, self.template, self.tokenizer)
                .with_context(|| source.name.clone())?;
            let to_train = match source.val {
                true => 0,
                false => {
                    (self.train_count.saturating_sub(self.written) as usize).min(rendered.len())
                }
            };
            if !source.val {
                self.written += rendered.len() as u64;
            }
            let val = rendered.split_off(to_train);
            let written = out.train.write(&rendered).and_then(|_| out.val.write(&val));
            written.with_context(|| "cannot write the prepared files".to_string())?;
            self.bar.inc(read);
        }
        if lines.sha256() != scanned {
            bail!(
                "{} changed while it was being prepared (it differs between the two passes); \
                 prepare it again once nothing writes to it",
                source.name
            );
        }
        Ok(())
    }
}

/// The train and val files being written.
struct Outputs {
    train: SplitWriter,
    val: SplitWriter,
}

impl Outputs {
    fn create(dir: &Path, width: Width) -> Result<Self> {
        Ok(Self {
            train: SplitWriter::create(dir, TRAIN, TRAIN_TAUGHT, width)?,
            val: SplitWriter::create(dir, VAL, VAL_TAUGHT, width)?,
        })
    }

    /// Everything on disk, the offsets files written; what each split holds.
    fn finish(self, dir: &Path) -> Result<(Written, Written)> {
        let train = self.train.finish(dir, TRAIN_DOCS)?;
        let val = self.val.finish(dir, VAL_DOCS)?;
        Ok((train, val))
    }
}

/// What one split holds.
struct Written {
    offsets: Vec<u64>,
    tokens: u64,
    taught: u64,
}

impl Written {
    fn len(&self) -> u64 {
        self.offsets.len() as u64 - 1
    }
}

/// One split's token file and taught marks, and where each conversation starts.
struct SplitWriter {
    ids: TokenWriter,
    marks: TokenWriter,
    width: Width,
    written: Written,
    bytes: Vec<u8>,
}

impl SplitWriter {
    fn create(dir: &Path, ids: &str, marks: &str, width: Width) -> Result<Self> {
        Ok(Self {
            ids: TokenWriter::create(dir, ids)?,
            marks: TokenWriter::create(dir, marks)?,
            width,
            written: Written {
                offsets: vec![0],
                tokens: 0,
                taught: 0,
            },
            bytes: Vec::new(),
        })
    }

    fn write(&mut self, rendered: &Rendered) -> std::io::Result<()> {
        self.bytes.clear();
        self.width.encode_into(&rendered.ids, &mut self.bytes);
        self.ids.write_all(&self.bytes)?;
        self.marks.write_all(&rendered.taught)?;
        self.ids.write_back();
        self.marks.write_back();
        let base = self.written.tokens;
        let starts = rendered.offsets[1..].iter().map(|o| o + base);
        self.written.offsets.extend(starts);
        self.written.tokens += rendered.tokens();
        self.written.taught += rendered.taught_tokens();
        Ok(())
    }

    fn finish(self, dir: &Path, docs: &str) -> Result<Written> {
        let cannot = || format!("cannot write the prepared files in {}", dir.display());
        self.ids.finish().with_context(cannot)?;
        self.marks.finish().with_context(cannot)?;
        let bytes: Vec<u8> = (self.written.offsets.iter())
            .flat_map(|o| o.to_le_bytes())
            .collect();
        crate::fs::write_atomic(&dir.join(docs), &bytes)?;
        Ok(self.written)
    }
}
