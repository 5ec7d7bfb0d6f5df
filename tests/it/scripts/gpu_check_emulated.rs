//! `scripts/gpu-check.sh --emulated` on the emulated device: the output folder holds exactly
//! one archive and one summary.md, the summary lists every step of the GPU check in its order
//! (each run, or skipped with a reason), and the documented unpack command yields the logs and
//! scenario results. A stand-in binary that "passes" everything shows the check can fail: the
//! planted faults are then not caught, and the script says so and exits 1.
//!
//! CI runs a subset of the steps (KVBENCH_GPU_CHECK_ONLY) to stay within its time budget; the
//! full emulated check is `scripts/gpu-check.sh --emulated OUTPUT_FOLDER target/debug/kvbench`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every step of the GPU check, in the order the script runs them (the GPU names of the
/// sanitizer steps are `memcheck`/`racecheck`; emulated, one `compute_sanitizer` line).
const ORDER: [&str; 17] = [
    "doctor",
    "cuda_check",
    "kernel_bench",
    "kernel_bench_window",
    "peer_sdpa",
    "e2e_quick_basic",
    "e2e_quick_mixed",
    "e2e_quick_mixed_async",
    "e2e_conversation_quick",
    "e2e_tiny_sliding",
    "fault_skip-cow",
    "fault_early-reuse",
    "fault_leak",
    "fault_bad-block-table",
    "fault_device-leak",
    "compute_sanitizer",
    "e2e_chat_8b",
];

/// The steps CI runs: a scenario on the emulated device takes minutes of CPU, so one (the
/// faults' exit codes are covered by the stand-in test below), and the quick cuda-check grid.
const SELECTED: &str = "doctor,cuda_check,e2e_quick_basic";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fresh(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

fn gpu_check(out: &Path, bin: &Path, only: Option<&str>) -> (i32, String) {
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("scripts/gpu-check.sh"))
        .arg("--emulated")
        .arg(out)
        .arg(bin)
        .env("KVBENCH_GPU_BUDGET_S", "460");
    match only {
        Some(o) => cmd.env("KVBENCH_GPU_CHECK_ONLY", o),
        None => cmd.env_remove("KVBENCH_GPU_CHECK_ONLY"),
    };
    let o = cmd.output().expect("run gpu-check.sh");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code().unwrap_or(-1), text)
}

/// The summary's step rows: (name, verdict, note).
fn steps(summary: &str) -> Vec<(String, String, String)> {
    summary
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| step ") && !l.starts_with("|---"))
        .map(|l| {
            l.split('|')
                .map(|c| c.trim().to_string())
                .collect::<Vec<_>>()
        })
        .filter(|c| c.len() >= 8 && ORDER.contains(&c[1].as_str()))
        .map(|c| (c[1].clone(), c[2].clone(), c[6].clone()))
        .collect()
}

fn only_archive_and_summary(out: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(out)
        .expect("output folder")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["gpu-check.tar.gz", "summary.md"],
        "{}",
        out.display()
    );
    std::fs::read_to_string(out.join("summary.md")).expect("summary.md")
}

/// The README's unpack command, run in a scratch copy of the results layout.
fn unpack(out: &Path, into: &Path) -> PathBuf {
    let st = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "mkdir -p results/gpu && tar -xzf {} -C results/gpu",
            out.join("gpu-check.tar.gz").display()
        ))
        .current_dir(into)
        .status()
        .expect("tar");
    assert!(st.success());
    into.join("results/gpu")
}

