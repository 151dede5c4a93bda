//! `metrics.csv` and `loss.svg`: the loss estimates of a run, rewritten at each eval.

use std::path::Path;

use anyhow::{Context, Result};
use plotters::prelude::*;

use crate::fs::write_atomic;
use crate::run::checkpoint::{METRICS, PLOT};

const HEADER: &str = "step,train_loss,val_loss,lr,tokens,elapsed_s,skipped_steps";

/// One eval.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub step: usize,
    pub train_loss: f64,
    pub val_loss: f64,
    pub lr: f64,
    pub tokens: u64,
    pub elapsed_s: f64,
    /// Steps so far whose update was skipped (non-finite loss or gradient norm).
    pub skipped: u64,
}

/// The rows so far.
pub struct Metrics {
    rows: Vec<Row>,
}

impl Metrics {
    /// The metrics of the run in `dir` (none for a new run).
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join(METRICS);
        let rows = match std::fs::read_to_string(&path) {
            Ok(text) => text
                .lines()
                .skip(1)
                .filter(|l| !l.trim().is_empty())
                .map(parse_row)
                .collect::<Option<Vec<_>>>()
                .with_context(|| format!("{} is corrupt", path.display()))?,
            Err(_) => Vec::new(),
        };
        Ok(Self { rows })
    }

    /// Adds an eval (replacing any row at or after `step`, left by a run that was resumed from
    /// an earlier checkpoint) and rewrites the CSV and the plot.
    pub fn record(&mut self, dir: &Path, row: Row) -> Result<()> {
        self.rows.retain(|r| r.step < row.step);
        self.rows.push(row);
        let mut csv = String::from(HEADER);
        csv.push('\n');
        for r in &self.rows {
            csv.push_str(&format!(
                "{},{:.6},{:.6},{:.6e},{},{:.3},{}\n",
                r.step, r.train_loss, r.val_loss, r.lr, r.tokens, r.elapsed_s, r.skipped
            ));
        }
        write_atomic(&dir.join(METRICS), csv.as_bytes())?;
        write_atomic(&dir.join(PLOT), plot(&self.rows)?.as_bytes())
    }
}

/// A row; runs written before `skipped_steps` existed have six columns.
fn parse_row(line: &str) -> Option<Row> {
    let f: Vec<&str> = line.split(',').collect();
    if f.len() != 6 && f.len() != 7 {
        return None;
    }
    Some(Row {
        step: f[0].parse().ok()?,
        train_loss: f[1].parse().ok()?,
        val_loss: f[2].parse().ok()?,
        lr: f[3].parse().ok()?,
        tokens: f[4].parse().ok()?,
        elapsed_s: f[5].parse().ok()?,
        skipped: f.get(6).map_or(Some(0), |s| s.parse().ok())?,
    })
}

/// Train and val loss against step, as an SVG document.
fn plot(rows: &[Row]) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (800, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let max_step = rows.iter().map(|r| r.step).max().unwrap_or(1).max(1) as f64;
        let losses = rows.iter().flat_map(|r| [r.train_loss, r.val_loss]);
        let (lo, hi) = losses.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let pad = ((hi - lo) * 0.05).max(1e-3);
        let mut chart = ChartBuilder::on(&root)
            .caption("tinygpt: loss", ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d(0.0..max_step, (lo - pad)..(hi + pad))
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("cross-entropy (nats)")
            .draw()
            .map_err(plot_error)?;
        for (name, color, value) in [
            ("train", BLUE, (|r: &Row| r.train_loss) as fn(&Row) -> f64),
            ("val", RED, |r: &Row| r.val_loss),
        ] {
            chart
                .draw_series(LineSeries::new(
                    rows.iter().map(|r| (r.step as f64, value(r))),
                    color.stroke_width(2),
                ))
                .map_err(plot_error)?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

fn plot_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("cannot draw the loss plot: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_resume_replaces_later_rows() {
        let dir = tempfile::tempdir().unwrap();
        let row = |step, loss| Row {
            step,
            train_loss: loss,
            val_loss: loss + 0.1,
            lr: 1e-3,
            tokens: step as u64 * 768,
            elapsed_s: step as f64,
            skipped: step as u64 / 10,
        };
        let mut m = Metrics::open(dir.path()).unwrap();
        for (step, loss) in [(0, 4.2), (10, 3.0), (20, 2.5)] {
            m.record(dir.path(), row(step, loss)).unwrap();
        }
        // Resumed from step 10: the old step-20 row is replaced, not duplicated.
        let mut m = Metrics::open(dir.path()).unwrap();
        m.record(dir.path(), row(20, 2.4)).unwrap();
        let m = Metrics::open(dir.path()).unwrap();
        assert_eq!(m.rows, vec![row(0, 4.2), row(10, 3.0), row(20, 2.4)]);
        let svg = std::fs::read_to_string(dir.path().join(PLOT)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("polyline"),
            "{}",
            &svg[..100]
        );
    }

    #[test]
    fn six_column_rows_of_older_runs_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let csv = "step,train_loss,val_loss,lr,tokens,elapsed_s\n10,3.0,3.1,1e-3,7680,1.5\n";
        std::fs::write(dir.path().join(METRICS), csv).unwrap();
        let m = Metrics::open(dir.path()).unwrap();
        assert_eq!((m.rows[0].step, m.rows[0].skipped), (10, 0));
    }
}
