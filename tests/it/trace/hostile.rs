//! Traces as hostile input, through the binary: an empty, header-only or fully windowed-out
//! trace is refused (exit 2, no results) instead of "running" 0 requests; `trace stats` refuses
//! a FIFO and `/dev/zero` as `run` does (it hung on them); dates and times that do not exist are
//! refused with file:line; a scaled arrival past the clock's horizon is refused at load naming
//! its row; `--trace` keeps the scenario's own trace keys; a replay cut by `traffic.requests`
//! says so in the report, and a window inherited from a synthetic scenario warns on stderr.

use crate::support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::kvbench;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write fixture");
    p.display().to_string()
}

fn run_trace(scenario: &str, trace: &str, out: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec![
        "run",
        scenario,
        "--backend",
        "sim",
        "--trace",
        trace,
        "--out",
        out.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    kvbench(&args)
}

#[test]
fn a_trace_with_nothing_to_replay_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        ("empty.csv", "", "no data rows"),
        (
            "header.csv",
            "arrival_ms,prompt_tokens,output_tokens\n",
            "no data rows",
        ),
    ];
    for (name, text, want) in cases {
        let f = write(tmp.path(), name, text);
        let out = tmp.path().join(format!("out-{name}"));
        let (code, text) = run_trace("scenarios/trace-csv.toml", &f, &out, &[]);
        assert_eq!(code, 2, "{name}: {text}");
        assert!(text.contains(&f) && text.contains(want), "{name}: {text}");
        assert!(!text.contains("All checks passed"), "{name}: {text}");
        assert!(!out.join("summary.json").exists(), "{name}: no results");
    }
    // A window past the trace's end.
    let f = write(
        tmp.path(),
        "short.csv",
        "arrival_ms,prompt_tokens,output_tokens\n0,100,10\n5,120,12\n",
    );
    let out = tmp.path().join("out-window");
    let (code, text) = run_trace(
        "scenarios/trace-csv.toml",
        &f,
        &out,
        &["--set", "traffic.arrival.start_s=60"],
    );
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("none of its 2 rows"), "{text}");
    assert!(text.contains("2 before start_s = 60 s"), "{text}");
    assert!(!out.join("summary.json").exists());
}

/// Runs `kvbench trace stats FILE`, killing it after 60 s (it used to block forever).
fn stats_with_deadline(file: &str) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args(["trace", "stats", file])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let out = child.wait_with_output().expect("output");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return (status.code(), text);
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            return (None, "still running after 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn trace_stats_refuses_what_is_not_a_regular_file() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("fifo.csv");
    let made = Command::new("mkfifo").arg(&fifo).status();
    let mut files = vec!["/dev/zero".to_string()];
    match made {
        Ok(s) if s.success() => files.push(fifo.display().to_string()),
        // Printed, not hidden: the FIFO half did not run here.
        _ => println!("SKIP: no mkfifo on this machine; the FIFO case did not run"),
    }
    files.push(tmp.path().display().to_string());
    for f in &files {
        let (code, text) = stats_with_deadline(f);
        assert_eq!(code, Some(2), "{f}: {text}");
        assert!(text.contains("not a regular file"), "{f}: {text}");
    }
    // `run` gives the same sentence.
    let out = tmp.path().join("out");
    let (code, text) = run_trace("scenarios/trace-csv.toml", "/dev/zero", &out, &[]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("not a regular file"), "{text}");
}

#[test]
fn dates_and_times_that_do_not_exist_are_refused_with_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, stamp) in [
        ("feb29.csv", "2023-02-29 10:00:00.0000000"),
        ("apr31.csv", "2023-04-31 10:00:00.0000000"),
        ("second60.csv", "2023-11-16 18:15:60.0000000"),
    ] {
        let f = write(
            tmp.path(),
            name,
            &format!(
                "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:00.0000000,100,10\n{stamp},100,10\n"
            ),
        );
        let (code, text) = kvbench(&["trace", "stats", &f]);
        assert_eq!(code, 2, "{name}: {text}");
        assert!(text.contains(&format!("{f}:3:1:")), "{name}: {text}");
    }
    // A leap day that exists reads.
    let f = write(
        tmp.path(),
        "leap.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-02-29 23:59:59.5,100,10\n",
    );
    let (code, text) = kvbench(&["trace", "stats", &f]);
    assert_eq!(code, 0, "{text}");
}

