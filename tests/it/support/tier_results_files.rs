//! Reading a tier run's files for `tiers::results`: exact numbers from `requests.csv` and
//! `trace.jsonl` (decimals parsed as text, never through f64), and the onload waits recomputed
//! from the trace alone.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// Exact ns of a `ms.ffffff` text.
pub fn ns(ms: &str) -> u64 {
    let (a, b) = ms.split_once('.').expect("ms with decimals");
    a.parse::<u64>().expect("int") * 1_000_000 + b.parse::<u64>().expect("frac")
}

/// The raw number text after `"key":` in a JSON line (exact decimals, not through f64).
pub fn raw<'a>(line: &'a str, key: &str) -> &'a str {
    let at = format!("\"{key}\":");
    line.split(at.as_str())
        .nth(1)
        .and_then(|s| s.split([',', '}']).next())
        .unwrap_or_else(|| panic!("{key} in {line}"))
}

pub type Row = BTreeMap<String, String>;

pub fn csv_rows(path: &Path, cache: &str) -> Vec<Row> {
    let text = std::fs::read_to_string(path).expect("csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    lines
        .map(|l| {
            header
                .iter()
                .map(|h| h.to_string())
                .zip(l.split(',').map(String::from))
                .collect::<Row>()
        })
        .filter(|r| r["cache"] == cache)
        .collect()
}

pub fn num(r: &Row, k: &str) -> u64 {
    r[k].parse()
        .unwrap_or_else(|_| panic!("{k} = {:?} in {r:?}", r[k]))
}

/// One onload line of `trace.jsonl`.
pub struct Onload {
    pub t_ns: u64,
    pub step: u64,
    pub request: String,
    pub from: String,
    pub from_slot: u64,
    pub tokens: u64,
}

/// What `trace.jsonl` says about one cache mode's tiers.
#[derive(Default)]
pub struct TierTrace {
    pub onloads: Vec<Onload>,
    /// (to tier, to slot, from tier) of each offload, in order.
    pub offloads: Vec<(String, u64, String)>,
    /// Step → (wait ns, step end ns).
    pub waits: BTreeMap<u64, (u64, u64)>,
    /// (request, t_ns) → prefix_hit tokens.
    pub prefix_hits: BTreeMap<(String, u64), u64>,
}

pub fn tier_trace(dir: &Path, cache: &str) -> TierTrace {
    let text = std::fs::read_to_string(dir.join("trace.jsonl")).expect("trace");
    let mut t = TierTrace::default();
    // Slots written so far per tier: an onload must read a slot an offload wrote.
    let mut written: BTreeMap<(String, u64), bool> = BTreeMap::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).expect("json line");
        if v["cache"] != cache {
            continue;
        }
        let t_ns = ns(raw(line, "t_ms"));
        match v["event"].as_str().expect("event") {
            "onload" => {
                let from = v["from"]["tier"].as_str().expect("from").to_string();
                let from_slot = v["from"]["slot"].as_u64().expect("slot");
                assert_eq!(v["to"]["tier"], "device", "{line}");
                assert!(
                    written.contains_key(&(from.clone(), from_slot)),
                    "onload from a slot no offload wrote: {line}"
                );
                let request = v["request"].as_str().expect("an onload has a request");
                assert!(v["seq"].is_u64(), "{line}");
                t.onloads.push(Onload {
                    t_ns,
                    step: v["step"].as_u64().expect("step"),
                    request: request.to_string(),
                    from,
                    from_slot,
                    tokens: v["tokens"].as_u64().expect("tokens"),
                });
            }
            "offload" => {
                assert!(v["request"].is_null() && v["seq"].is_null(), "{line}");
                assert_eq!(v["tokens"].as_u64(), Some(16), "{line}");
                let to = v["to"]["tier"].as_str().expect("to").to_string();
                let slot = v["to"]["slot"].as_u64().expect("slot");
                written.insert((to.clone(), slot), true);
                let from = v["from"]["tier"].as_str().expect("from").to_string();
                t.offloads.push((to, slot, from));
            }
            "onload_wait" => {
                assert!(v["request"].is_null(), "{line}");
                let step = v["step"].as_u64().expect("step");
                let prev = t.waits.insert(step, (ns(raw(line, "wait_ms")), t_ns));
                assert!(prev.is_none(), "two waits for step {step}");
            }
            "prefix_hit" => {
                let r = v["request"].as_str().expect("request").to_string();
                t.prefix_hits
                    .insert((r, t_ns), v["tokens"].as_u64().expect("tokens"));
            }
            _ => {}
        }
    }
    t
}

/// Per request label, recomputed from the trace: (onload wait, its part before the first
/// token), by the rounding rule (floors by tokens, remainder to the first in op order), credited
/// only to a stream not done when the step ended (finish ≥ step end).
pub fn recompute_waits(
    t: &TierTrace,
    rows: &BTreeMap<String, &Row>,
) -> BTreeMap<String, (u64, u64)> {
    let mut by_step: BTreeMap<u64, Vec<(String, u64)>> = BTreeMap::new();
    for o in &t.onloads {
        let v = by_step.entry(o.step).or_default();
        match v.iter_mut().find(|(r, _)| *r == o.request) {
            Some((_, n)) => *n += o.tokens,
            None => v.push((o.request.clone(), o.tokens)),
        }
    }
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (step, list) in by_step {
        let &(wait, end) = t
            .waits
            .get(&step)
            .unwrap_or_else(|| panic!("step {step} carried onloads but has no onload_wait"));
        let total: u64 = list.iter().map(|(_, n)| n).sum();
        let mut shares: Vec<u64> = list
            .iter()
            .map(|(_, n)| (wait as u128 * *n as u128 / total as u128) as u64)
            .collect();
        let rest = wait - shares.iter().sum::<u64>();
        shares[0] += rest;
        for ((r, _), share) in list.iter().zip(shares) {
            let row = rows[r.as_str()];
            if ns(&row["finish_ms"]) < end {
                continue;
            }
            let e = out.entry(r.clone()).or_default();
            e.0 += share;
            if !row["first_token_ms"].is_empty() && end <= ns(&row["first_token_ms"]) {
                e.1 += share;
            }
        }
    }
    out
}
