//! Where a run's tokens come from. `data.path` is a prepared directory (its token files mapped
//! as they are), or text (a file, a folder, the built-in corpus) that is prepared first, into
//! the run directory (`RUN/data/`, the same layout): one way data flows, and a resumed run maps
//! the tokens it prepared instead of encoding the text again. `documents` batching still reads
//! the text into memory, as it needs the documents' boundaries.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use crate::config::{Batching, RunConfig};
use crate::data::{Dataset, read_corpus};
use crate::prepare::{
    self, DEFAULT_INCLUDE, PrepareOptions, Prepared, TokenizerSource, ValSplit, temp_beside,
};
use crate::tokenizer::Tokenizer;

/// The prepared tokens inside a run directory.
pub const RUN_DATA: &str = "data";

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
    let block_size = config.model.block_size;
    let path = config.data.path.clone();
    if config.data.batching == Batching::Documents {
        refuse_prepared_documents(&path)?;
        let text = read_corpus(&path)?;
        let data = &config.data;
        let tokenizer = match given {
            Some(given) => clone(given)?,
            None => Tokenizer::train(data.tokenizer, &text, data.bpe_vocab_size)?,
        };
        let data = Dataset::new(&text, &tokenizer, data, block_size)
            .with_context(|| format!("corpus {}", path.display()))?;
        return Ok(Corpus {
            tokenizer,
            data,
            prepared: None,
        });
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
        let temp = temp_beside(out)?;
        let prepared = prepare_text(&path, source, config.data.val_fraction, temp.path())?;
        (prepared, Some(temp))
    };
    let d = &mut config.data;
    d.tokenizer = prepared.meta.tokenizer;
    if let Some(fraction) = prepared.meta.val_fraction {
        d.val_fraction = fraction;
    }
    if d.tokenizer == crate::config::TokenizerKind::Bpe {
        d.bpe_vocab_size = prepared.meta.vocab_size;
    }
    let data = mapped(&prepared, block_size)?;
    Ok(Corpus {
        tokenizer: clone(&prepared.tokenizer)?,
        data,
        prepared: temp,
    })
}

/// The splits of a run being resumed (or evaluated): its prepared tokens when they are of the
/// corpus `config.data.path` names now, else that corpus encoded with the run's tokenizer
/// (into `RUN/data/` when `write` is set: the caller holds the run's lock).
pub fn for_run(
    run_dir: &Path,
    config: &RunConfig,
    tokenizer: &Tokenizer,
    write: bool,
) -> Result<Dataset> {
    let block_size = config.model.block_size;
    let path = &config.data.path;
    if config.data.batching == Batching::Documents {
        refuse_prepared_documents(path)?;
        let text = read_corpus(path)?;
        return Dataset::new(&text, tokenizer, &config.data, block_size)
            .with_context(|| format!("corpus {}", path.display()));
    }
    if Prepared::is_prepared(path) {
        let prepared = Prepared::open(path)?;
        same_tokenizer(&prepared, tokenizer)?;
        return mapped(&prepared, block_size);
    }
    let inside = run_dir.join(RUN_DATA);
    if Prepared::is_prepared(&inside) {
        let prepared = Prepared::open(&inside)?;
        if prepared.meta.val_fraction == Some(config.data.val_fraction)
            && prepare::unchanged(&prepared.meta, path)?
        {
            same_tokenizer(&prepared, tokenizer)?;
            return mapped(&prepared, block_size);
        }
    }
    let source = TokenizerSource::Given(clone(tokenizer)?);
    let fraction = config.data.val_fraction;
    if !write {
        let temp = tempfile::tempdir().context("cannot create a temporary directory")?;
        let prepared = prepare_text(path, source, fraction, temp.path())?;
        // The mapping keeps the files alive after the directory's name is gone.
        return mapped(&prepared, block_size);
    }
    let temp = temp_beside(&inside)?;
    prepare_text(path, source, fraction, temp.path())?;
    replace_dir(temp, &inside)?;
    mapped(&Prepared::open(&inside)?, block_size)
}

/// Prepares the text at `path` into `dir`.
fn prepare_text(
    path: &Path,
    tokenizer: TokenizerSource,
    fraction: f64,
    dir: &Path,
) -> Result<Prepared> {
    let options = PrepareOptions {
        inputs: vec![path.to_path_buf()],
        include: DEFAULT_INCLUDE.split(',').map(String::from).collect(),
        tokenizer,
        val: ValSplit::Fraction(fraction),
        skip_invalid: false,
        progress: true,
    };
    prepare::prepare_into(options, dir)?;
    Prepared::open(dir)
}

fn mapped(prepared: &Prepared, block_size: usize) -> Result<Dataset> {
    let (train, val) = prepared.splits()?;
    Dataset::packed(train, val, block_size)
        .with_context(|| format!("corpus {}", prepared.dir.display()))
}

fn refuse_prepared_documents(path: &Path) -> Result<()> {
    if Prepared::is_prepared(path) {
        bail!(
            "{} is a prepared directory, which holds one token stream: `data.batching = \
             \"documents\"` needs the text (give the text file instead)",
            path.display()
        );
    }
    Ok(())
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

/// Puts `temp` in place of `dst` (which may exist): two renames, the old copy removed last.
pub fn replace_dir(temp: TempDir, dst: &Path) -> Result<()> {
    let temp: PathBuf = temp.keep();
    let old = dst.with_file_name(format!(
        ".{}.old",
        dst.file_name().unwrap_or_default().to_string_lossy()
    ));
    if dst.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old)?;
        }
        std::fs::rename(dst, &old)?;
    }
    std::fs::rename(&temp, dst).with_context(|| format!("cannot create {}", dst.display()))?;
    if old.exists() {
        std::fs::remove_dir_all(&old)?;
    }
    Ok(())
}
