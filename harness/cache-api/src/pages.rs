//! A block table's page list that takes a fresh version number at every change.
//!
//! A verifier (`sim`'s shadow) compares each scheduled stream's tables with its own copy every
//! step, since nothing a manager *says* about what changed can be trusted: the manager is the
//! code under test. The version is not something a manager says. Only this type's methods
//! change the list, every one of them that changes it takes a number no list has had, and a
//! clone keeps its number only with its contents; so two lists with one version hold the same
//! pages, whatever the code holding them did, short of `unsafe`. A verifier that compared a
//! list and remembered its version skips the comparison while the version is the same.
//!
//! The numbers come from one process-wide counter (a relaxed atomic add: a list changes when a
//! sequence enters or leaves a block, not at every token). Version 0 is the empty list every
//! [`Pages::default`] starts as. Every method is `#[inline]`: managers in other crates call them
//! on their hot paths, and without it each was a call.
//!
//! A list also says how its last change was made when that change only took pages from its front
//! and added pages at its end — a push, an extend, a drain at the front, a ring's turn
//! ([`Pages::parent`]): the version it changed from, how many pages left the front, how many came
//! at the end. That is as trustworthy as the version — only these methods set it, and a version
//! names one contents — so a verifier whose copy equals version `v` knows, of a list whose parent
//! is `v`, every page that stayed without comparing them: a decode entering a block, or a sliding
//! window leaving one, changes a table exactly so.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};

/// The next version any list takes; 0 is the default empty list's.
static NEXT_VERSION: AtomicU64 = AtomicU64::new(1);

#[inline]
fn fresh() -> u64 {
    NEXT_VERSION.fetch_add(1, Ordering::Relaxed)
}

/// A list of page (block) ids, read as a slice, changed only through methods that renumber it.
#[derive(Debug, Clone)]
pub struct Pages {
    list: Vec<u32>,
    version: u64,
    /// The version the last change started from, where that change only took pages from the
    /// front and added pages at the end ([`NO_PARENT`] otherwise), and how many of each.
    from: u64,
    drained: u32,
    pushed: u32,
}

/// `Pages::from` when the last change did anything else (or the list never changed). No version
/// takes it: the counter would have to run for centuries.
const NO_PARENT: u64 = u64::MAX;

/// How a list came from its parent: it is the list of version `version` with its first
/// `drained_front` pages taken away and `pushed` pages added at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub version: u64,
    pub drained_front: usize,
    pub pushed: usize,
}

impl Pages {
    /// The number this list's contents took at its last change: equal numbers, equal lists.
    #[inline]
    pub fn version(&self) -> u64 {
        self.version
    }

    /// What the list was one change ago, when that change only took pages from the front and
    /// added pages at the end.
    #[inline]
    pub fn parent(&self) -> Option<Parent> {
        (self.from != NO_PARENT).then_some(Parent {
            version: self.from,
            drained_front: self.drained as usize,
            pushed: self.pushed as usize,
        })
    }

    /// A change that is not only pages taken from the front and added at the end.
    #[inline]
    fn renumber(&mut self) {
        self.version = fresh();
        self.from = NO_PARENT;
    }

    /// A change that took `drained` pages from the front and added `pushed` at the end (a count
    /// past `u32` says no parent).
    #[inline]
    fn renumber_from_parent(&mut self, drained: usize, pushed: usize) {
        match (u32::try_from(drained), u32::try_from(pushed)) {
            (Ok(d), Ok(p)) => (self.from, self.drained, self.pushed) = (self.version, d, p),
            _ => self.from = NO_PARENT,
        }
        self.version = fresh();
    }

    #[inline]
    pub fn push(&mut self, page: u32) {
        self.list.push(page);
        self.renumber_from_parent(0, 1);
    }

    #[inline]
    pub fn pop(&mut self) -> Option<u32> {
        let page = self.list.pop();
        if page.is_some() {
            self.renumber();
        }
        page
    }

