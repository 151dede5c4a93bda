//! How a prepare reports: the passes' wall times ([`Phases`]), the progress bars, and the
//! last write that makes a prepared directory complete.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};

use super::format::{META, Meta};

/// Wall time of each pass of a prepare.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// Reading, checking and hashing the inputs (and sampling them for BPE).
    pub scan: Duration,
    /// Learning the tokenizer (BPE's merges; the char table is free).
    pub learn: Duration,
    /// Encoding the inputs and writing the token files.
    pub encode: Duration,
}

/// Writes `meta.json` last (what is there is complete once it is), and the passes' times from
/// when the work `started`, the inputs were `scanned` and the tokenizer `learned`.
pub(super) fn finish(
    dir: &Path,
    meta: Meta,
    [started, scanned, learned]: [Instant; 3],
) -> Result<(Meta, Phases)> {
    let text = serde_json::to_string_pretty(&meta)?;
    crate::fs::write_atomic(&dir.join(META), text.as_bytes())?;
    let phases = Phases {
        scan: scanned - started,
        learn: learned - scanned,
        encode: learned.elapsed(),
    };
    Ok((meta, phases))
}

/// A bytes progress bar with MB/s and ETA, shown on a terminal only.
pub(super) fn bar(show: bool, total: u64, what: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} {bar:30} {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} eta {eta}",
        )
        .expect("a valid template"),
    );
    bar.set_message(what.to_string());
    bar
}
