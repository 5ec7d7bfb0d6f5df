//! Helpers shared by the integration tests that drive the `kvbench` binary.
#![allow(dead_code)]

use std::process::Command;

/// Runs the binary from the repository root; returns its exit code and stdout+stderr.
pub fn kvbench(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .expect("run kvbench");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}
