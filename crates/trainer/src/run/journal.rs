//! A run's journal: what training saw as it went, appended line by line (each flushed, so a
//! run killed at any moment leaves every line it finished), for `loss.svg` and `tinygpt
//! watch`:
//!
//! - `steps.csv`: a line per `train.log_interval`: the step's loss, learning rate, gradient
//!   norm, throughput, skipped steps so far, and wall time.
//! - `evals.jsonl`: a line per evaluation: the losses, a short sample from a fixed prompt
//!   (`train.sample_prompt`, seeded) and the attention of every layer and head on that prompt.
//!
//! A run resumed from step N drops what an earlier session wrote past N. Runs from before
//! the journal have neither file, and open everywhere as runs with no steps logged.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::fs::write_atomic;

pub(crate) const STEPS: &str = "steps.csv";
pub(crate) const EVALS: &str = "evals.jsonl";

const STEPS_HEADER: &str = "step,loss,lr,grad_norm,tokens_per_s,skipped_steps,elapsed_s";

/// One logged step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepLine {
    pub step: usize,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    /// Training tokens per second over the last log window.
    pub tokens_per_s: f64,
    /// Steps so far whose update was skipped (non-finite loss or gradient norm).
    pub skipped: u64,
    pub elapsed_s: f64,
}

/// One evaluation, as `evals.jsonl` holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EvalLine {
    pub step: usize,
    pub train_loss: f64,
    pub val_loss: f64,
    /// The prompt's tokens, as text (a label each).
    pub prompt: Vec<String>,
    /// What the model wrote after the prompt (empty with `train.sample_tokens = 0`).
    pub sample: String,
    /// `attention[layer][head]`: the prompt's `[seq, seq]` weights row-major, each rounded to
    /// a 255th (0 = none, 255 = all of a row's attention): small, and plenty for a heatmap.
    pub attention: Vec<Vec<Vec<u8>>>,
}

/// The two files, open for appending.
pub(crate) struct Journal {
    steps: File,
    evals: File,
}

impl Journal {
    /// Opens the journal of the run in `dir` at `step`: lines an earlier session wrote past it
    /// (or half-written by a killed one) are dropped first, and the evaluation at `step` too
    /// when this session evaluates there again (`evaluates_first`).
    pub fn open(dir: &Path, step: usize, evaluates_first: bool) -> Result<Self> {
        let steps_path = dir.join(STEPS);
        keep_until(&steps_path, step, |line| {
            line.split(',').next()?.parse().ok()
        })?;
        let last_eval = match evaluates_first {
            true => step.checked_sub(1),
            false => Some(step),
        };
        match last_eval {
            Some(last) => keep_until(&dir.join(EVALS), last, |line| {
                serde_json::from_str::<EvalStep>(line).ok().map(|e| e.step)
            })?,
            None => {
                let _ = std::fs::remove_file(dir.join(EVALS));
            }
        }
        let steps = append(&steps_path)?;
        if steps.metadata()?.len() == 0 {
            writeln!(&steps, "{STEPS_HEADER}")?;
        }
        Ok(Self {
            steps,
            evals: append(&dir.join(EVALS))?,
        })
    }

    pub fn step(&mut self, s: &StepLine) -> Result<()> {
        writeln!(
            self.steps,
            "{},{:.6},{:.6e},{:.6},{:.1},{},{:.3}",
            s.step, s.loss, s.lr, s.grad_norm, s.tokens_per_s, s.skipped, s.elapsed_s
        )
        .and_then(|()| self.steps.flush())
        .with_context(|| format!("cannot write {STEPS}"))
    }

    pub fn eval(&mut self, e: &EvalLine) -> Result<()> {
        let line = serde_json::to_string(e)?;
        writeln!(self.evals, "{line}")
            .and_then(|()| self.evals.flush())
            .with_context(|| format!("cannot write {EVALS}"))
    }
}

/// The step of an `evals.jsonl` line, read without the rest.
#[derive(Deserialize)]
struct EvalStep {
    step: usize,
}

fn append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Rewrites `path` with its complete lines whose step (`step_of`; lines without one, such as
/// a header, are kept) is at most `step`; nothing when there is no file.
fn keep_until(path: &Path, step: usize, step_of: impl Fn(&str) -> Option<usize>) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    let kept: String = complete
        .lines()
        .filter(|line| step_of(line).is_none_or(|s| s <= step))
        .map(|line| format!("{line}\n"))
        .collect();
    if kept.len() != text.len() {
        write_atomic(path, kept.as_bytes())?;
    }
    Ok(())
}

/// The logged steps of the run in `dir`, in order (none for a run from before the journal);
/// lines that do not parse (a header, one cut by a kill) are skipped.
pub(crate) fn read_steps(dir: &Path) -> Vec<StepLine> {
    std::fs::read_to_string(dir.join(STEPS))
        .map(|text| text.lines().filter_map(parse_step).collect())
        .unwrap_or_default()
}

/// A `steps.csv` line.
pub(crate) fn parse_step(line: &str) -> Option<StepLine> {
    let f: Vec<&str> = line.split(',').collect();
    if f.len() != 7 {
        return None;
    }
    Some(StepLine {
        step: f[0].parse().ok()?,
        loss: f[1].parse().ok()?,
        lr: f[2].parse().ok()?,
        grad_norm: f[3].parse().ok()?,
        tokens_per_s: f[4].parse().ok()?,
        skipped: f[5].parse().ok()?,
        elapsed_s: f[6].parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(step: usize) -> StepLine {
        StepLine {
            step,
            loss: 4.0 - step as f64 / 100.0,
            lr: 1e-3,
            grad_norm: 0.5,
            tokens_per_s: 1000.0,
            skipped: 0,
            elapsed_s: step as f64 / 10.0,
        }
    }

    fn eval(step: usize) -> EvalLine {
        EvalLine {
            step,
            train_loss: 3.0,
            val_loss: 3.1,
            prompt: vec!["a".into(), "b".into()],
            sample: "ab".into(),
            attention: vec![vec![vec![255, 0, 128, 127]]],
        }
    }

    /// A resumed run drops what was logged past its checkpoint, and a line cut by a kill;
    /// the rest reads back as written.
    #[test]
    fn resume_drops_lines_past_the_checkpoint_and_cut_lines() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path(), 0, true).unwrap();
        for step in [10, 20, 30] {
            journal.step(&line(step)).unwrap();
            journal.eval(&eval(step)).unwrap();
        }
        drop(journal);
        let mut steps = OpenOptions::new()
            .append(true)
            .open(dir.path().join(STEPS))
            .unwrap();
        write!(steps, "40,3.6").unwrap();
        assert_eq!(read_steps(dir.path()).len(), 3, "a cut line is skipped");

        let mut journal = Journal::open(dir.path(), 20, true).unwrap();
        journal.step(&line(30)).unwrap();
        let steps = read_steps(dir.path());
        assert_eq!(steps, vec![line(10), line(20), line(30)]);
        let text = std::fs::read_to_string(dir.path().join(STEPS)).unwrap();
        assert!(text.starts_with(STEPS_HEADER), "{text}");
        let evals: Vec<EvalLine> = std::fs::read_to_string(dir.path().join(EVALS))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(evals, vec![eval(10)], "step 20 is evaluated again");
        // Resumed where no evaluation happens first: the one at that step stays.
        journal.eval(&eval(20)).unwrap();
        drop(journal);
        Journal::open(dir.path(), 20, false).unwrap();
        let kept = std::fs::read_to_string(dir.path().join(EVALS)).unwrap();
        assert_eq!(kept.lines().count(), 2);
    }
}
