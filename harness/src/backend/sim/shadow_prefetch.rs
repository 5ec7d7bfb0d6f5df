//! Software prefetch for the shadow's walk over a step's streams. Each stream-step touches a
//! handful of cache lines nothing else touched since the stream's previous step — its record, its
//! copy of the block table, the tail of its token history, the tag slot it writes — and with a
//! batch of hundreds of streams none of them is still in L1 (measured with cachegrind on
//! `chat-8b-h200`: about ten extra L1 misses a decode, most of them L2 hits). Asking for the next
//! streams' lines while this one is worked on overlaps those misses with useful work instead of
//! waiting on each in turn. A prefetch changes no state and never faults, so what the shadow
//! checks is exactly what it checked without them.

/// Ask for the cache line holding `p`.
#[inline(always)]
pub(crate) fn line<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch only hints the cache; it never faults, whatever the address, and
        // changes no program state. Callers pass addresses derived from live references.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Ask for the lines of `s`, at most `max_lines` of them from its start.
#[inline(always)]
pub(crate) fn lines<T>(s: &[T], max_lines: usize) {
    let base = s.as_ptr().cast::<u8>();
    // From the start of the line holding the first byte to the line holding the last.
    let lead = base as usize % 64;
    let bytes = (lead + std::mem::size_of_val(s)).min(max_lines * 64);
    let mut off = 0;
    while off < bytes {
        line(base.wrapping_sub(lead).wrapping_add(off));
        off += 64;
    }
}