#[test]
fn the_emulated_gpu_check_packs_one_archive_and_one_summary_with_every_step() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_kvbench"));
    let probe = Command::new(&bin)
        .args(["run", "--help"])
        .output()
        .expect("kvbench run --help");
    if !String::from_utf8_lossy(&probe.stdout).contains("cuda-emu") {
        eprintln!(
            "SKIP: this kvbench has no --backend cuda-emu (kvbench run --help does not offer it)"
        );
        return;
    }
    let tmp = fresh("gpu_check_emulated");
    let out = tmp.join("out");
    let (rc, text) = gpu_check(&out, &bin, Some(SELECTED));
    let summary = only_archive_and_summary(&out);
    assert!(summary.contains("EMULATED"), "{summary}");
    let rows = steps(&summary);
    let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(names, ORDER, "every step, in order:\n{summary}");
    for (name, verdict, note) in &rows {
        if SELECTED.split(',').any(|s| s == name) {
            assert_eq!(verdict, "ok", "{name}: {note}\n{summary}\n{text}");
        } else {
            assert_eq!(verdict, "skipped", "{name}\n{summary}");
            assert!(!note.is_empty(), "{name} skipped without a reason");
        }
    }
    assert_eq!(rc, 0, "{text}");
    let res = unpack(&out, &tmp);
    for f in [
        "cuda_check.csv",
        "summary.md",
        "steps.tsv",
        "environment.txt",
        "doctor.log",
        "e2e_quick_basic.log",
    ] {
        assert!(res.join(f).is_file(), "{f} missing from the archive");
    }
    let run: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(res.join("e2e/quick-basic/summary.json")).expect("summary.json"),
    )
    .expect("json");
    assert_eq!(run["backend"], "cuda-emu");
    assert_eq!(run["checks"]["ok"], true, "{run}");
    assert!(summary.contains("checks passed"), "{summary}");
    assert!(
        summary.contains("| quick-basic | cuda-emu | ok"),
        "{summary}"
    );
}

#[test]
fn a_binary_that_catches_nothing_fails_the_check_and_the_summary_says_which_steps() {
    let tmp = fresh("gpu_check_stand_in");
    // Exits 0 for everything: scenarios "pass", planted faults go uncaught.
    let stub = tmp.join("kvbench");
    std::fs::write(
        &stub,
        "#!/bin/sh\n[ \"$1\" = --version ] && echo stand-in\nexit 0\n",
    )
    .expect("stub");
    let st = Command::new("chmod")
        .arg("+x")
        .arg(&stub)
        .status()
        .expect("chmod");
    assert!(st.success());
    let out = tmp.join("out");
    let (rc, text) = gpu_check(&out, &stub, None);
    assert_eq!(rc, 1, "{text}");
    let summary = only_archive_and_summary(&out);
    let rows = steps(&summary);
    let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(names, ORDER, "{summary}");
    for (name, verdict, _) in &rows {
        let want = if name.starts_with("fault_") {
            "FAILED"
        } else if name.starts_with("e2e_quick")
            || name.starts_with("e2e_conv")
            || name == "e2e_tiny_sliding"
            || name == "doctor"
        {
            "ok"
        } else {
            "skipped"
        };
        assert_eq!(verdict, want, "{name}\n{summary}");
    }
    assert!(summary.contains("5 failed"), "{summary}");
    // Exit 0 where 1 was wanted, and no line naming the fault: never "caught".
    assert!(
        summary.contains("exit 0 without the planted fault named as the cause"),
        "{summary}"
    );
    // A second run into the same folder replaces the first, leaving the same two files.
    let (rc2, _) = gpu_check(&out, &stub, Some("doctor"));
    assert_eq!(rc2, 0);
    let again = only_archive_and_summary(&out);
    assert!(again.contains("1 ok, 0 failed, 16 skipped"), "{again}");
    // Usage errors exit 2 and write nothing.
    let o = Command::new("bash")
        .arg(repo().join("scripts/gpu-check.sh"))
        .arg("--emulated")
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(2));
}

/// A stand-in binary for the fault steps: exit 1, with the run's own verdict line as given.
fn fault_stub(dir: &Path, verdict: &str) -> PathBuf {
    let stub = dir.join("kvbench");
    let script = format!(
        "#!/bin/sh\n[ \"$1\" = --version ] && echo stand-in\n\
         for a in \"$@\"; do [ \"$prev\" = --inject-fault ] && f=$a; prev=$a; done\n\
         [ -n \"$f\" ] && {{ echo \"quick-mixed: planted fault \\`$f\\` {verdict}\"; exit 1; }}\n\
         exit 0\n"
    );
    std::fs::write(&stub, script).expect("stub");
    let st = Command::new("chmod")
        .arg("+x")
        .arg(&stub)
        .status()
        .expect("chmod");
    assert!(st.success());
    stub
}

