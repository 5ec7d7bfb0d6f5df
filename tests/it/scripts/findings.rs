//! `scripts/findings.sh OUT --quick` end to end: it runs, and every figure its findings.md states
//! is recomputed here from the runs' own files (plan JSON, summary.json, sweep.json,
//! requests.csv, memory.csv, probes.csv) with code of this test's own — not the script's
//! extraction — so a figure read from the wrong field, mode, seed set or file fails here. Each
//! printed figure must be rounded to the place its interval supports (recomputed here), and
//! findings.json must hold it at full precision.
//!
//! Needs python3 (the script's extraction) and bash; skipped, saying so, where either is missing.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const MIB: f64 = 1024.0 * 1024.0;

/// One table row of findings.md: `| `key` | value | interval |`.
#[derive(Debug)]
struct Row {
    key: String,
    value: String,
    /// The interval's ends as printed.
    interval: Option<(String, String)>,
}

fn parse_rows(md: &str) -> Vec<Row> {
    md.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 3, "row: {l}");
            let interval = if cells[2] == "—" {
                None
            } else {
                let inner = cells[2]
                    .strip_prefix('[')
                    .and_then(|s| s.strip_suffix(']'))
                    .unwrap_or_else(|| panic!("interval: {l}"));
                let (lo, hi) = inner.split_once(", ").unwrap();
                Some((lo.to_string(), hi.to_string()))
            };
            Row {
                key: cells[0].trim_matches('`').to_string(),
                value: cells[1].to_string(),
                interval,
            }
        })
        .collect()
}

fn read_json(p: &Path) -> Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A CSV file as header-keyed rows (the files read here hold no quoted fields).
fn read_csv(p: &Path) -> Vec<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            assert_eq!(cells.len(), header.len(), "{}: {l}", p.display());
            header
                .iter()
                .zip(cells)
                .map(|(h, c)| (h.to_string(), c.to_string()))
                .collect()
        })
        .collect()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn mode_run<'a>(summary: &'a Value, mode: &str) -> &'a Value {
    summary["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cache"] == mode)
        .unwrap_or_else(|| panic!("no {mode} run"))
}

/// runs/FAMILY-LABEL-sN folders, every seed that ran.
fn seed_dirs(out: &Path, family: &str, label: &str) -> Vec<PathBuf> {
    let prefix = format!("{family}-{label}-s");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.strip_prefix(&prefix)
                .is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no runs/{prefix}*");
    dirs
}

/// Mean TTFT (ms) of a mode's completed requests in requests.csv.
fn requests_ttft_ms(dir: &Path, mode: &str) -> f64 {
    let ttfts: Vec<f64> = read_csv(&dir.join("requests.csv"))
        .iter()
        .filter(|r| r["cache"] == mode && r["status"] == "completed")
        .map(|r| {
            r["first_token_ms"].parse::<f64>().unwrap() - r["arrival_ms"].parse::<f64>().unwrap()
        })
        .collect();
    assert!(!ttfts.is_empty(), "{}: no {mode} request", dir.display());
    ttfts.iter().sum::<f64>() / ttfts.len() as f64
}

/// The mode's rows of requests.csv.
fn mode_rows(dir: &Path, mode: &str) -> Vec<BTreeMap<String, String>> {
    let rows: Vec<_> = read_csv(&dir.join("requests.csv"))
        .into_iter()
        .filter(|r| r["cache"] == mode)
        .collect();
    assert!(!rows.is_empty(), "{}: no {mode} rows", dir.display());
    rows
}

fn int_sum(rows: &[BTreeMap<String, String>], column: &str) -> f64 {
    rows.iter()
        .map(|r| r[column].parse::<u64>().unwrap() as f64)
        .sum()
}

