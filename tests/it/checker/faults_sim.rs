//! Planted faults must fire and be caught on `sim` with `--check-every 0` (no per-step invariant
//! checks), and the shadow KV payload must catch them by itself, without the cache manager's own
//! bookkeeping; a fault that never fired fails the run with the reason; the shadow catches a
//! cross-scope prefix read even though the tokens match; a clean run's shadow finds nothing on
//! any shipped scenario.

use std::path::PathBuf;

use kvbench::backend::sim::SimBackend;
use kvbench::backend::RunSetup;
use kvbench::cache::{PagedCache, PagedConfig, Placement, PlantedBug};
use kvbench::engine::{self, EngineConfig};
use kvbench::experiment::{self, Experiment, RunOptions};
use kvbench::results;
use kvbench::scenario::Scenario;
use kvbench_cache_api::{CacheMode, Fault};

use crate::support;
use support::kvbench;

fn scenario_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"))
}

fn scenario(name: &str, overrides: &[&str]) -> Scenario {
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    kvbench::scenario::load(&scenario_path(name), &o).expect("scenario loads")
}

fn run(s: &Scenario, fault: Option<Fault>, shadow: bool) -> Experiment {
    let opts = RunOptions {
        fault,
        shadow,
        invariant_check_every: 0,
        trace_tokens: false,
        ..RunOptions::default()
    };
    experiment::run_scenario(s, &opts).expect("run")
}

fn shadow_violations(exp: &Experiment, mode: CacheMode) -> u64 {
    exp.run(mode)
        .and_then(|r| r.shadow.as_ref())
        .expect("sim carries the shadow")
        .violations
}

/// Which shipped scenario exercises which fault, and which check must catch it.
const CASES: [(Fault, &str, &[&str]); 4] = [
    // Half the requests fork 4 continuations that share a partially filled block.
    (
        Fault::SkipCow,
        "parallel-sampling-8b-h200",
        &["traffic.requests=40"],
    ),
    // Streams are cancelled while a step that reads them is in flight (the fault runs with
    // async steps), so their blocks are handed out again while that step still reads them.
    (
        Fault::EarlyReuse,
        "cancel-storm-8b-h200",
        &["traffic.requests=60"],
    ),
    (Fault::Leak, "chat-8b-h200", &["traffic.requests=40"]),
    (
        Fault::BadBlockTable,
        "chat-8b-h200",
        &["traffic.requests=40"],
    ),
];

#[test]
fn every_planted_fault_fires_and_is_caught_with_check_every_0() {
    for (fault, name, overrides) in CASES {
        let exp = run(&scenario(name, overrides), Some(fault), true);
        let paged = exp.run(CacheMode::Paged).expect("paged run");
        assert!(
            paged.fault_fired > 0,
            "{}: never fired on {name}",
            fault.name()
        );
        let failures = exp.failures();
        assert!(
            !failures.is_empty(),
            "{} on {name}: not caught",
            fault.name()
        );
        assert!(
            !failures.iter().any(|f| f.contains("never fired")),
            "{failures:?}"
        );
        match fault {
            // A leak is a reclamation failure; the shadow has nothing to read wrong.
            Fault::Leak => assert!(!paged.end.reclamation.ok),
            // The others corrupt what steps read: the shadow sees it on its own.
            _ => {
                let sh = paged.shadow.as_ref().expect("shadow");
                assert!(
                    sh.violations > 0,
                    "{} on {name}: the shadow saw nothing",
                    fault.name()
                );
                assert!(
                    failures.iter().any(|f| f.contains("shadow payload")),
                    "{failures:?}"
                );
                assert!(
                    sh.messages[0].contains("read position"),
                    "{:?}",
                    sh.messages
                );
            }
        }
        assert_eq!(
            shadow_violations(&exp, CacheMode::Contiguous),
            0,
            "{}: the fault is armed on paged only",
            fault.name()
        );
        let summary = results::summary::build(&exp);
        assert_eq!(summary.fault_fired, Some(exp.fault_fired()));
        assert!(!summary.checks.ok);
    }
}

#[test]
fn bad_block_table_is_caught_by_the_shadow_alone() {
    // With per-step invariant checks off, the layout corruption is visible only in what steps
    // read; without the shadow nothing reads layouts on sim, so the fault never even fires.
    let s = scenario("chat-8b-h200", &["traffic.requests=40"]);
    let with = run(&s, Some(Fault::BadBlockTable), true);
    let paged = with.run(CacheMode::Paged).expect("paged");
    assert!(paged.end.violation.is_none() && paged.end.reclamation.ok);
    assert!(shadow_violations(&with, CacheMode::Paged) > 0);
    let without = run(&s, Some(Fault::BadBlockTable), false);
    assert_eq!(without.fault_fired(), 0);
    assert!(without
        .run(CacheMode::Paged)
        .expect("paged")
        .shadow
        .is_none());
    assert_eq!(
        without.failures(),
        vec![
            "bad-block-table never fired: no block table was handed to the backend, so the run \
             proves nothing"
                .to_string()
        ]
    );
}

