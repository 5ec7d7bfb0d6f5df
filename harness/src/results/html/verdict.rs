//! The one line a page opens with: does paging pay here? Paged ÷ contiguous throughput and
//! goodput, each mode's p99 TTFT, and the SLO with whether each mode met it — every figure read
//! from the folder's `summary.json`. Each figure sits in a `data-figure` span so a test can
//! recompute it from the folder's files and compare.

use super::super::plot::data::{RunFigures, RunFolder, Sweep, SweepSlo};
use super::super::plot::ticks::{fmt_short, fmt_sig, fmt_time_ms};
use super::esc;

/// Ratios within this share of 1 count as no difference.
const EVEN: f64 = 0.01;

fn fig(name: &str, text: &str) -> String {
    format!("<span data-figure=\"{name}\">{}</span>", esc(text))
}

/// Paged ÷ contiguous; infinite where only contiguous is 0 (e.g. no contiguous request met the
/// SLO), `None` where both are or a figure is missing.
fn ratio(paged: Option<f64>, contiguous: Option<f64>) -> Option<f64> {
    match (paged, contiguous) {
        (Some(p), Some(c)) if p.is_finite() && c.is_finite() && c > 0.0 => Some(p / c),
        (Some(p), Some(c)) if p.is_finite() && p > 0.0 && c == 0.0 => Some(f64::INFINITY),
        _ => None,
    }
}

fn ratio_text(r: Option<f64>) -> String {
    match r {
        Some(r) if r.is_infinite() => "∞ (contiguous 0)".into(),
        Some(r) => format!("{r:.2}×"),
        None => "n/a".into(),
    }
}

/// Share of a mode's requests that met every per-request target: goodput × duration over the
/// requests issued.
pub fn attainment(r: &RunFigures) -> Option<f64> {
    let (g, d) = (r.goodput_requests_per_s?, r.duration_s?);
    (r.requests.total > 0 && g.is_finite() && d.is_finite())
        .then(|| (g * d).round() / r.requests.total as f64)
}

/// The SLO in words, with units.
pub fn slo_text(slo: &SweepSlo) -> String {
    let mut parts = Vec::new();
    if let Some(t) = slo.ttft_p99_ms {
        parts.push(format!("TTFT ≤ {}", fmt_time_ms(t)));
    }
    if let Some(t) = slo.itl_p99_ms {
        parts.push(format!("time per output token ≤ {}", fmt_time_ms(t)));
    }
    let per_request = if parts.is_empty() {
        "every completed request".to_string()
    } else {
        format!("{} per request", parts.join(" and "))
    };
    match slo.attainment {
        Some(a) => format!(
            "{per_request}, for ≥ {}% of requests",
            fmt_short(100.0 * a, 3)
        ),
        None => per_request,
    }
}

/// "pays", "does not pay" or "makes no difference", and by which figure.
fn judge(goodput: Option<f64>, throughput: Option<f64>) -> (&'static str, &'static str) {
    let word = |r: f64| {
        if r > 1.0 + EVEN {
            "Paging pays here"
        } else if r < 1.0 - EVEN {
            "Paging does not pay here"
        } else {
            "Paging makes no difference here"
        }
    };
    match (goodput, throughput) {
        (Some(g), _) if (g - 1.0).abs() > EVEN => (word(g), "by goodput"),
        (_, Some(t)) => (word(t), "by throughput"),
        (Some(g), None) => (word(g), "by goodput"),
        (None, None) => ("No verdict", "no ratio could be formed"),
    }
}

