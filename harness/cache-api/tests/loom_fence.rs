//! loom model of the fence/release protocol: a device-completion thread, a cancelling thread and
//! an allocating thread share one `SharedFence` and a free list. A block is tagged with the
//! sequence that owns it; the device reads the tag while its step is in flight, and must never see
//! a new owner's tag there (that would be a delayed device access into reassigned storage).
//!
//! Run: `LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" cargo test -p kvbench-cache-api --release --test loom_fence`
#![cfg(loom)]

use kvbench_cache_api::fence::SharedFence;
use kvbench_cache_api::sync::{Arc, AtomicU64, Mutex, Ordering};
use loom::thread;

const SEQ_A: u64 = 1;
const SEQ_B: u64 = 2;

/// One block (id 0) owned by sequence A, an empty free list, and the fence.
struct Pool {
    fence: SharedFence<u32>,
    free: Mutex<Vec<u32>>,
    owner: AtomicU64,
    /// Planted bug: release pushes straight to the free list, ignoring the fence.
    early_reuse: bool,
}

impl Pool {
    fn new(early_reuse: bool) -> Arc<Pool> {
        Arc::new(Pool {
            fence: SharedFence::new(),
            free: Mutex::new(Vec::new()),
            owner: AtomicU64::new(SEQ_A),
            early_reuse,
        })
    }

    fn push_free(&self, blocks: impl IntoIterator<Item = u32>) {
        self.free.lock().unwrap().extend(blocks);
    }

    /// The cancelling thread lets go of block 0.
    fn release(&self) {
        if self.early_reuse {
            self.push_free([0]);
        } else if let Some(b) = self.fence.defer(0) {
            self.push_free([b]);
        }
    }

    /// The allocating thread hands a free block to sequence B, which writes it.
    fn allocate_for_b(&self) {
        let got = self.free.lock().unwrap().pop();
        if got.is_some() {
            self.owner.store(SEQ_B, Ordering::Relaxed);
        }
    }

    /// The device touches block 0 for its step, then the completion thread retires the step.
    fn run_step(&self, step: u64) {
        let seen = self.owner.load(Ordering::Relaxed);
        assert_eq!(
            seen, SEQ_A,
            "step {step} touched block 0 after it was handed to another sequence"
        );
        let released = self.fence.retire(step);
        self.push_free(released);
    }
}

fn three_threads(early_reuse: bool) {
    loom::model(move || {
        let pool = Pool::new(early_reuse);
        let step = pool.fence.begin_step();
        let device = {
            let p = pool.clone();
            thread::spawn(move || p.run_step(step))
        };
        let cancel = {
            let p = pool.clone();
            thread::spawn(move || p.release())
        };
        pool.allocate_for_b();
        device.join().unwrap();
        cancel.join().unwrap();
    });
}

#[test]
fn loom_no_block_is_handed_out_before_its_step_retires() {
    three_threads(false);
}

#[test]
fn loom_out_of_order_retirement_keeps_the_older_fence() {
    loom::model(|| {
        let pool = Pool::new(false);
        let s1 = pool.fence.begin_step();
        let s2 = pool.fence.begin_step();
        let d1 = {
            let p = pool.clone();
            thread::spawn(move || p.run_step(s1))
        };
        let d2 = {
            let p = pool.clone();
            thread::spawn(move || p.run_step(s2))
        };
        // The engine thread cancels sequence A, then admits B.
        pool.release();
        pool.allocate_for_b();
        d1.join().unwrap();
        d2.join().unwrap();
    });
}

#[test]
fn loom_finds_the_planted_early_reuse() {
    // The same model with the fence ignored must fail in some interleaving.
    let caught = std::panic::catch_unwind(|| three_threads(true)).is_err();
    assert!(caught, "loom did not find the early-reuse interleaving");
}
