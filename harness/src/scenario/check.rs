//! Feasibility checks: everything that would make a scenario fail (or silently mean nothing)
//! once running is refused at load time, each problem naming its key.

use std::path::{Path, PathBuf};

use super::error::{Diagnostic, KeyProblem, Origin, ScenarioError};
use super::ranges::{self, range_message, within, MAX_DELAY_MS, MAX_HORIZON_S};
use super::trace_spec::SessionsSpec;
use super::types::*;
use crate::model::ModelShape;
use crate::units::{parse_bytes, KvBudget};

impl Scenario {
    /// All problems found; empty when the scenario can run.
    pub fn check(&self) -> Vec<KeyProblem> {
        let mut p = Vec::new();
        if !ranges::safe_slug(&self.name) {
            p.push(KeyProblem::new(
                "name",
                format!(
                    "{:?} is not a safe folder name: use letters, digits, `-`, `_` and `.` \
                     (not `.` or `..`)",
                    self.name
                ),
            ));
        }
        // A device name picks `devices/<name>.toml`: a name, never a path.
        if !ranges::safe_slug(&self.device) {
            p.push(KeyProblem::new(
                "device",
                format!(
                    "{:?} is not a device profile name: use letters, digits, `-`, `_` and `.`",
                    self.device
                ),
            ));
        }
        let shape = self.check_model(&mut p);
        if let Err(e) = KvBudget::parse(&self.memory.kv_budget) {
            p.push(KeyProblem::new("memory.kv_budget", e.to_string()));
        }
        if let Some(w) = &self.memory.workspace {
            if let Err(e) = parse_bytes(w) {
                p.push(KeyProblem::new("memory.workspace", e.to_string()));
            }
        }
        self.check_cache(&mut p);
        self.check_tiers(shape.as_ref(), &mut p);
        self.check_manager(&mut p);
        self.check_traffic(&mut p);
        self.check_scheduler(&mut p);
        // The budget check needs a sound shape and sound distributions; skip it otherwise so
        // the user sees the root cause, not its echo.
        if p.is_empty() {
            if let Some(shape) = shape {
                self.check_budget(&shape, &mut p);
                if p.is_empty() {
                    self.check_host_memory(&shape, &mut p);
                }
            }
        }
        p
    }