/// A lower-tier figure: hits counted at a prompt's first admission (rows without a parent) as a
/// share of those prompts' tokens; TTFT parts averaged over completed requests; bytes onloaded
/// from requests.csv, offloaded from summary.json's tiers; the prefix cache's bounds.
fn tier_value(dir: &Path, mode: &str, metric: &str) -> Option<f64> {
    let first = || -> Vec<BTreeMap<String, String>> {
        mode_rows(dir, mode)
            .into_iter()
            .filter(|r| r["parent_id"].is_empty())
            .collect()
    };
    let share = |column: &str| {
        let rows = first();
        100.0 * int_sum(&rows, column) / int_sum(&rows, "prompt_tokens")
    };
    let part_mean = |column: &str| {
        let done: Vec<f64> = mode_rows(dir, mode)
            .iter()
            .filter(|r| r["status"] == "completed")
            .map(|r| r[column].parse::<f64>().unwrap())
            .collect();
        done.iter().sum::<f64>() / done.len() as f64
    };
    let gib = 1024.0 * MIB;
    let v = match metric {
        "hit_pct" => share("cached_prompt_tokens"),
        "hit_device_pct" => share("hit_device_tokens"),
        "hit_host_pct" => share("hit_host_tokens"),
        "hit_disk_pct" => share("hit_disk_tokens"),
        "computed_tokens" => int_sum(&first(), "prefill_computed_tokens"),
        "onload_gib" => int_sum(&mode_rows(dir, mode), "onload_bytes") / gib,
        "ttft_queue_mean_ms" => part_mean("ttft_queue_ms"),
        "ttft_onload_mean_ms" => part_mean("ttft_onload_ms"),
        "ttft_prefill_mean_ms" => part_mean("ttft_prefill_ms"),
        "offload_gib" => {
            let summary = read_json(&dir.join("summary.json"));
            let tiers = mode_run(&summary, mode)["tiers"].as_array().cloned();
            tiers
                .unwrap_or_default()
                .iter()
                .map(|t| f(&t["offload_bytes"]))
                .sum::<f64>()
                / gib
        }
        "achieved_hit_rate" => {
            let summary = read_json(&dir.join("summary.json"));
            f(&mode_run(&summary, mode)["prefix_cache"]["achieved_hit_rate"])
        }
        "optimum_hit_rate" | "ceiling_hit_rate" | "replayed_lru_hit_rate" => {
            let summary = read_json(&dir.join("summary.json"));
            f(&mode_run(&summary, mode)["prefix_cache"]["bounds"][metric])
        }
        _ => return None,
    };
    Some(v)
}

fn run_value(dir: &Path, mode: &str, metric: &str) -> f64 {
    if metric == "req_ttft_ms" {
        return requests_ttft_ms(dir, mode);
    }
    if let Some(v) = tier_value(dir, mode, metric) {
        return v;
    }
    if let Some(column) = metric.strip_suffix("_peak_mib") {
        let rows = read_csv(&dir.join("memory.csv"));
        let peak = rows
            .iter()
            .filter(|r| r["cache"] == mode)
            .map(|r| r[column].parse::<f64>().unwrap())
            .fold(f64::NEG_INFINITY, f64::max);
        assert!(peak.is_finite(), "{}: no {mode} memory rows", dir.display());
        return peak / MIB;
    }
    let summary = read_json(&dir.join("summary.json"));
    let r = mode_run(&summary, mode);
    let v = match metric {
        "ttft_p50_ms" => &r["ttft_ms"]["p50"],
        "ttft_p99_ms" => &r["ttft_ms"]["p99"],
        "itl_p99_ms" => &r["itl_ms"]["p99"],
        "throughput_tok_s" => &r["throughput_tokens_per_s"],
        "peak_running" => &r["peak_running_sequences"],
        "hit_rate" => &r["prefix_cache"]["hit_rate"],
        "preemptions" => &r["preemptions"],
        "cancelled" => &r["requests"]["cancelled"],
        "max_rel_err" => &r["numerics"]["max_rel_err"],
        other => panic!("unknown run metric {other}"),
    };
    f(v)
}

/// What a figure should be: a number with its interval, or a word.
enum Expected {
    Num(f64, Option<(f64, f64)>),
    Word(String),
}

