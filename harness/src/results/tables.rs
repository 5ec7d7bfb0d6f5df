//! `requests.csv` and `memory.csv`. Times are exact: integer nanoseconds written as
//! milliseconds with six decimals, so percentiles recompute exactly from the file.
//!
//! `requests.csv`'s tier columns: `hit_device_tokens`, `hit_host_tokens`, `hit_disk_tokens`
//! (where the prompt's hits came from at first admission; they sum to `cached_prompt_tokens`),
//! `prefill_computed_tokens` (prompt − those hits; empty if never admitted), `onload_bytes` and
//! `onload_wait_ms` (every admission's onloads and the stream's share of their steps' waits),
//! `ttft_queue_ms` + `ttft_onload_ms` + `ttft_prefill_ms` = TTFT exactly (empty without a first
//! token; see [`crate::metrics::tiers`]).

use std::collections::BTreeMap;
use std::io::Write;

use crate::backend::MemoryParts;
use crate::engine::StreamRecord;
use crate::metrics::tiers::{hit_device_tokens, prefill_computed_tokens, ttft_parts, TtftParts};
use crate::metrics::timeline::Bucket;

/// Integer nanoseconds as milliseconds with six decimals (exact, locale- and float-free).
pub fn fmt_ms(ns: u64) -> String {
    format!("{}.{:06}", ns / 1_000_000, ns % 1_000_000)
}

pub const REQUESTS_HEADER: &str = "cache,request_id,parent_id,tenant,arrival_ms,admitted_ms,first_token_ms,finish_ms,prompt_tokens,cached_prompt_tokens,output_tokens,status,preemptions,intended_arrival_ms,queueing_ms,recomputed_tokens,swapped_bytes,hit_device_tokens,hit_host_tokens,hit_disk_tokens,prefill_computed_tokens,onload_bytes,onload_wait_ms,ttft_queue_ms,ttft_onload_ms,ttft_prefill_ms";

/// `requests.csv` written as streams resolve, in stream order per cache mode: a resolved
/// stream's row waits in a reorder buffer until every earlier stream's row is out (the buffer
/// holds the rows that resolved while an earlier stream was still in flight).
pub struct RequestsWriter {
    pending: BTreeMap<u32, String>,
    next: u32,
    /// Most rows held at once (a measure of how far out of order streams resolved).
    pub peak_pending: usize,
}

impl RequestsWriter {
    pub fn new(w: &mut impl Write) -> std::io::Result<RequestsWriter> {
        writeln!(w, "{REQUESTS_HEADER}")?;
        Ok(RequestsWriter {
            pending: BTreeMap::new(),
            next: 0,
            peak_pending: 0,
        })
    }

    /// A new cache mode's streams start again at index 0.
    pub fn begin_mode(&mut self) {
        self.pending.clear();
        self.next = 0;
    }

    pub fn stream(
        &mut self,
        cache: &str,
        index: u32,
        s: &StreamRecord,
        w: &mut impl Write,
    ) -> std::io::Result<()> {
        let row = row(cache, s);
        if index == self.next {
            w.write_all(row.as_bytes())?;
            self.next += 1;
            while let Some(row) = self.pending.remove(&self.next) {
                w.write_all(row.as_bytes())?;
                self.next += 1;
            }
        } else {
            self.pending.insert(index, row);
            self.peak_pending = self.peak_pending.max(self.pending.len());
        }
        Ok(())
    }

    /// The mode ended: whatever is held goes out in order (a gap would be an engine bug; the
    /// rows still come out rather than being lost).
    pub fn end_mode(&mut self, w: &mut impl Write) -> std::io::Result<()> {
        for (_, row) in std::mem::take(&mut self.pending) {
            w.write_all(row.as_bytes())?;
        }
        Ok(())
    }
}

fn row(cache: &str, s: &StreamRecord) -> String {
    let opt = |v: Option<u64>| v.map(fmt_ms).unwrap_or_default();
    let parent = if s.rank == 0 {
        String::new()
    } else {
        s.request.to_string()
    };
    let parts = ttft_parts(s);
    let part = |f: fn(&TtftParts) -> u64| parts.as_ref().map(f).map(fmt_ms).unwrap_or_default();
    let computed = s
        .admitted_ns
        .map(|_| prefill_computed_tokens(s).to_string())
        .unwrap_or_default();
    format!(
        "{cache},{},{parent},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{computed},{},{},{},{},{}\n",
        s.request_label(),
        s.tenant,
        fmt_ms(s.arrival_ns),
        opt(s.admitted_ns),
        opt(s.first_token_ns()),
        fmt_ms(s.finish_ns),
        s.prompt_tokens,
        s.cached_prompt_tokens,
        s.token_ns.len(),
        s.status.name(),
        s.preemptions,
        fmt_ms(s.intended_arrival_ns),
        opt(s.admitted_ns.map(|a| a.saturating_sub(s.arrival_ns))),
        s.recomputed_tokens,
        s.swapped_bytes,
        hit_device_tokens(s),
        s.admission_tier_hits.host_tokens,
        s.admission_tier_hits.disk_tokens,
        s.onload_bytes,
        fmt_ms(s.onload_wait_ns),
        part(|p| p.queue_ns),
        part(|p| p.onload_ns),
        part(|p| p.prefill_ns),
    )
}

pub const MEMORY_HEADER: &str = "cache,step,t_ms,running_sequences,weights_bytes,kv_live_bytes,kv_allocated_unfilled_bytes,kv_cached_free_bytes,kv_pending_free_bytes,kv_free_bytes,workspace_bytes,other_bytes,host_tier_bytes,disk_tier_bytes";

/// `memory.csv` rows of one cache mode from its timeline: a row per step, or per interval of
/// the stated resolution with each column's maximum over the interval (see
/// [`crate::metrics::timeline`]). The lower tiers' columns are blocks held × a block's bytes
/// (host memory and disk, outside the device's budget; 0 without tiers). Slots are
/// `slot_bytes` each: the run's accounting unit, from its start.
pub fn write_memory_rows(
    cache: &str,
    rows: &[Bucket],
    slot_bytes: u64,
    block_size: u32,
    memory: &MemoryParts,
    w: &mut impl Write,
) -> std::io::Result<()> {
    let kvb = slot_bytes;
    let block = crate::metrics::ledger::block_bytes(block_size, kvb);
    for b in rows {
        writeln!(
            w,
            "{cache},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            b.last_step,
            fmt_ms(b.end_ns),
            b.running,
            memory.weights_bytes,
            b.live_slots * kvb,
            b.allocated_unfilled_slots * kvb,
            b.cached_free_slots * kvb,
            b.pending_free_slots * kvb,
            b.free_slots * kvb,
            memory.workspace_bytes,
            b.metadata_bytes + memory.other_bytes,
            b.tier_used_blocks[0].saturating_mul(block),
            b.tier_used_blocks[1].saturating_mul(block),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::fmt_ms;

    #[test]
    fn ms_formatting_is_exact() {
        assert_eq!(fmt_ms(0), "0.000000");
        assert_eq!(fmt_ms(1), "0.000001");
        assert_eq!(fmt_ms(12_345_678_901), "12345.678901");
    }
}
