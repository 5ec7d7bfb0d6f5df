//! The CUDA subcommands without a GPU: `doctor` reports and exits as documented, and every
//! command that needs a device exits 2 naming what is missing — never a panic. The driver is
//! hidden with `KVBENCH_CUDA_HIDE`, so these hold on GPU machines too.

use crate::support;

fn kvbench(args: &[&str], hide: &str) -> (i32, String) {
    support::kvbench_env(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
        &[("KVBENCH_CUDA_HIDE", hide)],
        args,
    )
}

#[test]
fn doctor_reports_every_piece_and_exits_0_when_nothing_is_required() {
    let (code, out) = kvbench(&["doctor", "--no-compile"], "");
    assert_eq!(code, 0, "{out}");
    for label in [
        "cpu:",
        "memory:",
        "driver:",
        "nvrtc:",
        "cublas:",
        "gpu:",
        "cuda backend:",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(label)),
            "no {label} line in:\n{out}"
        );
    }
    assert!(!out.contains("panicked"), "{out}");
}

#[test]
fn doctor_exits_1_when_a_required_piece_is_missing_and_2_on_a_bad_flag() {
    let (code, out) = kvbench(
        &["doctor", "--no-compile", "--require", "driver,gpu"],
        "driver",
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("required but missing: driver"), "{out}");
    assert!(out.contains("hidden by KVBENCH_CUDA_HIDE"), "{out}");
    let (code, out) = kvbench(&["doctor", "--require", "tpu"], "");
    assert_eq!(code, 2, "{out}");
}

#[test]
fn device_commands_without_a_driver_exit_2_naming_it() {
    for args in [
        vec!["cuda-check"],
        vec!["kernel-bench", "--backend", "cuda", "--quick"],
    ] {
        let (code, out) = kvbench(&args, "driver");
        assert_eq!(code, 2, "{args:?}: {out}");
        assert!(out.contains("CUDA driver (libcuda)"), "{args:?}: {out}");
        assert!(!out.contains("panicked"), "{args:?}: {out}");
    }
}

#[test]
fn kernel_bench_cuda_refuses_shapes_and_block_sizes_without_a_kernel_before_any_device_work() {
    let (code, out) = kvbench(
        &["kernel-bench", "--backend", "cuda", "--block-size", "12"],
        "driver",
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("power of two"), "{out}");
}

#[test]
fn run_backend_cuda_without_a_driver_exits_2_naming_it_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let o = out.to_str().expect("utf-8");
    let (code, text) = kvbench(
        &[
            "run",
            "scenarios/quick-basic.toml",
            "--backend",
            "cuda",
            "--out",
            o,
        ],
        "driver",
    );
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("backend unavailable: cuda: missing"),
        "{text}"
    );
    assert!(text.contains("CUDA driver (libcuda)"), "{text}");
    assert!(!out.exists(), "no half-written results");
}

#[test]
fn run_backend_auto_says_it_fell_back_to_cpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let o = out.to_str().expect("utf-8");
    let (code, text) = kvbench(
        &[
            "run",
            "scenarios/quick-basic.toml",
            "--backend",
            "auto",
            "--set",
            "traffic.requests=4",
            "--out",
            o,
        ],
        "driver",
    );
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("--backend auto: cuda unavailable"), "{text}");
    assert!(text.contains("falling back to cpu"), "{text}");
    let summary = std::fs::read_to_string(out.join("quick-basic").join("summary.json"))
        .or_else(|_| std::fs::read_to_string(out.join("summary.json")))
        .expect("summary.json");
    assert!(summary.contains("\"cpu\""), "ran on cpu: {summary}");
}
