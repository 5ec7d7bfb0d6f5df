//! Swap preemption of grouped runs: the engine swaps sequences of the hybrid paged manager and
//! the grouped contiguous baseline out and back in under the grouped shadow; each swap's bytes
//! are recomputed from `trace.jsonl` by the grouping rule (a full table every block, a sliding
//! table the blocks touching its window, a recurrent state its bytes).

use crate::support::engine as engine_support;
use crate::support::hybrid_run as hybrid_run_support;
use hybrid_run_support::*;

use serde_json::Value;

/// A run of `scenario` on sim with the grouped shadow on, swap preemption and pressure (a small
/// budget, long outputs, no watermark): its summary and `trace.jsonl`'s swap lines.
fn swap_run(scenario: &str, extra: &[&str]) -> (Value, Vec<Value>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let mut flags = vec![
        "--check-every",
        "0",
        "--set",
        "traffic.requests=60",
        "--set",
        "traffic.arrival.rate_per_s=40",
        "--set",
        "traffic.prompt_tokens.median=300",
        "--set",
        "traffic.output_tokens.median=900",
        "--set",
        "scheduler.preemption=swap",
        "--set",
        "scheduler.watermark=0",
        "--set",
        "scheduler.max_tokens_per_step=512",
    ];
    flags.extend_from_slice(extra);
    let (_, s) = run_sim(scenario, &out, &flags);
    let swaps = std::fs::read_to_string(out.join("trace.jsonl"))
        .expect("trace")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("trace line"))
        .filter(|v| v["event"] == "swap_out" || v["event"] == "swap_in")
        .collect();
    (s, swaps)
}

/// Both shapes' swaps, recomputed from each trace line's tokens by the grouping rule: a full
/// table swaps every block, a sliding table the blocks touching its window, and a recurrent
/// state its bytes (in slots, rounded up); the shadow sees every swap-in restore what was
/// swapped out, so the runs being clean is the check that the restored tables are right.
#[test]
fn swap_preemption_on_grouped_runs_is_shadowed_clean_and_priced_at_what_the_tables_keep() {
    // gpt-oss-120b: one full and one sliding (window 128) table of 18 layers, 16-token pages of
    // 18 × 16 × 2 KiB.
    let gpt_oss = |tokens: u64| {
        let blocks = tokens.div_ceil(BLOCK_TOKENS);
        let sliding = blocks - tokens.saturating_sub(WINDOW_TOKENS) / BLOCK_TOKENS;
        (blocks + sliding) * page_bytes()
    };
    // qwen3-next-80b: one table of its 12 full layers (2 KV heads of 256, bf16), and 36
    // DeltaNet states of (32 × 128 × 128 + 3 × 8192) bf16 values.
    let qwen_page: u64 = 12 * 16 * (2 * 2 * 256 * 2);
    let qwen_state: u64 = 36 * (32 * 128 * 128 + 3 * 8192) * 2;
    let qwen_slot = qwen_page / 16;
    let qwen =
        |tokens: u64| tokens.div_ceil(16) * qwen_page + qwen_state.div_ceil(qwen_slot) * qwen_slot;
    type Price<'a> = &'a dyn Fn(u64) -> u64;
    let cases: [(&str, &[&str], Price); 2] = [
        (GPT_OSS, &["--set", "memory.kv_budget=512 MiB"], &gpt_oss),
        (
            "scenarios/qwen3-next-80b-h200.toml",
            &[
                "--set",
                "memory.kv_budget=1 GiB",
                "--set",
                "scheduler.max_seqs_per_step=24",
            ],
            &qwen,
        ),
    ];
    for (scenario, extra, price) in cases {
        let (s, swaps) = swap_run(scenario, extra);
        assert_eq!(s["cache_manager"], "hybrid", "{scenario}");
        for mode in ["paged", "contiguous"] {
            let r = run_of(&s, mode);
            assert_eq!(r["requests"]["completed"], 60, "{scenario} {mode}");
            assert_eq!(r["reclamation"]["ok"], true, "{scenario} {mode}");
            assert_eq!(r["invariants"]["ok"], true, "{scenario} {mode}");
            assert_eq!(r["shadow"]["violations"], 0, "{scenario} {mode}");
            // Swapped-in tags are checked when their stream reads them next; only the paged
            // manager swaps (a stream's own writes are kept valid without re-reading them).
            if mode == "paged" {
                assert!(num(&r["shadow"]["checked_slots"]) > 0, "{scenario} {mode}");
            }
        }
        let paged = run_of(&s, "paged");
        let preempted = num(&paged["preemptions"]);
        assert!(preempted > 5, "{scenario}: {preempted} preemptions");
        let (mut outs, mut ins, mut bytes) = (0u64, 0u64, 0u64);
        for v in &swaps {
            assert_eq!(
                v["cache"], "paged",
                "{scenario}: only the paged manager preempts"
            );
            let tokens = num(&v["tokens"]);
            assert_eq!(num(&v["bytes"]), price(tokens), "{scenario}: {v}");
            bytes += num(&v["bytes"]);
            if v["event"] == "swap_out" {
                outs += 1;
            } else {
                ins += 1;
            }
        }
        assert_eq!((outs, ins), (preempted, preempted), "{scenario}");
        assert_eq!(num(&paged["swapped_bytes"]), bytes, "{scenario}");
        eprintln!("{scenario}: {preempted} swaps out and in, {bytes} bytes moved");
    }
}

