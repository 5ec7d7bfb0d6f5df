//! Lower tiers in a run's files: every figure the tiers add — `requests.csv`'s hit split, computed
//! tokens, onload bytes and waits and the TTFT decomposition; `summary.json`'s `tiers`,
//! `tier_costs` and the ledger's host-tier bytes; `memory.csv`'s tier columns; `report.md`'s
//! section — recomputed independently from `requests.csv`, `trace.jsonl` (its `offload`,
//! `onload` and `onload_wait` lines) and `memory.csv`, on small `sim` scenarios whose tiny device
//! budget evicts shared prefix blocks that later requests find again in the host tier (and on
//! disk). The onload-wait attribution is checked with non-zero waits through a backend that
//! reports them; both result paths give the same bytes on a tier run.
//!
//! The shadow payload is off in these runs: following blocks through tiers is the shadow's own
//! work, tested with it.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use kvbench::backend::sim::SimBackend;
use kvbench::backend::{
    Backend, BackendError, MemoryParts, NumericsReport, RunSetup, StepOutput, StepPlan,
};
use kvbench::engine::{self, EngineConfig};
use kvbench::experiment::{self, RunOptions};
use kvbench::metrics::timeline::Resolution;
use kvbench::results::{self, Staging};
use kvbench::scenario::Scenario;
use kvbench_cache_api::{CacheMode, KvCacheManager, ScopeKey, SeqId};
use serde_json::Value;

use crate::support::tier_results_files;
use tier_results_files::*;

/// A tiny-model scenario (1024 bytes a token, 16-token blocks: 16 KiB a block) with six shared
/// 64-token prefixes and a 32-block device budget, plus `tiers` (TOML tables).
fn scenario_text(name: &str, tiers: &str) -> String {
    format!(
        r#"name = "{name}"
description = "shared prefixes evicted from a tiny device budget and found again below it"
seed = 11
device = "cpu"

[model]
preset = "tiny"

[memory]
kv_budget = "512 KiB"

[cache]
block_size = 16
contiguous_reservation = "prompt_plus_output"
max_seq_len = 256

{tiers}

[traffic]
requests = 120

[traffic.arrival]
kind = "poisson"
rate_per_s = 400.0

[traffic.prompt_tokens]
dist = "uniform"
min = 16
max = 48

[traffic.output_tokens]
dist = "uniform"
min = 4
max = 16

[traffic.shared_prefix]
groups = 6
prefix_tokens = 64
share = 0.9

[scheduler]
policy = "decode_first"
max_tokens_per_step = 256
max_seqs_per_step = 16
prefix_cache = true
prefix_scope = "global"
"#
    )
}

const HOST: &str = "[cache.host_tier]\ncapacity = \"256 KiB\"\n";
const HOST_AND_DISK: &str = "[cache.host_tier]\ncapacity = \"64 KiB\"\n\n[cache.disk_tier]\ncapacity = \"1 MiB\"\nread_bytes_per_s = 2e9\nwrite_bytes_per_s = 1e9\nlatency_us = 100.0\n";

fn load(dir: &Path, name: &str, tiers: &str) -> Scenario {
    load_with(dir, name, tiers, "")
}

/// [`load`] with `extra` TOML appended (more traffic tables).
fn load_with(dir: &Path, name: &str, tiers: &str, extra: &str) -> Scenario {
    let path = dir.join(format!("{name}.toml"));
    let text = format!("{}\n{extra}", scenario_text(name, tiers));
    std::fs::write(&path, text).expect("write scenario");
    kvbench::scenario::load(&path, &[]).expect("scenario loads")
}

fn opts() -> RunOptions {
    RunOptions {
        shadow: false,
        memory_resolution: Resolution::EveryStep,
        ..RunOptions::default()
    }
}

/// What the checks saw, for the callers' non-vacuity assertions.
#[derive(Debug, Default)]
struct Seen {
    host_hit_tokens: u64,
    disk_hit_tokens: u64,
    offloads: u64,
    wait_ns: u64,
    steps_with_remainder: u64,
}

