//! The hybrid manager's invariants, recomputed from its state: every page in exactly one place
//! (the free list once, or block tables as many times as its reference count says), each table
//! holding exactly the logical blocks its kind keeps at the sequence's length (so no sliding
//! table holds a block wholly out of its window), and one recurrent state per live sequence.

use super::manager::HybridCache;

impl HybridCache {
    /// Every violation found, described; empty when the state is consistent.
    pub fn check_invariants(&self) -> Vec<String> {
        let mut bad = Vec::new();
        let pages = self.pool.pages() as usize;
        let mut counted = vec![0u64; pages];
        for (&seq, entry) in &self.seqs {
            if entry.tables.len() != self.layout.tables.len() {
                bad.push(format!(
                    "seq {seq}: {} tables, layout has {}",
                    entry.tables.len(),
                    self.layout.tables.len()
                ));
                continue;
            }
            for (t, (spec, table)) in self.layout.tables.iter().zip(&entry.tables).enumerate() {
                let (first, end) = spec.held_blocks(entry.tokens);
                if (table.first_block, table.end_block()) != (first, end) {
                    bad.push(format!(
                        "seq {seq} table {t} ({:?}) holds blocks {}..{} at {} tokens, should hold {first}..{end}",
                        spec.kind,
                        table.first_block,
                        table.end_block(),
                        entry.tokens
                    ));
                }
                for &page in &table.pages {
                    match counted.get_mut(page as usize) {
                        Some(c) => *c += 1,
                        None => bad.push(format!("seq {seq} table {t}: page {page} out of range")),
                    }
                }
            }
        }
        let mut free_seen = vec![false; pages];
        for &page in self.pool.free_pages() {
            match free_seen.get_mut(page as usize) {
                Some(true) => bad.push(format!("page {page} is on the free list twice")),
                Some(seen) => *seen = true,
                None => bad.push(format!("free page {page} out of range")),
            }
        }
        for (page, (&count, &free)) in counted.iter().zip(&free_seen).enumerate() {
            let refs = self.pool.refs(page as u32).unwrap_or(0) as u64;
            if free && count > 0 {
                bad.push(format!("page {page} is free and in {count} tables"));
            }
            if !free && count == 0 {
                bad.push(format!(
                    "page {page} is neither free nor in any table (leaked)"
                ));
            }
            if refs != count {
                bad.push(format!(
                    "page {page}: {refs} references counted, {count} in tables"
                ));
            }
        }
        let live = self.seqs.len() as u64;
        let held = self.states_held as u64;
        match self.layout.state_sequences {
            Some(cap) if held != live || held > cap as u64 => bad.push(format!(
                "{held} recurrent states held for {live} sequences (of {cap} reserved)"
            )),
            None if held != 0 => bad.push(format!("{held} states held without a recurrent group")),
            _ => {}
        }
        bad
    }

    /// What is still held when nothing should be: sequences, pages out of the pool, states.
    pub fn check_quiescent(&self) -> Vec<String> {
        let mut bad = Vec::new();
        if !self.seqs.is_empty() {
            bad.push(format!("{} sequences still held", self.seqs.len()));
        }
        if self.pool.free_count() != self.pool.pages() {
            bad.push(format!(
                "{} of {} pages not free",
                self.pool.pages() - self.pool.free_count(),
                self.pool.pages()
            ));
        }
        if self.states_held != 0 {
            bad.push(format!("{} recurrent states still held", self.states_held));
        }
        bad
    }
}
