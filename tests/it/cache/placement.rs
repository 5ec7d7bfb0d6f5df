//! The paged manager's placement policies: `extents` keeps a sequence's blocks ascending within
//! 64-block extents, and — whatever the operations — hands out exactly as many blocks as `lifo`
//! at every step, so no count, failure or waste figure moves. The model-based property tests
//! (`cache::model`, through `cache::fuzz`) run `extents` against the reference model too.
//!
//! `PROPTEST_CASES` raises the case count; a failure prints the operations that caused it.

use crate::support;

use kvbench::cache::{PagedCache, PagedConfig, Placement};
use kvbench_cache_api::{
    AllocError, CopyOp, KvCacheManager, ReleaseReason, ReuseScope, ScopeKey, StartRequest,
};
use proptest::prelude::*;

fn paged(total_blocks: u32, block_size: u32, placement: Placement) -> PagedCache {
    PagedCache::new(PagedConfig {
        total_blocks,
        block_size,
        prefix_cache: true,
        placement,
    })
}

/// One operation, naming sequences by an index modulo the live count.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// A prompt of `len` tokens drawn from a small vocabulary (so prefixes repeat and hit).
    Start {
        len: u8,
        vocab: u8,
    },
    Append {
        pick: u8,
        n: u8,
    },
    Fork {
        pick: u8,
    },
    Release {
        pick: u8,
    },
    BeginStep,
    RetireOldest,
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u8..60, 1u8..4).prop_map(|(len, vocab)| Op::Start { len, vocab }),
        4 => (any::<u8>(), 1u8..20).prop_map(|(pick, n)| Op::Append { pick, n }),
        1 => any::<u8>().prop_map(|pick| Op::Fork { pick }),
        2 => any::<u8>().prop_map(|pick| Op::Release { pick }),
        1 => Just(Op::BeginStep),
        1 => Just(Op::RetireOldest),
        1 => Just(Op::Flush),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// Both managers, driven by the same operations; every outcome compared.
struct Pair {
    lifo: PagedCache,
    ext: PagedCache,
    live: Vec<u64>,
    next: u64,
    in_flight: std::collections::VecDeque<u64>,
    scope: ScopeKey,
    token: u32,
}

impl Pair {
    fn apply(&mut self, op: Op) -> Result<(), String> {
        let pick = |live: &[u64], p: u8| (!live.is_empty()).then(|| live[p as usize % live.len()]);
        match op {
            Op::Start { len, vocab } => {
                let seq = self.next;
                self.next += 1;
                let tokens: Vec<u32> = (0..u32::from(len))
                    .map(|i| (i * 7 + seq as u32 % u32::from(vocab)) % 5)
                    .collect();
                let req = StartRequest {
                    seq,
                    tokens: &tokens,
                    scope: Some(&self.scope),
                    reserve_tokens: tokens.len() as u32,
                };
                let (a, b) = (self.lifo.start(&req), self.ext.start(&req));
                same(
                    "start",
                    &a.as_ref().map(|s| s.cached_tokens),
                    &b.as_ref().map(|s| s.cached_tokens),
                )?;
                if let Ok(s) = a {
                    let n = tokens.len() as u32 - s.cached_tokens;
                    same("fill", &self.lifo.fill(seq, n), &self.ext.fill(seq, n))?;
                    self.live.push(seq);
                }
            }
            Op::Append { pick: p, n } => {
                if let Some(seq) = pick(&self.live, p) {
                    for _ in 0..n {
                        self.token += 1;
                        let (a, b) = (
                            self.lifo.append_token(seq, self.token % 5),
                            self.ext.append_token(seq, self.token % 5),
                        );
                        // Copy lists name different blocks; their number and lengths agree.
                        let shape =
                            |r: &Result<Vec<CopyOp>, AllocError>| -> Result<Vec<u32>, AllocError> {
                                r.clone().map(|c| c.iter().map(|c| c.len_tokens).collect())
                            };
                        same("append", &shape(&a), &shape(&b))?;
                        if a.is_err() {
                            break;
                        }
                    }
                }
            }
            Op::Fork { pick: p } => {
                if let Some(parent) = pick(&self.live, p) {
                    let child = self.next;
                    self.next += 1;
                    let (a, b) = (self.lifo.fork(parent, child), self.ext.fork(parent, child));
                    same("fork", &a.is_ok(), &b.is_ok())?;
                    if a.is_ok() {
                        self.live.push(child);
                    }
                }
            }
            Op::Release { pick: p } => {
                if let Some(seq) = pick(&self.live, p) {
                    self.live.retain(|&s| s != seq);
                    let why = ReleaseReason::Finish;
                    same(
                        "release",
                        &self.lifo.release(seq, why),
                        &self.ext.release(seq, why),
                    )?;
                }
            }
            Op::BeginStep => {
                let (a, b) = (self.lifo.begin_step(), self.ext.begin_step());
                same("begin_step", &a, &b)?;
                self.in_flight.push_back(a);
            }
            Op::RetireOldest => {
                if let Some(s) = self.in_flight.pop_front() {
                    self.lifo.retire_step(s);
                    self.ext.retire_step(s);
                }
            }
            Op::Flush => {
                self.lifo.flush_prefix_cache();
                self.ext.flush_prefix_cache();
            }
        }
        same(
            "accounting",
            &self.lifo.accounting(),
            &self.ext.accounting(),
        )?;
        same(
            "prefix stats",
            &self.lifo.prefix_stats(),
            &self.ext.prefix_stats(),
        )?;
        self.ext
            .check_invariants()
            .map_err(|e| format!("extents invariants: {e}"))
    }
}