/// `requests.csv` and `memory.csv` of the paged run against `trace.jsonl`.
fn check_requests(dir: &Path, kvb: u64, block_bytes: u64) -> Seen {
    let rows = csv_rows(&dir.join("requests.csv"), "paged");
    assert!(!rows.is_empty());
    let by_label: BTreeMap<String, &Row> =
        rows.iter().map(|r| (r["request_id"].clone(), r)).collect();
    let t = tier_trace(dir, "paged");
    let waits = recompute_waits(&t, &by_label);
    let mut seen = Seen {
        offloads: t.offloads.len() as u64,
        wait_ns: t.waits.values().map(|w| w.0).sum(),
        ..Seen::default()
    };
    // Steps whose split left a remainder (the rounding rule at work).
    let mut per_step: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for o in &t.onloads {
        per_step.entry(o.step).or_default().push(o.tokens);
    }
    for (step, (wait, _)) in &t.waits {
        let n = per_step.get(step).map_or(0, |v| v.len() as u64);
        if n > 1 && wait % n != 0 {
            seen.steps_with_remainder += 1;
        }
    }
    for r in &rows {
        let label = &r["request_id"];
        let what = format!("request {label}");
        let cached = num(r, "cached_prompt_tokens");
        let (dev, host, disk) = (
            num(r, "hit_device_tokens"),
            num(r, "hit_host_tokens"),
            num(r, "hit_disk_tokens"),
        );
        assert_eq!(dev + host + disk, cached, "{what}: hits sum to cached");
        // Every onload of this stream, and those of its first admission (at its admit time).
        let mine: Vec<&Onload> = t.onloads.iter().filter(|o| o.request == *label).collect();
        let bytes: u64 = mine.iter().map(|o| o.tokens).sum::<u64>() * kvb;
        assert_eq!(num(r, "onload_bytes"), bytes, "{what}: onload_bytes");
        if r["admitted_ms"].is_empty() {
            assert_eq!(r["prefill_computed_tokens"], "", "{what}");
            continue;
        }
        let admitted = ns(&r["admitted_ms"]);
        assert_eq!(
            num(r, "prefill_computed_tokens"),
            num(r, "prompt_tokens") - cached,
            "{what}: prefill_computed_tokens"
        );
        if r["parent_id"].is_empty() {
            let at_admission = |tier: &str| -> u64 {
                mine.iter()
                    .filter(|o| o.t_ns == admitted && o.from == tier)
                    .map(|o| o.tokens)
                    .sum()
            };
            assert_eq!(host, at_admission("host"), "{what}: hit_host_tokens");
            assert_eq!(disk, at_admission("disk"), "{what}: hit_disk_tokens");
            if cached > 0 {
                assert_eq!(
                    t.prefix_hits.get(&(label.clone(), admitted)),
                    Some(&cached),
                    "{what}: the prefix_hit line at first admission"
                );
            }
            seen.host_hit_tokens += host;
            seen.disk_hit_tokens += disk;
        }
        let (wait, before_first) = waits.get(label).copied().unwrap_or_default();
        assert_eq!(ns(&r["onload_wait_ms"]), wait, "{what}: onload_wait_ms");
        if r["first_token_ms"].is_empty() {
            for k in ["ttft_queue_ms", "ttft_onload_ms", "ttft_prefill_ms"] {
                assert_eq!(r[k], "", "{what}: {k} without a first token");
            }
            continue;
        }
        let ttft = ns(&r["first_token_ms"]) - ns(&r["arrival_ms"]);
        let queue = admitted - ns(&r["arrival_ms"]);
        let onload = if r["parent_id"].is_empty() {
            before_first
        } else {
            // A continuation's first token is its parent's step: the parent's onload part.
            let parent = by_label[r["parent_id"].as_str()];
            ns(&parent["ttft_onload_ms"])
        };
        assert_eq!(ns(&r["ttft_queue_ms"]), queue, "{what}: ttft_queue_ms");
        assert_eq!(ns(&r["ttft_onload_ms"]), onload, "{what}: ttft_onload_ms");
        assert_eq!(
            ns(&r["ttft_prefill_ms"]),
            ttft - queue - onload,
            "{what}: ttft_prefill_ms"
        );
    }
    // The contiguous baseline has no tiers: zeros, and no tier lines.
    for r in csv_rows(&dir.join("requests.csv"), "contiguous") {
        for k in [
            "hit_host_tokens",
            "hit_disk_tokens",
            "onload_bytes",
            "hit_device_tokens",
        ] {
            assert_eq!(num(&r, k), 0, "contiguous {k}");
        }
        assert_eq!(r["onload_wait_ms"], "0.000000");
        if !r["first_token_ms"].is_empty() {
            assert_eq!(r["ttft_onload_ms"], "0.000000");
        }
    }
    let c = tier_trace(dir, "contiguous");
    assert!(c.onloads.is_empty() && c.offloads.is_empty() && c.waits.is_empty());
    for m in csv_rows(&dir.join("memory.csv"), "contiguous") {
        assert_eq!(
            (num(&m, "host_tier_bytes"), num(&m, "disk_tier_bytes")),
            (0, 0)
        );
    }
    // memory.csv: whole blocks, within capacity (checked against summary.json by the caller).
    for m in csv_rows(&dir.join("memory.csv"), "paged") {
        for k in ["host_tier_bytes", "disk_tier_bytes"] {
            assert_eq!(num(&m, k) % block_bytes, 0, "memory.csv {k}: whole blocks");
        }
    }
    seen
}