    /// [`Scenario::check`] as a `Result`, for scenarios built in memory (no file positions).
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let problems = self.check();
        if problems.is_empty() {
            return Ok(());
        }
        Err(ScenarioError::Invalid(
            problems
                .into_iter()
                .map(|k| Diagnostic {
                    origin: Origin::Memory,
                    key: k.key,
                    message: k.message,
                })
                .collect(),
        ))
    }

    /// A path written in the scenario, resolved against the scenario file's folder.
    pub fn resolve_path(&self, written: &str) -> PathBuf {
        let p = PathBuf::from(written);
        if p.is_absolute() {
            return p;
        }
        match self.source.as_deref().and_then(|s| s.parent()) {
            Some(dir) => dir.join(p),
            None => p,
        }
    }

    fn check_model(&self, p: &mut Vec<KeyProblem>) -> Option<ModelShape> {
        if let Some(preset) = &self.model.preset {
            if ModelShape::preset(preset).is_none() {
                p.push(KeyProblem::new(
                    "model.preset",
                    format!(
                        "unknown preset `{preset}` (known: {})",
                        ModelShape::PRESETS.join(", ")
                    ),
                ));
                return None;
            }
        }
        let Some(shape) = self.model_shape() else {
            let m = &self.model;
            let missing: Vec<&str> = [
                ("name", m.name.is_none()),
                ("layers", m.layers.is_none()),
                ("q_heads", m.q_heads.is_none()),
                ("kv_heads", m.kv_heads.is_none()),
                ("head_dim", m.head_dim.is_none()),
                ("d_model", m.d_model.is_none()),
                ("ffn_dim", m.ffn_dim.is_none()),
                ("vocab", m.vocab.is_none()),
            ]
            .into_iter()
            .filter_map(|(k, miss)| miss.then_some(k))
            .collect();
            p.push(KeyProblem::new(
                "model",
                format!(
                    "give a `preset` ({}) or every field; missing: {}",
                    ModelShape::PRESETS.join(", "),
                    missing.join(", ")
                ),
            ));
            return None;
        };
        let before = p.len();
        for (key, v) in [
            ("layers", shape.layers),
            ("q_heads", shape.q_heads),
            ("kv_heads", shape.kv_heads),
            ("head_dim", shape.head_dim),
            ("d_model", shape.d_model),
            ("ffn_dim", shape.ffn_dim),
            ("vocab", shape.vocab),
            ("tp", shape.tp),
        ] {
            let most = ranges::MODEL_MAX
                .iter()
                .find(|(k, _)| *k == key)
                .map_or(u32::MAX, |(_, m)| *m);
            if v == 0 || v > most {
                p.push(KeyProblem::new(
                    format!("model.{key}"),
                    format!("must be in 1..={most} (got {v})"),
                ));
            }
        }
        if let Some(moe) = shape.moe {
            check_moe(&moe, p);
        }
        super::check_groups::check(&self.model, &shape, p);
        if let (Some(g), false) = (self.model.kv_scale, shape.kv_dtype.is_fp8()) {
            p.push(KeyProblem::new(
                "model.kv_scale",
                format!(
                    "{} scales belong to an FP8 cache (kv_dtype = \"fp8_e4m3\" or \"fp8_e5m2\"), not {}",
                    g.name(),
                    shape.kv_dtype.name()
                ),
            ));
        }
        if p.len() > before {
            return None;
        }
        if shape.q_heads % shape.kv_heads != 0 {
            p.push(KeyProblem::new(
                "model.kv_heads",
                format!(
                    "{} query heads cannot be grouped over {} KV heads",
                    shape.q_heads, shape.kv_heads
                ),
            ));
        }
        if shape.checked_kv_bytes_per_token().is_none() {
            p.push(KeyProblem::new(
                "model.layers",
                "KV bytes per token (2 x layers x kv_heads/tp x head_dim x dtype) overflow 64 bits",
            ));
        }
        if shape.checked_weight_bytes_per_device().is_none() {
            p.push(KeyProblem::new(
                "model.d_model",
                "the weight bytes of this shape overflow 64 bits",
            ));
        }
        if shape.kv_heads % shape.tp != 0 {
            p.push(KeyProblem::new(
                "model.tp",
                format!(
                    "tensor-parallel degree {} does not divide {} KV heads",
                    shape.tp, shape.kv_heads
                ),
            ));
        }
        Some(shape)
    }

    fn check_cache(&self, p: &mut Vec<KeyProblem>) {
        let sizes = self.cache.block_size.as_slice();
        if sizes.is_empty() {
            p.push(KeyProblem::new("cache.block_size", "the list is empty"));
        }
        for &b in sizes {
            if b == 0 || !b.is_power_of_two() {
                p.push(KeyProblem::new(
                    "cache.block_size",
                    format!("{b} is not a power of two (1, 2, 4, ..., 16, 32, ...)"),
                ));
            } else if b > ranges::MAX_BLOCK_SIZE {
                p.push(KeyProblem::new(
                    "cache.block_size",
                    format!(
                        "{b} tokens per block; the most is {}",
                        ranges::MAX_BLOCK_SIZE
                    ),
                ));
            }
        }
        if let Some(k) = self.cache.checkpoint_every_blocks {
            if k > ranges::MAX_SEQ_LEN {
                p.push(KeyProblem::new(
                    "cache.checkpoint_every_blocks",
                    format!("{k} blocks; the most is {}", ranges::MAX_SEQ_LEN),
                ));
            }
        }
        let msl = self.cache.max_seq_len;
        if !(2..=ranges::MAX_SEQ_LEN).contains(&msl) {
            p.push(KeyProblem::new(
                "cache.max_seq_len",
                format!(
                    "must be in 2..={} (one prompt token and one output token at least; got {msl})",
                    ranges::MAX_SEQ_LEN
                ),
            ));
        }
    }

    fn check_traffic(&self, p: &mut Vec<KeyProblem>) {
        let t = &self.traffic;
        let msl = self.cache.max_seq_len;
        let open_loop = matches!(
            t.arrival,
            ArrivalSpec::Poisson { .. }
                | ArrivalSpec::Gamma { .. }
                | ArrivalSpec::Constant { .. }
                | ArrivalSpec::Trace(_)
        );
        let trace = matches!(t.arrival, ArrivalSpec::Trace(_));
        match (t.requests, t.duration_s) {
            // A trace runs to its end unless a window is given.
            (None, None) if trace => {}
            (None, None) => p.push(KeyProblem::new(
                "traffic.requests",
                "give `requests` or `duration_s`",
            )),
            (Some(0), _) => p.push(KeyProblem::new("traffic.requests", "must be at least 1")),
            _ => {}
        }
        if let Some(d) = t.duration_s {
            if !(d.is_finite() && d > 0.0 && d <= MAX_HORIZON_S) {
                p.push(KeyProblem::new(
                    "traffic.duration_s",
                    format!("must be in (0, {MAX_HORIZON_S:e}] seconds (got {d:e})"),
                ));
            } else if !open_loop {
                p.push(KeyProblem::new(
                    "traffic.duration_s",
                    "only open-loop arrivals (poisson, gamma, constant) run for a duration; give `requests`",
                ));
            }
        }
        check_arrival(&t.arrival, p);
        check_horizon(t, p);
        for (d, key) in [
            (&t.prompt_tokens, "traffic.prompt_tokens"),
            (&t.output_tokens, "traffic.output_tokens"),
        ] {
            match d {
                Some(d) => check_length(self, d, key, msl, p),
                None if !trace => p.push(KeyProblem::new(
                    key,
                    "required (only a trace gives its own lengths)",
                )),
                None => {}
            }
        }
        if let Some(ss) = &t.sessions {
            self.check_sessions(ss, p);
        }
        if let ArrivalSpec::Trace(tr) = &t.arrival {
            // Its rows are checked when it is read (errors name the trace's own line and column).
            let path = self.resolve_path(&tr.path);
            if !tr.path.trim().is_empty() {
                if let Err(message) = check_trace_file(&path) {
                    p.push(KeyProblem::new("traffic.arrival.path", message));
                }
            }
        }
        if let Some(sp) = &t.shared_prefix {
            check_share(sp.share, "traffic.shared_prefix.share", p);
            if sp.groups == 0 {
                p.push(KeyProblem::new(
                    "traffic.shared_prefix.groups",
                    "must be at least 1",
                ));
            }
            if sp.prefix_tokens == 0 || sp.prefix_tokens >= msl {
                p.push(KeyProblem::new(
                    "traffic.shared_prefix.prefix_tokens",
                    format!("must be in 1..{msl} (below cache.max_seq_len)"),
                ));
            }
        }
        if let Some(ps) = &t.parallel_sampling {
            check_share(ps.share, "traffic.parallel_sampling.share", p);
            if ps.n == 0 || ps.n > ranges::MAX_SAMPLES {
                p.push(KeyProblem::new(
                    "traffic.parallel_sampling.n",
                    format!("must be in 1..={} (got {})", ranges::MAX_SAMPLES, ps.n),
                ));
            } else if let Some(n) = t.requests {
                // Streams are numbered in 32 bits; keep half of that range as margin.
                let streams = n as u64 * ps.n as u64;
                if ps.share > 0.0 && streams > ranges::MAX_STREAMS {
                    p.push(KeyProblem::new(
                        "traffic.parallel_sampling.n",
                        format!(
                            "{n} requests x {} continuations = {streams} streams; the most is {}",
                            ps.n,
                            ranges::MAX_STREAMS
                        ),
                    ));
                }
            }
        }
        if let Some(c) = &t.cancellation {
            check_share(c.share, "traffic.cancellation.share", p);
            let needs_delay = matches!(
                c.when,
                CancelWhen::Queued | CancelWhen::AfterDelay | CancelWhen::Mixed
            );
            let needs_tokens = matches!(c.when, CancelWhen::AfterTokens | CancelWhen::Mixed);
            match (&c.delay, needs_delay) {
                (None, true) => p.push(KeyProblem::new(
                    "traffic.cancellation.delay",
                    "required for when = queued, after_delay or mixed",
                )),
                (Some(d), _) => check_delay(d, "traffic.cancellation.delay", p),
                _ => {}
            }
            match (&c.after_tokens, needs_tokens) {
                (None, true) => p.push(KeyProblem::new(
                    "traffic.cancellation.after_tokens",
                    "required for when = after_tokens or mixed",
                )),
                (Some(d), _) => check_length(self, d, "traffic.cancellation.after_tokens", msl, p),
                _ => {}
            }
        }
        if let Some(tn) = &t.tenants {
            if tn.count == 0 {
                p.push(KeyProblem::new(
                    "traffic.tenants.count",
                    "must be at least 1",
                ));
            }
            if let Some(shares) = &tn.shares {
                if shares.len() != tn.count as usize {
                    p.push(KeyProblem::new(
                        "traffic.tenants.shares",
                        format!("{} shares for {} tenants", shares.len(), tn.count),
                    ));
                } else if shares.iter().any(|s| !(s.is_finite() && *s >= 0.0)) {
                    p.push(KeyProblem::new(
                        "traffic.tenants.shares",
                        "every share must be a finite number >= 0",
                    ));
                } else {
                    let sum: f64 = shares.iter().sum();
                    if (sum - 1.0).abs() > 1e-6 {
                        p.push(KeyProblem::new(
                            "traffic.tenants.shares",
                            format!("shares sum to {sum}, not 1"),
                        ));
                    }
                }
            }
        }
    }

    fn check_scheduler(&self, p: &mut Vec<KeyProblem>) {
        let s = &self.scheduler;
        if s.max_tokens_per_step == 0 {
            p.push(KeyProblem::new(
                "scheduler.max_tokens_per_step",
                "must be at least 1",
            ));
        }
        if s.max_seqs_per_step == 0 {
            p.push(KeyProblem::new(
                "scheduler.max_seqs_per_step",
                "must be at least 1",
            ));
        }
        if !(s.watermark.is_finite() && (0.0..1.0).contains(&s.watermark)) {
            p.push(KeyProblem::new("scheduler.watermark", "must be in [0, 1)"));
        }
        if let Some(bw) = s.swap_gbytes_per_s {
            if !within(bw, ranges::SWAP_GBYTES_PER_S) {
                p.push(KeyProblem::new(
                    "scheduler.swap_gbytes_per_s",
                    range_message(ranges::SWAP_GBYTES_PER_S, bw),
                ));
            }
        }
        for (key, v) in [
            ("slo.ttft_p99_ms", self.slo.ttft_p99_ms),
            ("slo.itl_p99_ms", self.slo.itl_p99_ms),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0 && v <= MAX_DELAY_MS) {
                    p.push(KeyProblem::new(
                        key,
                        format!("must be in (0, {MAX_DELAY_MS:e}] ms (got {v:e})"),
                    ));
                }
            }
        }
        let a = self.slo.attainment;
        if !(a.is_finite() && a > 0.0 && a <= 1.0) {
            p.push(KeyProblem::new("slo.attainment", "must be in (0, 1]"));
        }
    }
}

