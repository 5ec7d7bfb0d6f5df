//! `kvbench kernel-bench` through the binary: the CSV has the documented columns, one paged and
//! one paged-extents and one contiguous row per grid point with positive figures, and with
//! `--repeats` each row's median ratio to contiguous inside its interval; bad input exits 2.

use std::process::Command;

fn kvbench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kvbench"))
}

#[test]
fn writes_the_documented_csv() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = kvbench()
        .args([
            "kernel-bench",
            "--backend",
            "cpu",
            "--quick",
            "--batch",
            "1,3",
            "--context",
            "40",
        ])
        .args(["--block-size", "8,16", "--model", "tiny", "--out"])
        .arg(dir.path())
        .output()
        .expect("run kvbench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("streaming-read ceiling"), "{stdout}");
    let csv = std::fs::read_to_string(dir.path().join("kernel_bench.csv")).expect("csv written");
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some(concat!(
            "backend,cache,batch,context_tokens,block_size,time_us,gbytes_per_s,ceiling_fraction,",
            "repeats,time_us_median,ratio_median,ratio_low,ratio_high,ratio_confidence"
        ))
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2 * 2 * 3, "batch × block size × cache: {csv}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[0], "cpu");
        assert_eq!(r[1], ["paged", "paged-extents", "contiguous"][i % 3]);
        assert_eq!(r[3], "40");
        assert_eq!(r[8], "1", "one repeat by default");
        for f in &r[5..13] {
            let v: f64 = f.parse().expect("number");
            assert!(v > 0.0 && v.is_finite(), "{csv}");
        }
        assert_eq!(num(r[13]), 0.0, "one ratio bounds nothing: {csv}");
    }
}

fn num(f: &str) -> f64 {
    f.parse().unwrap_or_else(|e| panic!("{f}: {e}"))
}

/// Seven repeats: the median ratio inside an interval of stated confidence 1 − 2·2⁻⁷ (ranks 1
/// and 7, the smallest sample for which no narrower ranks reach 95%), the contiguous row's ratio
/// exactly 1, and each ratio consistent with the rows' times.
#[test]
fn repeats_give_paired_ratio_intervals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = kvbench()
        .args([
            "kernel-bench",
            "--backend",
            "cpu",
            "--quick",
            "--batch",
            "2",
        ])
        .args(["--context", "64", "--block-size", "16", "--model", "tiny"])
        .args(["--repeats", "7", "--out"])
        .arg(dir.path())
        .output()
        .expect("run kvbench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("median of 7 side-by-side repeats"),
        "{stdout}"
    );
    let csv = std::fs::read_to_string(dir.path().join("kernel_bench.csv")).expect("csv written");
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 3, "{csv}");
    let stated = 1.0 - 2.0 * 0.5f64.powi(7);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[8], "7", "{csv}");
        let (time, median_time) = (num(r[5]), num(r[9]));
        assert!(time <= median_time, "fastest ≤ median: {csv}");
        let (m, lo, hi, conf) = (num(r[10]), num(r[11]), num(r[12]), num(r[13]));
        assert!(lo <= m && m <= hi && lo > 0.0, "{csv}");
        assert!((conf - stated).abs() < 1e-12, "{conf} vs {stated}: {csv}");
        // The terminal shows the same median and interval for paged and placed.
        let shown = format!("{m:.3} [{lo:.3}, {hi:.3}]");
        assert!(i == 2 || stdout.contains(&shown), "{shown} not in {stdout}");
    }
    let c = &rows[2];
    assert_eq!(c[1], "contiguous");
    assert_eq!(
        (num(c[10]), num(c[11]), num(c[12])),
        (1.0, 1.0, 1.0),
        "{csv}"
    );
}

/// `--run-blocks` adds one `paged-runs-L` row per run length after each grid point's three,
/// each with its ratio to that point's contiguous row.
#[test]
fn run_blocks_add_a_row_per_run_length() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = kvbench()
        .args([
            "kernel-bench",
            "--backend",
            "cpu",
            "--quick",
            "--batch",
            "2",
        ])
        .args(["--context", "64,96", "--block-size", "8", "--model", "tiny"])
        .args(["--repeats", "3", "--run-blocks", "1,4", "--out"])
        .arg(dir.path())
        .output()
        .expect("run kvbench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv = std::fs::read_to_string(dir.path().join("kernel_bench.csv")).expect("csv written");
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    let caches = [
        "paged",
        "paged-extents",
        "contiguous",
        "paged-runs-1",
        "paged-runs-4",
    ];
    assert_eq!(rows.len(), 2 * caches.len(), "context × cache: {csv}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[1], caches[i % caches.len()], "{csv}");
        assert_eq!(r[3], ["64", "96"][i / caches.len()], "{csv}");
        let (m, lo, hi) = (num(r[10]), num(r[11]), num(r[12]));
        assert!(lo <= m && m <= hi && lo > 0.0, "{csv}");
        if r[1].starts_with("paged-runs") {
            assert!(stdout.contains(r[1]), "{} not in {stdout}", r[1]);
        }
    }
}

#[test]
fn bad_input_exits_2() {
    for args in [
        vec!["kernel-bench", "--backend", "sim", "--quick"],
        vec!["kernel-bench", "--quick", "--dtype", "fp8"],
        vec!["kernel-bench", "--quick", "--block-size", "0"],
        vec!["kernel-bench", "--quick", "--model", "nope"],
        vec!["kernel-bench", "--quick", "--repeats", "0"],
        vec!["kernel-bench", "--quick", "--run-blocks", "4,0"],
        vec![
            "kernel-bench",
            "--backend",
            "cuda",
            "--quick",
            "--run-blocks",
            "4",
        ],
        vec![
            "kernel-bench",
            "--backend",
            "cuda",
            "--quick",
            "--repeats",
            "3",
        ],
    ] {
        let out = kvbench().args(&args).output().expect("run kvbench");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
