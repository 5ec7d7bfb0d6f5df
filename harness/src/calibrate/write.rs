//! Writing a fitted profile: the same TOML the shipped profiles use, every constant preceded by
//! a comment naming its source, so the file is loadable and auditable alike.

use std::fmt::Write as _;

use super::fit::{Fit, Origin, HALF_TOKENS, PARAMS};
use super::grid::Grid;

/// The profile file's text.
pub fn profile_toml(fit: &Fit, grid: &Grid, base_name: &str) -> String {
    let p = &fit.profile;
    let load = grid
        .load_average
        .map(|[a, b]| format!(" (load average {a:.1} → {b:.1})"))
        .unwrap_or_default();
    let fitted = format!(
        "Fitted on {} ({} backend, model {}) at {}{load}, {} points, R² {:.4}, median |error| {:.1}%, max {:.1}%.",
        grid.device,
        grid.backend,
        grid.model.name,
        grid.date,
        fit.points,
        fit.r2,
        100.0 * fit.median_abs_rel_err,
        100.0 * fit.max_abs_rel_err
    );
    let source = |key: &str| -> String {
        let Some(j) = PARAMS.iter().position(|k| *k == key) else {
            return format!("Kept from the {base_name} profile (not part of the fit).");
        };
        match fit.origins[j] {
            Origin::Fitted => fitted.clone(),
            Origin::AtBound => format!(
                "{fitted} No measurable cost in the grid (coefficient 0): the range's bound."
            ),
            Origin::Kept => format!(
                "Kept from the {base_name} profile: the grid has no steps that exercise it."
            ),
        }
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Device profile written by `kvbench calibrate`: the sim cost model (combine = \"sum\")\n\
         # fitted by weighted non-negative least squares to measured step times; refit with\n\
         # `kvbench calibrate --from-grid` on the grid file named below.\n\
         # Grid: {} points of {} on {}.",
        grid.points.len(),
        grid.model.name,
        grid.device
    );
    let _ = writeln!(out, "name = {:?}\n", p.name);
    let mut entry = |key: &str, comment: String, value: String| {
        let _ = writeln!(out, "# {comment}\n{key} = {value}\n");
    };
    entry(
        "memory_bytes",
        format!("Kept from the {base_name} profile (memory is not measured by the grid)."),
        p.memory_bytes.to_string(),
    );
    entry(
        "hbm_datasheet_bytes_per_s",
        format!("Kept from the {base_name} profile (for the report only)."),
        num(p.hbm_datasheet_bytes_per_s),
    );
    let rows: [(&str, f64); 10] = [
        ("hbm_effective_bytes_per_s", p.hbm_effective_bytes_per_s),
        ("peak_flops_per_s", p.peak_flops_per_s),
        ("host_link_bytes_per_s", p.host_link_bytes_per_s),
        ("step_overhead_s", p.step_overhead_s),
        ("paged_attention_efficiency", p.paged_attention_efficiency),
        ("seq_overhead_s", p.seq_overhead_s),
        (
            "attention_flops_per_s",
            p.attention_flops_per_s.unwrap_or(p.peak_flops_per_s),
        ),
        (
            "weight_bytes_per_s",
            p.weight_bytes_per_s.unwrap_or(p.hbm_effective_bytes_per_s),
        ),
        (
            "copy_bytes_per_s",
            p.copy_bytes_per_s.unwrap_or(p.hbm_effective_bytes_per_s),
        ),
        ("combine", f64::NAN),
    ];
    for (key, v) in rows {
        if key == "combine" {
            entry(
                key,
                "Memory and compute time add (a fitted, linear model; see cost.rs).".into(),
                "\"sum\"".into(),
            );
        } else {
            entry(key, source(key), num(v));
        }
    }
    if let Some(v) = p.attention_half_tokens {
        let comment = match fit.half_tokens_origin {
            Origin::Fitted => format!(
                "{fitted} Tokens; searched with the attention rate (calibrate/fit.rs): 0 is one \
                 rate at every length."
            ),
            _ => format!(
                "Kept from the {base_name} profile: the grid's attention rate was not fitted, \
                 so its length curve was not either."
            ),
        };
        entry(HALF_TOKENS, comment, num(v));
    }
    // The device-to-device link is not measured by a one-device grid; a tp > 1 grid's fit
    // takes its all-reduces at these figures (calibrate/fit.rs).
    for (key, v) in [
        ("nvlink_bytes_per_s", p.nvlink_bytes_per_s),
        ("nvlink_latency_s", p.nvlink_latency_s),
        ("host_link_latency_s", p.host_link_latency_s),
    ] {
        if let Some(v) = v {
            entry(
                key,
                format!("Kept from the {base_name} profile (not part of the fit)."),
                num(v),
            );
        }
    }
    out
}

/// A float TOML reads back bit for bit (`{:e}` is the shortest round-trip form).
fn num(v: f64) -> String {
    format!("{v:e}")
}
