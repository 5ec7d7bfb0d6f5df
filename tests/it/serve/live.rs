//! The engine's live path on `sim`, fed by a scripted source: requests taken while it runs,
//! cancellations at any point releasing through the one path, shutdowns that drain or cancel,
//! and the end-of-run checks of a batch run.

use std::time::Duration;

use kvbench::backend::sim::SimBackend;
use kvbench::engine::sink::Collect;
use kvbench::engine::{self, LiveInput, LiveSource, LiveStats, StreamStatus};
use kvbench::model::ModelShape;
use kvbench_cache_api::CacheMode;

use crate::support::engine::{config, req, sched, sim_setup};

/// Hands over one scripted batch a poll (idle or not); then shuts down.
struct Script {
    batches: Vec<Vec<LiveInput>>,
    polls: usize,
    last: LiveStats,
}

impl LiveSource for Script {
    fn poll(&mut self, _wait: Option<Duration>) -> Vec<LiveInput> {
        self.polls += 1;
        if self.batches.is_empty() {
            return vec![LiveInput::Shutdown { cancel: false }];
        }
        self.batches.remove(0)
    }
    fn observe(&mut self, s: &LiveStats) {
        self.last = *s;
    }
}

fn live(mode: CacheMode, batches: Vec<Vec<LiveInput>>) -> (engine::RunRecord, usize, Script) {
    let cfg = config(mode, sched());
    let slots = 4096;
    let setup = sim_setup(&ModelShape::tiny(), &cfg, slots);
    let mut backend = SimBackend::new(&setup).expect("sim backend");
    let mut cache = kvbench::cache::build(&kvbench::cache::CacheSpec::new(
        cfg.mode,
        slots,
        cfg.block_size,
        cfg.scheduler.prefix_cache,
    ));
    let mut src = Script {
        batches,
        polls: 0,
        last: LiveStats::default(),
    };
    let mut collect = Collect::default();
    let (end, workload) =
        engine::run_live(&cfg, cache.as_mut(), &mut backend, &mut src, &mut collect)
            .expect("live run");
    let r = collect.into_record(end);
    assert_eq!(r.end.violation, None, "{mode:?}: invariants");
    assert!(
        r.end.reclamation.ok,
        "{mode:?}: {}",
        r.end.reclamation.detail
    );
    (r, workload.requests.len(), src)
}

fn submit(ids: std::ops::Range<u64>, output: u32) -> Vec<LiveInput> {
    ids.map(|i| LiveInput::Request(req(i, 0.0, 40, output)))
        .collect()
}

#[test]
fn requests_taken_while_running_all_complete_and_the_run_reclaims() {
    for mode in [CacheMode::Paged, CacheMode::Contiguous] {
        // Two now, nothing for a few turns, two more while the first ones decode.
        let (r, n, src) = live(
            mode,
            vec![submit(0..2, 30), vec![], vec![], submit(2..4, 10)],
        );
        assert_eq!(n, 4, "{mode:?}: the run returns the requests it took");
        assert_eq!(r.streams.len(), 4);
        for s in &r.streams {
            assert_eq!(s.status, StreamStatus::Completed, "{mode:?}: {s:?}");
            assert_eq!(s.token_ns.len(), if s.request < 2 { 30 } else { 10 });
        }
        assert_eq!(
            src.last.running, 0,
            "{mode:?}: the gauge reads idle at the end"
        );
        assert_eq!(src.last.waiting, 0);
    }
}

#[test]
fn a_client_cancel_at_any_point_releases_and_the_others_finish() {
    for mode in [CacheMode::Paged, CacheMode::Contiguous] {
        // Request 1 is cancelled while decoding, 3 right as it arrives (queued), 7 (never
        // sent) and 0 twice are ignored.
        let mut first = submit(0..3, 40);
        first.push(LiveInput::Cancel(7));
        let mut later = submit(3..4, 40);
        later.push(LiveInput::Cancel(3));
        let (r, _, _) = live(
            mode,
            vec![
                first,
                vec![],
                vec![],
                vec![LiveInput::Cancel(1)],
                later,
                vec![LiveInput::Cancel(1)],
            ],
        );
        let status: Vec<_> = r.streams.iter().map(|s| (s.request, s.status)).collect();
        for (id, st) in &status {
            let want = if *id == 1 || *id == 3 {
                StreamStatus::Cancelled
            } else {
                StreamStatus::Completed
            };
            assert_eq!(*st, want, "{mode:?}: request {id}: {status:?}");
        }
        let cancelled = r.streams.iter().find(|s| s.request == 1).expect("1");
        assert!(
            !cancelled.token_ns.is_empty() && cancelled.token_ns.len() < 40,
            "{mode:?}: cancelled mid-decode ({} tokens)",
            cancelled.token_ns.len()
        );
    }
}

#[test]
fn a_cancelling_shutdown_cuts_every_running_request() {
    let (r, n, _) = live(
        CacheMode::Paged,
        vec![
            submit(0..3, 200),
            vec![],
            // A request behind the shutdown is taken, and cancelled at once; nothing is polled
            // after (the run ends as soon as nothing is left).
            vec![
                LiveInput::Shutdown { cancel: true },
                LiveInput::Request(req(3, 0.0, 40, 5)),
            ],
            submit(4..5, 5),
        ],
    );
    assert_eq!(n, 4);
    for s in &r.streams {
        assert_eq!(s.status, StreamStatus::Cancelled, "{s:?}");
        assert!(s.token_ns.len() < 200);
    }
}
