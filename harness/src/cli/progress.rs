//! A progress bar for `run` and `suite`, drawn only when both stdout and stderr are terminals
//! (a pipe or a log file gets the plain lines and no control characters). It ticks on its own, so
//! a long scenario shows its elapsed time between scenario boundaries.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress(Option<ProgressBar>);

impl Progress {
    pub fn new(scenarios: usize) -> Progress {
        if !(std::io::stdout().is_terminal() && std::io::stderr().is_terminal()) {
            return Progress(None);
        }
        let bar = ProgressBar::new(scenarios as u64);
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} {elapsed_precise} [{bar:20}] {pos}/{len} {wide_msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress(Some(bar))
    }

    /// A scenario begins (paged, then contiguous).
    pub fn start(&self, what: &str) {
        if let Some(b) = &self.0 {
            b.set_message(format!("{what}: paged, then contiguous"));
        }
    }

    pub fn done_one(&self) {
        if let Some(b) = &self.0 {
            b.inc(1);
        }
    }

    /// Print to stdout above the bar.
    pub fn println(&self, text: &str) {
        match &self.0 {
            Some(b) => b.suspend(|| println!("{text}")),
            None => println!("{text}"),
        }
    }

    /// Print to stderr above the bar.
    pub fn eprintln(&self, text: &str) {
        match &self.0 {
            Some(b) => b.suspend(|| eprintln!("{text}")),
            None => eprintln!("{text}"),
        }
    }

    pub fn finish(self) {}
}

/// Cleared on every exit path, an error included, so the error prints on a clean line.
impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}