    /// Replaces the page at `i`, returning the old one (`None`, nothing changed, past the end).
    #[inline]
    pub fn set(&mut self, i: usize, page: u32) -> Option<u32> {
        let old = std::mem::replace(self.list.get_mut(i)?, page);
        if old != page {
            self.renumber();
        }
        Some(old)
    }

    /// Takes the first `n` pages (all of them if fewer are held).
    #[inline]
    pub fn drain_front(&mut self, n: usize) -> std::vec::Drain<'_, u32> {
        let n = n.min(self.list.len());
        if n > 0 {
            self.renumber_from_parent(n, 0);
        }
        self.list.drain(..n)
    }

    /// Rotates the list `n` places left (a ring of pages turning: its first pages go to the end).
    #[inline]
    pub fn rotate_left(&mut self, n: usize) {
        let len = self.list.len();
        if len > 0 && !n.is_multiple_of(len) {
            self.list.rotate_left(n % len);
            self.renumber_from_parent(n % len, n % len);
        }
    }

    #[inline]
    pub fn clear(&mut self) {
        if !self.list.is_empty() {
            self.list.clear();
            self.renumber();
        }
    }

    #[inline]
    pub fn extend(&mut self, pages: impl IntoIterator<Item = u32>) {
        let before = self.list.len();
        self.list.extend(pages);
        if self.list.len() != before {
            self.renumber_from_parent(0, self.list.len() - before);
        }
    }
}

impl Default for Pages {
    /// The empty list, version 0, with no parent.
    #[inline]
    fn default() -> Pages {
        Pages::from(Vec::new())
    }
}

impl Deref for Pages {
    type Target = [u32];
    #[inline]
    fn deref(&self) -> &[u32] {
        &self.list
    }
}

impl From<Vec<u32>> for Pages {
    #[inline]
    fn from(list: Vec<u32>) -> Pages {
        let version = if list.is_empty() { 0 } else { fresh() };
        Pages {
            list,
            version,
            from: NO_PARENT,
            drained: 0,
            pushed: 0,
        }
    }
}

impl FromIterator<u32> for Pages {
    #[inline]
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Pages {
        Pages::from(iter.into_iter().collect::<Vec<u32>>())
    }
}

impl<'a> IntoIterator for &'a Pages {
    type Item = &'a u32;
    type IntoIter = std::slice::Iter<'a, u32>;
    #[inline]
    fn into_iter(self) -> Self::IntoIter {
        self.list.iter()
    }
}

impl IntoIterator for Pages {
    type Item = u32;
    type IntoIter = std::vec::IntoIter<u32>;
    #[inline]
    fn into_iter(self) -> Self::IntoIter {
        self.list.into_iter()
    }
}

/// Lists are equal by contents; the version only says when they surely are.
impl PartialEq for Pages {
    #[inline]
    fn eq(&self, other: &Pages) -> bool {
        self.list == other.list
    }
}

impl Eq for Pages {}

impl PartialEq<[u32]> for Pages {
    #[inline]
    fn eq(&self, other: &[u32]) -> bool {
        self.list == other
    }
}