/// Nearest-rank percentile, exact, ms.
fn exact_ms(values_ns: &[u64], q: f64) -> f64 {
    let mut v = values_ns.to_vec();
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1] as f64 / 1e6
}

fn check_dist(d: &Value, values: &[u64], what: &str) {
    assert_eq!(
        d["count"].as_u64(),
        Some(values.len() as u64),
        "{what}.count"
    );
    let max = values.iter().max().copied().unwrap_or(0) as f64 / 1e6;
    assert_eq!(d["max"].as_f64(), Some(max), "{what}.max");
    let mean = values.iter().sum::<u64>() as f64 / values.len().max(1) as f64 / 1e6;
    let got = d["mean"].as_f64().expect("mean");
    assert!(
        (got - mean).abs() <= mean * 1e-12 + 1e-9,
        "{what}.mean {got} vs {mean}"
    );
    for (key, q) in [("p50", 0.5), ("p99", 0.99)] {
        let (got, exact) = (d[key].as_f64().expect("pct"), exact_ms(values, q));
        assert!(
            (got - exact).abs() <= exact * 1e-3 + 1e-6,
            "{what}.{key}: {got} vs exact {exact}"
        );
    }
}

/// `summary.json`'s tier figures and `report.md`'s section against the data files.
fn check_summary(dir: &Path, tiers: &[(&str, &str)], kvb: u64, block_size: u64) {
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).expect("summary"))
            .expect("json");
    let (paged, contiguous) = (&summary["runs"][0], &summary["runs"][1]);
    assert_eq!(paged["cache"], "paged");
    assert!(contiguous.get("tiers").is_none() && contiguous.get("tier_costs").is_none());
    assert!(contiguous["memory"]
        .get("host_tier_capacity_bytes")
        .is_none());
    let block_bytes = block_size * kvb;
    let rows = csv_rows(&dir.join("requests.csv"), "paged");
    let memory = csv_rows(&dir.join("memory.csv"), "paged");
    let t = tier_trace(dir, "paged");
    let list = paged["tiers"].as_array().expect("tiers");
    assert_eq!(list.len(), tiers.len());
    let end_ns = (paged["duration_s"].as_f64().expect("duration") * 1e9).round() as u64;
    for (s, &(tier, capacity)) in list.iter().zip(tiers) {
        let what = format!("tiers.{tier}");
        assert_eq!(s["tier"], tier);
        let cap_bytes = kvbench::units::parse_bytes(capacity).expect("size");
        let cap_blocks = cap_bytes / block_bytes;
        assert_eq!(s["capacity_blocks"].as_u64(), Some(cap_blocks), "{what}");
        assert_eq!(
            s["capacity_bytes"].as_u64(),
            Some(cap_blocks * block_bytes),
            "{what}"
        );
        let hits: Vec<&Onload> = t.onloads.iter().filter(|o| o.from == tier).collect();
        let hit_tokens: u64 = hits.iter().map(|o| o.tokens).sum();
        assert_eq!(s["hit_blocks"].as_u64(), Some(hits.len() as u64), "{what}");
        assert_eq!(s["onloads"].as_u64(), Some(hits.len() as u64), "{what}");
        assert_eq!(s["hit_tokens"].as_u64(), Some(hit_tokens), "{what}");
        assert_eq!(
            s["onload_bytes"].as_u64(),
            Some(hits.len() as u64 * block_bytes),
            "{what}"
        );
        assert!(s["lookups"].as_u64() >= s["hit_blocks"].as_u64(), "{what}");
        assert!(
            hits.iter().all(|o| o.from_slot < cap_blocks),
            "{what}: slots"
        );
        let offloads = t.offloads.iter().filter(|o| o.0 == tier).count() as u64;
        assert_eq!(s["offloads"].as_u64(), Some(offloads), "{what}");
        assert_eq!(
            s["offload_bytes"].as_u64(),
            Some(offloads * block_bytes),
            "{what}"
        );
        // Occupancy from memory.csv (a row per step): each row holds until the next row's end.
        let col = format!("{tier}_tier_bytes");
        let used: Vec<(u64, u64)> = memory
            .iter()
            .map(|m| (ns(&m["t_ms"]), num(m, &col)))
            .collect();
        let peak = used.iter().map(|u| u.1).max().unwrap_or(0);
        assert!(peak <= cap_blocks * block_bytes, "{what}: within capacity");
        assert_eq!(s["peak_used_bytes"].as_u64(), Some(peak), "{what}");
        let integral: u128 = used
            .windows(2)
            .map(|w| w[0].1 as u128 * (w[1].0 - w[0].0) as u128)
            .sum();
        let mean = integral as f64 / end_ns as f64;
        let got = s["time_weighted_used_bytes"].as_f64().expect("mean used");
        assert!(
            (got - mean).abs() <= mean * 1e-12,
            "{what}: time_weighted_used_bytes {got} vs {mean}"
        );
        // Blocks held = offloaded − evicted at every moment (nothing flushed mid-run).
        let held_at_end = used.last().map_or(0, |u| u.1) / block_bytes;
        assert_eq!(
            s["evictions"].as_u64(),
            Some(offloads - held_at_end),
            "{what}: evictions"
        );
        if tier == "host" {
            let m = &paged["memory"];
            assert_eq!(m["host_tier_capacity_bytes"], s["capacity_bytes"]);
            assert_eq!(m["host_tier_peak_bytes"].as_u64(), Some(peak));
        }
    }
    // Where first admissions' prompt tokens came from, over the requests (rank 0).
    let costs = &paged["tier_costs"];
    let requests: Vec<&Row> = rows.iter().filter(|r| r["parent_id"].is_empty()).collect();
    for (k, col) in [
        ("device_tokens", "hit_device_tokens"),
        ("host_tokens", "hit_host_tokens"),
        ("disk_tokens", "hit_disk_tokens"),
    ] {
        let sum: u64 = requests.iter().map(|r| num(r, col)).sum();
        assert_eq!(costs["admission_hits"][k].as_u64(), Some(sum), "{k}");
    }
    let computed: u64 = requests
        .iter()
        .filter(|r| !r["admitted_ms"].is_empty())
        .map(|r| num(r, "prefill_computed_tokens"))
        .sum();
    assert_eq!(
        costs["admission_hits"]["computed_tokens"].as_u64(),
        Some(computed)
    );
    let onload_bytes: u64 = rows.iter().map(|r| num(r, "onload_bytes")).sum();
    assert_eq!(costs["onload_bytes"].as_u64(), Some(onload_bytes));
    let wait_ns: u64 = rows.iter().map(|r| ns(&r["onload_wait_ms"])).sum();
    assert_eq!(costs["onload_wait_ms"].as_f64(), Some(wait_ns as f64 / 1e6));
    let with_first: Vec<&Row> = rows
        .iter()
        .filter(|r| r["status"] != "rejected" && !r["first_token_ms"].is_empty())
        .collect();
    for k in ["ttft_queue_ms", "ttft_onload_ms", "ttft_prefill_ms"] {
        let v: Vec<u64> = with_first.iter().map(|r| ns(&r[k])).collect();
        check_dist(&costs[k], &v, k);
    }
    // report.md: the section, its capacity and hits from summary.json.
    let report = std::fs::read_to_string(dir.join("report.md")).expect("report");
    assert!(report.contains("## Lower tiers (paged run)"), "{report}");
    for s in list {
        let line = format!(
            "| {} | {} | {} | {} (",
            s["tier"].as_str().expect("tier"),
            kvbench::units::format_bytes(s["capacity_bytes"].as_u64().expect("cap")),
            s["hit_tokens"],
            s["offloads"]
        );
        assert!(report.contains(&line), "report.md lacks {line:?}\n{report}");
    }
    assert!(report.contains("| onload |") && report.contains("| prefill |"));
}