fn over_seeds(vals: Vec<f64>) -> Expected {
    let mean = vals.iter().sum::<f64>() / vals.len() as f64;
    let interval = (vals.len() > 1).then(|| {
        (
            vals.iter().copied().fold(f64::INFINITY, f64::min),
            vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        )
    });
    Expected::Num(mean, interval)
}

fn pair(v: &Value) -> (f64, f64) {
    (f(&v[0]), f(&v[1]))
}

fn sweep_json(out: &Path, label: &str) -> Value {
    read_json(&out.join("sweep").join(label).join("sweep.json"))
}

/// The directed AUC by brute force over all (hit, miss) pairs, with its 95% interval: the wider
/// of Hanley–McNeil's and the Wilson score interval of the AUC as a proportion over the smaller
/// class's count (never a point from a few probes), clipped to [0, 1].
fn auc_with_interval(hits: &[f64], misses: &[f64]) -> (f64, (f64, f64)) {
    let a = support::pairwise_auc(hits, misses);
    let (n1, n2) = (hits.len() as f64, misses.len() as f64);
    let q1 = a / (2.0 - a);
    let q2 = 2.0 * a * a / (1.0 + a);
    let var = (a * (1.0 - a) + (n1 - 1.0) * (q1 - a * a) + (n2 - 1.0) * (q2 - a * a)) / (n1 * n2);
    let se = var.max(0.0).sqrt();
    let z = 1.959_963_984_540_054;
    let n = n1.min(n2).max(1.0);
    let centre = (a + z * z / (2.0 * n)) / (1.0 + z * z / n);
    let half = z / (1.0 + z * z / n) * (a * (1.0 - a) / n + z * z / (4.0 * n * n)).max(0.0).sqrt();
    let lo = (a - z * se).min(centre - half).max(0.0);
    let hi = (a + z * se).max(centre + half).min(1.0);
    (a, (lo, hi))
}

fn level(s: &str) -> f64 {
    s.replace('p', ".").parse().unwrap()
}

fn sweep_verdict(ci: (f64, f64)) -> &'static str {
    if ci.0 > 1.0 {
        "paged wins"
    } else if ci.1 < 1.0 {
        "contiguous wins"
    } else {
        "tie"
    }
}

