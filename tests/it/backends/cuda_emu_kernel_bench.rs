//! `kvbench kernel-bench --backend cuda-emu`: decode and prefill rows with the K/V bytes the
//! emulator counted, within the bounds of the design (decode ≤ 1.05× the sequences' K/V,
//! prefill ≤ 1.1× the tiling bound), in `kernel_bench.csv` after the cuda columns; with
//! `--window` decode reads exactly the window's K/V; an unusable block seed is refused naming
//! the variable.

use crate::support;

#[test]
fn kernel_bench_on_the_emulated_device_reports_kv_bytes_within_the_bounds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("kb");
    let out_s = out.to_str().expect("utf-8 path");
    let (code, text) = support::kvbench(&[
        "kernel-bench",
        "--backend",
        "cuda-emu",
        "--model",
        "tiny",
        "--batch",
        "2",
        "--context",
        "70",
        "--block-size",
        "8",
        "--out",
        out_s,
    ]);
    assert_eq!(code, 0, "{text}");
    let csv = std::fs::read_to_string(out.join("kernel_bench.csv")).expect("kernel_bench.csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    assert_eq!(
        &header[..8],
        &[
            "backend",
            "cache",
            "batch",
            "context_tokens",
            "block_size",
            "time_us",
            "gbytes_per_s",
            "ceiling_fraction"
        ]
    );
    assert_eq!(
        &header[header.len() - 4..],
        &["phase", "kv_bytes_read", "kv_bytes_ideal", "window_tokens"]
    );
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (phase, read, ideal) = (col("phase"), col("kv_bytes_read"), col("kv_bytes_ideal"));
    let mut phases = Vec::new();
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f[0], "cuda-emu", "{line}");
        let (r, i): (f64, f64) = (
            f[read].parse().expect("read"),
            f[ideal].parse().expect("ideal"),
        );
        let bound = if f[phase] == "decode" { 1.05 } else { 1.1 };
        assert!(r > 0.0 && r <= bound * i, "{line}");
        phases.push(f[phase].to_string());
    }
    phases.sort();
    phases.dedup();
    assert_eq!(phases, ["decode", "prefill"]);

    // A sliding window of 20 tokens: decode reads exactly the window's K/V, stated in the file.
    let out_win = dir.path().join("kb-window");
    let out_w = out_win.to_str().expect("utf-8 path");
    let (code, text) = support::kvbench(&[
        "kernel-bench",
        "--backend",
        "cuda-emu",
        "--model",
        "tiny",
        "--batch",
        "2",
        "--context",
        "70",
        "--block-size",
        "8",
        "--window",
        "20",
        "--out",
        out_w,
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("sliding window 20 tokens"), "{text}");
    let csv = std::fs::read_to_string(out_win.join("kernel_bench.csv")).expect("kernel_bench.csv");
    let (kv_bytes, window) = (col("kv_bytes"), col("window_tokens"));
    let mut decodes = 0;
    for line in csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f[window], "20", "{line}");
        let (r, i): (u64, u64) = (
            f[read].parse().expect("read"),
            f[ideal].parse().expect("ideal"),
        );
        if f[phase] == "decode" {
            decodes += 1;
            assert_eq!(r, i, "decode reads the window exactly: {line}");
            assert_eq!(f[kv_bytes], f[ideal], "{line}");
        } else {
            assert!(r > 0 && r as f64 <= 1.1 * i as f64, "{line}");
        }
    }
    assert_eq!(decodes, 2, "paged and contiguous");

    let (code, text) = support::kvbench_env(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        &[("KVBENCH_EMU_BLOCK_SEED", "soon")],
        &[
            "kernel-bench",
            "--backend",
            "cuda-emu",
            "--model",
            "tiny",
            "--batch",
            "1",
            "--context",
            "8",
            "--block-size",
            "8",
        ],
    );
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("KVBENCH_EMU_BLOCK_SEED"), "{text}");
    assert!(!text.contains("panicked"), "{text}");
}
