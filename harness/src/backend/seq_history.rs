//! Per-sequence bookkeeping shared by the computing backends (`cpu`, `cuda`): each sequence's
//! token history (prompt, then every sampled token), its latest logits (a fork picks its
//! continuation from them) and, for checked sequences, the sampled steps the oracle check
//! compares. One table owns it so both backends derive a fork's first token, extend a history
//! and re-derive a recomputed position the same way.

use std::collections::BTreeMap;

use kvbench_cache_api::SeqId;
use kvbench_kernels::rank_token;

use super::{BackendError, SeqWork};

/// The backend's logits after position `pos` of a sequence.
#[derive(Debug, Clone)]
pub struct Record {
    pub pos: usize,
    pub logits: Vec<f32>,
}

#[derive(Debug, Default)]
pub struct SeqState {
    /// Token id at each logical position.
    pub history: Vec<u32>,
    /// The latest sampled step whose logits were kept (a fork picks its continuation from it).
    pub last: Option<Record>,
    /// Sampled steps, kept only for checked sequences.
    pub records: Vec<Record>,
    pub checked: bool,
    /// This sequence (not its fork parent) has sampled a token.
    pub sampled_once: bool,
}

impl SeqState {
    /// The step ending at `pos` chose `token` for `pos + 1`; `logits` where they were kept, and
    /// at most `keep_steps` records. A recompute that re-derives a known position replaces what
    /// followed it.
    pub fn sampled(&mut self, pos: usize, logits: Option<Vec<f32>>, token: u32, keep_steps: usize) {
        self.history.truncate(pos + 1);
        self.history.push(token);
        self.sampled_once = true;
        let Some(logits) = logits else { return };
        let rec = Record { pos, logits };
        if self.checked {
            self.records.retain(|r| r.pos < pos);
            if self.records.len() < keep_steps {
                self.records.push(rec.clone());
            }
        }
        self.last = Some(rec);
    }
}

/// Every registered, not yet forgotten sequence, and how many were ever registered.
#[derive(Debug, Default)]
pub struct SeqTable {
    seqs: BTreeMap<SeqId, SeqState>,
    registered: u64,
}

impl SeqTable {
    /// Sequences registered (or forked) so far, forgotten ones included.
    pub fn registered(&self) -> u64 {
        self.registered
    }

    pub fn get(&self, seq: SeqId) -> Option<&SeqState> {
        self.seqs.get(&seq)
    }

    pub fn get_mut(&mut self, seq: SeqId) -> Option<&mut SeqState> {
        self.seqs.get_mut(&seq)
    }

    /// A new sequence whose history is `prompt`.
    pub fn register(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        checked: bool,
    ) -> Result<(), BackendError> {
        self.add(
            seq,
            SeqState {
                history: prompt.to_vec(),
                checked,
                ..SeqState::default()
            },
        )
    }

    /// Forks `child` off `parent`: its first token is the `sample_rank`-th best of the parent's
    /// latest logits, after the parent's history up to that step. `checked` decides, from the
    /// parent's flag and the registered count, whether the child is checked.
    pub fn fork(
        &mut self,
        parent: SeqId,
        child: SeqId,
        sample_rank: u32,
        checked: impl FnOnce(bool, u64) -> bool,
    ) -> Result<u32, BackendError> {
        let p = self
            .seqs
            .get(&parent)
            .ok_or_else(|| BackendError::Step(format!("fork of unknown sequence {parent}")))?;
        let last = p.last.as_ref().ok_or_else(|| {
            BackendError::Step(format!(
                "fork of sequence {parent} before it sampled a token"
            ))
        })?;
        let token = rank_token(&last.logits, sample_rank as usize).ok_or_else(|| {
            BackendError::Step(format!(
                "sample rank {sample_rank} exceeds the vocabulary of {}",
                last.logits.len()
            ))
        })?;
        let mut history = p.history[..=last.pos].to_vec();
        history.push(token);
        let checked = checked(p.checked, self.registered);
        let state = SeqState {
            history,
            last: Some(last.clone()),
            records: Vec::new(),
            checked,
            sampled_once: false,
        };
        self.add(child, state)?;
        Ok(token)
    }

