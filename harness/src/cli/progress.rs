//! A progress bar for `run` and `suite`, drawn only when both stdout and stderr are terminals
//! (a pipe or a log file gets the plain lines and no control characters). It ticks on its own, so
//! a long scenario shows its elapsed time between scenario boundaries. Without a terminal each
//! scenario's start is one plain line on stderr, so a log shows what runs.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress {
    bar: Option<ProgressBar>,
    total: usize,
    started: std::cell::Cell<usize>,
}

impl Progress {
    pub fn new(scenarios: usize) -> Progress {
        if !(std::io::stdout().is_terminal() && std::io::stderr().is_terminal()) {
            return Progress {
                bar: None,
                total: scenarios,
                started: std::cell::Cell::new(0),
            };
        }
        let bar = ProgressBar::new(scenarios as u64);
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} {elapsed_precise} [{bar:20}] {pos}/{len} {wide_msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress {
            bar: Some(bar),
            total: scenarios,
            started: std::cell::Cell::new(0),
        }
    }

    /// A scenario begins (paged, then contiguous).
    pub fn start(&self, what: &str) {
        let k = self.started.get() + 1;
        self.started.set(k);
        match &self.bar {
            Some(b) => b.set_message(format!("{what}: paged, then contiguous")),
            None => eprintln!("[{k}/{}] {what}: paged, then contiguous", self.total),
        }
    }

    pub fn done_one(&self) {
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }

    /// Print to stdout above the bar.
    pub fn println(&self, text: &str) {
        match &self.bar {
            Some(b) => b.suspend(|| println!("{text}")),
            None => println!("{text}"),
        }
    }

    /// Print to stderr above the bar.
    pub fn eprintln(&self, text: &str) {
        match &self.bar {
            Some(b) => b.suspend(|| eprintln!("{text}")),
            None => eprintln!("{text}"),
        }
    }

    pub fn finish(self) {}
}

/// Cleared on every exit path, an error included, so the error prints on a clean line.
impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