/// Forced pressure on any manager: the third append of each sequence is refused once as if the
/// pool were full, so the engine preempts (the newest running sequence) and, with swap
/// preemption, swaps it out and back in through this manager. Everything else is the inner
/// manager's.
struct Pressed {
    inner: Box<dyn kvbench_cache_api::KvCacheManager>,
    appends: std::collections::BTreeMap<u64, u32>,
    refused: u64,
}

impl kvbench_cache_api::KvCacheManager for Pressed {
    fn mode(&self) -> kvbench_cache_api::CacheMode {
        self.inner.mode()
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn probe_start(&self, req: &kvbench_cache_api::StartRequest<'_>) -> kvbench_cache_api::Probe {
        self.inner.probe_start(req)
    }
    fn start(
        &mut self,
        req: &kvbench_cache_api::StartRequest<'_>,
    ) -> Result<kvbench_cache_api::Started, kvbench_cache_api::AllocError> {
        self.inner.start(req)
    }
    fn fill(&mut self, seq: u64, n: u32) -> Result<(), kvbench_cache_api::AllocError> {
        self.inner.fill(seq, n)
    }
    fn restore(&mut self, seq: u64, n: u32) -> Result<(), kvbench_cache_api::AllocError> {
        self.inner.restore(seq, n)
    }
    fn swap_slots(&self, seq: u64, tokens: u32) -> u64 {
        self.inner.swap_slots(seq, tokens)
    }
    fn append(
        &mut self,
        seq: u64,
    ) -> Result<Vec<kvbench_cache_api::CopyOp>, kvbench_cache_api::AllocError> {
        let n = self.appends.entry(seq).or_insert(0);
        *n += 1;
        if *n == 3 {
            self.refused += 1;
            return Err(kvbench_cache_api::AllocError::NoSpace {
                needed_slots: 1,
                available_slots: 0,
            });
        }
        self.inner.append(seq)
    }
    fn append_cost(&self, seq: u64) -> u64 {
        self.inner.append_cost(seq)
    }
    fn sequence_slots(&self, tokens: u64, reserve_tokens: u32) -> u64 {
        self.inner.sequence_slots(tokens, reserve_tokens)
    }
    fn fork(
        &mut self,
        parent: u64,
        child: u64,
    ) -> Result<Vec<kvbench_cache_api::CopyOp>, kvbench_cache_api::AllocError> {
        self.inner.fork(parent, child)
    }
    fn release(
        &mut self,
        seq: u64,
        why: kvbench_cache_api::ReleaseReason,
    ) -> Result<(), kvbench_cache_api::AllocError> {
        self.inner.release(seq, why)
    }
    fn begin_step(&mut self) -> kvbench_cache_api::StepId {
        self.inner.begin_step()
    }
    fn retire_step(&mut self, step: kvbench_cache_api::StepId) {
        self.inner.retire_step(step)
    }
    fn layout(&self, seq: u64) -> Option<kvbench_cache_api::SeqLayout<'_>> {
        self.inner.layout(seq)
    }
    fn seq_tokens(&self, seq: u64) -> Option<u32> {
        self.inner.seq_tokens(seq)
    }
    fn accounting(&self) -> kvbench_cache_api::Accounting {
        self.inner.accounting()
    }
    fn prefix_stats(&self) -> kvbench_cache_api::PrefixStats {
        self.inner.prefix_stats()
    }
    fn largest_free_extent(&self) -> u64 {
        self.inner.largest_free_extent()
    }
    fn flush_prefix_cache(&mut self) {
        self.inner.flush_prefix_cache()
    }
    fn check_invariants(&self) -> Result<(), String> {
        self.inner.check_invariants()
    }
    fn assert_quiescent(&self) -> Result<(), String> {
        self.inner.assert_quiescent()
    }
    fn inject_fault(&mut self, fault: kvbench_cache_api::Fault) {
        self.inner.inject_fault(fault)
    }
    fn fault_fired(&self) -> u64 {
        self.inner.fault_fired()
    }
}

