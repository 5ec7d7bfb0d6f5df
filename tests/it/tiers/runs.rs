//! A whole `kvbench run` with a host tier, through the binary: the shipped `quick-tiered`
//! scenario brings evicted prompt heads back from the host tier on `cpu` (real bytes, checked by
//! the oracle) and on `sim` (checked by the shadow payload), and the planted `stale-onload` —
//! a host slot handed out again while an onload from it may not have run — fails the run on
//! both, by wrong logits on `cpu` and wrong tags on `sim`, besides the manager's own check.

use std::path::Path;

use serde_json::Value;

use crate::support;
use support::kvbench;

fn run(backend: &str, out: &Path, extra: &[&str]) -> (i32, String, Value) {
    let out_s = out.to_str().expect("utf-8 path");
    let mut args = vec![
        "run",
        "scenarios/quick-tiered.toml",
        "--backend",
        backend,
        "--out",
        out_s,
        "--force",
        "--check-every",
        "0",
    ];
    args.extend_from_slice(extra);
    let (code, text) = kvbench(&args);
    let summary = std::fs::read_to_string(out.join("summary.json"))
        .unwrap_or_else(|e| panic!("summary.json: {e}\n{text}"));
    let v: Value = serde_json::from_str(&summary).expect("summary.json parses");
    (code, text, v)
}

fn paged(v: &Value) -> &Value {
    v["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .find(|r| r["cache"] == "paged")
        .expect("a paged run")
}

fn host_onloads(v: &Value) -> u64 {
    paged(v)["tiers"][0]["onloads"].as_u64().unwrap_or(0)
}

#[test]
fn host_tier_hits_pass_the_oracle_on_cpu_and_the_shadow_on_sim() {
    let dir = tempfile::tempdir().expect("tempdir");
    for backend in ["cpu", "sim"] {
        let (code, text, v) = run(backend, &dir.path().join(backend), &[]);
        assert_eq!(code, 0, "{backend}: {text}");
        let onloads = host_onloads(&v);
        assert!(
            onloads > 0,
            "{backend}: no block came back from the host tier"
        );
        let hits = &paged(&v)["tier_costs"]["admission_hits"];
        assert!(
            hits["host_tokens"].as_u64().unwrap_or(0) > 0,
            "{backend}: no admission hit the host tier: {hits}"
        );
        match backend {
            "cpu" => {
                let n = &paged(&v)["numerics"];
                assert_eq!(n["ok"], true, "{n}");
                assert!(n["checked_steps"].as_u64().unwrap_or(0) > 0, "{n}");
            }
            _ => {
                let sh = &v["shadow"];
                assert!(!sh.is_null(), "sim carries the shadow by default");
                let sh = &paged(&v)["shadow"];
                assert_eq!(sh["violations"], 0, "{sh}");
                assert_eq!(sh["onloads"].as_u64(), Some(onloads), "{sh}");
            }
        }
    }
}

#[test]
fn a_stale_onload_fails_the_run_on_cpu_and_on_sim() {
    let dir = tempfile::tempdir().expect("tempdir");
    for backend in ["cpu", "sim"] {
        let (code, text, v) = run(
            backend,
            &dir.path().join(backend),
            &["--inject-fault", "stale-onload"],
        );
        assert_eq!(code, 1, "{backend}: {text}");
        assert!(
            v["fault_fired"].as_u64().unwrap_or(0) > 0,
            "{backend}: the fault never fired: {text}"
        );
        match backend {
            // The bytes alone catch it: the onloaded block holds another prompt's K/V.
            "cpu" => {
                let n = &paged(&v)["numerics"];
                assert_eq!(n["ok"], false, "{n}");
                assert!(text.contains("numerics: max relative error"), "{text}");
            }
            _ => {
                let sh = &paged(&v)["shadow"];
                assert!(sh["violations"].as_u64().unwrap_or(0) > 0, "{sh}");
                assert!(text.contains("shadow payload"), "{text}");
            }
        }
    }
}