/// Run `s` both ways; the two folders must be byte-identical. Returns the streamed folder.
fn run_both_paths(root: &Path, s: &Scenario) -> PathBuf {
    let (a, b) = (root.join("collect"), root.join("stream"));
    let collected = experiment::run_scenario(s, &opts()).expect("collect run");
    assert!(
        collected.failures().is_empty(),
        "{:?}",
        collected.failures()
    );
    results::write(&collected, &a, true, true).expect("collect write");
    let staging = Staging::begin(&b, kvbench::results::marker::Kind::Run, true).expect("staging");
    let streamed = experiment::run_streaming(s, &opts(), staging).expect("streaming run");
    for (x, y) in collected.runs.iter().zip(&streamed.runs) {
        assert_eq!(x.metrics, y.metrics, "metrics of {}", x.end.mode.name());
    }
    for f in [
        "summary.json",
        "report.md",
        "requests.csv",
        "trace.jsonl",
        "memory.csv",
        "trace.perfetto.json",
    ] {
        let (x, y) = (
            std::fs::read(a.join(f)).expect("collect"),
            std::fs::read(b.join(f)).expect("stream"),
        );
        assert!(
            x == y,
            "{f} differs between the collect and streaming paths"
        );
    }
    b
}

fn tiny_kvb() -> u64 {
    kvbench::model::ModelShape::tiny().kv_bytes_per_token()
}