#[test]
fn a_fault_that_never_fires_exits_1_and_says_why() {
    // quick-basic has no parallel sampling: no block is ever shared while partially filled.
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("r");
    let (code, text) = kvbench(&[
        "run",
        "scenarios/quick-basic.toml",
        "--backend",
        "sim",
        "--check-every",
        "0",
        "--inject-fault",
        "skip-cow",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("skip-cow never fired: no write into a shared partially filled block"),
        "{text}"
    );
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("summary.json")).expect("summary.json"),
    )
    .expect("json");
    assert_eq!(summary["fault_fired"], 0);
    assert_eq!(summary["runs"][0]["fault_fired"], 0);
    assert_eq!(summary["checks"]["ok"], false);
    assert_eq!(summary["shadow"], true);
}

#[test]
fn the_shadow_catches_a_cross_scope_prefix_read_with_matching_tokens() {
    // Tenant-scoped reuse: a manager whose prefix keys ignore the scope lets one tenant read
    // another's system-prompt blocks. The tokens are identical, so only the writer's scope,
    // recorded in the shadow, tells the read apart.
    let s = scenario("shared-prompts-8b-h200", &["traffic.requests=60"]);
    let w = kvbench::workload::generate(&s, s.seed).expect("workload");
    let model = s.model_shape().expect("model");
    let bs = s.block_size();
    let total_slots =
        s.kv_budget_bytes(Some(141_000_000_000)).expect("budget") / model.kv_bytes_per_token();
    let cfg = EngineConfig {
        mode: CacheMode::Paged,
        block_size: bs,
        kv_bytes_per_token: model.kv_bytes_per_token(),
        slot_bytes: model.kv_bytes_per_token(),
        max_seq_len: s.cache.max_seq_len,
        reservation: s.cache.contiguous_reservation,
        scheduler: s.scheduler.clone(),
        model_name: model.name.clone(),
        trace_tokens: false,
        invariant_check_every: 0,
        fault: None,
    };
    let setup = RunSetup {
        model,
        device: s.device.clone(),
        scenario_dir: None,
        cache_slots: total_slots,
        block_size: bs,
        seed: s.seed,
        max_step_tokens: s.scheduler.max_tokens_per_step,
        swap_gbytes_per_s: None,
        workspace_bytes: None,
        profile: None,
        clock: Default::default(),
        tiers: Default::default(),
    };
    for planted in [false, true] {
        let mut cache = PagedCache::new(PagedConfig {
            total_blocks: (total_slots / u64::from(bs)) as u32,
            block_size: bs,
            prefix_cache: true,
            placement: Placement::Lifo,
        });
        if planted {
            cache.plant_bug(PlantedBug::CrossScopeHit);
        }
        let mut be = SimBackend::new(&setup)
            .expect("sim")
            .with_shadow()
            .expect("shadow");
        let rec = engine::run(&cfg, &w, &mut cache, &mut be).expect("run");
        let sh = be.shadow_report().expect("shadow");
        assert!(
            rec.end.prefix.hit_tokens > 0,
            "the scenario reuses prefixes"
        );
        if planted {
            assert!(sh.violations > 0, "cross-scope read not seen");
            assert!(
                sh.messages[0].contains("reuse scope tenant:")
                    && sh.messages[0].contains("tokens match"),
                "{:?}",
                sh.messages
            );
        } else {
            assert_eq!(sh.violations, 0, "{:?}", sh.messages);
            // Prefix hits are reads of another stream's tags: compared one by one.
            assert!(sh.checked_slots > 0);
        }
    }
}

#[test]
fn a_clean_run_passes_the_shadow_on_every_shipped_scenario() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("scenarios/")
        .filter_map(|e| {
            let p = e.ok()?.path();
            let stem = p.file_stem()?.to_string_lossy().into_owned();
            (p.extension()? == "toml").then_some(stem)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 10, "{names:?}");
    let mut variants: Vec<(String, Vec<&str>)> = names
        .iter()
        .map(|n| (n.clone(), vec!["traffic.requests=120"]))
        .collect();
    // Pipelined steps, swap preemption and a tight pool: copies, swaps and fenced reuse.
    variants.push((
        "cancel-storm-8b-h200".into(),
        vec![
            "traffic.requests=120",
            "memory.kv_budget=2GiB",
            "scheduler.preemption=swap",
            "scheduler.async_steps=true",
        ],
    ));
    variants.push((
        "parallel-sampling-8b-h200".into(),
        vec![
            "traffic.requests=60",
            "memory.kv_budget=3GiB",
            "scheduler.async_steps=true",
        ],
    ));
    variants.push((
        "shared-prompts-8b-h200".into(),
        vec!["traffic.requests=120", "scheduler.prefix_scope=global"],
    ));
    for (name, overrides) in &variants {
        let exp = run(&scenario(name, overrides), None, true);
        assert!(
            exp.failures().is_empty(),
            "{name} {overrides:?}: {:?}",
            exp.failures()
        );
        for r in &exp.runs {
            let sh = r.shadow.as_ref().expect("shadow");
            assert_eq!(sh.violations, 0, "{name}: {:?}", sh.messages);
            assert!(
                sh.read_slots > 0 && sh.written_slots > 0,
                "{name}: the shadow saw no traffic"
            );
        }
    }
}

#[test]
fn report_md_names_a_switched_off_shadow() {
    let s = scenario("quick-basic", &[]);
    let off = results::report::markdown(&run(&s, None, false));
    let on = results::report::markdown(&run(&s, None, true));
    assert!(off.contains("shadow KV payload was switched off"), "{off}");
    assert!(!on.contains("switched off"), "{on}");
}
