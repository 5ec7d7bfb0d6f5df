//! The memory ledger: weights, KV live, KV allocated-but-unfilled, KV cached-free, KV pending
//! (fenced) release, workspace and other (block tables, per-sequence metadata), one row per step.
//!
//! **KV waste fraction** = ∫ allocated-unfilled dt ÷ ∫ (live + allocated-unfilled) dt: the share
//! of KV memory held by sequences that holds no token, weighted by how long it was held (each
//! sample holds until the next). A ratio of integrals rather than a mean of ratios, so idle
//! moments with one half-empty block do not dominate.
//!
//! **Accounting unit:** managers count slots; every slots → bytes conversion (here, in
//! `accum.rs`, in `memory.csv` and Perfetto's counters, the summary's leaked and tier bytes)
//! multiplies by the run's own `slot_bytes`, carried by `RunStart` and `RunEnd`, so one run's
//! record or files are read alone. A summed run's slot is `kv_bytes_per_token`; a hybrid run's
//! is a page's bytes ÷ `page_slots`.

use serde::Serialize;

use crate::engine::{RunRecord, StepSample, BLOCK_TABLE_ENTRY_BYTES, SEQ_METADATA_BYTES};

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LedgerRow {
    pub step: u64,
    pub t_ms: f64,
    pub running_sequences: u32,
    pub weights_bytes: u64,
    pub kv_live_bytes: u64,
    pub kv_allocated_unfilled_bytes: u64,
    pub kv_cached_free_bytes: u64,
    pub kv_pending_free_bytes: u64,
    pub kv_free_bytes: u64,
    pub workspace_bytes: u64,
    pub other_bytes: u64,
    /// Blocks held by the host tier × a block's bytes (0 without one).
    pub host_tier_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct LedgerSummary {
    pub kv_budget_bytes: u64,
    pub weights_bytes: u64,
    pub kv_peak_live_bytes: u64,
    pub kv_peak_allocated_bytes: u64,
    pub kv_peak_cached_free_bytes: u64,
    pub workspace_peak_bytes: u64,
    pub other_bytes: u64,
    pub kv_waste_fraction: f64,
    /// The host tier's capacity and the most it held at a step's end, bytes (absent without a
    /// host tier: host memory, outside the device's budget).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_tier_capacity_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_tier_peak_bytes: Option<u64>,
}

/// Bytes of one block of `block_size` slots of `slot_bytes` each (a lower tier's block is a
/// device block's: all layers' K and V).
pub fn block_bytes(block_size: u32, slot_bytes: u64) -> u64 {
    u64::from(block_size).saturating_mul(slot_bytes)
}

/// The host tier's part of a ledger summary that starts with `start`: its capacity, and a peak
/// of 0 to grow (both absent without a host tier).
pub fn host_tier_start(out: &mut LedgerSummary, start: &crate::engine::RunStart, kvb: u64) {
    let cap = start.tier_capacity_blocks[0];
    if cap > 0 {
        out.host_tier_capacity_bytes = Some(cap.saturating_mul(block_bytes(start.block_size, kvb)));
        out.host_tier_peak_bytes = Some(0);
    }
}

/// Grow the host tier's peak by one step sample.
pub fn host_tier_step(out: &mut LedgerSummary, s: &StepSample, block_size: u32, kvb: u64) {
    if let Some(peak) = &mut out.host_tier_peak_bytes {
        *peak = (*peak).max(s.tier_used_blocks[0].saturating_mul(block_bytes(block_size, kvb)));
    }
}

pub fn other_bytes(s: &StepSample, block_size: u32, paged: bool) -> u64 {
    let a = &s.accounting;
    let mapped_blocks =
        (a.live_slots + a.allocated_unfilled_slots).div_ceil(block_size.max(1) as u64);
    s.running as u64 * SEQ_METADATA_BYTES
        + if paged {
            mapped_blocks * BLOCK_TABLE_ENTRY_BYTES
        } else {
            0
        }
}

/// The ledger at each step, in bytes: slots × the run's `slot_bytes` (its record's).
pub fn rows(r: &RunRecord) -> Vec<LedgerRow> {
    let kv_bytes_per_token = r.end.slot_bytes;
    let paged = r.end.mode == kvbench_cache_api::CacheMode::Paged;
    r.steps
        .iter()
        .map(|s| {
            let a = &s.accounting;
            LedgerRow {
                step: s.step,
                t_ms: s.end_ns as f64 / 1e6,
                running_sequences: s.running,
                weights_bytes: r.end.memory.weights_bytes,
                kv_live_bytes: a.live_slots * kv_bytes_per_token,
                kv_allocated_unfilled_bytes: a.allocated_unfilled_slots * kv_bytes_per_token,
                kv_cached_free_bytes: a.cached_free_slots * kv_bytes_per_token,
                kv_pending_free_bytes: a.pending_free_slots * kv_bytes_per_token,
                kv_free_bytes: a.free_slots * kv_bytes_per_token,
                workspace_bytes: r.end.memory.workspace_bytes,
                other_bytes: other_bytes(s, r.end.block_size, paged) + r.end.memory.other_bytes,
                host_tier_bytes: s.tier_used_blocks[0]
                    .saturating_mul(block_bytes(r.end.block_size, kv_bytes_per_token)),
            }
        })
        .collect()
}

/// The ledger's peaks and waste over the run, in bytes of the run's `slot_bytes`.
pub fn summarize(r: &RunRecord) -> LedgerSummary {
    let kv_bytes_per_token = r.end.slot_bytes;
    let mut out = LedgerSummary {
        kv_budget_bytes: r.end.total_slots * kv_bytes_per_token,
        weights_bytes: r.end.memory.weights_bytes,
        workspace_peak_bytes: r.end.memory.workspace_bytes,
        ..LedgerSummary::default()
    };
    host_tier_start(&mut out, &r.start(), kv_bytes_per_token);
    let paged = r.end.mode == kvbench_cache_api::CacheMode::Paged;
    let (mut unfilled_dt, mut held_dt) = (0f64, 0f64);
    for (i, s) in r.steps.iter().enumerate() {
        host_tier_step(&mut out, s, r.end.block_size, kv_bytes_per_token);
        let a = &s.accounting;
        out.kv_peak_live_bytes = out
            .kv_peak_live_bytes
            .max(a.live_slots * kv_bytes_per_token);
        out.kv_peak_allocated_bytes = out
            .kv_peak_allocated_bytes
            .max((a.live_slots + a.allocated_unfilled_slots) * kv_bytes_per_token);
        out.kv_peak_cached_free_bytes = out
            .kv_peak_cached_free_bytes
            .max(a.cached_free_slots * kv_bytes_per_token);
        out.other_bytes = out
            .other_bytes
            .max(other_bytes(s, r.end.block_size, paged) + r.end.memory.other_bytes);
        let dt = r.steps.get(i + 1).map_or(0, |n| n.end_ns - s.end_ns) as f64;
        unfilled_dt += a.allocated_unfilled_slots as f64 * dt;
        held_dt += (a.live_slots + a.allocated_unfilled_slots) as f64 * dt;
    }
    out.kv_waste_fraction = if held_dt > 0.0 {
        unfilled_dt / held_dt
    } else {
        0.0
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvbench_cache_api::Accounting;

    fn sample(step: u64, end_ms: u64, live: u64, unfilled: u64) -> StepSample {
        StepSample {
            step,
            start_ns: 0,
            end_ns: end_ms * 1_000_000,
            batch_seqs: 1,
            batch_tokens: 1,
            running: 2,
            accounting: Accounting {
                total_slots: 1000,
                live_slots: live,
                allocated_unfilled_slots: unfilled,
                cached_free_slots: 0,
                pending_free_slots: 0,
                free_slots: 1000 - live - unfilled,
            },
            tier_used_blocks: [0; 2],
        }
    }

    #[test]
    fn waste_is_a_ratio_of_time_integrals_and_peaks_are_maxima() {
        let mut r = crate::metrics::tests_support::empty_record();
        // 10 ms at 90 live / 10 unfilled, then 30 ms at 10 live / 90 unfilled, then the end.
        r.steps = vec![
            sample(0, 0, 90, 10),
            sample(1, 10, 10, 90),
            sample(2, 40, 0, 0),
        ];
        // Slots of 2 bytes: the record carries its unit.
        r.end.slot_bytes = 2;
        let s = summarize(&r);
        let expect = (10.0 * 10.0 + 90.0 * 30.0) / (100.0 * 10.0 + 100.0 * 30.0);
        assert!(
            (s.kv_waste_fraction - expect).abs() < 1e-12,
            "{}",
            s.kv_waste_fraction
        );
        assert_eq!(s.kv_peak_live_bytes, 180);
        assert_eq!(s.kv_peak_allocated_bytes, 200);
        assert_eq!(s.kv_budget_bytes, 2048);
        // Paged: 2 sequences × 64 B + ceil(100 / 16) = 7 block-table entries × 4 B.
        assert_eq!(s.other_bytes, 2 * 64 + 7 * 4);
        let rows = rows(&r);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1].kv_allocated_unfilled_bytes, 180);
    }
}
