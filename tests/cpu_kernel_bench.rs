//! `kvbench kernel-bench` through the binary: the CSV has the documented columns, one paged and
//! one paged-extents and one contiguous row per grid point with positive figures; bad input exits 2.

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
        Some("backend,cache,batch,context_tokens,block_size,time_us,gbytes_per_s,ceiling_fraction")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2 * 2 * 3, "batch × block size × cache: {csv}");
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r[0], "cpu");
        assert_eq!(r[1], ["paged", "paged-extents", "contiguous"][i % 3]);
        assert_eq!(r[3], "40");
        for f in &r[5..] {
            let v: f64 = f.parse().expect("number");
            assert!(v > 0.0 && v.is_finite(), "{csv}");
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
