//! `/metrics`: the server's counters in Prometheus' text exposition (0.0.4), under vLLM's names
//! where one exists, each sample labelled `model_name`.
//!
//! The figures come from the facts the results folder is written from: the gauges and the
//! prefix-cache counters from the engine's state after each turn ([`crate::engine::LiveStats`]:
//! the cache manager's own counters, so `prefix_cache_queries_total` / `prefix_cache_hits_total`
//! are `summary.json`'s `prefix_cache.lookup_tokens` / `hit_tokens`, in tokens, every admission
//! counted as vLLM v1 counts them), the histograms and totals from each stream's record when its
//! request resolves (TTFT from arrival to first token, inter-token gaps between consecutive
//! tokens, as the summary measures them).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::engine::{LiveStats, StreamRecord};

/// vLLM's bucket bounds for time to first token, seconds.
pub const TTFT_BUCKETS_S: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's bucket bounds for inter-token latency, seconds.
pub const ITL_BUCKETS_S: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    /// Per bound: observations at or below it (not cumulative; summed when written).
    counts: Vec<u64>,
    sum_s: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum_s: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, s: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| s <= b) {
            self.counts[i] += 1;
        }
        self.sum_s += s;
        self.count += 1;
    }

    fn write(&self, out: &mut String, name: &str, help: &str, label: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cumulative += c;
            let _ = writeln!(out, "{name}_bucket{{{label},le=\"{b}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{label},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{label}}} {}", self.sum_s);
        let _ = writeln!(out, "{name}_count{{{label}}} {}", self.count);
    }
}

/// The server's counters, shared by the engine thread (which writes) and the HTTP side.
#[derive(Debug)]
pub struct Metrics {
    model: String,
    running: AtomicU64,
    waiting: AtomicU64,
    /// `f64` bits of the KV cache's used share, 0..1.
    kv_usage: AtomicU64,
    prefix_queries: AtomicU64,
    prefix_hits: AtomicU64,
    success: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    /// Requests answered with an error status before reaching the engine.
    refused: AtomicU64,
    histograms: Mutex<(Histogram, Histogram)>,
}

impl Metrics {
    pub fn new(model: &str) -> Metrics {
        Metrics {
            model: model.to_string(),
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            kv_usage: AtomicU64::new(0f64.to_bits()),
            prefix_queries: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            success: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            histograms: Mutex::new((
                Histogram::new(&TTFT_BUCKETS_S),
                Histogram::new(&ITL_BUCKETS_S),
            )),
        }
    }

    /// The engine's state after a turn.
    pub fn observe(&self, s: &LiveStats) {
        self.running.store(s.running, Ordering::Relaxed);
        self.waiting.store(s.waiting, Ordering::Relaxed);
        let usage = if s.total_slots > 0 {
            s.used_slots as f64 / s.total_slots as f64
        } else {
            0.0
        };
        self.kv_usage.store(usage.to_bits(), Ordering::Relaxed);
        self.prefix_queries
            .store(s.prefix.lookup_tokens, Ordering::Relaxed);
        self.prefix_hits
            .store(s.prefix.hit_tokens, Ordering::Relaxed);
    }

