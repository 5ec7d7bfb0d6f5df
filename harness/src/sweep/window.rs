//! The measurement window of a probe and what is measured in it.
//!
//! **Trim rule**: requests are ordered by intended arrival (id order); the first and the last
//! [`TRIM_SHARE`] of them are dropped: the first while the batch fills from empty (warm-up), the
//! last while arrivals stop and the batch drains (latencies fall as load leaves). The window is
//! the span from the first kept request's arrival to the last kept one's. Latency samples and SLO
//! attainment come from the kept requests (all their streams, whenever their tokens come);
//! throughput counts every output token stamped inside the span, achieved rate every request
//! completed inside it, offered rate every arrival inside it.
//!
//! **Over-saturation**: the TTFT of kept requests and the queue depth each of them found on
//! arrival are series over arrival time; a series is *growing* when its least-squares slope's 95%
//! interval lies above zero and its median over the last third of the window is more than twice
//! its median over the first third (plus one request, for the queue). Below capacity the queue
//! settles and an excursion (a run of long requests filling memory) comes and goes; above
//! capacity the backlog and the TTFT grow without bound. Medians of thirds keep one late
//! excursion from reading as growth; the slope test keeps noise from doing so (GuideLLM's check
//! has the same shape).

use crate::engine::{RunRecord, StreamRecord, StreamStatus};

use crate::stats;

/// Share of requests trimmed at each end.
pub const TRIM_SHARE: f64 = 0.10;

/// The window of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// Request ids in `first_id..end_id` are kept.
    pub first_id: u64,
    pub end_id: u64,
    pub start_ns: u64,
    pub end_ns: u64,
}

impl Window {
    pub fn span_s(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 / 1e9
    }
}

/// Rates measured inside a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub offered_rps: f64,
    pub achieved_rps: f64,
    pub throughput_tokens_per_s: f64,
}

/// Arrival time of each request (its first stream's), indexed by request id.
fn arrivals_ns(r: &RunRecord) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = r
        .streams
        .iter()
        .filter(|s| s.rank == 0)
        .map(|s| (s.request, s.intended_arrival_ns))
        .collect();
    v.sort_unstable();
    v
}

/// The window of `r` by the trim rule; `None` when fewer than three requests would remain or the
/// kept arrivals span no time.
pub fn window(r: &RunRecord) -> Option<Window> {
    let arr = arrivals_ns(r);
    let n = arr.len();
    let cut = (n as f64 * TRIM_SHARE).floor() as usize;
    let (lo, hi) = (cut, n - cut);
    if hi <= lo + 2 {
        return None;
    }
    let (start_ns, end_ns) = (arr[lo].1, arr[hi - 1].1);
    (end_ns > start_ns).then_some(Window {
        first_id: arr[lo].0,
        end_id: arr[hi - 1].0 + 1,
        start_ns,
        end_ns,
    })
}

pub fn in_window(w: &Window, s: &StreamRecord) -> bool {
    (w.first_id..w.end_id).contains(&s.request)
}

pub fn rates(r: &RunRecord, w: &Window) -> Rates {
    let inside = |t: u64| (w.start_ns..=w.end_ns).contains(&t);
    let mut tokens = 0u64;
    let (mut arrived, mut completed) = (0u64, 0u64);
    for s in &r.streams {
        tokens += s.token_ns.iter().filter(|&&t| inside(t)).count() as u64;
        if s.rank == 0 {
            arrived += u64::from(inside(s.intended_arrival_ns));
            completed += u64::from(s.status == StreamStatus::Completed && inside(s.finish_ns));
        }
    }
    let span = w.span_s();
    Rates {
        // n arrivals at both ends of the span are n − 1 gaps.
        offered_rps: arrived.saturating_sub(1) as f64 / span,
        achieved_rps: completed as f64 / span,
        throughput_tokens_per_s: tokens as f64 / span,
    }
}

/// `r` with only the window's streams (and no events or steps): what metrics are computed over.
pub fn trimmed(r: RunRecord, w: &Window) -> RunRecord {
    let mut r = r;
    r.streams.retain(|s| in_window(w, s));
    r.events = Vec::new();
    r.steps = Vec::new();
    r
}

/// Whether TTFT or the queue found on arrival grows through the window (rule in the module doc).
pub fn oversaturated(r: &RunRecord, w: &Window) -> bool {
    let firsts: Vec<&StreamRecord> = r.streams.iter().filter(|s| s.rank == 0).collect();
    // When each request left the queue: admitted, or gone (cancelled, rejected) unadmitted.
    let mut left: Vec<u64> = firsts
        .iter()
        .map(|s| s.admitted_ns.unwrap_or(s.finish_ns))
        .collect();
    left.sort_unstable();
    let mut arrivals: Vec<u64> = firsts.iter().map(|s| s.intended_arrival_ns).collect();
    arrivals.sort_unstable();
    let (mut xs, mut queue) = (Vec::new(), Vec::new());
    let (mut ttft_xs, mut ttft_ms) = (Vec::new(), Vec::new());
    for s in firsts.iter().filter(|s| in_window(w, s)) {
        let t = s.intended_arrival_ns;
        // Signed: the window is a range of request ids, and a later turn of a session (its id
        // allocated with the session) may arrive before the window's first arrival.
        let x = (t as f64 - w.start_ns as f64) / 1e9;
        let arrived = arrivals.partition_point(|&a| a <= t);
        let gone = left.partition_point(|&l| l <= t);
        xs.push(x);
        queue.push(arrived.saturating_sub(gone) as f64);
        if let Some(f) = s.first_token_ns() {
            ttft_xs.push(x);
            ttft_ms.push(f.saturating_sub(t) as f64 / 1e6);
        }
    }
    growing(&ttft_xs, &ttft_ms, 0.0) || growing(&xs, &queue, 1.0)
}

fn growing(xs: &[f64], ys: &[f64], min_rise: f64) -> bool {
    let Some((_, lo, _)) = stats::slope_interval(xs, ys, stats::CONFIDENCE) else {
        return false;
    };
    let third = ys.len() / 3;
    if third == 0 {
        return false;
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (head, tail) = (median(&ys[..third]), median(&ys[ys.len() - third..]));
    lo > 0.0 && tail > 2.0 * head + min_rise
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_needs_significance_and_size() {
        let xs: Vec<f64> = (0..99).map(f64::from).collect();
        // A backlog growing one request per second from 1: flagged.
        let grow: Vec<f64> = xs.iter().map(|x| 1.0 + x).collect();
        assert!(growing(&xs, &grow, 1.0));
        // Stationary noise around 5: not flagged.
        let flat: Vec<f64> = xs.iter().map(|x| 5.0 + ((x * 7.0) % 3.0) - 1.0).collect();
        assert!(!growing(&xs, &flat, 1.0));
        // Significant but small drift (level 100, grows by 10 over the window): not flagged.
        let drift: Vec<f64> = xs.iter().map(|x| 100.0 + 0.1 * x).collect();
        assert!(!growing(&xs, &drift, 1.0));
        // One late excursion on a flat series: not flagged.
        let burst: Vec<f64> = xs
            .iter()
            .map(|&x| if x > 85.0 { 300.0 } else { 30.0 })
            .collect();
        assert!(!growing(&xs, &burst, 0.0));
    }
}