impl Scenario {
    fn check_sessions(&self, ss: &SessionsSpec, p: &mut Vec<KeyProblem>) {
        let key = "traffic.sessions";
        let msl = self.cache.max_seq_len;
        match self.traffic.arrival {
            ArrivalSpec::ClosedLoop { .. } | ArrivalSpec::Trace(_) => p.push(KeyProblem::new(
                key,
                "sessions start by an open-loop or burst arrival process, not closed_loop or a trace",
            )),
            _ => {}
        }
        check_length(self, &ss.turns, &format!("{key}.turns"), msl, p);
        check_length(self, &ss.new_tokens, &format!("{key}.new_tokens"), msl, p);
        check_delay(&ss.think, &format!("{key}.think"), p);
    }
}

fn check_share(share: f64, key: &str, p: &mut Vec<KeyProblem>) {
    if !(share.is_finite() && (0.0..=1.0).contains(&share)) {
        p.push(KeyProblem::new(key, format!("{share} is outside [0, 1]")));
    }
}

fn check_arrival(a: &ArrivalSpec, p: &mut Vec<KeyProblem>) {
    let key = "traffic.arrival";
    let rate = |rate_per_s: f64, p: &mut Vec<KeyProblem>| {
        if !within(rate_per_s, ranges::RATE_PER_S) {
            p.push(KeyProblem::new(
                format!("{key}.rate_per_s"),
                format!(
                    "{} requests per second",
                    range_message(ranges::RATE_PER_S, rate_per_s)
                ),
            ));
        }
    };
    match a {
        ArrivalSpec::Poisson { rate_per_s } | ArrivalSpec::Constant { rate_per_s } => {
            rate(*rate_per_s, p)
        }
        ArrivalSpec::Gamma { rate_per_s, shape } => {
            rate(*rate_per_s, p);
            if !within(*shape, ranges::GAMMA_SHAPE) {
                p.push(KeyProblem::new(
                    format!("{key}.shape"),
                    format!(
                        "{} (1 = Poisson, < 1 burstier)",
                        range_message(ranges::GAMMA_SHAPE, *shape)
                    ),
                ));
            }
        }
        ArrivalSpec::Burst => {}
        ArrivalSpec::ClosedLoop { clients, think_ms } => {
            if *clients == 0 {
                p.push(KeyProblem::new(
                    format!("{key}.clients"),
                    "must be at least 1",
                ));
            }
            if !within(*think_ms, (0.0, MAX_DELAY_MS)) {
                p.push(KeyProblem::new(
                    format!("{key}.think_ms"),
                    format!("must be in [0, {MAX_DELAY_MS:e}] ms (got {think_ms:e})"),
                ));
            }
        }
        ArrivalSpec::Trace(tr) => {
            if tr.path.trim().is_empty() {
                p.push(KeyProblem::new(format!("{key}.path"), "must not be empty"));
            }
            for (field, v) in [("time_scale", tr.time_scale), ("rate_scale", tr.rate_scale)] {
                if !within(v, ranges::TIME_SCALE) {
                    p.push(KeyProblem::new(
                        format!("{key}.{field}"),
                        range_message(ranges::TIME_SCALE, v),
                    ));
                }
            }
            if !within(tr.start_s, (0.0, MAX_HORIZON_S)) {
                p.push(KeyProblem::new(
                    format!("{key}.start_s"),
                    range_message((0.0, MAX_HORIZON_S), tr.start_s),
                ));
            }
            if tr.hash_block_tokens == Some(0) {
                p.push(KeyProblem::new(
                    format!("{key}.hash_block_tokens"),
                    "must be at least 1",
                ));
            }
        }
    }
}

