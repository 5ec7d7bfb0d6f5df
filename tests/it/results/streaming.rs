//! The streaming run (engine → sink → accumulators and writers as the run goes) against the
//! collect path (a whole `RunRecord`, then `metrics::compute` and the writers): the same metrics
//! and byte-identical files, on named scenarios (sessions, cancellations, forks, trace replay)
//! and on random fuzz scenarios; and `memory.csv` sampled to a bound keeps the exact peaks.

use std::path::{Path, PathBuf};

use kvbench::experiment::{self, RunOptions};
use kvbench::metrics::timeline::Resolution;
use kvbench::results::marker::Kind;
use kvbench::results::{self, Staging};
use kvbench::scenario::Scenario;
use proptest::prelude::*;

const FILES: [&str; 6] = [
    "summary.json",
    "report.md",
    "requests.csv",
    "trace.jsonl",
    "memory.csv",
    "trace.perfetto.json",
];

fn scenario(name: &str, overrides: &[&str]) -> Scenario {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"));
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    kvbench::scenario::load(&path, &o).expect("scenario loads")
}

/// Run `s` both ways into `root/{collect,stream}`; panics naming the first file that differs.
fn both_paths(root: &Path, s: &Scenario, opts: &RunOptions, what: &str) {
    both_paths_files(root, s, opts, what, &FILES)
}

fn both_paths_files(root: &Path, s: &Scenario, opts: &RunOptions, what: &str, files: &[&str]) {
    let (a, b) = (root.join("collect"), root.join("stream"));
    let collected = experiment::run_scenario(s, opts).expect("collect run");
    results::write(&collected, &a, true, opts.trace_tokens).expect("collect write");
    let staging = Staging::begin(&b, Kind::Run, true).expect("staging");
    let streamed = experiment::run_streaming(s, opts, staging).expect("streaming run");
    for (x, y) in collected.runs.iter().zip(&streamed.runs) {
        assert_eq!(
            x.metrics,
            y.metrics,
            "{what}: metrics of {}",
            x.end.mode.name()
        );
        let mut end = x.end.clone();
        end.peak_live_streams = y.end.peak_live_streams;
        end.host_overhead_s = y.end.host_overhead_s;
        assert_eq!(end, y.end, "{what}: run outcome");
        assert_eq!(x.files, y.files, "{what}: file layout");
        assert!(y.record.is_none());
    }
    assert_eq!(collected.token_mismatch, streamed.token_mismatch);
    for &f in files {
        let (x, y) = (
            std::fs::read(a.join(f)).expect("collect file"),
            std::fs::read(b.join(f)).expect("stream file"),
        );
        if x != y {
            let at = x.iter().zip(&y).position(|(p, q)| p != q).unwrap_or(0);
            let show = |v: &[u8]| {
                String::from_utf8_lossy(&v[at.saturating_sub(200)..(at + 200).min(v.len())])
                    .into_owned()
            };
            panic!(
                "{what}: {f} differs at byte {at} ({} vs {} bytes)\ncollect: …{}…\nstream:  …{}…",
                x.len(),
                y.len(),
                show(&x),
                show(&y)
            );
        }
    }
}

#[test]
fn streaming_and_collect_paths_write_identical_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cases: [(&str, &[&str], bool); 7] = [
        ("quick-mixed", &[], true),
        ("conversation-quick", &[], true),
        ("cancel-storm-8b-h200", &["traffic.requests=150"], false),
        ("parallel-sampling-8b-h200", &["traffic.requests=60"], true),
        ("trace-mooncake", &[], false),
        ("trace-burstgpt", &[], true),
        (
            "chat-8b-h200",
            &["traffic.requests=80", "scheduler.preemption=\"swap\""],
            false,
        ),
    ];
    for (i, (name, overrides, tokens)) in cases.iter().enumerate() {
        let opts = RunOptions {
            trace_tokens: *tokens,
            invariant_check_every: 0,
            ..RunOptions::default()
        };
        both_paths(
            &tmp.path().join(i.to_string()),
            &scenario(name, overrides),
            &opts,
            name,
        );
    }
}

/// On a computing backend (cpu, its clock by the cost model so the schedule is repeatable) the
/// streaming path compares token ids across modes as the collect path does, and its files and
/// metrics equal the collect path's.
#[test]
fn a_cpu_streaming_run_compares_tokens_like_the_collect_path() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let s = scenario("quick-basic", &["traffic.requests=10"]);
    let opts = RunOptions {
        backend: kvbench::backend::BackendKind::Cpu,
        clock: kvbench::backend::Clock::Model,
        invariant_check_every: 0,
        ..RunOptions::default()
    };
    // summary.json and report.md hold wall-clock step times on cpu: the data files are compared.
    both_paths_files(tmp.path(), &s, &opts, "cpu", &FILES[2..]);
    let exp = experiment::run_streaming(
        &s,
        &opts,
        Staging::begin(&tmp.path().join("again"), Kind::Run, true).expect("staging"),
    )
    .expect("cpu run");
    assert_eq!(exp.backend, "cpu");
    assert!(exp.runs.iter().all(|r| r.end.computes));
    assert_eq!(exp.failures(), Vec::<String>::new());
}

