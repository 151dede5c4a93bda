//! What a training run prints while it works: a progress bar on a terminal, plain log lines
//! otherwise.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// The run's progress display.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar from `position` to `len` steps on a terminal; hidden (log lines instead) otherwise.
    pub fn new(len: u64, position: u64) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self {
                bar: ProgressBar::hidden(),
            };
        }
        let bar = ProgressBar::new(len).with_position(position);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30.cyan/blue} step {pos}/{len} | {msg} | {elapsed_precise} < {eta_precise}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        Self { bar }
    }

    /// A line for the user: above the bar on a terminal, plain stdout otherwise (a hidden bar
    /// swallows `println`).
    pub fn say(&self, line: String) {
        if self.bar.is_hidden() {
            println!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    /// The bar at `step`.
    pub fn at(&self, step: usize) {
        self.bar.set_position(step as u64);
    }

    /// The latest figures on the bar; on a pipe, `line` is printed instead.
    pub fn update(&self, figures: &str, line: impl FnOnce() -> String) {
        if self.bar.is_hidden() {
            println!("{}", line());
        } else {
            self.bar.set_message(figures.to_string());
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
