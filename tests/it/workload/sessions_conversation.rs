//! Multi-turn sessions on `sim` and `cpu`: turn k + 1's prompt is turn k's prompt, then turn
//! k's output token for token, then its own new tokens; with nothing evicted it hits the prefix
//! cache for at least turn k's full prompt blocks; a cancelled or overlong turn ends its session;
//! front truncation keeps the conversation's tail. The prompts are recorded at the backend seam
//! (what the backend was asked to compute), so on `cpu` the oracle has checked these very prompts.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kvbench::backend::{self, Backend, BackendError, BackendKind, MemoryParts, NumericsReport};
use kvbench::backend::{RunSetup, StepOutput, StepPlan};
use kvbench::engine::{self, EngineConfig, RunRecord, StreamStatus};
use kvbench::scenario::{Scenario, SessionOverflow};
use kvbench::workload::{self, Workload};
use kvbench_cache_api::{CacheMode, KvCacheManager, ScopeKey, SeqId};

/// A backend that remembers the prompt each sequence was registered with.
struct Recording {
    inner: Box<dyn Backend>,
    prompts: BTreeMap<SeqId, Vec<u32>>,
}

impl Backend for Recording {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn computes(&self) -> bool {
        self.inner.computes()
    }
    fn register(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        scope: Option<&ScopeKey>,
    ) -> Result<(), BackendError> {
        self.prompts.entry(seq).or_insert_with(|| prompt.to_vec());
        self.inner.register(seq, prompt, scope)
    }
    fn fork(&mut self, parent: SeqId, child: SeqId, rank: u32) -> Result<u32, BackendError> {
        self.inner.fork(parent, child, rank)
    }
    fn forget(&mut self, seq: SeqId) -> Result<(), BackendError> {
        self.inner.forget(seq)
    }
    fn submit(&mut self, plan: &StepPlan, cache: &dyn KvCacheManager) -> Result<(), BackendError> {
        self.inner.submit(plan, cache)
    }
    fn complete(&mut self) -> Result<StepOutput, BackendError> {
        self.inner.complete()
    }
    fn memory(&self) -> MemoryParts {
        self.inner.memory()
    }
    fn numerics(&self) -> Option<NumericsReport> {
        self.inner.numerics()
    }
}

fn scenario(overrides: &[&str]) -> Scenario {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/conversation-quick.toml");
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    kvbench::scenario::load(&path, &o).unwrap_or_else(|e| panic!("{e}"))
}

/// One run; returns the record and each request's (rank-0) prompt as the backend saw it.
fn run(
    s: &Scenario,
    w: &Workload,
    kind: BackendKind,
    mode: CacheMode,
) -> (RunRecord, BTreeMap<u64, Vec<u32>>) {
    let model = s.model_shape().unwrap();
    let slots = s.kv_budget_bytes(None).unwrap() / model.kv_bytes_per_token();
    let setup = RunSetup {
        model: model.clone(),
        device: s.device.clone(),
        scenario_dir: None,
        cache_slots: slots,
        block_size: s.block_size(),
        seed: s.seed,
        max_step_tokens: s.scheduler.max_tokens_per_step,
        swap_gbytes_per_s: None,
        workspace_bytes: None,
        profile: None,
        clock: Default::default(),
        tiers: Default::default(),
    };
    let mut be = Recording {
        inner: backend::create(kind, &setup).expect("backend"),
        prompts: BTreeMap::new(),
    };
    let mut cache = kvbench::cache::build(&kvbench::cache::CacheSpec::new(
        mode,
        slots,
        s.block_size(),
        s.scheduler.prefix_cache,
    ));
    let cfg = EngineConfig {
        mode,
        block_size: cache.block_size(),
        kv_bytes_per_token: model.kv_bytes_per_token(),
        slot_bytes: model.kv_bytes_per_token(),
        max_seq_len: s.cache.max_seq_len,
        reservation: s.cache.contiguous_reservation,
        scheduler: s.scheduler.clone(),
        model_name: model.name.clone(),
        trace_tokens: false,
        invariant_check_every: 1,
        fault: None,
    };
    let rec = engine::run(&cfg, w, cache.as_mut(), &mut be).expect("engine run");
    assert_eq!(rec.end.violation, None);
    assert!(rec.end.reclamation.ok, "{}", rec.end.reclamation.detail);
    if let Some(n) = rec.end.numerics {
        assert!(n.ok && n.checked_steps > 0, "oracle: {n:?}");
    }
    let prompts = be
        .prompts
        .into_iter()
        .filter(|(seq, _)| rec.streams[*seq as usize].rank == 0)
        .map(|(seq, p)| (rec.streams[seq as usize].request, p))
        .collect();
    (rec, prompts)
}