#[test]
fn a_fault_step_passes_only_when_the_run_names_its_fault_as_the_cause() {
    let faults = "fault_skip-cow,fault_leak,fault_device-leak";
    let tmp = fresh("gpu_check_fault_attribution");
    let caught = fault_stub(&tmp, "fired 3 times, caught: paged: reclamation failed: x");
    let (rc, text) = gpu_check(&tmp.join("caught"), &caught, Some(faults));
    assert_eq!(rc, 0, "{text}");
    let summary = only_archive_and_summary(&tmp.join("caught"));
    for (name, verdict, note) in steps(&summary) {
        if name.starts_with("fault_") && faults.contains(&name) {
            assert_eq!(verdict, "ok", "{name}: {summary}");
            assert!(
                note.starts_with("caught: paged: reclamation failed"),
                "{note}"
            );
        }
    }
    let silent = tmp.join("silent");
    std::fs::create_dir_all(&silent).expect("dir");
    let stub = fault_stub(&silent, "did not fire");
    let (rc, text) = gpu_check(&tmp.join("silent-out"), &stub, Some(faults));
    assert_eq!(rc, 1, "{text}");
    let summary = only_archive_and_summary(&tmp.join("silent-out"));
    let failed: Vec<_> = steps(&summary)
        .into_iter()
        .filter(|(n, _, _)| faults.contains(n.as_str()))
        .collect();
    assert_eq!(failed.len(), 3, "{summary}");
    for (name, verdict, note) in failed {
        assert_eq!(
            (verdict.as_str(), note.as_str()),
            ("FAILED", "did not fire"),
            "{name}"
        );
    }
}

#[test]
fn the_step_caps_are_stated_checked_and_within_360_seconds() {
    let script = std::fs::read_to_string(repo().join("scripts/gpu-check.sh")).expect("script");
    let stated: u64 = script
        .lines()
        .find_map(|l| l.strip_prefix("CAPS_SUM_S="))
        .and_then(|v| v.trim().parse().ok())
        .expect("CAPS_SUM_S stated");
    let caps: u64 = script
        .split("declare -A CAP=(")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .expect("CAP table")
        .split_whitespace()
        .filter_map(|kv| kv.split('=').nth(1)?.parse::<u64>().ok())
        .sum();
    assert_eq!(caps, stated);
    assert!(stated <= 360, "{stated}");
    assert!(
        script.contains(&format!("caps sum to {stated} s")),
        "the header states the sum"
    );
}

#[test]
fn a_check_killed_mid_step_leaves_a_valid_archive_and_summary_of_the_steps_done() {
    use std::os::unix::process::CommandExt;
    let tmp = fresh("gpu_check_killed");
    // Its scenarios never end: the check is killed inside the first one.
    let stub = tmp.join("kvbench");
    std::fs::write(
        &stub,
        "#!/bin/sh\n[ \"$1\" = --version ] && echo stand-in\n[ \"$1\" = run ] && exec sleep 300\nexit 0\n",
    )
    .expect("stub");
    let st = Command::new("chmod")
        .arg("+x")
        .arg(&stub)
        .status()
        .expect("chmod");
    assert!(st.success());
    let out = tmp.join("out");
    let mut child = Command::new("bash")
        .arg(repo().join("scripts/gpu-check.sh"))
        .arg("--emulated")
        .arg(&out)
        .arg(&stub)
        .env_remove("KVBENCH_GPU_CHECK_ONLY")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .expect("spawn gpu-check.sh");
    // Wait until the doctor step's row is saved: up to five minutes, as the script's set-up
    // shares two cores with the rest of the suite (it is seconds on a quiet machine).
    let mut saved = false;
    for _ in 0..3000 {
        let s = std::fs::read_to_string(out.join("summary.md")).unwrap_or_default();
        if s.contains("| doctor | ok") {
            saved = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let pg = format!("-{}", child.id());
    let st = Command::new("kill")
        .args(["-KILL", "--", &pg])
        .status()
        .expect("kill");
    assert!(st.success());
    let _ = child.wait();
    assert!(saved, "the doctor step's row was never saved");
    let list = Command::new("tar")
        .arg("-tzf")
        .arg(out.join("gpu-check.tar.gz"))
        .output()
        .expect("tar");
    assert!(list.status.success(), "the archive is not a valid tar.gz");
    let names = String::from_utf8_lossy(&list.stdout);
    assert!(
        names.contains("doctor.log") && names.contains("summary.md"),
        "{names}"
    );
    let summary = std::fs::read_to_string(out.join("summary.md")).expect("summary.md");
    assert!(summary.contains("| doctor | ok"), "{summary}");
}