fn csv_rows(path: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(path).expect("read");
    text.lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

#[test]
fn sampled_memory_rows_stay_bounded_and_keep_the_exact_peaks() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let s = scenario("chat-8b-h200", &["traffic.requests=120"]);
    let max_rows = 40;
    let opts = RunOptions {
        trace_tokens: false,
        invariant_check_every: 0,
        memory_resolution: Resolution::Auto { max_rows },
        ..RunOptions::default()
    };
    // Both paths sample alike...
    both_paths(tmp.path(), &s, &opts, "sampled");
    // ...and against every step, the sampled file keeps each mode's peaks.
    let every = tmp.path().join("every");
    let exact = RunOptions {
        memory_resolution: Resolution::EveryStep,
        ..opts.clone()
    };
    let exp = experiment::run_streaming(
        &s,
        &exact,
        Staging::begin(&every, Kind::Run, true).expect("staging"),
    )
    .expect("run");
    let sampled = csv_rows(&tmp.path().join("stream/memory.csv"));
    let full = csv_rows(&every.join("memory.csv"));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("stream/summary.json")).unwrap())
            .unwrap();
    for (i, run) in exp.runs.iter().enumerate() {
        let cache = run.end.mode.name();
        let pick = |rows: &[Vec<String>], col: usize| -> Vec<u64> {
            rows.iter()
                .filter(|r| r[0] == cache)
                .map(|r| r[col].parse().expect("integer"))
                .collect()
        };
        assert_eq!(pick(&full, 1).len() as u64, run.end.steps, "a row per step");
        let rows = pick(&sampled, 1).len();
        assert!(
            rows <= max_rows && rows > 1,
            "{cache}: {rows} rows for {} steps",
            run.end.steps
        );
        // kv_live (5), kv_allocated_unfilled (6), running (3), other (11): peaks equal.
        for col in [3, 5, 6, 7, 11] {
            assert_eq!(
                pick(&sampled, col).iter().max(),
                pick(&full, col).iter().max(),
                "{cache}: column {col}"
            );
        }
        let m = &run.metrics.ledger;
        assert_eq!(
            pick(&sampled, 5).iter().max().copied(),
            Some(m.kv_peak_live_bytes)
        );
        let r = &summary["runs"][i];
        let res = r["memory_resolution_ms"]
            .as_f64()
            .expect("resolution stated");
        assert!(res >= 1.0 && (res as u64).is_power_of_two(), "{res}");
        assert_eq!(r["memory_rows"].as_u64(), Some(rows as u64));
        // The last row ends at the last step.
        assert_eq!(pick(&sampled, 1).last(), pick(&full, 1).last());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Accumulators equal `metrics::compute`, and the files equal, on random fuzz scenarios
    /// (bursts, closed loops, cancellations at every point, forks, prefixes, swaps, async steps).
    /// proptest prints the failing seed; `kvbench fuzz --seed N` shows its scenario.
    #[test]
    fn accumulated_metrics_and_files_equal_the_collect_path(seed in any::<u64>()) {
        println!("fuzz seed {seed}");
        let text = kvbench::experiment::fuzz::case_toml(seed);
        let Ok(s) = kvbench::scenario::parse_str(&text, None, &[]) else {
            return Ok(());
        };
        let tmp = tempfile::tempdir().expect("tempdir");
        let opts = RunOptions {
            invariant_check_every: 0,
            trace_tokens: seed % 2 == 0,
            memory_resolution: if seed % 3 == 0 {
                Resolution::Auto { max_rows: 8 }
            } else {
                Resolution::default()
            },
            ..RunOptions::default()
        };
        if experiment::run_scenario(&s, &opts).is_err() {
            return Ok(()); // infeasible for the generator's reasons, not this test's
        }
        both_paths(tmp.path(), &s, &opts, &format!("fuzz seed {seed}"));
    }
}

/// A streaming run that fails after its files were opened (here: a bad trace row, found when
/// the workload is generated) leaves no results folder and no temporary beside it.
#[test]
fn a_failed_streaming_run_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    std::fs::create_dir(tmp.path().join("traces")).expect("mkdir");
    std::fs::copy(root.join("trace-azure.toml"), tmp.path().join("s.toml")).expect("copy");
    let good = std::fs::read_to_string(root.join("traces/azure-mini.csv")).expect("fixture");
    std::fs::write(
        tmp.path().join("traces/azure-mini.csv"),
        format!("{good}2023-11-16 18:16:00.0000000,12,not-a-number\n"),
    )
    .expect("write");
    let s = kvbench::scenario::load(&tmp.path().join("s.toml"), &[]).expect("scenario loads");
    let out = tmp.path().join("out");
    let staging = Staging::begin(&out, Kind::Run, false).expect("staging");
    let err = match experiment::run_streaming(&s, &RunOptions::default(), staging) {
        Ok(_) => panic!("a bad trace row must fail the run"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("azure-mini.csv"), "{err}");
    assert!(!out.exists(), "no results folder");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let mut left = left;
    left.sort();
    assert_eq!(left, ["s.toml", "traces"], "nothing but the inputs is left");
}