impl PartialEq<Vec<u32>> for Pages {
    #[inline]
    fn eq(&self, other: &Vec<u32>) -> bool {
        &self.list == other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every change renumbers the list, a no-op does not, and no two contents share a number.
    #[test]
    fn every_change_takes_a_fresh_version_and_equal_versions_mean_equal_lists() {
        let mut seen: Vec<(u64, Vec<u32>)> = Vec::new();
        let mut note = |p: &Pages| {
            for (v, list) in &seen {
                if *v == p.version() {
                    assert_eq!(list[..], p[..], "version {v} names two lists");
                }
            }
            seen.push((p.version(), p.to_vec()));
        };
        let mut p = Pages::default();
        assert_eq!(p.version(), 0);
        note(&p);
        p.push(7);
        assert_ne!(p.version(), 0);
        note(&p);
        let before = p.version();
        p.extend(std::iter::empty());
        assert_eq!(p.set(0, 7), Some(7));
        assert_eq!(p.set(3, 1), None);
        assert_eq!(p.drain_front(0).count(), 0);
        assert_eq!(p.version(), before, "no-ops keep the number");
        let mut q = p.clone();
        assert_eq!(q.version(), p.version(), "a clone has the same contents");
        q.push(9);
        p.push(8);
        assert_ne!(q.version(), p.version(), "two clones changed differently");
        note(&q);
        note(&p);
        assert_eq!(p.set(0, 5), Some(7));
        note(&p);
        assert_eq!(p.drain_front(1).collect::<Vec<_>>(), vec![5]);
        note(&p);
        p.extend([1, 2, 3]);
        note(&p);
        let before = p.version();
        p.rotate_left(4);
        assert_eq!(p.version(), before, "a whole turn is a no-op");
        p.rotate_left(1);
        assert_eq!(p[..], [1, 2, 3, 8]);
        note(&p);
        p.rotate_left(2);
        note(&p);
        assert_eq!(p.pop(), Some(2));
        note(&p);
        p.clear();
        note(&p);
        let r = Pages::from(vec![8, 1]);
        note(&r);
        q.clone_from(&r);
        assert_eq!((q.version(), &q[..]), (r.version(), &[8, 1][..]));
        assert_eq!(Pages::from(Vec::new()).version(), 0);
    }

    /// A change that only took pages from the front and added pages at the end names the
    /// version it changed from; any other change has no parent, and two changes name the one
    /// between them.
    #[test]
    fn front_and_back_changes_name_their_parent_and_nothing_else_does() {
        // The rule a verifier applies: its copy of the parent without the drained front is what
        // the list holds before the pages pushed.
        let check = |p: &Pages, copy: &[u32]| {
            let q = p.parent().expect("parent");
            let kept = &copy[q.drained_front.min(copy.len())..];
            assert_eq!(&p[..p.len() - q.pushed], kept, "{q:?}");
        };
        let parent = |version, drained_front, pushed| {
            Some(Parent {
                version,
                drained_front,
                pushed,
            })
        };
        let mut p = Pages::default();
        assert_eq!(p.parent(), None, "a list that never changed has no parent");
        p.push(4);
        assert_eq!(p.parent(), parent(0, 0, 1), "pushed onto the empty list");
        let (v, copy) = (p.version(), p.to_vec());
        p.extend([5, 6, 7]);
        assert_eq!(p.parent(), parent(v, 0, 3));
        check(&p, &copy);
        let (v, copy) = (p.version(), p.to_vec());
        assert_eq!(p.drain_front(2).count(), 2);
        assert_eq!(p.parent(), parent(v, 2, 0));
        check(&p, &copy);
        let (v, copy) = (p.version(), p.to_vec());
        p.rotate_left(3);
        assert_eq!(p[..], [7, 6]);
        assert_eq!(
            p.parent(),
            parent(v, 1, 1),
            "a turn: the front went to the end"
        );
        check(&p, &copy);
        let q = p.clone();
        assert_eq!(q.parent(), p.parent(), "a clone has the same history");
        let v = q.version();
        for change in [
            |p: &mut Pages| {
                p.set(0, 9);
            },
            |p: &mut Pages| {
                p.pop();
            },
            |p: &mut Pages| p.clear(),
        ] {
            let mut r = q.clone();
            change(&mut r);
            assert_eq!(r.parent(), None, "{:?}", &r[..]);
            r.push(3);
            assert_ne!(r.parent().map(|p| p.version), Some(v), "two changes");
        }
        let mut r = q.clone();
        r.push(1);
        r.push(2);
        assert_ne!(
            r.parent().map(|p| p.version),
            Some(v),
            "two pushes name the one between"
        );
        assert_eq!(Pages::from(vec![1, 2]).parent(), None);
    }
}
