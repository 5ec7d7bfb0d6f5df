//! `requests.csv` and `memory.csv`. Times are exact: integer nanoseconds written as
//! milliseconds with six decimals, so percentiles recompute exactly from the file.

use std::io::Write;

use super::experiment::Experiment;
use crate::metrics::ledger;

/// Integer nanoseconds as milliseconds with six decimals (exact, locale- and float-free).
pub fn fmt_ms(ns: u64) -> String {
    format!("{}.{:06}", ns / 1_000_000, ns % 1_000_000)
}

pub const REQUESTS_HEADER: &str = "cache,request_id,parent_id,tenant,arrival_ms,admitted_ms,first_token_ms,finish_ms,prompt_tokens,cached_prompt_tokens,output_tokens,status,preemptions,intended_arrival_ms,queueing_ms,recomputed_tokens,swapped_bytes";

pub fn write_requests(exp: &Experiment, w: &mut impl Write) -> std::io::Result<()> {
    writeln!(w, "{REQUESTS_HEADER}")?;
    for run in &exp.runs {
        let cache = run.record.mode.name();
        for s in &run.record.streams {
            let opt = |v: Option<u64>| v.map(fmt_ms).unwrap_or_default();
            let parent = if s.rank == 0 {
                String::new()
            } else {
                s.request.to_string()
            };
            writeln!(
                w,
                "{cache},{},{parent},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
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
            )?;
        }
    }
    Ok(())
}

pub fn write_memory(exp: &Experiment, w: &mut impl Write) -> std::io::Result<()> {
    writeln!(
        w,
        "cache,step,t_ms,running_sequences,weights_bytes,kv_live_bytes,kv_allocated_unfilled_bytes,kv_cached_free_bytes,kv_pending_free_bytes,kv_free_bytes,workspace_bytes,other_bytes"
    )?;
    for run in &exp.runs {
        let cache = run.record.mode.name();
        for (row, s) in ledger::rows(&run.record, exp.kv_bytes_per_token)
            .iter()
            .zip(&run.record.steps)
        {
            writeln!(
                w,
                "{cache},{},{},{},{},{},{},{},{},{},{},{}",
                row.step,
                fmt_ms(s.end_ns),
                row.running_sequences,
                row.weights_bytes,
                row.kv_live_bytes,
                row.kv_allocated_unfilled_bytes,
                row.kv_cached_free_bytes,
                row.kv_pending_free_bytes,
                row.kv_free_bytes,
                row.workspace_bytes,
                row.other_bytes,
            )?;
        }
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
