//! The shadow payload's reverse index: per grain of slots (a paged block, a run of contiguous
//! slots, or a grouped page), the streams whose checked context covers it — what keeps a stream's
//! unchanged context valid between checks. A write asks it whether anyone but the writer could be
//! affected; almost always the answer is "no" from one 16-byte entry, with no allocation: two
//! readers are held inline (a stream and one fork), more move, all of them, into a side list the
//! entry names.

use super::LazyArray;

/// A stream whose checked context covers (part of) a grain: its index in the shadow's stream
/// table and the chunk of its layout that lies there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holder {
    pub seq: u32,
    pub chunk: u32,
}

/// What [`Readers::hold`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// Nobody read the grain: the new reader is its only one.
    Alone,
    /// The grain had exactly this one reader, which is not alone any more.
    Joined(Holder),
    /// Two or more read it already, or the grain is past the end (ignored).
    Shared,
}

/// Matches any chunk in [`Readers::only`].
pub(crate) const ANY_CHUNK: u32 = u32::MAX;
/// `seq` of an inline place that holds no reader. Stream indices stay below [`SPILLED`]: the
/// stream table would need 2³² records of 128 bytes first.
const VACANT: u32 = u32::MAX;
/// `seq` of the first inline place when the grain's readers are in side list `chunk`.
const SPILLED: u32 = u32::MAX - 1;
const NOBODY: Holder = Holder {
    seq: VACANT,
    chunk: 0,
};

/// The readers of one grain, in the order a vector with push / swap-remove would keep them:
/// up to two inline (the first place filled first), or all of them in a side list. 16 bytes,
/// so a page of the index holds half as many more grains as with a count and a list index.
#[derive(Debug, Clone, Copy)]
struct Entry {
    inline: [Holder; 2],
}

/// `summary.json`'s `allocated_bytes` counts index pages of these.
const _: () = assert!(std::mem::size_of::<Entry>() == 16);

const EMPTY: Entry = Entry {
    inline: [NOBODY; 2],
};

impl Entry {
    /// The side list holding every reader, if the grain has more than two.
    #[inline(always)]
    fn spill(&self) -> Option<usize> {
        (self.inline[0].seq == SPILLED).then_some(self.inline[0].chunk as usize)
    }
}

#[derive(Debug)]
pub(crate) struct Readers {
    grains: LazyArray<Entry>,
    /// Readers of grains with more than two, per spilled entry.
    spills: Vec<Vec<Holder>>,
    free_spills: Vec<u32>,
}

impl Readers {
    /// An index over `grains` grains, or `None` when that is more than the store tracks.
    pub fn new(grains: u64) -> Option<Readers> {
        Some(Readers {
            grains: LazyArray::new(grains, EMPTY)?,
            spills: Vec::new(),
            free_spills: Vec::new(),
        })
    }

    /// Pages of the index allocated so far, bytes.
    pub fn allocated_bytes(&self) -> u64 {
        self.grains.allocated_bytes()
    }

    /// Register `h` as a reader of grain `g` (grains past the end are ignored): whether it is
    /// the grain's only reader now, or joined one that is not alone any more.
    #[inline(always)]
    pub fn hold(&mut self, g: u64, h: Holder) -> Held {
        let Some(e) = self.grains.get_mut(g) else {
            return Held::Shared;
        };
        if let Some(i) = e.spill() {
            self.spills[i].push(h);
            return Held::Shared;
        }
        if e.inline[0].seq == VACANT {
            e.inline[0] = h;
            return Held::Alone;
        }
        if e.inline[1].seq == VACANT {
            e.inline[1] = h;
            return Held::Joined(e.inline[0]);
        }
        // A third reader: all three into a side list.
        let i = match self.free_spills.pop() {
            Some(i) => i,
            None => {
                self.spills.push(Vec::new());
                (self.spills.len() - 1) as u32
            }
        };
        let list = &mut self.spills[i as usize];
        list.clear();
        list.extend_from_slice(&[e.inline[0], e.inline[1], h]);
        e.inline = [
            Holder {
                seq: SPILLED,
                chunk: i,
            },
            NOBODY,
        ];
        Held::Shared
    }

    /// Whether stream `seq` is the one and only reader of grain `g`.
    #[inline]
    pub fn sole(&self, g: u64, seq: u32) -> bool {
        self.grains
            .get(g)
            .is_some_and(|e| e.inline[0].seq == seq && e.inline[1].seq == VACANT)
    }

    /// The one reader of grain `g`, if it has exactly one.
    #[inline]
    pub fn single(&self, g: u64) -> Option<Holder> {
        let e = self.grains.get(g)?;
        (e.inline[0].seq < SPILLED && e.inline[1].seq == VACANT).then_some(e.inline[0])
    }

    /// Drop the first registration of `h` on grain `g`, moving the last reader into its place.
    #[inline(always)]
    pub fn unhold(&mut self, g: u64, h: Holder) {
        let Some(e) = self.grains.get_mut(g) else {
            return;
        };
        let Some(i) = e.spill() else {
            // Inline: the last reader takes the place of the one leaving.
            if e.inline[0] == h {
                e.inline[0] = e.inline[1];
                e.inline[1] = NOBODY;
            } else if e.inline[1] == h {
                e.inline[1] = NOBODY;
            }
            return;
        };
        let list = &mut self.spills[i];
        let Some(at) = list.iter().position(|&x| x == h) else {
            return;
        };
        list.swap_remove(at);
        if list.len() == 2 {
            e.inline = [list[0], list[1]];
            list.clear();
            self.free_spills.push(i as u32);
        }
    }

