//! A run's files followed as they grow: `steps.csv` and `evals.jsonl` are read from where the
//! last look stopped, whole lines only (a line being written waits for the next look); a file
//! that shrank (a run resumed from an earlier checkpoint rewrites it) sends the run again
//! whole. Runs from before the journal have only `metrics.csv`, sent whole when it changes.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::run::checkpoint::{CONFIG, METRICS};
use crate::run::journal::{EVALS, STEPS, parse_step};

/// Refuses a path that is neither a run directory nor one still to be made by `train`.
pub fn check(dir: &Path) -> Result<()> {
    if !dir.exists() {
        eprintln!(
            "note: {} does not exist yet: it is shown once `tinygpt train` makes it",
            dir.display()
        );
        return Ok(());
    }
    if !dir.join(CONFIG).is_file() {
        bail!(
            "{} is not a run directory (no {CONFIG}): give the --out of tinygpt train",
            dir.display()
        );
    }
    Ok(())
}

/// One file read up to `offset` so far.
struct Follower {
    path: PathBuf,
    offset: u64,
}

impl Follower {
    /// The whole lines added since the last call, or `None` when the file shrank (it was
    /// rewritten: read it again from the start).
    fn new_lines(&mut self) -> Option<Vec<String>> {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return Some(Vec::new());
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            return None;
        }
        let mut text = String::new();
        let read = file
            .seek(SeekFrom::Start(self.offset))
            .and_then(|_| file.take(len - self.offset).read_to_string(&mut text));
        if read.is_err() {
            return Some(Vec::new());
        }
        let complete = text.rfind('\n').map_or(0, |end| end + 1);
        self.offset += complete as u64;
        Some(text[..complete].lines().map(String::from).collect())
    }
}

/// A run being followed.
pub struct Run {
    name: String,
    dir: PathBuf,
    steps: Follower,
    evals: Follower,
    /// `metrics.csv`'s size and time when last sent (runs without `evals.jsonl`).
    metrics_seen: Option<(u64, std::time::SystemTime)>,
    sent: bool,
}

impl Run {
    pub fn new(dir: &Path) -> Self {
        let follower = |name| Follower {
            path: dir.join(name),
            offset: 0,
        };
        Self {
            name: dir.display().to_string(),
            dir: dir.to_path_buf(),
            steps: follower(STEPS),
            evals: follower(EVALS),
            metrics_seen: None,
            sent: false,
        }
    }

    /// What the page has not seen yet, as one JSON event (`run` is the run's index), or
    /// `None` when nothing changed.
    pub fn update(&mut self, index: usize) -> Option<String> {
        let mut reset = !self.sent;
        let (steps, evals) = match (self.steps.new_lines(), self.evals.new_lines()) {
            (Some(steps), Some(evals)) => (steps, evals),
            _ => {
                self.steps.offset = 0;
                self.evals.offset = 0;
                reset = true;
                (
                    self.steps.new_lines().unwrap_or_default(),
                    self.evals.new_lines().unwrap_or_default(),
                )
            }
        };
        let mut evals: Vec<Value> = evals
            .iter()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        if !self.evals.path.exists() {
            let metrics = self.dir.join(METRICS);
            let seen = std::fs::metadata(&metrics)
                .ok()
                .and_then(|m| Some((m.len(), m.modified().ok()?)));
            if seen.is_some() && seen != self.metrics_seen {
                self.metrics_seen = seen;
                evals = metrics_rows(&metrics);
                reset = true;
            }
        }
        let steps: Vec<Value> = steps
            .iter()
            .filter_map(|line| parse_step(line))
            .map(|s| {
                json!([
                    s.step,
                    s.loss,
                    s.lr,
                    s.grad_norm,
                    s.tokens_per_s,
                    s.skipped,
                    s.elapsed_s
                ])
            })
            .collect();
        if !reset && steps.is_empty() && evals.is_empty() {
            return None;
        }
        self.sent = true;
        Some(
            json!({"run": index, "name": self.name, "reset": reset, "steps": steps, "evals": evals})
                .to_string(),
        )
    }
}

/// The evaluations of a run from before the journal: its losses, nothing else.
fn metrics_rows(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            let step: usize = f.first()?.parse().ok()?;
            let train: f64 = f.get(1)?.parse().ok()?;
            let val: f64 = f.get(2)?.parse().ok()?;
            Some(json!({"step": step, "train_loss": train, "val_loss": val,
                        "prompt": [], "sample": "", "attention": []}))
        })
        .collect()
}
