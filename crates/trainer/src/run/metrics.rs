//! `metrics.csv` and `loss.svg`: the loss estimates of a run, rewritten at each eval (the plot
//! draws the steps of `steps.csv` too, see [`crate::run::journal`]).

use std::path::Path;

use anyhow::{Context, Result};
use plotters::prelude::*;

use crate::fs::write_atomic;
use crate::run::checkpoint::{METRICS, PLOT};
use crate::run::journal::{StepLine, read_steps};

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
pub(crate) struct Metrics {
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
    pub(crate) fn record(&mut self, dir: &Path, row: Row) -> Result<()> {
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
        let steps = read_steps(dir);
        write_atomic(&dir.join(PLOT), plot(&self.rows, &steps)?.as_bytes())
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

/// The loss of a run as a person reads it at a glance, as an SVG document: the loss of every
/// logged step (thin, from `steps`), train and val at each evaluation (bold, with markers), the
/// best val marked, and the learning rate on a second axis.
fn plot(rows: &[Row], steps: &[StepLine]) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let mut chart = axes(&root, rows, steps)?;
        draw_losses(&mut chart, rows, steps)?;
        draw_best(&mut chart, rows)?;
        draw_learning_rate(&mut chart, rows, steps)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// Steps across, the loss on the left, the learning rate on the right.
type Chart<'a, 'b> = plotters::chart::DualCoordChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The chart's axes, sized to every step, loss and learning rate there is.
fn axes<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    rows: &[Row],
    steps: &[StepLine],
) -> Result<Chart<'a, 'b>> {
    let last_step = rows
        .iter()
        .map(|r| r.step)
        .chain(steps.iter().map(|s| s.step));
    let max_step = last_step.max().unwrap_or(1).max(1) as f64;
    let losses = rows
        .iter()
        .flat_map(|r| [r.train_loss, r.val_loss])
        .chain(steps.iter().map(|s| s.loss))
        .filter(|v| v.is_finite());
    let (lo, hi) = losses.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo <= hi { (lo, hi) } else { (0.0, 1.0) };
    let pad = ((hi - lo) * 0.05).max(1e-3);
    let lrs = rows.iter().map(|r| r.lr).chain(steps.iter().map(|s| s.lr));
    let max_lr = lrs.fold(0.0f64, f64::max).max(1e-12) * 1.1;
    let mut chart = ChartBuilder::on(root)
        .caption("tinygpt: loss", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .right_y_label_area_size(70)
        .build_cartesian_2d(0.0..max_step, (lo - pad)..(hi + pad))
        .map_err(plot_error)?
        .set_secondary_coord(0.0..max_step, 0.0..max_lr);
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("cross-entropy (nats)")
        .x_label_formatter(&|x| format!("{}", x.round() as i64))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(plot_error)?;
    chart
        .configure_secondary_axes()
        .y_desc("learning rate")
        .y_label_formatter(&|v| format!("{v:.1e}"))
        .draw()
        .map_err(plot_error)?;
    Ok(chart)
}

/// Every logged step's loss, thin; train and val at each evaluation, bold with markers.
fn draw_losses(chart: &mut Chart<'_, '_>, rows: &[Row], steps: &[StepLine]) -> Result<()> {
    let step_color = RGBColor(120, 120, 200);
    chart
        .draw_series(LineSeries::new(
            steps
                .iter()
                .filter(|s| s.loss.is_finite())
                .map(|s| (s.step as f64, s.loss)),
            step_color.mix(0.6).stroke_width(1),
        ))
        .map_err(plot_error)?
        .label("loss of each logged step")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], step_color.stroke_width(1)));
    for (name, color, value) in [
        (
            "train (evaluation)",
            BLUE,
            (|r: &Row| r.train_loss) as fn(&Row) -> f64,
        ),
        ("val (evaluation)", RED, |r: &Row| r.val_loss),
    ] {
        let points = || rows.iter().map(move |r| (r.step as f64, value(r)));
        chart
            .draw_series(LineSeries::new(points(), color.stroke_width(3)))
            .map_err(plot_error)?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(3)));
        chart
            .draw_series(points().map(|p| Circle::new(p, 4, color.filled())))
            .map_err(plot_error)?;
    }
    Ok(())
}

/// The best val loss, circled and labelled.
fn draw_best(chart: &mut Chart<'_, '_>, rows: &[Row]) -> Result<()> {
    if let Some(best) = rows.iter().min_by(|a, b| a.val_loss.total_cmp(&b.val_loss)) {
        let label = format!("best val {:.4} (step {})", best.val_loss, best.step);
        // Above and left of the point (pixel offsets), where the curve has already been.
        let mark = EmptyElement::at((best.step as f64, best.val_loss))
            + Circle::new((0, 0), 9, RED.stroke_width(2))
            + Text::new(
                label,
                (-190, -28),
                ("sans-serif", 15).into_font().color(&RED),
            );
        chart.draw_series([mark]).map_err(plot_error)?;
    }
    Ok(())
}

/// The learning rate of each logged step (of each evaluation, without a step journal), on the
/// right axis.
fn draw_learning_rate(chart: &mut Chart<'_, '_>, rows: &[Row], steps: &[StepLine]) -> Result<()> {
    let lr_color = RGBColor(0, 150, 80);
    let lr_points: Vec<(f64, f64)> = match steps.is_empty() {
        true => rows.iter().map(|r| (r.step as f64, r.lr)).collect(),
        false => steps.iter().map(|s| (s.step as f64, s.lr)).collect(),
    };
    chart
        .draw_secondary_series(LineSeries::new(lr_points, lr_color.stroke_width(1)))
        .map_err(plot_error)?
        .label("learning rate (right axis)")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], lr_color.stroke_width(1)));
    Ok(())
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
