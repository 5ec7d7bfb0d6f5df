//! `kernel-bench` bounds its time and its memory before measuring: a grid estimated past an
//! hour is refused naming `--repeats` and the figure, and a grid point whose K/V storage the
//! process cannot get (under an address-space limit) is refused naming `--max-gib`, never an
//! abort on a failed allocation. Each child is killed past a wall bound, so a build without the
//! bound fails here instead of running for hours.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const WALL: Duration = Duration::from_secs(120);

/// `kvbench ARGS` under `ulimit -v limit_kib`; exit code and stderr, killed past [`WALL`].
fn kernel_bench(limit_kib: u64, args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {limit_kib} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_kvbench"))
        .arg("kernel-bench")
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > WALL {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kernel-bench {args:?} ran past {WALL:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.code(), std::fs::read_to_string(err_path).unwrap())
}

#[test]
fn ten_thousand_repeats_are_refused_with_the_estimate() {
    let (code, err) = kernel_bench(8 << 20, &["--quick", "--repeats", "10000"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--repeats 10000") && err.contains("at least 4000 s"),
        "{err}"
    );
}

#[test]
fn a_grid_point_past_host_memory_is_refused_naming_max_gib() {
    // 32 sequences of 16,384 tokens of the 8B shape's f32 K/V: 4 GiB (5 GiB with the held
    // blocks' slots), under a 2 GiB address-space limit.
    let (code, err) = kernel_bench(
        2 << 20,
        &[
            "--quick",
            "--batch",
            "32",
            "--context",
            "16384",
            "--max-gib",
            "64",
        ],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--max-gib 64") && err.contains("of host memory"),
        "{err}"
    );
    for bad in ["memory allocation of", "panicked at"] {
        assert!(!err.contains(bad), "{err}");
    }
}
