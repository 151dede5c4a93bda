//! Where a run's tokens come from. `data.path` is a prepared directory (its token files mapped
//! as they are), or text (a file, a folder, the built-in corpus) that is prepared first, into
//! the run directory (`RUN/data/`, the same layout): one way data flows, and a resumed run maps
//! the tokens it prepared instead of encoding the text again. `documents` batching prepares
//! with `data.separator`, which writes where each document starts. A `.jsonl` file holds
//! conversations for fine-tuning, read and rendered through the run's chat template as the run
//! starts (and again when it resumes).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use crate::chat::jsonl::{self, Numbered};
use crate::chat::{ChatSection, ChatTemplate};
use crate::config::{Batching, DataSection, RunConfig};
use crate::data::Dataset;
use crate::data::conversations::{self, Summary, render};
use crate::data::prepare::{
    self, DEFAULT_INCLUDE, PrepareOptions, Prepared, TokenizerSource, ValSplit, Verification,
};
use crate::data::tokenizer::Tokenizer;
use crate::fs::temp_beside;

/// The prepared tokens inside a run directory.
pub(crate) const RUN_DATA: &str = "data";

/// BPE learns from at most this much of a corpus (evenly spaced chunks).
pub const BPE_SAMPLE_BYTES: u64 = 256 << 20;

/// A run's corpus: tokenizer, splits, and the prepared directory that a new run moves into its
/// run directory.
pub struct Corpus {
    pub tokenizer: Tokenizer,
    pub data: Dataset,
    /// Token files prepared for a new run, still in a temporary directory.
    pub prepared: Option<TempDir>,
}

/// The corpus of a new run of `config`, preparing its text beside `out` (the run directory to
/// be) with the `given` tokenizer, or one learnt from it. A prepared directory sets the run's
/// tokenizer settings to its own.
pub fn for_new_run(
    config: &mut RunConfig,
    out: &Path,
    given: Option<&Tokenizer>,
) -> Result<Corpus> {
    let path = config.data.path.clone();
    if jsonl::is_jsonl(&path) {
        return conversations_for_new_run(config, given);
    }
    let (prepared, temp) = if Prepared::is_prepared(&path) {
        let prepared = Prepared::open(&path)?;
        if let Some(given) = given {
            same_tokenizer(&prepared, given)?;
        }
        (prepared, None)
    } else {
        let source = match given {
            Some(given) => TokenizerSource::Given(clone(given)?),
            None => TokenizerSource::Learn {
                kind: config.data.tokenizer,
                bpe_vocab_size: config.data.bpe_vocab_size,
                bpe_sample_bytes: BPE_SAMPLE_BYTES,
            },
        };
        let temp = temp_beside(out, "prepare")?;
        let prepared = prepare_text(&path, source, &config.data, temp.path())?;
        (prepared, Some(temp))
    };
    let d = &mut config.data;
    d.tokenizer = prepared.meta.tokenizer;
    if let Some(fraction) = prepared.meta.val_fraction {
        d.val_fraction = fraction;
    }
    if d.tokenizer == crate::data::tokenizer::TokenizerKind::Bpe {
        d.bpe_vocab_size = prepared.meta.vocab_size;
    }
    let chat = std::mem::take(&mut config.chat);
    config.chat = match &prepared.meta.conversations {
        Some(conversations) => prepared_chat(chat, &conversations.chat, &prepared)?,
        None => chat.for_new_run(&prepared.tokenizer),
    };
    let (mut data, summary) = mapped_with_summary(&prepared, config)?;
    if temp.is_none() {
        data.verification = Verification::start(&prepared.dir, &prepared.meta);
    }
    if let Some(summary) = summary {
        println!("conversations: {}", summary.describe());
    }
    Ok(Corpus {
        tokenizer: clone(&prepared.tokenizer)?,
        data,
        prepared: temp,
    })
}

/// The chat section of a new run on conversations prepared with `recorded`: that, unless the
/// run's config (or the run it fine-tunes) has another.
fn prepared_chat(
    chat: ChatSection,
    recorded: &ChatSection,
    prepared: &Prepared,
) -> Result<ChatSection> {
    if chat.is_default() || chat.clone().for_new_run(&prepared.tokenizer) == *recorded {
        return Ok(recorded.clone());
    }
    bail!(
        "{} holds conversations written with another chat template than this run's [chat] (or \
         that of the run it fine-tunes): prepare them again with `tinygpt prepare \
         --tokenizer-from RUN`, or train on the .jsonl file",
        prepared.dir.display()
    )
}

