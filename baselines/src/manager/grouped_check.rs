//! Invariants of the grouped contiguous baseline, recomputed from the reservations, the fence
//! queue and the free extents themselves: reservations, fenced runs and free extents tile the
//! pool's pages exactly (no page in two reservations); every table's pages lie in its own share
//! of its sequence's run, block `b` of a ring on share page `b mod ring_len` (`off_ring`, one
//! vectorized comparison a run of pages); the sequences holding a state are the states taken,
//! and taken + pending ≤ the reserved states. The rings' reach is checked at every write
//! (`grouped.rs`, `check_ring_reach`): a ring never holds a block later than what the oldest
//! step not yet retired that writes the sequence reads from, so a ring sized for fewer tokens
//! than the steps in flight write is a reported violation, not a silent overwrite.

use kvbench_cache_api::{GroupTable, KvCacheManager};

use super::arena::Holder;
use super::grouped::GroupedContiguous;
use super::grouped_seq::{cut_tables, expected_blocks, Reservation};

/// Problems of one reservation: its cut, its counters, and the tables it hands out against the
/// ones its cut and tokens imply (every page inside its table's share, rings on the right page).
fn check_reservation(c: &GroupedContiguous, id: u64, r: &Reservation, problems: &mut Vec<String>) {
    if r.written_tokens > r.mapped_tokens || r.mapped_tokens > r.reserve_tokens {
        problems.push(format!(
            "seq {id}: written {} / mapped {} / reserved {} tokens",
            r.written_tokens, r.mapped_tokens, r.reserve_tokens
        ));
    }
    let shapes = &c.pool.shapes;
    match cut_tables(shapes, r.reserve_tokens, c.max_step_tokens) {
        Some(cuts) if cuts == r.cuts => {}
        other => problems.push(format!(
            "seq {id}: tables cut as {:?}, a reservation of {} tokens is {other:?}",
            r.cuts, r.reserve_tokens
        )),
    }
    if r.state != c.needs_state() {
        problems.push(format!("seq {id}: holds a state: {}", r.state));
    }
    let handed = match c.layout_unrecorded(id) {
        Some(t) => t,
        None => {
            problems.push(format!("seq {id}: no layout"));
            return;
        }
    };
    if handed.len() != shapes.len() || r.tables.len() != shapes.len() {
        problems.push(format!(
            "seq {id}: {} tables handed out, {} kept, {} in the pool",
            handed.len(),
            r.tables.len(),
            shapes.len()
        ));
        return;
    }
    for (t, ((shape, cut), table)) in shapes.iter().zip(&r.cuts).zip(handed).enumerate() {
        let (first, end) = expected_blocks(shape, *cut, r.mapped_tokens, r.written_tokens);
        if table.first_block != first || table.end_block() != end {
            problems.push(format!(
                "seq {id} table {t}: holds blocks {}..{}, should hold {first}..{end}",
                table.first_block,
                table.end_block()
            ));
            continue;
        }
        let share = r.base_page + cut.offset_pages;
        let ring = cut.pages.max(1);
        if let Some(i) = off_ring(&table.pages, share, ring, first) {
            let b = first + i as u64;
            let want = share + (b % u64::from(ring)) as u32;
            problems.push(format!(
                "seq {id} table {t}: block {b} on page {}, its share {share}..{} puts it on {want}",
                table.pages[i],
                share + cut.pages
            ));
        }
    }
}

/// The first index `i` of `pages` not on page `share + (first + i) % ring` (block `first + i`
/// of a table whose share of the reservation starts at page `share` and holds `ring` pages).
///
/// Checked every step for every table of every reservation, so it is the bulk of a checked
/// grouped run: the expected pages are ascending runs that wrap at the ring's end, and each run
/// is compared by folding `page ^ want` with `|` — a loop without an early exit, which the
/// compiler vectorizes — and searched one by one only once a run is known to hold the mismatch.
fn off_ring(pages: &[u32], share: u32, ring: u32, first: u64) -> Option<usize> {
    let ring = ring.max(1);
    let mut at = (first % u64::from(ring)) as u32;
    let mut i = 0usize;
    while i < pages.len() {
        // From ring position `at` to the ring's end, or to the table's.
        let n = ((ring - at) as usize).min(pages.len() - i);
        let run = &pages[i..i + n];
        let base = share.wrapping_add(at);
        let diff = run
            .iter()
            .zip(0u32..)
            .fold(0u32, |acc, (&p, k)| acc | (p ^ base.wrapping_add(k)));
        if diff != 0 {
            let k = run
                .iter()
                .zip(0u32..)
                .position(|(&p, k)| p != base.wrapping_add(k))
                .unwrap_or(0);
            return Some(i + k);
        }
        i += n;
        at = 0;
    }
    None
}

