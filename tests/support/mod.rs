//! Helpers shared by the integration tests that drive the `kvbench` binary.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// Runs the binary from the repository root; returns its exit code and stdout+stderr.
pub fn kvbench(args: &[&str]) -> (i32, String) {
    kvbench_env(Path::new(env!("CARGO_MANIFEST_DIR")), &[], args)
}

/// Runs the binary in `dir` with extra environment variables; returns its exit code and
/// stdout+stderr.
pub fn kvbench_env(dir: &Path, envs: &[(&str, &str)], args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .current_dir(dir)
        .envs(envs.iter().copied())
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
