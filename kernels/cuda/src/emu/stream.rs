//! An emulated stream: operations run later, in order, on a worker thread, each after a seeded
//! random delay, so host code that reads results or reuses memory before waiting on the right
//! event sees poison or stale data, as it would on a loaded GPU. The first failing operation
//! makes the stream's error sticky (as a faulted CUDA context's): later operations are skipped
//! and every wait returns it.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// An operation; `Err` is the message of a failed operation.
pub type Op = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// How late operations complete: each operation waits a uniform `min_delay_us..=max_delay_us`
/// with probability `1 / delay_one_in`, drawn from `seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delays {
    pub seed: u64,
    pub min_delay_us: u64,
    pub max_delay_us: u64,
    pub delay_one_in: u64,
}

#[derive(Default)]
struct State {
    submitted: u64,
    completed: u64,
    error: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct Stream {
    tx: Mutex<Option<Sender<(u64, Op)>>>,
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

/// splitmix64: a small seeded generator (the delays need no statistical quality).
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Stream {
    pub fn new(delays: Delays) -> Result<Stream, String> {
        let (tx, rx) = channel::<(u64, Op)>();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        });
        let sh = shared.clone();
        let worker = std::thread::Builder::new()
            .name("cuda-emu-stream".into())
            .spawn(move || {
                let mut rng = delays.seed;
                for (seq, op) in rx {
                    let r = next(&mut rng);
                    if delays.max_delay_us > 0 && r.is_multiple_of(delays.delay_one_in.max(1)) {
                        let span = delays.max_delay_us.saturating_sub(delays.min_delay_us);
                        let us = delays.min_delay_us + next(&mut rng) % (span + 1);
                        std::thread::sleep(Duration::from_micros(us));
                    }
                    let failed = sh.lock().error.is_some();
                    let result = if failed {
                        Ok(())
                    } else {
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(op))
                            .unwrap_or_else(|_| Err("an emulated operation panicked".into()))
                    };
                    let mut g = sh.lock();
                    if let Err(e) = result {
                        g.error.get_or_insert(e);
                    }
                    g.completed = seq;
                    sh.cv.notify_all();
                }
            })
            .map_err(|e| format!("cannot start the stream worker: {e}"))?;
        Ok(Stream {
            tx: Mutex::new(Some(tx)),
            shared,
            worker: Mutex::new(Some(worker)),
        })
    }

    /// Queues `op`; returns its sequence number, or the stream's sticky error.
    pub fn enqueue(&self, op: Op) -> Result<u64, String> {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let tx = tx.as_ref().ok_or("the stream is shut down")?;
        let seq = {
            let mut g = self.shared.lock();
            if let Some(e) = &g.error {
                return Err(e.clone());
            }
            g.submitted += 1;
            g.submitted
        };
        tx.send((seq, op))
            .map_err(|_| "the stream worker is gone".to_string())?;
        Ok(seq)
    }

    /// Waits until operation `seq` (and all before it) ran; the sticky error, if any.
    pub fn wait(&self, seq: u64) -> Result<(), String> {
        let mut g = self.shared.lock();
        while g.completed < seq && g.error.is_none() {
            g = self.shared.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g.error.clone().map_or(Ok(()), Err)
    }

    /// Whether operation `seq` ran (a failed stream counts as done; `wait` returns its error).
    pub fn passed(&self, seq: u64) -> bool {
        let g = self.shared.lock();
        g.completed >= seq || g.error.is_some()
    }

    /// Waits for everything queued so far.
    pub fn synchronize(&self) -> Result<(), String> {
        let seq = self.shared.lock().submitted;
        self.wait(seq)
    }

    pub fn error(&self) -> Option<String> {
        self.shared.lock().error.clone()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }
}

/// An emulated event: complete once the worker passed its latest record; never recorded, it
/// counts as complete (as `cuEventSynchronize` on a fresh event returns at once).
#[derive(Clone, Default)]
pub struct EmuEvent {
    inner: Arc<Mutex<EvState>>,
}

#[derive(Default)]
struct EvState {
    seq: Option<u64>,
    at: Option<Instant>,
}

impl EmuEvent {
    fn lock(&self) -> std::sync::MutexGuard<'_, EvState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn record(&self, stream: &Stream) -> Result<(), String> {
        let me = self.inner.clone();
        // Hold the lock across enqueue so the op cannot run before `seq` is stored.
        let mut g = self.lock();
        let seq = stream.enqueue(Box::new(move || {
            let mut g = me.lock().unwrap_or_else(|e| e.into_inner());
            g.at = Some(Instant::now());
            Ok(())
        }))?;
        g.seq = Some(seq);
        g.at = None;
        Ok(())
    }

    pub fn synchronize(&self, stream: &Stream) -> Result<(), String> {
        let seq = self.lock().seq;
        seq.map_or(Ok(()), |s| stream.wait(s))
    }

    pub fn is_complete(&self, stream: &Stream) -> bool {
        self.lock().seq.is_none_or(|s| stream.passed(s))
    }

    /// Milliseconds from `self` to `end`, both complete.
    pub fn elapsed_ms(&self, end: &EmuEvent) -> Result<f32, String> {
        let a = self.lock().at;
        let b = end.lock().at;
        match (a, b) {
            (Some(a), Some(b)) => Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3),
            _ => Err("elapsed time of an event that has not completed".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn operations_run_later_in_order_and_events_complete_when_passed() {
        let s = Stream::new(Delays {
            seed: 7,
            min_delay_us: 0,
            max_delay_us: 20_000,
            delay_one_in: 1,
        })
        .unwrap();
        let log = Arc::new(AtomicU64::new(0));
        let ev = EmuEvent::default();
        assert!(ev.is_complete(&s), "a fresh event counts as complete");
        for i in 1..=5u64 {
            let l = log.clone();
            s.enqueue(Box::new(move || {
                // Each op sees its predecessor's write: stream order.
                assert_eq!(l.load(Ordering::SeqCst), i - 1);
                l.store(i, Ordering::SeqCst);
                Ok(())
            }))
            .unwrap();
        }
        ev.record(&s).unwrap();
        // Five ops of up to 20 ms each: on a delay seed where the first waits, not yet done.
        ev.synchronize(&s).unwrap();
        assert_eq!(log.load(Ordering::SeqCst), 5);
        assert!(ev.is_complete(&s));
        s.enqueue(Box::new(|| Err("boom".into()))).unwrap();
        assert_eq!(s.synchronize().unwrap_err(), "boom");
        assert!(s.enqueue(Box::new(|| Ok(()))).is_err(), "sticky");
    }
}
