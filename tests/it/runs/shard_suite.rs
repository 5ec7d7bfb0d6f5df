//! `kvbench suite --shard K/N` and `kvbench merge`: shards of a suite merge into the very table
//! the unsharded suite writes (on `sim`, byte for byte), with every cell's folder; merging
//! refuses overlapping shards, missing cells, other builds and other plans, writing nothing.

use std::path::Path;
use std::process::Command;

fn kvbench_env(args: &[String], revision: Option<&str>) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvbench"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args(args);
    match revision {
        Some(r) => cmd.env("KVBENCH_REVISION", r),
        None => cmd.env_remove("KVBENCH_REVISION"),
    };
    let out = cmd.output().expect("run kvbench");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn suite(out: &Path, shard: Option<&str>, extra: &[&str], revision: Option<&str>) {
    let mut args: Vec<String> = [
        "suite",
        "scenarios/quick-basic.toml",
        "scenarios/quick-mixed.toml",
        "--backend",
        "sim",
        "--check-every",
        "0",
        "--trace-level",
        "requests",
        "--seeds",
        "2",
        "--out",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(out.display().to_string());
    if let Some(s) = shard {
        args.extend(["--shard".to_string(), s.to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let (code, text) = kvbench_env(&args, revision);
    assert_eq!(code, 0, "{text}");
}

fn merge(shards: &[&Path], out: &Path) -> (i32, String) {
    let mut args = vec!["merge".to_string()];
    args.extend(shards.iter().map(|p| p.display().to_string()));
    args.extend(["--out".to_string(), out.display().to_string()]);
    kvbench_env(&args, None)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&read(p)).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

const CELLS: [&str; 4] = [
    "quick-basic-seed7",
    "quick-basic-seed8",
    "quick-mixed-seed11",
    "quick-mixed-seed12",
];

#[test]
fn three_shards_merge_to_the_unsharded_table() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let t = tmp.path();
    suite(&t.join("full"), None, &[], None);
    let shards: Vec<_> = (0..3).map(|k| t.join(format!("shard{k}"))).collect();
    for (k, dir) in shards.iter().enumerate() {
        suite(dir, Some(&format!("{k}/3")), &[], None);
        let meta = json(&dir.join("suite.json"));
        assert_eq!(meta["shard"]["index"], k as u64);
        assert_eq!(meta["plan"].as_array().map(Vec::len), Some(CELLS.len()));
        // Round-robin over the plan: cell i belongs to shard i mod 3.
        let held: Vec<&str> = CELLS.iter().copied().skip(k).step_by(3).collect();
        for cell in CELLS {
            assert_eq!(
                dir.join(cell).is_dir(),
                held.contains(&cell),
                "shard {k}: {cell}"
            );
        }
    }
    let merged = t.join("merged");
    // Given out of order: the table follows the plan, not the arguments.
    let (code, text) = merge(&[&shards[2], &shards[0], &shards[1]], &merged);
    assert_eq!(code, 0, "{text}");
    let full = t.join("full");
    for f in ["suite.csv", "suite.md"] {
        assert!(
            read(&full.join(f)) == read(&merged.join(f)),
            "{f} differs:\n--- unsharded\n{}\n--- merged\n{}",
            read(&full.join(f)),
            read(&merged.join(f))
        );
    }
    let csv = read(&merged.join("suite.csv"));
    assert_eq!(csv.lines().count(), 1 + 2 * CELLS.len(), "{csv}");
    let (a, b) = (
        json(&full.join("suite.json")),
        json(&merged.join("suite.json")),
    );
    for k in ["plan", "plan_hash", "results", "revision", "header"] {
        assert_eq!(a[k], b[k], "suite.json {k}");
    }
    assert_eq!(b["shard"], serde_json::Value::Null);
    assert_eq!(b["merged_from"].as_array().map(Vec::len), Some(3));
    for cell in CELLS {
        for f in ["summary.json", "report.md", "requests.csv", "report.html"] {
            assert!(
                read(&full.join(cell).join(f)) == read(&merged.join(cell).join(f)),
                "{cell}/{f} differs between the unsharded and the merged suite"
            );
        }
    }
    // The report works on the merged folder.
    let page = read(&merged.join("report.html"));
    assert!(page.contains("merged from 3 shards"), "{page}");
    assert!(page.matches("<svg ").count() >= 2);
    let (code, text) = kvbench_env(&["report".into(), merged.display().to_string()], None);
    assert_eq!(code, 0, "{text}");
}

#[test]
fn merge_refuses_shards_that_do_not_fit_together() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let t = tmp.path();
    let (s0, s1) = (t.join("s0"), t.join("s1"));
    suite(&s0, Some("0/2"), &[], None);
    suite(&s1, Some("1/2"), &[], None);
    let out = t.join("out");

    let (code, text) = merge(&[&s0], &out);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("2 of 4 cells missing"), "{text}");

    let copy = t.join("s0-again");
    suite(&copy, Some("0/2"), &[], None);
    let (code, text) = merge(&[&s0, &s1, &copy], &out);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("is in both"), "{text}");

    let other_build = t.join("s1-other");
    suite(&other_build, Some("1/2"), &[], Some("some other build"));
    let (code, text) = merge(&[&s0, &other_build], &out);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("mixed revisions"), "{text}");

    let other_plan = t.join("s1-plan");
    suite(
        &other_plan,
        Some("1/2"),
        &["--set", "traffic.requests=20"],
        None,
    );
    let (code, text) = merge(&[&s0, &other_plan], &out);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("different suites"), "{text}");

    assert!(!out.exists(), "a refused merge wrote {}", out.display());
    let leftovers: Vec<_> = std::fs::read_dir(t)
        .expect("ls")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporary folders left: {leftovers:?}"
    );

    let (code, text) = merge(&[&s0, &s1], &out);
    assert_eq!(code, 0, "{text}");
    let (code, text) = merge(&[&s0, &s1], &out);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("output folder exists"), "{text}");
}

#[test]
fn a_shard_outside_its_count_is_bad_input() {
    let args: Vec<String> = ["suite", "--backend", "sim", "--shard", "2/2"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (code, text) = kvbench_env(&args, None);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("K 0-based"), "{text}");
}