fn same<T: std::fmt::Debug + PartialEq>(what: &str, lifo: &T, ext: &T) -> Result<(), String> {
    if lifo == ext {
        Ok(())
    } else {
        Err(format!("{what}: lifo {lifo:?}, extents {ext:?}"))
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Placement decides which block, never whether: every start, append, fork and release
    /// succeeds or fails alike, and accounting and prefix statistics agree after every operation.
    #[test]
    fn extents_hand_out_as_many_blocks_as_lifo(
        ops in prop::collection::vec(op(), 1..200),
        blocks in 8u32..200,
        bs in prop::sample::select(vec![1u32, 2, 4]),
    ) {
        let mut pair = Pair {
            lifo: paged(blocks, bs, Placement::Lifo),
            ext: paged(blocks, bs, Placement::Extents),
            live: Vec::new(),
            next: 1,
            in_flight: Default::default(),
            scope: ScopeKey { model: "m".into(), tokenizer: "t".into(), reuse: ReuseScope::Global },
            token: 0,
        };
        for (i, &op) in ops.iter().enumerate() {
            if let Err(e) = pair.apply(op) {
                prop_assert!(false, "after operation {i} ({op:?}): {e}");
            }
        }
    }

    /// In an empty pool, `k` sequences growing a token at a time in turn (as decode steps do)
    /// each get ascending neighbours: every step of a table is the next block, except one jump
    /// per 64 blocks into a fresh extent.
    #[test]
    fn interleaved_growth_keeps_each_table_ascending(k in 1usize..6, tokens in 1u32..700) {
        let bs = 4;
        let need = k as u32 * tokens.div_ceil(bs);
        let mut m = paged(need + 64 * k as u32, bs, Placement::Extents);
        for s in 0..k as u64 {
            let req = StartRequest { seq: s, tokens: &[1], scope: None, reserve_tokens: 1 };
            m.start(&req).expect("room");
            m.fill(s, 1).expect("fill");
        }
        for _ in 1..tokens {
            for s in 0..k as u64 {
                m.append(s).expect("room");
            }
        }
        for s in 0..k as u64 {
            let t = m.block_table(s).expect("live");
            let jumps = t.windows(2).filter(|w| w[1] != w[0] + 1).count();
            prop_assert!(jumps <= (t.len().saturating_sub(1)) / 64, "seq {s}: {jumps} jumps in {t:?}");
        }
        prop_assert!(m.check_invariants().is_ok());
    }
}

/// A run's `summary.json` names the placement its paged run used (and none for contiguous), and
/// the two placements give the same requests, tokens and waste on the same request list.
#[test]
fn summary_json_names_the_placement_and_figures_do_not_move() {
    let dir = tempfile::tempdir().expect("tempdir");
    let summary = |placement: &str| -> serde_json::Value {
        let out = dir.path().join(placement);
        support::run_sim(
            "scenarios/quick-mixed.toml",
            &out,
            &["--set", &format!("cache.placement={placement}")],
        );
        let text = std::fs::read_to_string(out.join("summary.json")).expect("summary.json");
        serde_json::from_str(&text).expect("json")
    };
    let (lifo, extents) = (summary("lifo"), summary("extents"));
    for (s, name) in [(&lifo, "lifo"), (&extents, "extents")] {
        let runs = s["runs"].as_array().expect("runs[]");
        let paged = runs.iter().find(|r| r["cache"] == "paged").expect("paged");
        let contiguous = runs
            .iter()
            .find(|r| r["cache"] == "contiguous")
            .expect("contiguous");
        assert_eq!(paged["placement"], name);
        assert!(contiguous.get("placement").is_none(), "{contiguous}");
    }
    for path in [
        &["requests"][..],
        &["output_tokens"],
        &["memory", "kv_waste_fraction"],
        &["peak_running_sequences"],
    ] {
        let at =
            |s: &serde_json::Value| path.iter().fold(s["runs"][0].clone(), |v, k| v[k].clone());
        assert!(!at(&lifo).is_null(), "{path:?} missing");
        assert_eq!(at(&lifo), at(&extents), "{path:?} moved with the placement");
    }
}
