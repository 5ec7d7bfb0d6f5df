//! `compare.md` and `compare.csv`: one row per metric both sides have.

use std::fmt::Write as _;

use super::{Comparison, Direction};

pub const CSV_HEADER: &str = "scenario,cache,metric,better,a,a_ci_low,a_ci_high,a_n,b,b_ci_low,b_ci_high,b_n,abs_change,rel_change_pct,rel_change_ci_low_pct,rel_change_ci_high_pct,significant,direction";

fn num(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite())
        .map_or_else(String::new, |x| format!("{x}"))
}

fn pct(v: Option<f64>) -> String {
    num(v.map(|x| x * 100.0))
}

fn direction(d: Direction) -> &'static str {
    match d {
        Direction::Better => "better",
        Direction::Worse => "worse",
        Direction::Unchanged => "unchanged",
    }
}

/// Full-precision figures (the markdown rounds them).
pub fn csv(c: &Comparison) -> String {
    let mut s = format!("{CSV_HEADER}\n");
    for ch in &c.changes {
        let (a, b) = (&ch.a, &ch.b);
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            a.scenario,
            a.cache,
            a.name,
            match a.better {
                super::Better::Higher => "higher",
                super::Better::Lower => "lower",
            },
            num(a.value),
            num(Some(a.lo)),
            num(Some(a.hi)),
            a.n,
            num(b.value),
            num(Some(b.lo)),
            num(Some(b.hi)),
            b.n,
            num(ch.abs),
            pct(ch.rel),
            pct(ch.rel_ci.map(|r| r[0])),
            pct(ch.rel_ci.map(|r| r[1])),
            significance(ch),
            direction(ch.direction),
        );
    }
    for (side, m) in &c.unmatched {
        let (a, b) = if *side == 'A' {
            (num(m.value), String::new())
        } else {
            (String::new(), num(m.value))
        };
        let _ = writeln!(
            s,
            "{},{},{},{},{a},,,,{b},,,,,,,,refused: in {side} only,",
            m.scenario,
            m.cache,
            m.name,
            match m.better {
                super::Better::Higher => "higher",
                super::Better::Lower => "lower",
            },
        );
    }
    s
}

/// `true`/`false`, or `no interval` where the change is between two points (two single runs).
fn significance(ch: &super::Change) -> String {
    if ch.rel_ci.is_some() && !ch.interval {
        "no interval".into()
    } else {
        ch.significant.to_string()
    }
}

fn fig(v: Option<f64>) -> String {
    match v {
        Some(x) if x.abs() >= 100.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.3}"),
        None => "-".into(),
    }
}

pub fn markdown(c: &Comparison) -> String {
    let mut md = format!(
        "# kvbench compare\n\nA: `{}` ({} on {}); B: `{}` ({} on {}). Change = B − A; intervals are 95% (module doc of `compare`: interval arithmetic on each side's own interval; a single run's is its point).\n\n",
        c.a.path.display(),
        c.a.kind.name(),
        c.a.backend,
        c.b.path.display(),
        c.b.kind.name(),
        c.b.backend
    );
    if !c.refusals.is_empty() {
        md.push_str("**The gate refuses this comparison** (exit 2): it compares only what both sides hold, from one consistent source.\n\n");
    }
    for m in &c.refusals {
        let _ = writeln!(md, "- **cannot compare**: {m}");
    }
    if !c.refusals.is_empty() {
        md.push('\n');
    }
    md.push_str("| scenario | cache | metric | A [95%] | B [95%] | change | relative [95%] | significant |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for ch in &c.changes {
        let (a, b) = (&ch.a, &ch.b);
        let side = |m: &super::Metric| {
            if m.lo == m.hi || m.value.is_none() {
                fig(m.value)
            } else {
                format!(
                    "{} [{}, {}]",
                    fig(m.value),
                    fig(Some(m.lo)),
                    fig(Some(m.hi))
                )
            }
        };
        let rel = match (ch.rel, ch.rel_ci) {
            (Some(r), Some([lo, hi])) => {
                format!(
                    "{:+.2}% [{:+.2}%, {:+.2}%]",
                    r * 100.0,
                    lo * 100.0,
                    hi * 100.0
                )
            }
            (Some(r), None) => format!("{:+.2}%", r * 100.0),
            _ => "-".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            a.scenario,
            a.cache,
            a.name,
            side(a),
            side(b),
            ch.abs.map_or_else(|| "-".into(), |x| format!("{x:+.3}")),
            rel,
            if ch.rel_ci.is_some() && !ch.interval {
                "no interval (points only)".into()
            } else if ch.significant {
                format!("yes ({})", direction(ch.direction))
            } else {
                "no".into()
            }
        );
    }
    for (side, m) in &c.unmatched {
        let (a, b) = if *side == 'A' {
            (fig(m.value), "-".to_string())
        } else {
            ("-".to_string(), fig(m.value))
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {a} | {b} | - | - | refused: in {side} only |",
            m.scenario, m.cache, m.name
        );
    }
    md
}