/// The span of virtual time the arrivals need, from their means: refused past
/// [`MAX_HORIZON_S`], so the clock can never wrap.
fn check_horizon(t: &TrafficSpec, p: &mut Vec<KeyProblem>) {
    // A request count past the limit is refused by the host-memory check, with its estimate.
    let most = ranges::MAX_REQUESTS;
    if t.requests.is_some_and(|n| n as u64 > most) {
        return;
    }
    let rate = match t.arrival {
        ArrivalSpec::Poisson { rate_per_s }
        | ArrivalSpec::Gamma { rate_per_s, .. }
        | ArrivalSpec::Constant { rate_per_s } => rate_per_s,
        ArrivalSpec::ClosedLoop { clients, think_ms } if clients > 0 => {
            let rounds = t.requests.unwrap_or(0).div_ceil(clients) as f64;
            let span_s = rounds * think_ms / 1000.0;
            if span_s > MAX_HORIZON_S {
                p.push(KeyProblem::new(
                    "traffic.arrival.think_ms",
                    format!(
                        "{rounds} rounds of {think_ms:e} ms think time span {span_s:e} s of \
                         virtual time; the most is {MAX_HORIZON_S:e} s"
                    ),
                ));
            }
            return;
        }
        _ => return,
    };
    if !within(rate, ranges::RATE_PER_S) {
        return;
    }
    if let Some(n) = t.requests {
        let span_s = n as f64 / rate;
        if span_s > MAX_HORIZON_S {
            p.push(KeyProblem::new(
                "traffic.arrival.rate_per_s",
                format!(
                    "{n} requests at {rate:e}/s span about {span_s:e} s of virtual time; the \
                     most is {MAX_HORIZON_S:e} s"
                ),
            ));
        }
    } else if let Some(d) = t.duration_s.filter(|d| d.is_finite() && *d > 0.0) {
        let expected = rate * d;
        if expected > most as f64 {
            p.push(KeyProblem::new(
                "traffic.duration_s",
                format!(
                    "{d:e} s at {rate:e}/s is about {expected:e} requests, more than the \
                     limit of {most}; lower the rate or the duration"
                ),
            ));
        }
    }
}

