//! The stream table: the one owner of per-stream state.
//!
//! Stream ids (the cache manager's and the backend's `SeqId`) are dense, handed out in arrival
//! order and never reused. A stream's state lives in a slot; once its request resolved and its
//! record went to the sink, [`StreamTable::release`] frees the slot for the next arrival. What
//! stays per stream ever seen is one `u32` (id → slot), so a run's resident stream state follows
//! the streams in flight, not the streams seen.
//!
//! A released id still reads, through `Index`, as a done stream that holds nothing (phase
//! `Done`, not cached, not registered) — exactly what the engine's checks on finished streams
//! (a token arriving for a cancelled stream, a copy for a gone child, a stale `running` entry)
//! expect — and a write to it lands in a scratch stream that is reset on every such write.

use std::ops::{Index, IndexMut};

use super::record::StreamRecord;
use super::streams::Stream;

const RELEASED: u32 = u32::MAX;

pub(super) struct StreamTable {
    /// Per stream id: its slot, or `RELEASED`.
    slot_of: Vec<u32>,
    slots: Vec<Stream>,
    free: Vec<u32>,
    live: usize,
    peak_live: usize,
    /// What a released id reads as.
    released: Stream,
    /// Where a write to a released id goes.
    scratch: Stream,
}

impl StreamTable {
    pub fn new() -> StreamTable {
        StreamTable {
            slot_of: Vec::new(),
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            peak_live: 0,
            released: Stream::released(),
            scratch: Stream::released(),
        }
    }

    /// Streams ever added (the next id).
    pub fn len(&self) -> usize {
        self.slot_of.len()
    }

    /// Most streams held at once.
    pub fn peak_live(&self) -> usize {
        self.peak_live
    }

    /// Add a stream; its id is the previous `len()`.
    pub fn push(&mut self, s: Stream) -> u32 {
        let id = self.slot_of.len() as u32;
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = s;
                slot
            }
            None => {
                self.slots.push(s);
                (self.slots.len() - 1) as u32
            }
        };
        self.slot_of.push(slot);
        self.live += 1;
        self.peak_live = self.peak_live.max(self.live);
        id
    }

    pub fn is_live(&self, id: u32) -> bool {
        self.slot_of
            .get(id as usize)
            .is_some_and(|&slot| slot != RELEASED)
    }

    /// Drop stream `id`'s state (its heavy parts — token times, token ids — freed now) and
    /// return its record; `None` when it was released already.
    pub fn release(&mut self, id: u32) -> Option<StreamRecord> {
        let slot = *self.slot_of.get(id as usize)?;
        if slot == RELEASED {
            return None;
        }
        self.slot_of[id as usize] = RELEASED;
        self.free.push(slot);
        self.live -= 1;
        let st = std::mem::replace(&mut self.slots[slot as usize], Stream::released());
        Some(st.record)
    }

    /// Ids of the streams still held, in id order.
    pub fn live_ids(&self) -> Vec<u32> {
        (0..self.slot_of.len() as u32)
            .filter(|&id| self.is_live(id))
            .collect()
    }
}

impl Index<usize> for StreamTable {
    type Output = Stream;
    fn index(&self, id: usize) -> &Stream {
        match self.slot_of.get(id) {
            Some(&slot) if slot != RELEASED => &self.slots[slot as usize],
            _ => &self.released,
        }
    }
}

impl IndexMut<usize> for StreamTable {
    fn index_mut(&mut self, id: usize) -> &mut Stream {
        match self.slot_of.get(id) {
            Some(&slot) if slot != RELEASED => &mut self.slots[slot as usize],
            _ => {
                self.scratch = Stream::released();
                &mut self.scratch
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(request: u32) -> Stream {
        let mut record = Stream::released().record;
        record.token_ns = vec![1, 2, 3];
        Stream::arriving(request, 0, 1, false, record)
    }

    #[test]
    fn released_slots_are_reused_and_ids_never_are() {
        let mut t = StreamTable::new();
        let a = t.push(stream(0));
        let b = t.push(stream(1));
        assert_eq!((a, b), (0, 1));
        let rec = t.release(a).expect("live");
        assert_eq!(rec.token_ns, [1, 2, 3]);
        assert!(t.release(a).is_none(), "released twice");
        let c = t.push(stream(2));
        assert_eq!(c, 2, "ids are dense and never reused");
        assert_eq!(t[c as usize].request, 2);
        assert_eq!(t[b as usize].request, 1);
        // Two slots serve three streams.
        assert_eq!(t.slots.len(), 2);
        assert_eq!(t.peak_live(), 2);
        assert_eq!(t.live_ids(), [1, 2]);
    }

    #[test]
    fn a_released_id_reads_as_done_and_writes_go_nowhere() {
        let mut t = StreamTable::new();
        let a = t.push(stream(7));
        t.release(a);
        assert!(t[a as usize].is_done());
        assert!(!t[a as usize].cached());
        t[a as usize].in_cache = 5;
        assert_eq!(
            t[a as usize].in_cache, 0,
            "a write to a released id is dropped"
        );
        assert!(t[99].is_done(), "an id never added reads as done too");
    }
}