/// The splits of a run being resumed (or evaluated): its prepared tokens when they are of the
/// corpus `config.data.path` names now, else that corpus encoded with the run's tokenizer
/// (into `RUN/data/` when `write` is set: the caller holds the run's lock, and trains: token
/// files prepared before are then checked, see [`mapped_verified`]).
pub fn for_run(
    run_dir: &Path,
    config: &RunConfig,
    tokenizer: &Tokenizer,
    write: bool,
) -> Result<Dataset> {
    let path = &config.data.path;
    if jsonl::is_jsonl(path) {
        let read = jsonl::read(path)?;
        return conversations(config, tokenizer, &read).map(|(data, _)| data);
    }
    // Training checks the files it maps (evaluation reads what it needs of them).
    let map = if write { mapped_verified } else { mapped };
    if Prepared::is_prepared(path) {
        let prepared = Prepared::open(path)?;
        same_tokenizer(&prepared, tokenizer)?;
        return map(&prepared, config);
    }
    let inside = run_dir.join(RUN_DATA);
    if Prepared::is_prepared(&inside) {
        let prepared = Prepared::open(&inside)?;
        if prepared.meta.val_fraction == Some(config.data.val_fraction)
            && prepared.meta.separator.as_deref() == separator(config)
            && prepare::unchanged(&prepared.meta, path)?
        {
            same_tokenizer(&prepared, tokenizer)?;
            return map(&prepared, config);
        }
    }
    let source = TokenizerSource::Given(clone(tokenizer)?);
    if !write {
        let temp = tempfile::tempdir().context("cannot create a temporary directory")?;
        let prepared = prepare_text(path, source, &config.data, temp.path())?;
        // The mapping keeps the files alive after the directory's name is gone.
        return mapped(&prepared, config);
    }
    let temp = temp_beside(&inside, "prepare")?;
    prepare_text(path, source, &config.data, temp.path())?;
    replace_dir(temp, &inside)?;
    mapped(&Prepared::open(&inside)?, config)
}

/// The splits the run `run_dir` trained on as its own prepared copy holds them (`RUN/data/`),
/// whatever became of the corpus they came from; `None` for a run without one (imported).
pub(crate) fn prepared_in_run(
    run_dir: &Path,
    config: &RunConfig,
    tokenizer: &Tokenizer,
) -> Result<Option<Dataset>> {
    let inside = run_dir.join(RUN_DATA);
    if !Prepared::is_prepared(&inside) {
        return Ok(None);
    }
    let prepared = Prepared::open(&inside)?;
    same_tokenizer(&prepared, tokenizer)?;
    mapped(&prepared, config).map(Some)
}

/// The conversations of a new fine-tuning run, with the `given` tokenizer (`--init-from`), or one
/// learnt from the conversations as the run's chat template writes them (by default tinygpt's
/// own format, whose markers are the new tokenizer's special tokens, not text to learn).
fn conversations_for_new_run(config: &mut RunConfig, given: Option<&Tokenizer>) -> Result<Corpus> {
    let read = jsonl::read(&config.data.path)?;
    let chat = std::mem::take(&mut config.chat);
    let tokenizer = match given {
        Some(given) => {
            config.chat = chat.for_new_run(given);
            clone(given)?
        }
        None => {
            config.chat = match chat.is_default() {
                true => ChatSection::own(),
                false => chat,
            };
            let template = ChatTemplate::new(None, &config.chat)?;
            let pieces = render::par_chunks(&read, |part| {
                let pieces = part.iter().map(|c| render::learning_pieces(&template, c));
                pieces.collect::<Result<Vec<_>>>()
            });
            let mut text = Vec::new();
            for part in pieces {
                text.extend(part?.into_iter().flatten());
            }
            let d = &config.data;
            render::learn(d.tokenizer, &text, d.bpe_vocab_size)?
        }
    };
    let (data, summary) = conversations(config, &tokenizer, &read)?;
    println!("conversations: {}", summary.describe());
    Ok(Corpus {
        tokenizer,
        data,
        prepared: None,
    })
}

