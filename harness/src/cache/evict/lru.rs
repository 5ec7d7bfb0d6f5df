//! Least recently made evictable goes first: an intrusive doubly linked list over slot ids,
//! O(1) an operation. The order the paged manager has always used (a block joins the back when
//! it becomes evictable; the head is evicted), kept exactly so `lru` runs stay byte-identical.

use super::{Evictable, Evictor};

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    len: usize,
}

impl Lru {
    pub fn new(capacity: u32) -> Self {
        Lru {
            prev: vec![NIL; capacity as usize],
            next: vec![NIL; capacity as usize],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl Evictor for Lru {
    fn insert(&mut self, slot: u32, _info: Evictable) {
        let s = slot as usize;
        if s >= self.prev.len() {
            // Built for fewer slots (a lower tier's grow with use).
            self.prev.resize(s + 1, NIL);
            self.next.resize(s + 1, NIL);
        }
        self.prev[s] = self.tail;
        self.next[s] = NIL;
        if self.tail == NIL {
            self.head = slot;
        } else {
            self.next[self.tail as usize] = slot;
        }
        self.tail = slot;
        self.len += 1;
    }

    fn remove(&mut self, slot: u32) {
        let s = slot as usize;
        let (prev, next) = (self.prev[s], self.next[s]);
        if prev == NIL {
            self.head = next;
        } else {
            self.next[prev as usize] = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.prev[next as usize] = prev;
        }
        self.prev[s] = NIL;
        self.next[s] = NIL;
        self.len -= 1;
    }

    fn pop_victim(&mut self) -> Option<u32> {
        let head = self.head;
        if head == NIL {
            return None;
        }
        self.remove(head);
        Some(head)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn contains(&self, slot: u32) -> bool {
        let s = slot as usize;
        s < self.next.len() && (self.head == slot || self.prev[s] != NIL)
    }

    fn order(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len);
        let mut s = self.head;
        while s != NIL && out.len() <= self.next.len() {
            out.push(s);
            s = self.next[s as usize];
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_first_and_removal_from_the_middle() {
        let mut l = Lru::new(8);
        for s in [3, 1, 4, 5] {
            l.insert(s, Evictable::default());
        }
        // What the pool sees: a hit on 1 takes it out; it comes back at the tail when released.
        l.remove(1);
        l.insert(1, Evictable::default());
        assert_eq!(l.order(), vec![3, 4, 5, 1]);
        assert_eq!(l.pop_victim(), Some(3));
        l.remove(5);
        assert_eq!(l.order(), vec![4, 1]);
        assert_eq!(
            (l.pop_victim(), l.pop_victim(), l.pop_victim()),
            (Some(4), Some(1), None)
        );
        assert!(l.is_empty());
    }

    #[test]
    fn what_it_is_told_does_not_change_the_order() {
        let mut l = Lru::new(4);
        l.insert(
            2,
            Evictable {
                depth: 0,
                hits: 9,
                shared: true,
            },
        );
        l.insert(0, Evictable::default());
        assert_eq!(l.pop_victim(), Some(2));
    }
}
