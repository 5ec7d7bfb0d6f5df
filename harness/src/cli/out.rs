//! Standard output for every subcommand.
//!
//! `std::println!` panics when stdout is a closed pipe (`kvbench trace stats FILE | head -3`). The
//! `println!`/`print!` macros of `cli/mod.rs` shadow std's for every subcommand file and come here
//! instead: a closed pipe stops the printing, not the work — a `suite | head` still finishes its
//! runs, renames its folders into place and exits with the checks' verdict. Any other write error
//! (a full disk behind a redirect) is said once on stderr, then printing stops likewise.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once stdout failed: later output is dropped instead of failing again.
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);

pub fn write_stdout(args: fmt::Arguments<'_>) {
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        STDOUT_GONE.store(true, Ordering::Relaxed);
        if e.kind() != io::ErrorKind::BrokenPipe {
            eprintln!("kvbench: standard output: {e}; further output dropped");
        }
    }
}