/// The run page's verdict paragraph.
pub fn run(s: &RunFolder) -> String {
    let find = |c: &str| s.runs.iter().find(|r| r.cache == c);
    let (Some(p), Some(c)) = (find("paged"), find("contiguous")) else {
        return "<p id=\"verdict\" class=\"verdict\">No verdict: summary.json does not hold both cache modes.</p>\n".into();
    };
    let tput = ratio(p.throughput_tokens_per_s, c.throughput_tokens_per_s);
    let good = ratio(p.goodput_requests_per_s, c.goodput_requests_per_s);
    let (word, by) = judge(good, tput);
    let num = |v: Option<f64>| v.map_or("-".into(), |v| fmt_sig(v, 4));
    let p99 =
        |r: &RunFigures| fmt_time_ms(r.ttft_ms.as_ref().and_then(|t| t.p99).unwrap_or(f64::NAN));
    let mut out = String::from("<p id=\"verdict\" class=\"verdict\">");
    if !s.checks.ok {
        out.push_str("<b class=\"bad\">Checks FAILED</b> (see below): ");
    }
    out.push_str(&format!(
        "<b>{word}</b> ({by}). Paged ÷ contiguous: throughput <b>{}</b> ({} vs {} tokens/s), \
         goodput <b>{}</b> ({} vs {} requests/s); TTFT p99 {} paged, {} contiguous. ",
        fig("throughput_ratio", &ratio_text(tput)),
        fig("throughput_paged", &num(p.throughput_tokens_per_s)),
        fig("throughput_contiguous", &num(c.throughput_tokens_per_s)),
        fig("goodput_ratio", &ratio_text(good)),
        fig("goodput_paged", &num(p.goodput_requests_per_s)),
        fig("goodput_contiguous", &num(c.goodput_requests_per_s)),
        fig("ttft_p99_paged", &p99(p)),
        fig("ttft_p99_contiguous", &p99(c)),
    ));
    let slo = s.slo.as_ref().or(p.slo.as_ref());
    match slo {
        Some(slo) => {
            let target = slo.attainment;
            let met = |r: &RunFigures, name: &str| match attainment(r) {
                Some(a) => {
                    let share = fig(
                        &format!("attainment_{name}"),
                        &format!("{}%", fmt_sig(100.0 * a, 3)),
                    );
                    let verdict = match target {
                        Some(t) if a >= t => "met it",
                        Some(_) => "<b class=\"bad\">missed it</b>",
                        None => "reached",
                    };
                    format!("{name} {verdict} ({share} of requests)")
                }
                None => format!("{name}: no attainment"),
            };
            out.push_str(&format!(
                "SLO ({}): {}, {}.",
                esc(&slo_text(slo)),
                met(p, "paged"),
                met(c, "contiguous")
            ));
        }
        None => out.push_str(
            "SLO: not recorded in this folder's summary.json, so whether each mode met it is not stated here.",
        ),
    }
    out.push_str("</p>\n");
    out
}

/// The sweep page's verdict: throughput at target, paged ÷ contiguous with its interval, and
/// each mode's throughput and rate at target, from `sweep.json`.
pub fn sweep(s: &Sweep, slo: &str) -> String {
    let r = s.ratio_paged_over_contiguous.filter(|r| r.is_finite());
    let ci = s.ratio_paged_over_contiguous_ci;
    let (word, _) = match ci {
        Some([lo, hi]) if lo > 1.0 || hi < 1.0 => judge(None, r),
        Some(_) => ("Paging makes no difference here", ""),
        None => judge(None, r),
    };
    let ci_text = ci.map_or(" (no interval)".into(), |[lo, hi]| {
        format!(" (95% CI {:.2}–{:.2}×)", lo, hi)
    });
    let modes: Vec<String> = s
        .runs
        .iter()
        .map(|run| {
            let label = match run.block_size {
                Some(b) => format!("{} bs{b}", run.cache),
                None => run.cache.clone(),
            };
            format!(
                "{} {} tokens/s at {} requests/s",
                esc(&label),
                run.throughput_at_target_tokens_per_s
                    .map_or("-".into(), |v| fmt_sig(v, 4)),
                run.rate_at_target_rps.map_or("-".into(), |v| fmt_sig(v, 3)),
            )
        })
        .collect();
    format!(
        "<p id=\"verdict\" class=\"verdict\"><b>{word}</b> (by throughput at target). Paged ÷ \
         contiguous throughput at the highest load that meets the SLO: <b>{}</b>{}; {}. SLO: {}.</p>\n",
        fig("throughput_at_target_ratio", &ratio_text(r)),
        esc(&ci_text),
        modes.join(", "),
        esc(slo),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_follows_goodput_then_throughput() {
        assert_eq!(judge(Some(2.0), Some(0.5)).0, "Paging pays here");
        assert_eq!(judge(Some(1.0), Some(0.5)).0, "Paging does not pay here");
        assert_eq!(
            judge(None, Some(1.005)).0,
            "Paging makes no difference here"
        );
        assert_eq!(judge(None, None).0, "No verdict");
        assert_eq!(
            judge(ratio(Some(3.0), Some(0.0)), Some(1.0)).0,
            "Paging pays here"
        );
        assert_eq!(ratio(Some(0.0), Some(0.0)), None);
        assert_eq!(ratio_text(ratio(Some(3.0), Some(0.0))), "∞ (contiguous 0)");
    }

    #[test]
    fn slo_words_carry_units() {
        let slo = SweepSlo {
            ttft_p99_ms: Some(2000.0),
            itl_p99_ms: Some(200.0),
            attainment: Some(0.9),
        };
        assert_eq!(
            slo_text(&slo),
            "TTFT ≤ 2 s and time per output token ≤ 200 ms per request, for ≥ 90% of requests"
        );
    }
}
