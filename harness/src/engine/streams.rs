//! The streams' lifecycle: every stream's state and the queue it is in, with each transition —
//! arrive → waiting → running ⇄ swapped (or back to waiting, preempted for recompute) → done —
//! made here, so a transition moves the stream, its phase, its flags and its queue together.
//!
//! **Invariants:** a stream joins `running` exactly when it starts holding cache (admission,
//! swap-in, fork) and leaves it as a preemption victim or, once it let go, at the next
//! [`Streams::tidy_running`] (before the next plan reads it); `swapped` and `waiting` entries
//! count only while the stream is `Swapped`, or `Waiting` and holding nothing. A request's open-stream count reaches 0 exactly once, when its last stream is done.
//! The decode reserve (the slots every running decode needs for one more token) is computed
//! once per plan and forgotten whenever a stream starts running.

use std::collections::VecDeque;
use std::ops::{Index, IndexMut};

use kvbench_cache_api::SeqId;

use super::policy::queue::WaitQueue;
use super::record::{StreamRecord, StreamStatus};
use super::table::StreamTable;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A continuation not forked yet, or a request not arrived yet.
    Pending,
    /// In the wait queue (new, or preempted by recompute).
    Waiting,
    /// Holds cache; prompt (or recompute) tokens still to prefill.
    Prefill,
    /// Holds cache; generating.
    Decode,
    /// K/V copied to the host tier; holds no device cache.
    Swapped,
    Done,
}

/// Per-stream scheduling state. Counts advance when a step is *planned* (so step N+1 can be
/// planned while step N is in flight); emission times are stamped when the step *completes*.
#[derive(Debug, Clone)]
pub struct Stream {
    pub request: u32,
    pub rank: u32,
    /// Changed only by [`Streams`]' transitions, like `cached`, `registered` and `restart`.
    phase: Phase,
    /// Holds blocks in the cache manager (must be released exactly once).
    cached: bool,
    /// Registered with the backend (must be forgotten exactly once).
    registered: bool,
    /// Tokens this stream emits before it is done.
    pub limit: u32,
    /// Reaching `limit` means the client cancelled (after-tokens cancellation).
    pub cancel_at_limit: bool,
    /// Samples planned so far (optimistic).
    pub generated: u32,
    /// Tokens whose K/V are in the cache (optimistic: counted when planned).
    pub in_cache: u32,
    /// Tokens this incarnation must prefill up to (prompt, or prompt + generated on restart).
    pub target: u32,
    /// Tokens copied to the host tier by the last swap-out.
    pub swapped_tokens: u32,
    /// The step this stream was last scheduled in (u64::MAX: never).
    pub scheduled_step: u64,
    pub first_admission_done: bool,
    /// Waiting to recompute after a preemption (or a fork with no room to copy).
    restart: bool,
    pub forked_children: bool,
    pub record: StreamRecord,
}

impl Stream {
    /// A stream of request `request` as it arrives: pending, holding nothing.
    pub fn arriving(
        request: u32,
        rank: u32,
        limit: u32,
        cancel_at_limit: bool,
        record: StreamRecord,
    ) -> Stream {
        Stream {
            request,
            rank,
            phase: Phase::Pending,
            cached: false,
            registered: false,
            limit,
            cancel_at_limit,
            generated: 0,
            in_cache: 0,
            target: 0,
            swapped_tokens: 0,
            scheduled_step: u64::MAX,
            first_admission_done: false,
            restart: false,
            forked_children: false,
            record,
        }
    }