pub(crate) fn check(c: &GroupedContiguous) -> Result<(), String> {
    let mut problems: Vec<String> = c.violations.clone();
    // Every page range: reservations, pending runs, free extents. Sorted, they must tile the
    // arena exactly (no page in two reservations, conservation).
    let mut ranges: Vec<(u64, u64, Holder)> = Vec::new();
    let mut states = 0u64;
    for (&id, r) in &c.seqs {
        check_reservation(c, id, r, &mut problems);
        states += u64::from(r.state);
        ranges.push((
            u64::from(r.base_page),
            u64::from(r.pages()),
            Holder::Seq(id),
        ));
    }
    let (mut pending_pages, mut pending_states) = (0u64, 0u64);
    for (step, f) in c.fence.pending() {
        pending_pages += u64::from(f.pages);
        pending_states += u64::from(f.state);
        if c.fence.is_retired(step) {
            problems.push(format!(
                "pages {} pending on retired step {step}",
                f.base_page
            ));
        }
        ranges.push((
            u64::from(f.base_page),
            u64::from(f.pages),
            Holder::Pending(step),
        ));
    }
    if (pending_pages, pending_states) != (c.pending_pages, c.pending_states) {
        problems.push(format!(
            "fences hold {pending_pages} pages and {pending_states} states, counters say {} and {}",
            c.pending_pages, c.pending_states
        ));
    }
    if states != c.states_held {
        problems.push(format!(
            "{states} sequences hold a state, {} states are taken",
            c.states_held
        ));
    }
    if let Some(n) = c.pool.state.reserved_sequences() {
        if c.states_held + c.pending_states > u64::from(n) {
            problems.push(format!(
                "{} states held and {} pending of {n}",
                c.states_held, c.pending_states
            ));
        }
    }
    super::arena::check_tiling(&c.arena, ranges, "page", c.accounting(), &mut problems);
    super::arena::verdict(problems)
}

pub(crate) fn quiescent(c: &GroupedContiguous) -> Result<(), String> {
    let mut problems = Vec::new();
    if let Err(e) = check(c) {
        problems.push(e);
    }
    if !c.seqs.is_empty() {
        problems.push(format!(
            "{} live sequences: {:?}",
            c.seqs.len(),
            c.seqs.keys().collect::<Vec<_>>()
        ));
    }
    if c.pending_pages > 0 || c.pending_states > 0 {
        problems.push(format!(
            "{} pages and {} states pending behind fences",
            c.pending_pages, c.pending_states
        ));
    }
    if c.fence.in_flight_len() > 0 {
        problems.push(format!(
            "steps still in flight: {:?}",
            c.fence.in_flight().collect::<Vec<_>>()
        ));
    }
    if c.arena.free_slots() != u64::from(c.pool.pages) {
        problems.push(format!(
            "free {} != total {} pages (leaked or still reserved)",
            c.arena.free_slots(),
            c.pool.pages
        ));
    }
    if c.states_held > 0 {
        problems.push(format!("{} recurrent states still taken", c.states_held));
    }
    super::arena::verdict(problems)
}

impl GroupedContiguous {
    /// The tables `layout` hands out for `seq`, without counting a corrupted one as read (a
    /// check is not a backend).
    pub(crate) fn layout_unrecorded(&self, seq: u64) -> Option<&[GroupTable]> {
        let r = self.seqs.get(&seq)?;
        Some(r.bad_tables.as_deref().unwrap_or(&r.tables))
    }
}

#[cfg(test)]
mod tests {
    use super::off_ring;

    /// The pages a table of `len` blocks from `first` holds on a ring of `ring` pages at `share`.
    fn on_ring(share: u32, ring: u32, first: u64, len: usize) -> Vec<u32> {
        (0..len as u64)
            .map(|i| share + ((first + i) % u64::from(ring)) as u32)
            .collect()
    }

    #[test]
    fn every_misplaced_page_is_found_first_across_wraps() {
        for (ring, first, len) in [(1, 0, 1), (4, 0, 4), (4, 3, 9), (7, 12, 20), (64, 100, 64)] {
            let good = on_ring(10, ring, first, len);
            assert_eq!(
                off_ring(&good, 10, ring, first),
                None,
                "{ring} {first} {len}"
            );
            assert_eq!(off_ring(&[], 10, ring, first), None);
            for wrong in 0..len {
                let mut bad = good.clone();
                bad[wrong] += 1;
                if wrong + 1 < len {
                    bad[len - 1] = 0; // a later mismatch must not be reported first
                }
                assert_eq!(
                    off_ring(&bad, 10, ring, first),
                    Some(wrong),
                    "ring {ring} first {first} len {len}, page {wrong} moved"
                );
            }
        }
    }
}
