//! The checks run after every operation and the final drain to quiescence.

use std::collections::BTreeSet;

use kvbench_cache_api::{CacheMode, ReleaseReason, SeqId, StepId};

use super::Harness;

impl Harness {
    /// Compare the manager with the model.
    pub fn check(&self) -> Result<(), String> {
        if let Some(last) = self.trace.last() {
            if let Some(i) = last.find("VIOLATION") {
                return Err(last[i..].to_string());
            }
        }
        if !self.model_only {
            self.mgr.check_invariants()?;
        }
        let mut live_slots = BTreeSet::new();
        for (&id, m) in &self.seqs {
            if self.mgr.seq_tokens(id) != Some(m.filled as u32) {
                return Err(format!(
                    "seq {id}: manager holds {:?} tokens, model {}",
                    self.mgr.seq_tokens(id),
                    m.filled
                ));
            }
            for pos in 0..m.filled {
                let slot = self
                    .slot(id, pos)
                    .ok_or_else(|| format!("seq {id}: position {pos} unmapped"))?;
                live_slots.insert(slot);
                let got = self
                    .payload
                    .get(slot as usize)
                    .copied()
                    .flatten()
                    .map(|(t, _)| t);
                if got != Some(m.tokens[pos]) {
                    return Err(format!(
                        "seq {id}: position {pos} (slot {slot}) reads {got:?}, expected {}",
                        m.tokens[pos]
                    ));
                }
            }
            // No slot fenced behind an in-flight step may carry new content.
            for (pos, slot) in self.mapped_slots(id).into_iter().enumerate() {
                if let Some(&(fence, content)) = self.fenced.get(&slot) {
                    let same_content = self.cfg.mode == CacheMode::Paged
                        && pos < m.filled
                        && content == Some(m.tokens[pos]);
                    if !same_content {
                        return Err(format!(
                            "seq {id}: slot {slot} handed out before its fence step {fence} retired"
                        ));
                    }
                }
            }
        }
        let acc = self.mgr.accounting();
        if acc.live_slots != live_slots.len() as u64 {
            return Err(format!(
                "accounting says {} live slots, the model reads {}",
                acc.live_slots,
                live_slots.len()
            ));
        }
        Ok(())
    }

    /// Release every sequence, retire every step, and require quiescence (then a flush frees all).
    pub fn drain(&mut self) -> Result<(), String> {
        let ids: Vec<SeqId> = self.seqs.keys().copied().collect();
        for id in ids {
            self.apply_release(id)?;
        }
        if self.cfg.tiers.is_enabled() {
            // Tier ops drained since the last step belong to one more step, as an engine submits
            // the step it planned (their pins wait for it).
            // Its drain may emit write-through offloads: they need one more step.
            for _ in 0..2 {
                let step = self.mgr.begin_step();
                self.in_flight.insert(step);
                self.trace.push(format!("drain: step {step} began"));
                if self.perform_tier_ops().is_none() {
                    break;
                }
            }
        }
        let steps: Vec<StepId> = self.in_flight.iter().copied().collect();
        for step in steps {
            self.mgr.retire_step(step);
            self.retire(step);
            self.trace.push(format!("drain: step {step} retired"));
        }
        self.check()?;
        if !self.model_only {
            self.mgr.assert_quiescent()?;
        }
        self.mgr.flush_prefix_cache();
        let acc = self.mgr.accounting();
        if acc.free_slots != acc.total_slots {
            return Err(format!(
                "after a flush {} of {} slots are free",
                acc.free_slots, acc.total_slots
            ));
        }
        Ok(())
    }

    pub(super) fn apply_release(&mut self, id: SeqId) -> Result<(), String> {
        let line = self.release(id, ReleaseReason::Finish);
        self.trace.push(format!("drain: {line}"));
        self.check()
    }
}