#[test]
fn host_tier_figures_recompute_from_the_run_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let s = load(tmp.path(), "tier-host", HOST);
    let dir = run_both_paths(tmp.path(), &s);
    let kvb = tiny_kvb();
    let seen = check_requests(&dir, kvb, 16 * kvb);
    check_summary(&dir, &[("host", "256 KiB")], kvb, 16);
    assert!(seen.offloads > 0, "nothing offloaded: {seen:?}");
    assert!(
        seen.host_hit_tokens > 0,
        "no host-tier hit at admission: {seen:?}"
    );
}

#[test]
fn write_through_figures_recompute_from_the_run_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let tiers = format!("{HOST}offload = \"write_through\"\n");
    let s = load(tmp.path(), "tier-write-through", &tiers);
    let exp = experiment::run_scenario(&s, &opts()).expect("run");
    assert!(exp.failures().is_empty(), "{:?}", exp.failures());
    let dir = tmp.path().join("out");
    results::write(&exp, &dir, true, true).expect("write");
    let kvb = tiny_kvb();
    let seen = check_requests(&dir, kvb, 16 * kvb);
    check_summary(&dir, &[("host", "256 KiB")], kvb, 16);
    assert!(
        seen.host_hit_tokens > 0,
        "no host-tier hit at admission: {seen:?}"
    );
}

