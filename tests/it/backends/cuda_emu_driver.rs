//! The emulated device behaving as a driver does: `cuMemGetInfo` that moves for the driver's own
//! reasons (`--emu-driver-noise`), and a reported driver version that hides the entry points it
//! lacks (`--emu-driver`). Runs pass under the noise, a planted one-block device leak still fails
//! on kvbench's exact count, and the reconciliation in `summary.json` is the one printed, term by
//! term. Through the CLI: the planted leak and the driver settings are process-wide.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::kvbench;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvbench-emu-driver-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn run(out: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec![
        "run",
        "scenarios/quick-basic.toml",
        "--backend",
        "cuda-emu",
        "--clock",
        "model",
        "--set",
        "traffic.requests=4",
        "--out",
        out.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    kvbench(&args)
}

fn summary(out: &Path) -> Value {
    let text = std::fs::read_to_string(out.join("summary.json")).expect("summary.json");
    serde_json::from_str(&text).expect("summary.json parses")
}

fn int(v: &Value, key: &str) -> i64 {
    v[key]
        .as_i64()
        .unwrap_or_else(|| panic!("{key} is an integer in {v}"))
}

#[test]
fn runs_pass_under_driver_noise_and_the_printed_reconciliation_is_the_summarys() {
    let seed = 5;
    eprintln!("driver noise seed {seed}");
    let d = dir("noise");
    let out = d.join("run");
    let (code, text) = run(&out, &["--emu-driver-noise", &seed.to_string()]);
    assert_eq!(code, 0, "driver noise alone must never fail a run: {text}");
    let s = summary(&out);
    for r in s["runs"].as_array().expect("runs") {
        let m = &r["memory"];
        let dev = &m["device"];
        assert_eq!(dev["emu_driver_noise_seed"], seed, "{dev}");
        // Recomputed from the file: unaccounted = used − kvbench; residue = unaccounted − warm-up.
        let unaccounted = int(dev, "device_used_bytes") - int(dev, "kvbench_bytes");
        assert_eq!(int(m, "device_unaccounted_bytes"), unaccounted, "{m}");
        assert_eq!(int(dev, "unaccounted_bytes"), unaccounted, "{dev}");
        assert_eq!(
            int(dev, "residue_bytes"),
            unaccounted - int(dev, "driver_warmup_bytes"),
            "{dev}"
        );
        assert_eq!(
            int(dev, "device_used_bytes"),
            int(dev, "baseline_free_bytes") - int(dev, "free_bytes"),
            "{dev}"
        );
        // The driver moved: a warm-up take and another process's allocation mid-run.
        assert!(int(dev, "driver_warmup_bytes") > 0, "{dev}");
        assert!(int(dev, "residue_bytes") > 0, "{dev}");
        assert_eq!(dev["residue_ok"], true, "{dev}");
        // The printed line states the same figures, sign included.
        let line = format!(
            "residue {} B; unaccounted {unaccounted} B; tolerance {} B",
            int(dev, "residue_bytes"),
            int(dev, "tolerance_bytes")
        );
        assert!(
            text.contains(&line),
            "printed reconciliation lacks {line:?}: {text}"
        );
        assert!(
            dev["tolerance"]
                .as_str()
                .is_some_and(|t| t.contains("driver allowance")),
            "{dev}"
        );
        assert_eq!(r["reclamation"]["ok"], true, "{r}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_planted_one_block_leak_fails_under_driver_noise() {
    let d = dir("leak");
    for fault in ["device-leak", "leak"] {
        let out = d.join(fault);
        let (code, text) = run(&out, &["--emu-driver-noise", "9", "--inject-fault", fault]);
        assert_eq!(code, 1, "{fault}: {text}");
        let verdict = format!("planted fault `{fault}` fired");
        assert!(
            text.contains(&verdict) && text.contains("caught: "),
            "{fault}: no attribution: {text}"
        );
        let s = summary(&out);
        let paged = &s["runs"][0];
        assert_eq!(paged["reclamation"]["ok"], false, "{fault}: {paged}");
        if fault == "device-leak" {
            let detail = paged["reclamation"]["detail"].as_str().expect("detail");
            assert!(detail.contains("kvbench holds"), "{detail}");
            let leak = int(&paged["memory"]["device"], "planted_leak_bytes");
            assert!(leak > 0, "{paged}");
        }
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_driver_before_12_8_runs_timing_events_with_the_older_call() {
    let d = dir("v124");
    let out = d.join("run");
    let (code, text) = run(&out, &["--emu-driver", "12.4"]);
    assert_eq!(code, 0, "{text}");
    assert!(!text.contains("panicked"), "{text}");
    let dev = &summary(&out)["runs"][0]["memory"]["device"];
    assert_eq!(dev["driver_version"], "12.4", "{dev}");
    assert_eq!(dev["event_timing_call"], "cuEventElapsedTime", "{dev}");
    let (code, text) = run(&d.join("bad"), &["--emu-driver", "11.0"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--emu-driver"), "{text}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_device_leak_without_a_device_is_refused_naming_the_flag() {
    let d = dir("sim");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/quick-basic.toml",
        "--backend",
        "sim",
        "--inject-fault",
        "device-leak",
        "--out",
        d.join("run").to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--inject-fault device-leak") && text.contains("cuda-emu"),
        "{text}"
    );
    assert!(!d.join("run").exists(), "nothing written for a refused run");
    let _ = std::fs::remove_dir_all(&d);
}