    /// A stream's final record (its request resolved); `request_ok` on a request's last
    /// stream: whether every stream of it completed.
    pub fn stream_done(&self, r: &StreamRecord, request_ok: Option<bool>) {
        if r.rank == 0 {
            self.prompt_tokens
                .fetch_add(u64::from(r.prompt_tokens), Ordering::Relaxed);
        }
        self.generation_tokens
            .fetch_add(r.token_ns.len() as u64, Ordering::Relaxed);
        if request_ok == Some(true) {
            self.success.fetch_add(1, Ordering::Relaxed);
        }
        let mut h = self.histograms.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(first) = r.first_token_ns() {
            h.0.observe(first.saturating_sub(r.arrival_ns) as f64 / 1e9);
        }
        for w in r.token_ns.windows(2) {
            h.1.observe(w[1].saturating_sub(w[0]) as f64 / 1e9);
        }
    }

    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub fn refused_total(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Streams running now (the engine's last turn).
    pub fn running(&self) -> u64 {
        self.running.load(Ordering::Relaxed)
    }

    /// The exposition text.
    pub fn text(&self) -> String {
        let label = format!(
            "model_name=\"{}\"",
            self.model.replace(['"', '\\', '\n'], "_")
        );
        let mut out = String::new();
        let mut one = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{label}}} {value}"
            );
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        one(
            "vllm:num_requests_running",
            "gauge",
            "Sequences holding KV cache (running or prefilling).",
            get(&self.running),
        );
        one(
            "vllm:num_requests_waiting",
            "gauge",
            "Sequences waiting to start.",
            get(&self.waiting),
        );
        one(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage: slots held by live sequences over the pool (1 = full).",
            f64::from_bits(self.kv_usage.load(Ordering::Relaxed)).to_string(),
        );
        one(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            get(&self.prefix_queries),
        );
        one(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prompt tokens the prefix cache supplied.",
            get(&self.prefix_hits),
        );
        one(
            "vllm:request_success_total",
            "counter",
            "Requests whose every choice completed.",
            get(&self.success),
        );
        one(
            "vllm:prompt_tokens_total",
            "counter",
            "Prompt tokens of resolved requests.",
            get(&self.prompt_tokens),
        );
        one(
            "vllm:generation_tokens_total",
            "counter",
            "Tokens generated for resolved requests.",
            get(&self.generation_tokens),
        );
        one(
            "kvbench:requests_refused_total",
            "counter",
            "Requests answered with an error before reaching the engine.",
            get(&self.refused),
        );
        let h = self.histograms.lock().unwrap_or_else(|e| e.into_inner());
        h.0.write(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Time to first token, seconds.",
            &label,
        );
        h.1.write(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Inter-token latency, seconds.",
            &label,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_carries_every_family_with_cumulative_buckets() {
        let m = Metrics::new("tiny");
        m.observe(&LiveStats {
            running: 2,
            waiting: 1,
            used_slots: 1,
            total_slots: 4,
            prefix: kvbench_cache_api::PrefixStats {
                lookup_tokens: 100,
                hit_tokens: 25,
                ..Default::default()
            },
        });
        let mut r = crate::engine::StreamRecord {
            request: 0,
            rank: 0,
            tenant: 0,
            intended_arrival_ns: 0,
            arrival_ns: 0,
            admitted_ns: Some(0),
            finish_ns: 0,
            prompt_tokens: 7,
            cached_prompt_tokens: 0,
            status: crate::engine::StreamStatus::Completed,
            preemptions: 0,
            recomputed_tokens: 0,
            swapped_bytes: 0,
            admission_tier_hits: Default::default(),
            onload_bytes: 0,
            onload_wait_ns: 0,
            ttft_onload_ns: 0,
            token_ns: vec![3_000_000, 23_000_000],
            token_ids: vec![1, 2],
        };
        m.stream_done(&r, Some(true));
        r.token_ns = vec![2_000_000_000];
        m.stream_done(&r, Some(false));
        let t = m.text();
        for line in [
            "vllm:num_requests_running{model_name=\"tiny\"} 2",
            "vllm:kv_cache_usage_perc{model_name=\"tiny\"} 0.25",
            "vllm:prefix_cache_queries_total{model_name=\"tiny\"} 100",
            "vllm:prefix_cache_hits_total{model_name=\"tiny\"} 25",
            "vllm:request_success_total{model_name=\"tiny\"} 1",
            "vllm:generation_tokens_total{model_name=\"tiny\"} 3",
            "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.005\"} 1",
            "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"2.5\"} 2",
            "vllm:time_to_first_token_seconds_count{model_name=\"tiny\"} 2",
            "vllm:inter_token_latency_seconds_bucket{model_name=\"tiny\",le=\"0.01\"} 0",
            "vllm:inter_token_latency_seconds_bucket{model_name=\"tiny\",le=\"0.025\"} 1",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
    }
}