fn expected(out: &Path, key: &str) -> Expected {
    let parts: Vec<&str> = key.split('.').collect();
    match parts.as_slice() {
        ["plan", preset, metric] => {
            let seq = &read_json(&out.join(format!("plan/shape-{preset}.json")))["sequence"];
            let v = match *metric {
                "bytes_per_token" => f(&seq["bytes_per_token"]),
                "seq_mib" => f(&seq["sequence_bytes"]) / MIB,
                "fits" => f(&seq["fits_paged"]),
                other => panic!("plan metric {other}"),
            };
            Expected::Num(v, None)
        }
        ["waste", trace, block, "paged_pct"] => {
            let d = read_json(&out.join(format!("plan/trace-{trace}-{block}.json")));
            Expected::Num(f(&d["distribution"]["paged_waste_share"]) * 100.0, None)
        }
        ["waste", trace, "contiguous_pct"] => {
            let d = read_json(&out.join(format!("plan/trace-{trace}-b16.json")));
            Expected::Num(
                f(&d["distribution"]["contiguous_waste_share"]) * 100.0,
                None,
            )
        }
        ["sweep", "block", "best"] => {
            let mut best: Option<(f64, u32)> = None;
            for b in [8u32, 16, 32, 64] {
                let r = f(&mode_run(&sweep_json(out, &format!("block-b{b}")), "paged")
                    ["rate_at_target_rps"]);
                // Highest rate; among equals the smaller block.
                if best.is_none_or(|(rate, _)| r > rate) {
                    best = Some((r, b));
                }
            }
            Expected::Num(f64::from(best.unwrap().1), None)
        }
        ["sweep", label, "ratio"] => {
            let s = sweep_json(out, label);
            Expected::Num(
                f(&s["ratio_paged_over_contiguous"]),
                Some(pair(&s["ratio_paged_over_contiguous_ci"])),
            )
        }
        ["sweep", label, "verdict"] => {
            let s = sweep_json(out, label);
            Expected::Word(sweep_verdict(pair(&s["ratio_paged_over_contiguous_ci"])).into())
        }
        ["sweep", label, mode, "rate_rps"] => {
            let s = sweep_json(out, label);
            let r = mode_run(&s, mode);
            Expected::Num(
                f(&r["rate_at_target_rps"]),
                Some(pair(&r["rate_at_target_rps_ci"])),
            )
        }
        ["iso", scope, load, noise, "auc"] => {
            let load = level(load.strip_prefix('l').unwrap());
            let noise = level(noise.strip_prefix('n').unwrap());
            let rows = read_csv(&out.join("isolation/probes.csv"));
            let of = |hit: &str| -> Vec<f64> {
                rows.iter()
                    .filter(|r| {
                        r["scope"] == *scope
                            && r["load_rps"].parse::<f64>().unwrap() == load
                            && r["noise_ms"].parse::<f64>().unwrap() == noise
                            && r["hit"] == hit
                    })
                    .map(|r| r["observed_ttft_ms"].parse().unwrap())
                    .collect()
            };
            let (hits, misses) = (of("1"), of("0"));
            assert!(!hits.is_empty() && !misses.is_empty(), "{key}: no probes");
            let (a, ci) = auc_with_interval(&hits, &misses);
            Expected::Num(a, Some(ci))
        }
        ["isot", scope, load, noise, pair, "auc"] => {
            // With a host tier: each class as the run's hit columns say (`class`), a hit against
            // the misses of its own probe slot; by intent, a late repeat against a late fresh one.
            let load = level(load.strip_prefix('l').unwrap());
            let noise = level(noise.strip_prefix('n').unwrap());
            let rows = read_csv(&out.join("isolation-tier/probes.csv"));
            let of = |col: &str, value: &str, slot: Option<&str>| -> Vec<f64> {
                rows.iter()
                    .filter(|r| {
                        r["scope"] == *scope
                            && r["load_rps"].parse::<f64>().unwrap() == load
                            && r["noise_ms"].parse::<f64>().unwrap() == noise
                            && r[col] == value
                            && slot.is_none_or(|s| r["slot"] == s)
                    })
                    .map(|r| r["observed_ttft_ms"].parse().unwrap())
                    .collect()
            };
            let (faster, slower) = match *pair {
                "host_hit" => (of("class", "host", None), of("class", "miss", Some("late"))),
                "device_hit" => (
                    of("class", "device", None),
                    of("class", "miss", Some("early")),
                ),
                "device_vs_host" => (of("class", "device", None), of("class", "host", None)),
                "intent_host_hit" => (
                    of("intended", "host", None),
                    of("intended", "miss", Some("late")),
                ),
                other => panic!("{key}: unknown pair {other}"),
            };
            assert!(!faster.is_empty() && !slower.is_empty(), "{key}: no probes");
            let (a, ci) = auc_with_interval(&faster, &slower);
            Expected::Num(a, Some(ci))
        }
        ["idle", where_, "verdict"] => {
            let pairs: Vec<(f64, f64)> = seed_dirs(out, "idle", where_)
                .iter()
                .map(|d| {
                    (
                        requests_ttft_ms(d, "paged"),
                        requests_ttft_ms(d, "contiguous"),
                    )
                })
                .collect();
            let v = if pairs.iter().all(|(p, c)| p == c) {
                "tie"
            } else if pairs.iter().all(|(p, c)| p < c) {
                "paged wins"
            } else if pairs.iter().all(|(p, c)| p > c) {
                "contiguous wins"
            } else {
                "mixed"
            };
            Expected::Word(v.into())
        }
        ["idle", where_, "paged_over_contiguous"] => {
            let dirs = seed_dirs(out, "idle", where_);
            let n = dirs.len() as f64;
            let paged: f64 = dirs.iter().map(|d| requests_ttft_ms(d, "paged")).sum();
            let contiguous: f64 = dirs.iter().map(|d| requests_ttft_ms(d, "contiguous")).sum();
            Expected::Num((paged / n) / (contiguous / n), None)
        }
        ["tune", "block_size"] => {
            // Only where a `kvbench tune` ran: its tune.json must say this block size.
            let text = std::fs::read_to_string(out.join("tune/tune.json")).unwrap();
            let v: Value = serde_json::from_str(&text).unwrap();
            let paged = v["modes"]
                .as_array()
                .expect("tune.json modes[]")
                .iter()
                .find(|m| m["cache"] == "paged")
                .expect("a paged mode");
            let best = paged["best"].as_u64().expect("a best configuration") as usize;
            let block: f64 = v["configurations"][best]["values"]["cache.block_size"]
                .as_str()
                .expect("the best configuration's cache.block_size")
                .parse()
                .expect("a number");
            Expected::Num(block, None)
        }
        [family, label, mode @ ("paged" | "contiguous"), metric] => over_seeds(
            seed_dirs(out, family, label)
                .iter()
                .map(|d| run_value(d, mode, metric))
                .collect(),
        ),
        _ => panic!("findings.md states a figure this test does not know: {key}"),
    }
}