/// The grouped contiguous baseline (and the hybrid paged manager beside it) swapped out and
/// back in by the engine: prompts of 150 tokens on `tiny-sliding` (2 sliding layers of window
/// 12, 2 full) with 64-token steps, so the baseline's rings (⌈(12 + 64) / 16⌉ + 1 = 6 pages)
/// turn, and a whole-prompt fill at swap-in would be refused. The shadow checks every read after
/// each swap-in; each swap moves the full table's blocks and the sliding table's window blocks.
#[test]
fn swap_preemption_restores_grouped_sequences_under_the_shadow_in_both_modes() {
    use kvbench::backend::sim::SimBackend;
    use kvbench::cache::hybrid::{HybridKv, HybridLayout};
    use kvbench::engine::TraceKind;
    use kvbench::model::ModelShape;
    use kvbench::scenario::PreemptionMode;
    use kvbench_cache_api::CacheMode;

    let shape = ModelShape::tiny_sliding();
    let layout = HybridLayout::new(&shape, 16, 64 << 20, 8).expect("layout");
    let slot_bytes = layout.slot_bytes();
    // Both tables of 2 layers store the same bytes a token: 16 tokens a page.
    assert!(layout.tables.iter().all(|t| t.block_tokens == 16));
    let window = u64::from(kvbench::model::TINY_SLIDING_WINDOW);
    let price = |tokens: u64| {
        let blocks = tokens.div_ceil(16);
        let sliding = blocks - tokens.saturating_sub(window) / 16;
        (blocks + sliding) * 16 * slot_bytes
    };
    for mode in [CacheMode::Contiguous, CacheMode::Paged] {
        let mut sched = engine_support::sched();
        sched.max_tokens_per_step = 64;
        sched.preemption = PreemptionMode::Swap;
        let mut cfg = engine_support::config(mode, sched);
        cfg.kv_bytes_per_token = shape.kv_bytes_per_token();
        cfg.slot_bytes = slot_bytes;
        cfg.model_name = shape.name.clone();
        let requests = (0..12u64)
            .map(|i| engine_support::req(i, i as f64 * 0.5, 150, 30))
            .collect();
        let w = engine_support::workload(requests);
        let inner: Box<dyn kvbench_cache_api::KvCacheManager> = match mode {
            CacheMode::Paged => Box::new(HybridKv::new(layout.clone())),
            CacheMode::Contiguous => Box::new(kvbench_baselines::manager::GroupedContiguous::new(
                layout.grouped_pool(),
                64,
            )),
        };
        let mut cache = Pressed {
            inner,
            appends: Default::default(),
            refused: 0,
        };
        let total = cache.inner.accounting().total_slots;
        let setup = engine_support::sim_setup(&shape, &cfg, total);
        let mut backend = SimBackend::new(&setup)
            .and_then(|b| b.with_shadow())
            .expect("sim backend");
        let r = kvbench::engine::run(&cfg, &w, &mut cache, &mut backend).expect("engine run");
        assert_eq!(r.end.violation, None, "{mode:?}");
        assert!(
            r.end.reclamation.ok,
            "{mode:?}: {}",
            r.end.reclamation.detail
        );
        let report = backend.shadow_report().expect("shadow");
        assert_eq!(report.violations, 0, "{mode:?}: {:?}", report.messages);
        assert!(report.checked_slots > 0, "{mode:?}");
        let completed = engine_support::count(&r, kvbench::engine::StreamStatus::Completed);
        assert_eq!(completed, 12, "{mode:?}");
        let (mut outs, mut ins) = (0, 0);
        for e in &r.events {
            let (bytes, tokens) = match e.kind {
                TraceKind::SwapOut { bytes, tokens } => {
                    outs += 1;
                    (bytes, tokens)
                }
                TraceKind::SwapIn { bytes, tokens } => {
                    ins += 1;
                    (bytes, tokens)
                }
                _ => continue,
            };
            assert!(tokens >= 150, "{mode:?}: swapped while decoding");
            assert_eq!(bytes, price(u64::from(tokens)), "{mode:?}: {tokens} tokens");
        }
        assert!(cache.refused > 0, "{mode:?}");
        assert!(outs > 0 && outs == ins, "{mode:?}: {outs} out, {ins} in");
        eprintln!("{mode:?}: {outs} swaps out and in under the shadow");
    }
}