    /// Whether nobody reads grain `g` (true past the end, as for [`Readers::only`]).
    #[inline]
    pub fn unread(&self, g: u64) -> bool {
        self.grains.get(g).is_none_or(|e| e.inline[0].seq == VACANT)
    }

    /// Whether every reader of grain `g` is stream `seq` at `chunk` (or at any chunk with
    /// [`ANY_CHUNK`]); true for a grain nobody reads. False whenever more than two read it:
    /// callers then look at each reader.
    #[inline]
    pub fn only(&self, g: u64, seq: u32, chunk: u32) -> bool {
        let Some(e) = self.grains.get(g) else {
            return true;
        };
        let own = |h: &Holder| {
            h.seq == VACANT || (h.seq == seq && (chunk == ANY_CHUNK || h.chunk == chunk))
        };
        own(&e.inline[0]) && own(&e.inline[1])
    }

    /// [`Readers::only`] and [`Readers::sole`] of the same grain and stream, from one lookup.
    #[inline]
    pub fn only_and_sole(&self, g: u64, seq: u32, chunk: u32) -> (bool, bool) {
        let Some(e) = self.grains.get(g) else {
            return (true, false);
        };
        let own = |h: &Holder| {
            h.seq == VACANT || (h.seq == seq && (chunk == ANY_CHUNK || h.chunk == chunk))
        };
        let sole = e.inline[0].seq == seq && e.inline[1].seq == VACANT;
        (own(&e.inline[0]) && own(&e.inline[1]), sole)
    }

    /// The readers of grain `g`, in order, into `out` (cleared first).
    pub fn collect(&self, g: u64, out: &mut Vec<Holder>) {
        out.clear();
        let Some(e) = self.grains.get(g) else {
            return;
        };
        match e.spill() {
            Some(i) => out.extend_from_slice(&self.spills[i]),
            None => out.extend(e.inline.iter().filter(|h| h.seq != VACANT)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(seq: u32, chunk: u32) -> Holder {
        Holder { seq, chunk }
    }

    fn readers(r: &Readers, g: u64) -> Vec<Holder> {
        let mut v = Vec::new();
        r.collect(g, &mut v);
        v
    }

    #[test]
    fn keeps_the_order_of_a_vector_with_swap_remove() {
        let mut r = Readers::new(10).expect("fits");
        let mut model: Vec<Holder> = Vec::new();
        // A fixed pseudo-random script of holds and unholds on one grain, up to 6 readers.
        let mut x = 12345u32;
        for _ in 0..400 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let who = h((x >> 16) % 5, (x >> 8) % 2);
            if (x >> 4) & 1 == 0 && model.len() < 6 {
                let held = r.hold(3, who);
                let want = match model.len() {
                    0 => Held::Alone,
                    1 => Held::Joined(model[0]),
                    _ => Held::Shared,
                };
                assert_eq!(held, want);
                model.push(who);
            } else {
                r.unhold(3, who);
                if let Some(i) = model.iter().position(|&m| m == who) {
                    model.swap_remove(i);
                }
            }
            assert_eq!(readers(&r, 3), model);
            let only0 = model.iter().all(|m| m.seq == 0);
            assert_eq!(r.only(3, 0, ANY_CHUNK), only0 && model.len() <= 2);
            assert_eq!(r.sole(3, 0), model.len() == 1 && model[0].seq == 0);
            for chunk in [0, 1, ANY_CHUNK] {
                assert_eq!(
                    r.only_and_sole(3, 0, chunk),
                    (r.only(3, 0, chunk), r.sole(3, 0))
                );
            }
            assert_eq!(r.unread(3), model.is_empty());
            let single = (model.len() == 1).then(|| model[0]);
            assert_eq!(r.single(3), single);
        }
        assert!(readers(&r, 4).is_empty() && r.only(4, 9, 0) && r.unread(4));
        assert!(r.unread(10), "past the end: nobody reads it");
        assert_eq!(r.single(10), None);
    }

    #[test]
    fn only_tells_the_writer_apart_from_other_readers() {
        let mut r = Readers::new(4).expect("fits");
        assert_eq!(r.hold(1, h(7, 2)), Held::Alone);
        assert!(r.only(1, 7, 2) && r.only(1, 7, ANY_CHUNK) && r.sole(1, 7));
        assert!(!r.only(1, 7, 3), "same stream, another chunk");
        assert!(!r.only(1, 8, ANY_CHUNK));
        assert_eq!(
            r.hold(1, h(8, 2)),
            Held::Joined(h(7, 2)),
            "7 was alone until now"
        );
        assert!(!r.only(1, 7, 2) && !r.sole(1, 7) && !r.sole(1, 8));
        r.unhold(1, h(8, 2));
        assert!(r.only(1, 7, 2));
        assert_eq!(r.hold(99, h(1, 1)), Held::Shared, "past the end: ignored");
        assert!(r.only(99, 5, 5) && !r.sole(99, 1));
        // Spilled lists are reused once an entry shrinks back to two.
        for s in 0..5 {
            r.hold(2, h(s, 0));
        }
        for s in 0..5 {
            r.unhold(2, h(s, 0));
        }
        assert!(readers(&r, 2).is_empty());
        assert_eq!(r.free_spills.len(), r.spills.len());
    }
}