/// Checks every consecutive pair of issued turns; returns how many pairs it checked.
/// `truncate_at`: the max_seq_len a front-truncating session keeps each turn within.
fn check_conversations(
    w: &Workload,
    rec: &RunRecord,
    prompts: &BTreeMap<u64, Vec<u32>>,
    truncate_at: Option<u32>,
) -> usize {
    let head: BTreeMap<u64, &engine::StreamRecord> = rec
        .streams
        .iter()
        .filter(|s| s.rank == 0)
        .map(|s| (s.request, s))
        .collect();
    let mut pairs = 0;
    for r in &w.requests {
        let Some(turn) = r.session else { continue };
        let Some(next) = turn.next else { continue };
        let (Some(prev), Some(cur)) = (head.get(&r.id), head.get(&next)) else {
            // Not issued: the previous turn did not complete, or was never issued itself.
            if let Some(prev) = head.get(&r.id) {
                assert_ne!(
                    prev.status,
                    StreamStatus::Completed,
                    "turn after {} missing",
                    r.id
                );
            }
            continue;
        };
        assert_eq!(
            prev.status,
            StreamStatus::Completed,
            "turn {next} issued after a failed turn"
        );
        let new = w.requests[next as usize].prompt.tokens();
        let pp = &prompts[&r.id];
        if cur.status == StreamStatus::Rejected {
            // Never computed: too long. Its length is still the whole conversation's.
            let whole = pp.len() + prev.token_ids.len() + new.len();
            assert_eq!(cur.prompt_tokens as usize, whole, "request {next}");
            assert!(truncate_at.is_none());
            continue;
        }
        let cp = &prompts[&next];
        let mut want: Vec<u32> = pp.clone();
        want.extend_from_slice(&prev.token_ids);
        want.extend_from_slice(&new);
        match truncate_at {
            None => assert_eq!(
                cp, &want,
                "request {next}: conversation so far + new tokens"
            ),
            Some(msl) => {
                let room = msl - w.requests[next as usize].output_tokens;
                let keep = want.len().min(room as usize);
                assert_eq!(
                    cp[..],
                    want[want.len() - keep..],
                    "request {next}: the conversation's tail"
                );
            }
        }
        // The next turn arrives after the previous turn's last token.
        assert!(cur.arrival_ns >= prev.finish_ns, "request {next}");
        assert_eq!(cur.prompt_tokens as usize, cp.len());
        pairs += 1;
    }
    pairs
}

