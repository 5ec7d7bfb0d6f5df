//! `report.md`'s lower-tier section: per tier what it held and moved, where first admissions'
//! prompt tokens came from, and TTFT in its three parts (p50 / p99). Written only for a run
//! with tiers, from the same figures as `summary.json`'s `tiers` and `tier_costs`.

use super::experiment::{Experiment, ModeRun};
use super::summary::{run_tier_costs, tier_summaries};
use crate::units::format_bytes;

/// The section, or nothing when no run of `exp` had a lower tier.
pub fn markdown(exp: &Experiment) -> String {
    let mut s = String::new();
    for r in exp.runs.iter().filter(|r| !r.end.tiers.is_empty()) {
        s.push_str(&run_section(r));
    }
    s
}

fn run_section(r: &ModeRun) -> String {
    let mut s = format!("\n## Lower tiers ({} run)\n\n", r.end.mode.name());
    s.push_str(
        "| tier | capacity | hit tokens | offloads | onloads | evictions | peak used | mean used |\n\
         |------|----------|------------|----------|---------|-----------|-----------|-----------|\n",
    );
    for t in tier_summaries(r) {
        s.push_str(&format!(
            "| {} | {} | {} | {} ({}) | {} ({}) | {} | {} | {} |\n",
            t.tier,
            format_bytes(t.capacity_bytes),
            t.hit_tokens,
            t.offloads,
            format_bytes(t.offload_bytes),
            t.onloads,
            format_bytes(t.onload_bytes),
            t.evictions,
            format_bytes(t.peak_used_bytes),
            format_bytes(t.time_weighted_used_bytes.round() as u64),
        ));
    }
    let Some(c) = run_tier_costs(r) else {
        return s;
    };
    let h = &c.admission_hits;
    let prompt = h.device_tokens + h.host_tokens + h.disk_tokens + h.computed_tokens;
    let pct = |t: u64| {
        if prompt == 0 {
            0.0
        } else {
            100.0 * t as f64 / prompt as f64
        }
    };
    s.push_str(&format!(
        "\nPrompt tokens at first admission: {} hit on the device ({:.1}%), {} in the host tier \
         ({:.1}%), {} on disk ({:.1}%), {} computed ({:.1}%). Onloaded {} in all; the steps \
         carrying onloads waited {:.3} ms for them.\n\n",
        h.device_tokens,
        pct(h.device_tokens),
        h.host_tokens,
        pct(h.host_tokens),
        h.disk_tokens,
        pct(h.disk_tokens),
        h.computed_tokens,
        pct(h.computed_tokens),
        format_bytes(c.onload_bytes),
        c.onload_wait_ms,
    ));
    s.push_str(
        "| TTFT part (ms) | p50 | p99 |\n\
         |----------------|-----|-----|\n",
    );
    for (name, d) in [
        ("queue", c.ttft_queue_ms),
        ("onload", c.ttft_onload_ms),
        ("prefill", c.ttft_prefill_ms),
    ] {
        s.push_str(&format!("| {name} | {:.3} | {:.3} |\n", d.p50, d.p99));
    }
    s
}