/// The decimal place (a power of ten) a figure is printed to, recomputed from the files: the
/// leading digit of its interval's half-width; with no interval (or one of zero width) three
/// significant digits, never rounding left of the point, integers whole (None); never more
/// than six significant digits.
fn print_place(v: f64, interval: Option<(f64, f64)>) -> Option<i32> {
    let top = if v == 0.0 {
        0
    } else {
        v.abs().log10().floor() as i32
    };
    let h = interval.map_or(0.0, |(lo, hi)| (hi - lo) / 2.0);
    let e = if h > 0.0 && h.is_finite() {
        h.log10().floor() as i32
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        return None;
    } else {
        (top - 2).min(0)
    };
    Some(e.max(top - 5))
}

/// `printed` is `actual` rounded to 10^e: as many decimals as the place asks, and within half a
/// unit of it (None: the integer itself).
fn rounded_to(printed: &str, actual: f64, e: Option<i32>) -> bool {
    let Ok(p) = printed.parse::<f64>() else {
        return false;
    };
    let Some(e) = e else {
        return p == actual;
    };
    let decimals = printed.split_once('.').map_or(0, |(_, d)| d.len()) as i32;
    let half_unit = 0.5 * 10f64.powi(e);
    decimals == (-e).max(0) && (p - actual).abs() <= half_unit * (1.0 + 1e-9) + 1e-12 * actual.abs()
}

/// findings.json's full-precision figure matches the recomputed one.
fn close(full: f64, actual: f64) -> bool {
    (full - actual).abs() <= 1e-9 * actual.abs().max(1e-12) + 1e-12
}