fn check_delay(d: &DelayDist, key: &str, p: &mut Vec<KeyProblem>) {
    let ok = |v: f64| within(v, (0.0, MAX_DELAY_MS));
    let msg = |v: f64| format!("must be in [0, {MAX_DELAY_MS:e}] ms (got {v:e})");
    match d {
        DelayDist::Fixed { ms } if !ok(*ms) => {
            p.push(KeyProblem::new(format!("{key}.ms"), msg(*ms)))
        }
        DelayDist::Uniform { min_ms, max_ms } => {
            if !ok(*min_ms) {
                p.push(KeyProblem::new(format!("{key}.min_ms"), msg(*min_ms)));
            } else if !ok(*max_ms) {
                p.push(KeyProblem::new(format!("{key}.max_ms"), msg(*max_ms)));
            } else if min_ms > max_ms {
                p.push(KeyProblem::new(
                    format!("{key}.min_ms"),
                    format!("min_ms {min_ms} > max_ms {max_ms}"),
                ));
            }
        }
        DelayDist::Exponential { mean_ms } if !(ok(*mean_ms) && *mean_ms > 0.0) => {
            p.push(KeyProblem::new(
                format!("{key}.mean_ms"),
                format!("{} and > 0", msg(*mean_ms)),
            ))
        }
        _ => {}
    }
}