#[test]
fn disk_tier_figures_recompute_from_the_run_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let s = load(tmp.path(), "tier-disk", HOST_AND_DISK);
    let exp = experiment::run_scenario(&s, &opts()).expect("run");
    assert!(exp.failures().is_empty(), "{:?}", exp.failures());
    let dir = tmp.path().join("out");
    results::write(&exp, &dir, true, true).expect("write");
    let kvb = tiny_kvb();
    let seen = check_requests(&dir, kvb, 16 * kvb);
    check_summary(&dir, &[("host", "64 KiB"), ("disk", "1 MiB")], kvb, 16);
    assert!(
        seen.disk_hit_tokens > 0,
        "no disk hit at admission: {seen:?}"
    );
    let t = tier_trace(&dir, "paged");
    assert!(
        t.offloads.iter().any(|o| o.0 == "disk" && o.2 == "host"),
        "the host tier passed nothing down to disk"
    );
}

/// `sim`, reporting an onload wait per step of 1.7 µs a token plus 7 ns, so shares and
/// remainders are exercised whatever `sim` itself charges.
struct Waits {
    inner: SimBackend,
    pending: VecDeque<u64>,
}

impl Backend for Waits {
    fn name(&self) -> &'static str {
        "sim-waits"
    }
    fn computes(&self) -> bool {
        false
    }
    fn register(&mut self, s: SeqId, p: &[u32], sc: Option<&ScopeKey>) -> Result<(), BackendError> {
        self.inner.register(s, p, sc)
    }
    fn fork(&mut self, p: SeqId, c: SeqId, rank: u32) -> Result<u32, BackendError> {
        self.inner.fork(p, c, rank)
    }
    fn forget(&mut self, s: SeqId) -> Result<(), BackendError> {
        self.inner.forget(s)
    }
    fn submit(&mut self, plan: &StepPlan, cache: &dyn KvCacheManager) -> Result<(), BackendError> {
        let tokens = plan
            .tier_ops
            .iter()
            .filter(|op| op.is_onload())
            .map(|op| u64::from(op.tokens))
            .sum();
        self.pending.push_back(tokens);
        self.inner.submit(plan, cache)
    }
    fn complete(&mut self) -> Result<StepOutput, BackendError> {
        let mut out = self.inner.complete()?;
        let tokens = self.pending.pop_front().unwrap_or(0);
        if tokens > 0 {
            out.onload_wait_s = tokens as f64 * 1.7e-6 + 7e-9;
            out.duration_s += out.onload_wait_s;
        }
        Ok(out)
    }
    fn memory(&self) -> MemoryParts {
        self.inner.memory()
    }
    fn numerics(&self) -> Option<NumericsReport> {
        None
    }
}

/// Continuations (parallel sampling) and cancellations at every point, on top of the waits run.
const FORKS_AND_CANCELS: &str = r#"
[traffic.parallel_sampling]
n = 3
share = 0.3

[traffic.cancellation]
share = 0.4
when = "mixed"
delay = { dist = "exponential", mean_ms = 15.0 }
after_tokens = { dist = "uniform", min = 1, max = 6 }
"#;

#[test]
fn onload_waits_are_shared_by_tokens_and_recompute_from_the_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (seen, rows) = run_with_waits(tmp.path(), "tier-waits", "");
    assert!(seen.wait_ns > 0, "no onload wait: {seen:?}");
    assert!(
        seen.steps_with_remainder > 0,
        "no split left a remainder: {seen:?}"
    );
    // Every step's wait went to its streams in full (nothing was cancelled in flight here).
    let charged: u64 = rows.iter().map(|r| ns(&r["onload_wait_ms"])).sum();
    assert_eq!(charged, seen.wait_ns, "waits charged vs waited");
    let parts: u64 = rows.iter().map(|r| ns(&r["ttft_onload_ms"])).sum();
    assert!(
        parts > 0 && parts <= charged,
        "TTFT onload parts {parts} of {charged}"
    );
}