/// The conversations `read` from `config.data.path` as train and val splits, rendered with the
/// run's chat template and `tokenizer` (read again on resume: the same file gives the same
/// split).
fn conversations(
    config: &RunConfig,
    tokenizer: &Tokenizer,
    read: &[Numbered],
) -> Result<(Dataset, Summary)> {
    let template = ChatTemplate::new(None, &config.chat)?;
    let block_size = config.model.block_size;
    let val_fraction = config.data.val_fraction;
    let (train, val, summary) =
        conversations::split(read, &template, tokenizer, block_size, val_fraction)
            .with_context(|| config.data.path.display().to_string())?;
    Ok((Dataset::conversations(train, val, block_size), summary))
}

/// The separator of documents when `config` batches documents.
fn separator(config: &RunConfig) -> Option<&str> {
    (config.data.batching == Batching::Documents).then_some(config.data.separator.as_str())
}

/// Prepares the text at `path` into `dir`, as `data` says (validation fraction, documents).
fn prepare_text(
    path: &Path,
    tokenizer: TokenizerSource,
    data: &DataSection,
    dir: &Path,
) -> Result<Prepared> {
    let options = PrepareOptions {
        inputs: vec![path.to_path_buf()],
        include: DEFAULT_INCLUDE.split(',').map(String::from).collect(),
        tokenizer,
        val: ValSplit::Fraction(data.val_fraction),
        skip_invalid: false,
        progress: true,
        exit_on_signal: false,
        separator: (data.batching == Batching::Documents).then(|| data.separator.clone()),
    };
    prepare::prepare_into(options, dir)?;
    Prepared::open(dir)
}

/// The splits of `prepared`, mapped, batched as `config` says (conversations as they are).
fn mapped(prepared: &Prepared, config: &RunConfig) -> Result<Dataset> {
    Ok(mapped_with_summary(prepared, config)?.0)
}

/// [`mapped`], with what the conversations hold when the directory has them.
fn mapped_with_summary(
    prepared: &Prepared,
    config: &RunConfig,
) -> Result<(Dataset, Option<Summary>)> {
    let block_size = config.model.block_size;
    if let Some((train, val, summary)) = prepared.conversations(block_size)? {
        let dataset = Dataset::conversations(train, val, block_size);
        return Ok((dataset, Some(summary)));
    }
    let dataset = match separator(config) {
        None => {
            let (train, val) = prepared.splits()?;
            Dataset::packed(train, val, block_size)
        }
        Some(wanted) => {
            let recorded = prepared.meta.separator.as_deref();
            let documents = prepared.documents(block_size)?;
            let Some((train, val)) = documents.filter(|_| recorded == Some(wanted)) else {
                bail!(
                    "{} was not prepared with the documents separator {wanted:?} that \
                     `data.batching = \"documents\"` uses (prepare it again with --separator)",
                    prepared.dir.display()
                );
            };
            Dataset::documents(train, val)
        }
    };
    let dataset = dataset.with_context(|| format!("corpus {}", prepared.dir.display()))?;
    Ok((dataset, None))
}

/// [`mapped`], for a directory prepared before this run: its files are checked against
/// `meta.json` on a thread of their own while training starts (one just prepared was hashed as
/// it was written).
fn mapped_verified(prepared: &Prepared, config: &RunConfig) -> Result<Dataset> {
    let mut dataset = mapped(prepared, config)?;
    dataset.verification = Verification::start(&prepared.dir, &prepared.meta);
    Ok(dataset)
}

fn same_tokenizer(prepared: &Prepared, tokenizer: &Tokenizer) -> Result<()> {
    if prepared.tokenizer.to_json()? != tokenizer.to_json()? {
        bail!(
            "{} was prepared with another tokenizer than this run's (prepare it again with \
             `tinygpt prepare --tokenizer-from RUN`)",
            prepared.dir.display()
        );
    }
    Ok(())
}

fn clone(tokenizer: &Tokenizer) -> Result<Tokenizer> {
    Tokenizer::from_json(&tokenizer.to_json()?)
}

/// Puts `temp` in place of `dst` (which may exist), the old copy removed last.
pub(crate) fn replace_dir(temp: TempDir, dst: &Path) -> Result<()> {
    let temp: PathBuf = temp.keep();
    let old = dst.with_file_name(format!(
        ".{}.old",
        dst.file_name().unwrap_or_default().to_string_lossy()
    ));
    crate::fs::swap_dir(&temp, dst, &old)?;
    if old.exists() {
        std::fs::remove_dir_all(&old)?;
    }
    Ok(())
}