fn check_length(s: &Scenario, d: &LengthDist, key: &str, msl: u32, p: &mut Vec<KeyProblem>) {
    if let Err(k) = super::length_range(s, d, key, msl) {
        p.push(k);
    }
}

/// The mixture-of-experts keys: each in its range ([`ranges::MOE_RANGE`]), and no more experts
/// per token than there are.
fn check_moe(moe: &crate::model::Moe, p: &mut Vec<KeyProblem>) {
    let mut bad = false;
    for (key, v) in moe.keys() {
        let Some(&(_, least, most)) = ranges::MOE_RANGE.iter().find(|(k, ..)| *k == key) else {
            continue;
        };
        if v < least || v > most {
            bad = true;
            let why = if v == 0 && least > 0 {
                " (a mixture of experts needs `experts` and `active_experts`)"
            } else {
                ""
            };
            p.push(KeyProblem::new(
                format!("model.{key}"),
                format!("must be in {least}..={most} (got {v}){why}"),
            ));
        }
    }
    if !bad && moe.active_experts > moe.experts {
        p.push(KeyProblem::new(
            "model.active_experts",
            format!(
                "{} experts per token is more than the {} experts there are",
                moe.active_experts, moe.experts
            ),
        ));
    }
}

/// A trace is read only from a regular file: a FIFO, a device (`/dev/zero`) or a directory
/// would block or never end. Shared by the scenario check (`run`) and every reader
/// (`trace stats`).
pub fn check_trace_file(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(format!(
            "{}: not a regular file (a FIFO, device or directory is not read as a trace)",
            path.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("{}: no such trace file", path.display()))
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}