#[test]
fn onload_waits_follow_forks_and_cancellations() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (seen, rows) = run_with_waits(tmp.path(), "tier-forks", FORKS_AND_CANCELS);
    assert!(seen.wait_ns > 0, "no onload wait: {seen:?}");
    let charged: u64 = rows.iter().map(|r| ns(&r["onload_wait_ms"])).sum();
    println!("{seen:?}; charged {charged} ns");
    assert!(
        charged <= seen.wait_ns,
        "charged {charged} > waited {}",
        seen.wait_ns
    );
    let forked_with_onload = rows
        .iter()
        .filter(|r| !r["parent_id"].is_empty() && !r["ttft_onload_ms"].is_empty())
        .filter(|r| ns(&r["ttft_onload_ms"]) > 0)
        .count();
    assert!(
        forked_with_onload > 0,
        "no continuation inherited an onload part"
    );
    assert!(
        rows.iter().any(|r| r["status"] == "cancelled"),
        "nothing was cancelled"
    );
}

/// Run scenario `name` (host tier, async steps, `extra` traffic) on the paged manager through
/// [`Waits`], write its files and check them; returns what the checks saw and the paged rows.
fn run_with_waits(tmp: &Path, name: &str, extra: &str) -> (Seen, Vec<Row>) {
    // Async steps: a step's onloads may complete while the next step is planned.
    let mut s = load_with(tmp, name, HOST, extra);
    s.scheduler.async_steps = true;
    let o = opts();
    let setup = experiment::setup(&s, &o).expect("setup");
    let workload = kvbench::workload::generate(&s, setup.seed).expect("workload");
    let plan = experiment::tiers::plan(&s, &setup, CacheMode::Paged).expect("tiers");
    assert_eq!(plan.setup.host_blocks, 16);
    let run_setup = RunSetup {
        model: setup.model.clone(),
        device: s.device.clone(),
        scenario_dir: setup.scenario_dir.clone(),
        cache_slots: setup.total_slots,
        block_size: s.block_size(),
        seed: setup.seed,
        max_step_tokens: s.scheduler.max_tokens_per_step,
        swap_gbytes_per_s: s.scheduler.swap_gbytes_per_s,
        workspace_bytes: setup.workspace_bytes,
        profile: None,
        clock: Default::default(),
        tiers: plan.setup,
    };
    let mut backend = Waits {
        inner: SimBackend::new(&run_setup).expect("sim"),
        pending: VecDeque::new(),
    };
    let spec =
        experiment::manager::spec(&s, &setup, CacheMode::Paged, &plan, s.scheduler.async_steps);
    let mut cache = kvbench::cache::build(&spec);
    let cfg = EngineConfig {
        mode: CacheMode::Paged,
        block_size: cache.block_size(),
        kv_bytes_per_token: setup.kv_bytes_per_token,
        slot_bytes: setup.slot_bytes,
        max_seq_len: s.cache.max_seq_len,
        reservation: s.cache.contiguous_reservation,
        scheduler: s.scheduler.clone(),
        model_name: setup.model.name.clone(),
        trace_tokens: true,
        invariant_check_every: 1,
        fault: None,
    };
    let record = engine::run(&cfg, &workload, cache.as_mut(), &mut backend).expect("run");
    assert_eq!(record.end.violation, None);
    assert!(
        record.end.reclamation.ok,
        "{}",
        record.end.reclamation.detail
    );
    let dir = tmp.join(format!("{name}-files"));
    std::fs::create_dir_all(&dir).expect("dir");
    let mut sink =
        results::sink::FileSink::create(&dir, true, Resolution::EveryStep).expect("files");
    engine::sink::replay(&record, &mut sink);
    sink.end_mode().expect("end mode");
    sink.finish().expect("finish");
    let kvb = setup.kv_bytes_per_token;
    let seen = check_requests(&dir, kvb, 16 * kvb);
    (seen, csv_rows(&dir.join("requests.csv"), "paged"))
}