fn check_on(kind: BackendKind) {
    let s = scenario(&[]);
    let w = workload::generate(&s, s.seed).unwrap();
    let (paged, pp) = run(&s, &w, kind, CacheMode::Paged);
    let (contiguous, cp) = run(&s, &w, kind, CacheMode::Contiguous);
    let pairs = check_conversations(&w, &paged, &pp, None);
    assert!(pairs >= 10, "only {pairs} follow-up turns were checked");
    check_conversations(&w, &contiguous, &cp, None);
    // Nothing was evicted: each follow-up hits at least the full blocks the previous turn held
    // — its prompt and its output but the last token, whose K/V no step wrote — since generated
    // blocks are published like prompt blocks.
    assert_eq!(paged.end.prefix.evictions, 0);
    let head: BTreeMap<u64, &engine::StreamRecord> = paged
        .streams
        .iter()
        .filter(|s| s.rank == 0)
        .map(|s| (s.request, s))
        .collect();
    let bs = s.block_size();
    for r in &w.requests {
        let (Some(turn), Some(prev)) = (r.session, head.get(&r.id)) else {
            continue;
        };
        let Some(cur) = turn.next.and_then(|n| head.get(&n)) else {
            continue;
        };
        if cur.status == StreamStatus::Rejected {
            continue;
        }
        let held = prev.prompt_tokens + (prev.token_ns.len() as u32).saturating_sub(1);
        let floor = held / bs * bs;
        assert!(
            cur.cached_prompt_tokens >= floor && floor > 0,
            "request {}: {} cached, previous turn held {} tokens ({} prompt)",
            cur.request,
            cur.cached_prompt_tokens,
            held,
            prev.prompt_tokens
        );
    }
    // Some conversations outgrew max_seq_len: their overlong turn was rejected, ending them.
    let rejected = paged
        .streams
        .iter()
        .filter(|s| s.status == StreamStatus::Rejected)
        .count();
    let issued = paged.streams.len();
    assert!(
        rejected > 0 && issued < w.requests.len(),
        "{rejected} rejected, {issued} of {}",
        w.requests.len()
    );
    if kind == BackendKind::Cpu {
        // Greedy decoding: both modes produced the same tokens, hence the same conversations.
        assert_eq!(results_mismatch(&paged, &contiguous), None);
        assert_eq!(pp, cp);
    }
}

fn results_mismatch(a: &RunRecord, b: &RunRecord) -> Option<String> {
    kvbench::experiment::compare_tokens(a, b)
}

#[test]
fn sessions_on_sim_carry_the_whole_conversation_and_hit_the_prefix_cache() {
    check_on(BackendKind::Sim);
}

#[test]
fn sessions_on_cpu_carry_real_generated_tokens_checked_by_the_oracle() {
    check_on(BackendKind::Cpu);
}

#[test]
fn a_cancelled_turn_ends_its_session() {
    let s = scenario(&[
        "traffic.cancellation={ share = 1.0, when = \"after_tokens\", after_tokens = { dist = \"fixed\", value = 2 } }",
    ]);
    let w = workload::generate(&s, s.seed).unwrap();
    let (rec, _) = run(&s, &w, BackendKind::Sim, CacheMode::Paged);
    let sessions = w
        .requests
        .iter()
        .filter(|r| r.session.is_some_and(|t| t.turn == 0))
        .count();
    assert!(w.requests.len() > sessions);
    assert_eq!(rec.streams.len(), sessions, "only first turns were issued");
    assert!(rec
        .streams
        .iter()
        .all(|s| s.status == StreamStatus::Cancelled));
}

#[test]
fn front_truncation_keeps_the_tail_of_the_conversation() {
    let mut s = scenario(&["cache.max_seq_len=160"]);
    s.traffic.sessions.as_mut().unwrap().overflow = SessionOverflow::Truncate;
    let w = workload::generate(&s, s.seed).unwrap();
    let (rec, prompts) = run(&s, &w, BackendKind::Sim, CacheMode::Paged);
    assert_eq!(
        rec.streams
            .iter()
            .filter(|s| s.status == StreamStatus::Rejected)
            .count(),
        0
    );
    let mut truncated = 0;
    for r in &w.requests {
        let Some(p) = prompts.get(&r.id) else {
            continue;
        };
        assert!(p.len() as u32 + r.output_tokens <= 160, "request {}", r.id);
        if p.len() as u32 + r.output_tokens == 160 {
            truncated += 1;
        }
    }
    assert!(truncated > 0, "no conversation reached the limit");
    // Every turn is issued: truncation never ends a session.
    assert_eq!(rec.streams.len(), w.requests.len());
    assert!(check_conversations(&w, &rec, &prompts, Some(160)) > 10);
}