    /// A done stream that holds nothing (what a released id reads as).
    pub fn released() -> Stream {
        Stream {
            request: u32::MAX,
            rank: 0,
            phase: Phase::Done,
            cached: false,
            registered: false,
            limit: 0,
            cancel_at_limit: false,
            generated: 0,
            in_cache: 0,
            target: 0,
            swapped_tokens: 0,
            scheduled_step: u64::MAX,
            first_admission_done: true,
            restart: false,
            forked_children: true,
            record: StreamRecord {
                request: u64::MAX,
                rank: 0,
                tenant: 0,
                intended_arrival_ns: 0,
                arrival_ns: 0,
                admitted_ns: None,
                finish_ns: 0,
                prompt_tokens: 0,
                cached_prompt_tokens: 0,
                status: StreamStatus::Cancelled,
                preemptions: 0,
                recomputed_tokens: 0,
                swapped_bytes: 0,
                admission_tier_hits: Default::default(),
                onload_bytes: 0,
                onload_wait_ns: 0,
                ttft_onload_ns: 0,
                token_ns: Vec::new(),
                token_ids: Vec::new(),
            },
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn cached(&self) -> bool {
        self.cached
    }

    pub fn registered(&self) -> bool {
        self.registered
    }

    pub fn restart(&self) -> bool {
        self.restart
    }

    pub fn seq(index: u32) -> SeqId {
        index as SeqId
    }

    pub fn in_cache_at_swap(&self) -> u32 {
        self.swapped_tokens
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }
}

pub(super) struct Streams {
    table: StreamTable,
    /// First stream index of each request (u32::MAX until it arrives).
    req_first: Vec<u32>,
    /// Streams of each request not yet done.
    req_open: Vec<u32>,
    /// Requests not resolved yet (including later session turns not issued yet).
    unresolved: usize,
    running: Vec<u32>,
    /// Some stream in `running` let go of its cache since the last tidy.
    running_dirty: bool,
    waiting: WaitQueue,
    /// Streams in the `Waiting` phase (the queue drops stale entries lazily, so its length is
    /// not this count).
    waiting_streams: usize,
    swapped: VecDeque<u32>,
    decode_reserve: Option<u64>,
}

/// A stream just marked done.
pub(super) struct Done {
    /// It was registered with the backend, which must now forget it.
    pub registered: bool,
    /// It was its request's last open stream: the request resolved.
    pub request_resolved: bool,
}

impl Streams {
    pub fn new(requests: usize, waiting: WaitQueue) -> Streams {
        Streams {
            table: StreamTable::new(),
            req_first: vec![u32::MAX; requests],
            req_open: vec![0; requests],
            unresolved: requests,
            running: Vec::new(),
            running_dirty: false,
            waiting,
            waiting_streams: 0,
            swapped: VecDeque::new(),
            decode_reserve: None,
        }
    }

    /// Streams ever added (the next id).
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn peak_live(&self) -> usize {
        self.table.peak_live()
    }

    pub fn live_ids(&self) -> Vec<u32> {
        self.table.live_ids()
    }

    /// Drop a resolved stream's state and return its record (`None` if released already).
    pub fn release(&mut self, id: u32) -> Option<StreamRecord> {
        self.table.release(id)
    }

    pub fn unresolved(&self) -> usize {
        self.unresolved
    }

    pub fn running(&self) -> &[u32] {
        &self.running
    }

    pub fn swapped_len(&self) -> usize {
        self.swapped.len()
    }

    /// Streams waiting to start (new, or preempted for recompute).
    pub fn waiting_streams(&self) -> usize {
        self.waiting_streams
    }

    /// A live run took in one more request (its index is the previous count).
    pub fn add_request(&mut self) {
        self.req_first.push(u32::MAX);
        self.req_open.push(0);
        self.unresolved += 1;
    }

    pub fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Request `r` arrived as `streams` (rank order, all `Pending`); returns its first id.
    pub fn arrive(&mut self, r: u32, streams: impl IntoIterator<Item = Stream>) -> u32 {
        let first = self.table.len() as u32;
        let mut open = 0;
        for s in streams {
            self.table.push(s);
            open += 1;
        }
        self.req_first[r as usize] = first;
        self.req_open[r as usize] = open;
        first
    }

    /// The first stream of request `r`, once it arrived.
    pub fn first_of(&self, r: u32) -> Option<u32> {
        let first = *self.req_first.get(r as usize)?;
        (first != u32::MAX).then_some(first)
    }

    /// Request `r` is refused at arrival: its streams are done as rejected, none of them open.
    pub fn reject(&mut self, r: u32, samples: u32) {
        let first = self.req_first[r as usize];
        for s in first..first + samples {
            self.table[s as usize].record.status = StreamStatus::Rejected;
            self.table[s as usize].phase = Phase::Done;
        }
        self.req_open[r as usize] = 0;
    }

    /// A new stream joins the back of the wait queue.
    pub fn enqueue(&mut self, s: u32, tenant: u32) {
        self.table[s as usize].phase = Phase::Waiting;
        self.waiting_streams += 1;
        self.waiting.push_back(s, tenant);
    }

    /// A stream that must (re)compute its cache goes to the front of the wait queue.
    pub fn requeue(&mut self, s: u32) {
        let st = &mut self.table[s as usize];
        if st.phase != Phase::Waiting {
            self.waiting_streams += 1;
        }
        st.phase = Phase::Waiting;
        st.restart = true;
        self.waiting.push_front(s);
    }

    /// The next waiting stream that may start, left in the queue.
    pub fn next_waiting(&mut self) -> Option<u32> {
        let table = &self.table;
        self.waiting.peek(|v| {
            let st = &table[v as usize];
            st.phase == Phase::Waiting && !st.cached
        })
    }

    /// Stream `s` (from [`Self::next_waiting`]) started: out of the wait queue.
    pub fn take_waiting(&mut self, s: u32) {
        self.waiting.pop(s);
    }

    /// Stream `s` now holds cache and runs in `phase` (its counts set by the caller).
    pub fn start_running(&mut self, s: u32, phase: Phase) {
        let st = &mut self.table[s as usize];
        if st.phase == Phase::Waiting {
            self.waiting_streams -= 1;
        }
        st.cached = true;
        st.phase = phase;
        self.running.push(s);
        self.decode_reserve = None;
    }

    /// Stream `s` finished its prefill in the step being planned: it decodes from now on.
    pub fn prefilled(&mut self, s: u32) {
        self.table[s as usize].phase = Phase::Decode;
    }

    /// Stream `s` is registered with the backend (and must be forgotten once, when done).
    pub fn registered(&mut self, s: u32) {
        self.table[s as usize].registered = true;
    }

    /// Stream `s` (already out of `running`) is swapped out with `tokens` tokens.
    pub fn swap_out(&mut self, s: u32, tokens: u32) {
        let st = &mut self.table[s as usize];
        st.swapped_tokens = tokens;
        st.phase = Phase::Swapped;
        self.swapped.push_back(s);
    }

    /// The oldest swapped-out stream still swapped out, left in the queue.
    pub fn next_swapped(&mut self) -> Option<u32> {
        while let Some(&s) = self.swapped.front() {
            if self.table[s as usize].phase == Phase::Swapped {
                return Some(s);
            }
            self.swapped.pop_front();
        }
        None
    }

    /// The stream from [`Self::next_swapped`] is being swapped in.
    pub fn take_swapped(&mut self) {
        self.swapped.pop_front();
    }

    /// Stream `s` lets go of its cache: true when it held some (the caller releases it in the
    /// cache manager, exactly once).
    pub fn drop_cached(&mut self, s: u32) -> bool {
        let st = &mut self.table[s as usize];
        if !std::mem::replace(&mut st.cached, false) {
            return false;
        }
        st.in_cache = 0;
        self.running_dirty = true;
        true
    }

    /// Stream `s` is done with `status` at `now_ns`; `None` when it was done already.
    pub fn finish(&mut self, s: u32, status: StreamStatus, now_ns: u64) -> Option<Done> {
        let st = &mut self.table[s as usize];
        if st.phase == Phase::Done {
            return None;
        }
        if st.phase == Phase::Waiting {
            self.waiting_streams -= 1;
        }
        st.phase = Phase::Done;
        st.record.status = status;
        st.record.finish_ns = now_ns;
        let registered = std::mem::replace(&mut st.registered, false);
        let r = st.request as usize;
        self.running_dirty = true;
        self.req_open[r] -= 1;
        Some(Done {
            registered,
            request_resolved: self.req_open[r] == 0,
        })
    }

    /// A request resolved, or a session turn will never be issued.
    pub fn resolved(&mut self) {
        self.unresolved -= 1;
    }

    /// Drop stale entries (streams that let go of their cache) from `running`.
    pub fn tidy_running(&mut self) {
        if self.running_dirty {
            let table = &self.table;
            self.running
                .retain(|&s| table[s as usize].cached && !table[s as usize].is_done());
            self.running_dirty = false;
        }
    }

    /// Remove and return the newest-admitted running stream that is not finishing and not
    /// scheduled in step `cur`; `s` itself when there is none.
    pub fn pop_victim(&mut self, s: u32, cur: u64) -> u32 {
        let mut j = self.running.len();
        while j > 0 {
            j -= 1;
            let v = self.running[j];
            let st = &self.table[v as usize];
            let eligible = st.cached
                && !st.is_done()
                && st.phase != Phase::Swapped
                && st.generated < st.limit
                && (st.scheduled_step != cur || v == s);
            if eligible {
                self.running.remove(j);
                return v;
            }
        }
        if let Some(j) = self.running.iter().position(|&v| v == s) {
            self.running.remove(j);
        }
        s
    }

    /// No running stream holds cache.
    pub fn none_cached(&self) -> bool {
        self.running.iter().all(|&v| !self.table[v as usize].cached)
    }

    /// Slots every running decode needs for one more token (`cost` per stream), computed once
    /// per plan until a stream starts running.
    pub fn decode_reserve(&mut self, cost: impl Fn(u32) -> u64) -> u64 {
        if let Some(r) = self.decode_reserve {
            return r;
        }
        let table = &self.table;
        let r = self
            .running
            .iter()
            .filter(|&&v| {
                let st = &table[v as usize];
                st.cached && st.phase == Phase::Decode && st.generated < st.limit
            })
            .map(|&v| cost(v))
            .sum();
        self.decode_reserve = Some(r);
        r
    }

    /// A new plan starts: the reserve is computed afresh.
    pub fn forget_reserve(&mut self) {
        self.decode_reserve = None;
    }
}

impl Index<usize> for Streams {
    type Output = Stream;
    fn index(&self, id: usize) -> &Stream {
        &self.table[id]
    }
}

impl IndexMut<usize> for Streams {
    fn index_mut(&mut self, id: usize) -> &mut Stream {
        &mut self.table[id]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streams_of(requests: &[u32]) -> Streams {
        let mut s = Streams::new(requests.len(), WaitQueue::new(false, 1));
        for (r, &n) in requests.iter().enumerate() {
            let r = r as u32;
            s.arrive(
                r,
                (0..n).map(|rank| Stream::arriving(r, rank, 4, false, Stream::released().record)),
            );
        }
        s
    }

    #[test]
    fn a_request_resolves_once_when_its_last_stream_is_done() {
        let mut s = streams_of(&[2, 1]);
        assert_eq!(s.first_of(1), Some(2));
        let a = s.finish(0, StreamStatus::Completed, 5).expect("open");
        assert!(!a.request_resolved, "one stream of request 0 is still open");
        assert!(
            s.finish(0, StreamStatus::Completed, 6).is_none(),
            "done twice"
        );
        let b = s.finish(1, StreamStatus::Cancelled, 7).expect("open");
        assert!(b.request_resolved);
        assert_eq!(s[1].record.finish_ns, 7);
        assert_eq!(s[1].record.status, StreamStatus::Cancelled);
        assert!(s[1].is_done());
    }

    #[test]
    fn starting_to_run_holds_cache_joins_running_and_forgets_the_reserve() {
        let mut s = streams_of(&[1, 1]);
        s.enqueue(0, 0);
        assert_eq!(s.next_waiting(), Some(0));
        s.take_waiting(0);
        s.start_running(0, Phase::Decode);
        assert!(s[0].cached() && s[0].phase() == Phase::Decode);
        assert_eq!(s.running(), [0]);
        assert_eq!(s.decode_reserve(|_| 3), 3);
        assert_eq!(s.decode_reserve(|_| 100), 3, "computed once per plan");
        s.start_running(1, Phase::Decode);
        assert_eq!(
            s.decode_reserve(|_| 5),
            10,
            "a new running stream forgets it"
        );
        // Letting go marks `running` stale until it is tidied.
        assert!(s.drop_cached(0));
        assert!(!s.drop_cached(0), "released once");
        assert_eq!(s.running(), [0, 1]);
        s.tidy_running();
        assert_eq!(s.running(), [1]);
    }

    #[test]
    fn preempted_streams_go_to_the_front_and_swapped_ones_wait_their_turn() {
        let mut s = streams_of(&[1, 1, 1]);
        s.enqueue(0, 0);
        s.requeue(1);
        assert!(s[1].restart() && s[1].phase() == Phase::Waiting);
        assert_eq!(s.next_waiting(), Some(1));
        s.start_running(2, Phase::Decode);
        assert_eq!(
            s.pop_victim(2, 0),
            2,
            "the only running stream is its own victim"
        );
        s.swap_out(2, 9);
        assert_eq!(s[2].in_cache_at_swap(), 9);
        assert_eq!(s.next_swapped(), Some(2));
        // A swapped stream cancelled in the meantime is skipped.
        s.finish(2, StreamStatus::Cancelled, 1);
        assert_eq!(s.next_swapped(), None);
        assert_eq!(s.swapped_len(), 0);
    }
}
