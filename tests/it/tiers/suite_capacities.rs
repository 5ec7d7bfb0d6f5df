//! `kvbench suite` over a scenario listing several host-tier capacities runs one cell per
//! capacity, each at that capacity (its `summary.json` says so), labels the table's rows with it,
//! and a sharded run of those cells merges into the unsharded table byte for byte.

use std::path::Path;

const SCENARIO: &str = "scenarios/conversation-tiered-8b-h200.toml";
const NAME: &str = "conversation-tiered-8b-h200";

use crate::support;

/// The binary from the repository root, under one revision name so shards merge.
fn kvbench(args: &[String]) -> (i32, String) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    support::kvbench_env(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        &[("KVBENCH_REVISION", "suite-tier-capacities-test")],
        &args,
    )
}

/// The suite over the tiered scenario, shortened for a test (the `--set` reaches every capacity's
/// variant, as it reaches every block size's).
fn suite(out: &Path, shard: Option<&str>) {
    let mut args: Vec<String> = [
        "suite",
        SCENARIO,
        "--backend",
        "sim",
        "--check-every",
        "0",
        "--trace-level",
        "requests",
        "--set",
        "traffic.requests=12",
        "--out",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(out.display().to_string());
    if let Some(s) = shard {
        args.extend(["--shard".to_string(), s.to_string()]);
    }
    let (code, text) = kvbench(&args);
    assert_eq!(code, 0, "{text}");
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The capacities the scenario file lists, as written.
fn listed_capacities() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(SCENARIO);
    let doc: toml::Value = toml::from_str(&read(&path)).expect("scenario toml");
    let caps: Vec<String> = doc["cache"]["host_tier"]["capacity"]
        .as_array()
        .expect("a capacity list")
        .iter()
        .map(|v| v.as_str().expect("a capacity string").to_string())
        .collect();
    assert!(caps.len() > 1, "the scenario must list several capacities");
    caps
}

fn bytes(cap: &str) -> u64 {
    let (n, unit) = cap.split_once(' ').expect("\"N UNIT\"");
    let n: u64 = n.parse().expect("whole number");
    let scale: u64 = match unit {
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => panic!("unit {other}"),
    };
    n * scale
}

#[test]
fn each_capacity_is_a_cell_run_at_that_capacity() {
    let caps = listed_capacities();
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("suite");
    suite(&out, None);
    assert!(
        !out.join(NAME).exists(),
        "a capacity list must not also write the unsuffixed folder"
    );
    let csv = read(&out.join("suite.csv"));
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no {name} column in {header:?}"))
    };
    let (cache_col, host_col, share_col) = (col("cache"), col("host_tier"), col("hit_host_share"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2 * caps.len(), "{csv}");
    let mut shares = Vec::new();
    for (i, cap) in caps.iter().enumerate() {
        let dir = out.join(format!("{NAME}-host{}", cap.replace(' ', "")));
        let summary: serde_json::Value =
            serde_json::from_str(&read(&dir.join("summary.json"))).expect("summary.json");
        let runs = summary["runs"].as_array().expect("runs");
        let paged = runs
            .iter()
            .find(|r| r["cache"] == "paged")
            .expect("a paged run");
        assert_eq!(
            paged["tiers"][0]["capacity_bytes"].as_u64(),
            Some(bytes(cap)),
            "{}",
            dir.display()
        );
        // The cell's rows, in plan order (capacities as listed), paged then contiguous.
        for (row, mode) in rows[2 * i..2 * i + 2].iter().zip(["paged", "contiguous"]) {
            assert_eq!(row[cache_col], mode, "{csv}");
            assert_eq!(row[host_col], cap.as_str(), "{csv}");
        }
        let share: f64 = rows[2 * i][share_col].parse().expect("paged hit share");
        assert!((0.0..=1.0).contains(&share), "{csv}");
        assert_eq!(
            rows[2 * i + 1][share_col],
            "",
            "contiguous has no tier: {csv}"
        );
        shares.push(share);
    }
    // A larger host tier never holds less: the host's share of admissions cannot fall.
    assert!(shares.windows(2).all(|w| w[0] <= w[1]), "{shares:?}");
    let md = read(&out.join("suite.md"));
    let html = read(&out.join("report.html"));
    for cap in &caps {
        assert!(md.contains(&format!("| {cap} |")), "{md}");
        assert!(
            html.contains(&format!("{NAME} host {cap}")),
            "report.html: no group for {cap}"
        );
    }
    // `compare` reads the capacities' rows as distinct cells, not one cell twice.
    let (code, text) = kvbench(&[
        "compare".into(),
        out.display().to_string(),
        out.display().to_string(),
        "--out".into(),
        tmp.path().join("cmp").display().to_string(),
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(!text.contains("appears twice"), "{text}");
    for cap in &caps {
        assert!(text.contains(&format!("paged b16 host {cap}")), "{text}");
    }
}

#[test]
fn sharded_capacity_cells_merge_into_the_unsharded_table() {
    let caps = listed_capacities();
    let tmp = tempfile::tempdir().expect("tempdir");
    let t = tmp.path();
    suite(&t.join("full"), None);
    let shards: Vec<_> = (0..2).map(|k| t.join(format!("shard{k}"))).collect();
    for (k, dir) in shards.iter().enumerate() {
        suite(dir, Some(&format!("{k}/2")));
    }
    let mut args = vec!["merge".to_string()];
    args.extend(shards.iter().map(|p| p.display().to_string()));
    args.extend(["--out".to_string(), t.join("merged").display().to_string()]);
    let (code, text) = kvbench(&args);
    assert_eq!(code, 0, "{text}");
    for f in ["suite.csv", "suite.md"] {
        assert_eq!(
            read(&t.join("merged").join(f)),
            read(&t.join("full").join(f)),
            "{f}"
        );
    }
    let meta: serde_json::Value =
        serde_json::from_str(&read(&t.join("merged").join("suite.json"))).expect("suite.json");
    let planned: Vec<&str> = meta["plan"]
        .as_array()
        .expect("plan")
        .iter()
        .map(|c| c["host_capacity"].as_str().expect("host_capacity"))
        .collect();
    assert_eq!(planned, caps.iter().map(String::as_str).collect::<Vec<_>>());
    for cap in &caps {
        let dir = format!("{NAME}-host{}", cap.replace(' ', ""));
        assert_eq!(
            read(&t.join("merged").join(&dir).join("summary.json")),
            read(&t.join("full").join(&dir).join("summary.json")),
            "{dir}"
        );
    }
}