    /// Removes a forgotten sequence, returning its state for the final check.
    pub fn forget(&mut self, seq: SeqId) -> Result<SeqState, BackendError> {
        self.seqs
            .remove(&seq)
            .ok_or_else(|| BackendError::Step(format!("forget of unknown sequence {seq}")))
    }

    /// The tokens a step's `w` covers: positions `context_tokens .. context_tokens + new_tokens`.
    pub fn step_tokens(&self, w: &SeqWork) -> Result<(usize, &[u32]), BackendError> {
        let st = self.seqs.get(&w.seq).ok_or_else(|| {
            BackendError::Step(format!("sequence {} was never registered", w.seq))
        })?;
        let start = w.context_tokens as usize;
        let end = start + w.new_tokens as usize;
        if end > st.history.len() {
            return Err(BackendError::Step(format!(
                "sequence {}: step covers positions {start}..{end} but only {} tokens are known",
                w.seq,
                st.history.len()
            )));
        }
        Ok((start, &st.history[start..end]))
    }

    /// History and records of each live checked sequence, for the numerics report.
    pub fn live_checked(&self) -> impl Iterator<Item = (&[u32], &[Record])> {
        self.seqs
            .values()
            .filter(|s| s.checked)
            .map(|s| (s.history.as_slice(), s.records.as_slice()))
    }

    fn add(&mut self, seq: SeqId, state: SeqState) -> Result<(), BackendError> {
        if self.seqs.contains_key(&seq) {
            return Err(BackendError::Step(format!(
                "sequence {seq} registered twice"
            )));
        }
        self.registered += 1;
        self.seqs.insert(seq, state);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sampled_token_extends_the_history_and_a_recompute_replaces_what_followed() {
        let mut st = SeqState {
            history: vec![1, 2, 3],
            checked: true,
            ..SeqState::default()
        };
        st.sampled(2, Some(vec![0.0, 1.0]), 9, 2);
        st.sampled(3, None, 8, 2);
        assert_eq!(st.history, vec![1, 2, 3, 9, 8]);
        assert_eq!(st.records.len(), 1, "a row without logits keeps no record");
        st.sampled(3, Some(vec![1.0, 0.0]), 7, 2);
        st.sampled(4, Some(vec![1.0, 0.0]), 6, 2);
        assert_eq!(st.history, vec![1, 2, 3, 9, 7, 6]);
        assert_eq!(
            st.records.iter().map(|r| r.pos).collect::<Vec<_>>(),
            vec![2, 3],
            "at most keep_steps records"
        );
        // Preempted and recomputed from position 2: the records after it are replaced.
        st.sampled(2, Some(vec![0.5, 0.5]), 4, 2);
        assert_eq!(st.history, vec![1, 2, 3, 4]);
        assert_eq!(
            st.records.iter().map(|r| r.pos).collect::<Vec<_>>(),
            vec![2]
        );
        assert!(st.sampled_once);
        assert_eq!(st.last.as_ref().map(|r| r.pos), Some(2));
    }

    #[test]
    fn a_fork_continues_from_the_parents_ranked_logits_and_counts_as_registered() {
        let mut t = SeqTable::default();
        t.register(1, &[5, 6], false).expect("register");
        assert!(t.fork(1, 2, 0, |_, _| true).is_err(), "nothing sampled yet");
        t.get_mut(1)
            .expect("live")
            .sampled(1, Some(vec![0.1, 0.9, 0.5]), 1, usize::MAX);
        let token = t
            .fork(1, 2, 1, |parent_checked, n| {
                assert!(!parent_checked);
                assert_eq!(n, 1);
                true
            })
            .expect("fork");
        assert_eq!(token, 2, "second-best logit");
        let child = t.get(2).expect("child");
        assert_eq!(child.history, vec![5, 6, 2]);
        assert!(child.checked && !child.sampled_once);
        assert_eq!(t.registered(), 2);
        assert!(t.register(2, &[1], true).is_err(), "registered twice");
        assert!(
            t.fork(1, 3, 3, |_, _| false).is_err(),
            "rank past the vocabulary"
        );
        assert_eq!(t.live_checked().count(), 1);
        assert!(t.forget(2).is_ok() && t.forget(2).is_err());
    }
}