fn tools_present() -> bool {
    ["python3", "bash"].iter().all(|t| {
        Command::new(t)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn quick_findings_recompute_from_the_runs_files() {
    if !tools_present() {
        eprintln!("SKIP: findings_script needs python3 and bash");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("findings");
    let status = Command::new("bash")
        .arg(root.join("scripts/findings.sh"))
        .arg(&out)
        .arg("--quick")
        .env("KVBENCH", env!("CARGO_BIN_EXE_kvbench"))
        .current_dir(root)
        .output()
        .expect("run scripts/findings.sh");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&status.stdout),
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(status.status.success(), "findings.sh failed:\n{log}");

    let md = std::fs::read_to_string(out.join("findings.md")).unwrap();
    for n in 1..=8 {
        assert!(md.contains(&format!("\n## {n}. ")), "section {n} missing");
    }
    let rows = parse_rows(&md);
    let json = read_json(&out.join("findings.json"));
    let json_figs: BTreeMap<String, Value> = json["figures"]
        .as_array()
        .expect("findings.json figures[]")
        .iter()
        .map(|g| (g["key"].as_str().unwrap().to_string(), g.clone()))
        .collect();
    assert!(rows.len() >= 80, "only {} figures", rows.len());
    let mut seen = std::collections::BTreeSet::new();
    let mut values = BTreeMap::new();
    for row in &rows {
        assert!(seen.insert(row.key.clone()), "{} twice", row.key);
        match expected(&out, &row.key) {
            Expected::Word(w) => {
                assert_eq!(row.value, w, "{}", row.key);
                assert!(row.interval.is_none(), "{}", row.key);
            }
            Expected::Num(v, interval) => {
                let e = print_place(v, interval);
                assert!(
                    rounded_to(&row.value, v, e),
                    "{}: findings.md {}, files {v} (to 10^{e:?})",
                    row.key,
                    row.value
                );
                let full = json_figs
                    .get(&row.key)
                    .unwrap_or_else(|| panic!("{} missing from findings.json", row.key));
                assert!(
                    close(f(&full["value"]), v),
                    "{}: findings.json {}, files {v}",
                    row.key,
                    full["value"]
                );
                match (&row.interval, interval) {
                    (None, None) => {}
                    (Some((plo, phi)), Some((lo, hi))) => {
                        assert!(
                            rounded_to(plo, lo, e) && rounded_to(phi, hi, e),
                            "{}: interval [{plo}, {phi}] vs files [{lo}, {hi}] (to 10^{e:?})",
                            row.key
                        );
                        assert!(
                            close(f(&full["lo"]), lo) && close(f(&full["hi"]), hi),
                            "{}: findings.json interval vs files [{lo}, {hi}]",
                            row.key
                        );
                    }
                    (p, e) => panic!("{}: interval {p:?} vs files {e:?}", row.key),
                }
                values.insert(row.key.clone(), v);
            }
        }
    }
    // Every section has its figures, and the ones the readings lean on are there.
    for key in [
        "plan.llama3-8b.bytes_per_token",
        "waste.mooncake.b64.paged_pct",
        "sweep.block.best",
        "prefix.on.paged.hit_rate",
        "sweep.sampling.ratio",
        "forks.cpu.paged.max_rel_err",
        "chunk.c512.paged.itl_p99_ms",
        "reserve.w30.paged.ttft_p99_ms",
        "ledger.wide.paged.workspace_bytes_peak_mib",
        "conv.none.paged.computed_tokens",
        "conv.h16g.paged.hit_host_pct",
        "conv.h4g.paged.ttft_onload_mean_ms",
        "moon.lfu.paged.achieved_hit_rate",
        "moon.lru.paged.optimum_hit_rate",
        "moon.h256m.paged.hit_host_pct",
        "nopay.h4g.paged.offload_gib",
        "iso.global.l0.n0.auc",
        "iso.tenant.l0.n0.auc",
        "isot.global.l0.n0.host_hit.auc",
        "isot.global.l0.n0.device_vs_host.auc",
        "isot.tenant.l0.n0.intent_host_hit.auc",
        "idle.sim.paged.req_ttft_ms",
        "sweep.uniform.ratio",
        "sweep.exact.ratio",
        "cpuuniform.basic.paged.throughput_tok_s",
    ] {
        assert!(values.contains_key(key), "{key} missing from findings.md");
    }
    // The figures are numbers from real runs, not placeholders: shapes differ, the cpu runs were
    // checked against the oracle, the global scope leaks more than the tenant scope.
    assert!(values["plan.llama3-70b.bytes_per_token"] > values["plan.llama3-8b.bytes_per_token"]);
    assert!(values["forks.cpu.paged.max_rel_err"] < 1e-3);
    assert!(values["iso.global.l0.n0.auc"] > values["iso.tenant.l0.n0.auc"]);
    assert!(
        values["isot.global.l0.n0.host_hit.auc"] > values["isot.tenant.l0.n0.intent_host_hit.auc"]
    );
    tier_runs_are_what_they_say(&out, &values);
    // Every command the findings cite is one the script ran.
    let commands = std::fs::read_to_string(out.join("commands.tsv")).unwrap();
    for line in md.lines().filter(|l| l.starts_with("kvbench ")) {
        assert!(commands.contains(line), "cited but not run: {line}");
    }
    assert!(!md.contains("| none |"), "a figure is missing:\n{md}");
}

/// The lower-tier runs are the configurations their labels name, and their figures hang together:
/// "none" runs have no tier and onload nothing, the tier runs hold the capacity in their label,
/// a request's TTFT parts add up to its TTFT, hits by tier add up to the prefix hits, and no
/// eviction policy beats the offline optimum, which the ceiling bounds.
fn tier_runs_are_what_they_say(out: &Path, values: &BTreeMap<String, f64>) {
    let gib = 1024.0 * MIB;
    for (family, label, capacity_bytes) in [
        ("conv", "none", None),
        ("conv", "h4g", Some(4.0 * gib)),
        ("conv", "h16g", Some(16.0 * gib)),
        ("nopay", "none", None),
        ("nopay", "h4g", Some(4.0 * gib)),
        ("moon", "lru", None),
        ("moon", "h16m", Some(16.0 * MIB)),
        ("moon", "h256m", Some(256.0 * MIB)),
    ] {
        for dir in seed_dirs(out, family, label) {
            let summary = read_json(&dir.join("summary.json"));
            let paged = mode_run(&summary, "paged");
            let host = paged["tiers"]
                .as_array()
                .and_then(|ts| ts.iter().find(|t| t["tier"] == "host"));
            assert_eq!(
                host.map(|t| f(&t["capacity_bytes"])),
                capacity_bytes,
                "{}",
                dir.display()
            );
            let rows = mode_rows(&dir, "paged");
            for r in rows.iter().filter(|r| r["status"] == "completed") {
                let num = |c: &str| r[c].parse::<f64>().unwrap();
                let ttft = num("first_token_ms") - num("arrival_ms");
                let parts = num("ttft_queue_ms") + num("ttft_onload_ms") + num("ttft_prefill_ms");
                assert!(
                    (ttft - parts).abs() < 1e-3,
                    "{}: request {} TTFT {ttft} vs parts {parts}",
                    dir.display(),
                    r["request_id"]
                );
                let hits = ["hit_device_tokens", "hit_host_tokens", "hit_disk_tokens"]
                    .iter()
                    .map(|c| r[*c].parse::<u64>().unwrap())
                    .sum::<u64>();
                if r["parent_id"].is_empty() {
                    assert_eq!(
                        hits,
                        r["cached_prompt_tokens"].parse::<u64>().unwrap(),
                        "{}: request {}",
                        dir.display(),
                        r["request_id"]
                    );
                }
            }
            if capacity_bytes.is_none() {
                assert_eq!(int_sum(&rows, "onload_bytes"), 0.0, "{}", dir.display());
                assert_eq!(int_sum(&rows, "hit_host_tokens"), 0.0, "{}", dir.display());
            }
        }
    }
    let v = |k: &str| values[k];
    assert!(v("conv.h16g.paged.hit_host_pct") > 0.0);
    assert!(v("conv.h16g.paged.computed_tokens") < v("conv.none.paged.computed_tokens"));
    assert!(v("conv.h16g.paged.onload_gib") > 0.0);
    assert!(v("nopay.h4g.paged.offload_gib") > 0.0);
    for ev in ["lru", "lfu", "priority"] {
        assert!(
            v(&format!("moon.{ev}.paged.achieved_hit_rate"))
                <= v("moon.lru.paged.optimum_hit_rate") + 1e-12,
            "{ev} beats the offline optimum"
        );
    }
    assert!(v("moon.lru.paged.optimum_hit_rate") <= v("moon.lru.paged.ceiling_hit_rate") + 1e-12);
}