#[test]
fn a_scaled_arrival_past_the_clock_horizon_is_refused_naming_its_row() {
    let tmp = tempfile::tempdir().unwrap();
    let f = write(
        tmp.path(),
        "far.csv",
        "arrival_ms,prompt_tokens,output_tokens\n0,100,10\n5,100,10\n200000,100,10\n",
    );
    let out = tmp.path().join("out");
    let (code, text) = run_trace(
        "scenarios/trace-csv.toml",
        &f,
        &out,
        &["--time-scale", "1000000"],
    );
    assert_eq!(code, 2, "{text}");
    assert!(text.contains(&format!("{f}:4:1:")), "{text}");
    assert!(text.contains("time_scale"), "{text}");
    assert_eq!(text.matches(&format!("{f}:4:1:")).count(), 1, "{text}");
    assert!(!out.join("summary.json").exists());
}

fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).expect("summary"))
        .expect("json")
}

#[test]
fn the_trace_flag_keeps_the_scenarios_trace_keys() {
    // trace-burstgpt filters on model and log type and replays failed rows as cancellations.
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("plain");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/trace-burstgpt.toml",
        "--backend",
        "sim",
        "--out",
        plain.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let flagged = tmp.path().join("flagged");
    let (code, text) = run_trace(
        "scenarios/trace-burstgpt.toml",
        "scenarios/traces/burstgpt-mini.csv",
        &flagged,
        &[],
    );
    assert_eq!(code, 0, "{text}");
    let (a, b) = (summary(&plain), summary(&flagged));
    for key in [
        "replayed",
        "filtered_rows",
        "failed_skipped",
        "failed_cancelled",
    ] {
        assert_eq!(a["trace"][key], b["trace"][key], "{key}");
    }
    assert!(b["trace"]["filtered_rows"].as_u64().unwrap_or(0) > 0);
    assert!(b["trace"]["failed_cancelled"].as_u64().unwrap_or(0) > 0);
    let csv = |d: &Path| std::fs::read_to_string(d.join("requests.csv")).expect("requests.csv");
    assert_eq!(csv(&plain), csv(&flagged));
}

#[test]
fn a_replay_cut_by_the_request_count_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    // A synthetic scenario: its request count becomes the replay's cap, with a warning.
    let (code, text) = run_trace(
        "scenarios/chat-8b-h200.toml",
        "scenarios/traces/azure-mini.csv",
        &out,
        &["--set", "traffic.requests=5"],
    );
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("warning: chat-8b-h200: --trace"), "{text}");
    assert!(text.contains("traffic.requests = 5 rows at most"), "{text}");
    let line = "5 of 12 rows replayed; left out: 7 past the cap traffic.requests = 5";
    assert!(text.contains(line), "{text}");
    assert!(text.contains("azure-mini.csv` (azure)"), "{text}");
    assert!(text.contains("rejected at arrival"), "{text}");
    let report = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(report.contains(line), "{report}");
    let s = summary(&out);
    assert_eq!(s["trace"]["past_requests"], 7);
    assert_eq!(s["trace"]["outside_window"], 7);
    // A trace scenario's own window is no surprise: no warning.
    let out2 = tmp.path().join("out2");
    let (code, text) = run_trace(
        "scenarios/trace-csv.toml",
        "scenarios/traces/plain-mini.csv",
        &out2,
        &["--set", "traffic.requests=3"],
    );
    assert_eq!(code, 0, "{text}");
    assert!(!text.contains("warning"), "{text}");
    assert!(text.contains("3 of 10 rows replayed"), "{text}");
}
