//! Length ranges and the memory one request needs: what decides whether a budget can run a
//! scenario at all.

use super::device::{device_memory_bytes, KNOWN_DEVICES};
use super::error::{Diagnostic, KeyProblem, Origin, ScenarioError};
use super::types::*;
use crate::model::ModelShape;
use crate::units::{format_bytes, KvBudget};

/// The lengths a distribution can produce after its clamps: every draw lands in `lo..=hi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LengthRange {
    pub lo: u32,
    pub hi: u32,
}

/// Checks a length distribution's parameters and returns its range. Unbounded distributions
/// (normal, lognormal) are clamped to `[1, max_seq_len]` unless `min`/`max` say otherwise.
pub fn length_range(
    s: &Scenario,
    d: &LengthDist,
    key: &str,
    max_seq_len: u32,
) -> Result<LengthRange, KeyProblem> {
    let bad = |field: &str, msg: &str| KeyProblem::new(format!("{key}.{field}"), msg);
    let finite_pos = |v: f64| v.is_finite() && v > 0.0;
    let (lo, hi, natural_hi) = match d {
        LengthDist::Fixed { value } => (*value, *value, *value),
        LengthDist::Uniform { min, max } => (*min, *max, *max),
        LengthDist::Normal {
            mean,
            std,
            min,
            max,
        } => {
            if !mean.is_finite() {
                return Err(bad("mean", "must be a finite number"));
            }
            if !(std.is_finite() && *std >= 0.0) {
                return Err(bad("std", "must be >= 0"));
            }
            (min.unwrap_or(1), max.unwrap_or(max_seq_len), u32::MAX)
        }
        LengthDist::Lognormal {
            median,
            sigma,
            min,
            max,
        } => {
            if !finite_pos(*median) {
                return Err(bad("median", "must be positive"));
            }
            if !(sigma.is_finite() && *sigma >= 0.0 && *sigma <= super::ranges::MAX_SIGMA) {
                return Err(bad(
                    "sigma",
                    &format!("must be in [0, {}]", super::ranges::MAX_SIGMA),
                ));
            }
            (min.unwrap_or(1), max.unwrap_or(max_seq_len), u32::MAX)
        }
        LengthDist::Zipf {
            n,
            s: exponent,
            scale,
            min,
            max,
        } => {
            if *n == 0 {
                return Err(bad("n", "must be at least 1"));
            }
            if !(exponent.is_finite() && *exponent >= 0.0 && *exponent <= super::ranges::MAX_ZIPF_S)
            {
                return Err(bad(
                    "s",
                    &format!("must be in [0, {}]", super::ranges::MAX_ZIPF_S),
                ));
            }
            if !finite_pos(*scale) {
                return Err(bad("scale", "must be positive"));
            }
            let top = (*n as f64 * scale).round().min(u32::MAX as f64) as u32;
            (min.unwrap_or(1), max.unwrap_or(max_seq_len), top.max(1))
        }
        LengthDist::Empirical {
            csv,
            column,
            min,
            max,
        } => {
            let path = s.resolve_path(csv);
            let values = super::empirical::read_lengths(&path, column)
                .map_err(|m| KeyProblem::new(format!("{key}.csv"), m))?;
            let top = values.iter().copied().max().unwrap_or(1);
            (min.unwrap_or(1), max.unwrap_or(max_seq_len), top.max(1))
        }
    };
    let field_lo = match d {
        LengthDist::Fixed { .. } => "value",
        _ => "min",
    };
    if lo == 0 {
        return Err(bad(field_lo, "must be at least 1 token"));
    }
    if lo > hi {
        return Err(bad(field_lo, &format!("min {lo} > max {hi}")));
    }
    if lo > max_seq_len {
        return Err(bad(
            field_lo,
            &format!("{lo} tokens exceed cache.max_seq_len {max_seq_len}"),
        ));
    }
    Ok(LengthRange {
        lo,
        hi: hi.min(natural_hi.max(lo)),
    })
}

/// The memory the largest possible request needs in each cache mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestNeed {
    /// Longest prompt + output a request can have (after truncation to `max_seq_len`).
    pub tokens: u32,
    /// Continuations held at once.
    pub samples: u32,
    /// Tokens one contiguous reservation spans (`cache.contiguous_reservation`).
    pub reserve_tokens: u32,
    /// Paged: whole blocks for every continuation, not counting on prompt sharing.
    pub paged_bytes: u64,
    /// Contiguous: one reservation per continuation.
    pub contiguous_bytes: u64,
}

impl RequestNeed {
    pub fn bytes(&self) -> u64 {
        self.paged_bytes.max(self.contiguous_bytes)
    }
}

/// What one largest request needs. Prompts are truncated to `max_seq_len - 1` and outputs to the
/// room left, as the generator does.
pub fn request_need(s: &Scenario, shape: &ModelShape) -> Result<RequestNeed, KeyProblem> {
    let msl = s.cache.max_seq_len;
    let t = &s.traffic;
    // A trace's lengths are known only when it is read, and a conversation grows to the limit:
    // both need room for one `max_seq_len` request (longer trace rows are rejected and counted).
    let whole = LengthRange { lo: 1, hi: msl };
    let range = |d: &Option<LengthDist>, key: &str| match d {
        Some(d) if t.sessions.is_none() => length_range(s, d, key, msl),
        _ => Ok(whole),
    };
    let prompt = range(&t.prompt_tokens, "traffic.prompt_tokens")?;
    let output = range(&t.output_tokens, "traffic.output_tokens")?;
    let prefix = t
        .shared_prefix
        .as_ref()
        .filter(|sp| sp.share > 0.0)
        .map_or(0, |sp| sp.prefix_tokens);
    let p = (prefix as u64 + prompt.hi as u64).min(msl as u64 - 1);
    let tokens = (p + output.hi as u64).min(msl as u64) as u32;
    let samples = t
        .parallel_sampling
        .as_ref()
        .filter(|ps| ps.share > 0.0)
        .map_or(1, |ps| ps.n.max(1));
    let block = s
        .cache
        .block_size
        .as_slice()
        .iter()
        .copied()
        .max()
        .unwrap_or(1) as u64;
    let bpt = shape.kv_bytes_per_token();
    let paged_tokens = (tokens as u64).div_ceil(block) * block;
    let reserve_tokens = match s.cache.contiguous_reservation {
        Reservation::MaxSeqLen => msl,
        Reservation::PromptPlusOutput => tokens,
    };
    let reserved = reserve_tokens as u64;
    // Saturating: a figure past 64 bits is refused by every budget, which is the right answer.
    Ok(RequestNeed {
        tokens,
        samples,
        reserve_tokens,
        paged_bytes: (samples as u64)
            .saturating_mul(paged_tokens)
            .saturating_mul(bpt),
        contiguous_bytes: (samples as u64)
            .saturating_mul(reserved)
            .saturating_mul(bpt),
    })
}

impl Scenario {
    /// The budget as written ("8 GiB" or "90%").
    pub fn kv_budget(&self) -> Result<KvBudget, ScenarioError> {
        KvBudget::parse(&self.memory.kv_budget).map_err(|e| self.budget_error(e.to_string()))
    }

    /// KV budget in bytes per device. A share ("90%") is of the memory left after the model's
    /// weights on a device of `device_memory_bytes`; without that figure a share is an error.
    pub fn kv_budget_bytes(&self, device_memory_bytes: Option<u64>) -> Result<u64, ScenarioError> {
        let budget = self.kv_budget()?;
        let weights = self
            .model_shape()
            .map_or(0, |m| m.weight_bytes_per_device());
        budget.resolve(device_memory_bytes, weights).ok_or_else(|| {
            self.budget_error(format!(
                "`{}` is a share of device memory, but no device memory size is known",
                self.memory.kv_budget
            ))
        })
    }

    fn budget_error(&self, message: String) -> ScenarioError {
        ScenarioError::Invalid(vec![Diagnostic {
            origin: Origin::Memory,
            key: "memory.kv_budget".into(),
            message,
        }])
    }

    pub(super) fn check_budget(&self, shape: &ModelShape, p: &mut Vec<KeyProblem>) {
        let key = "memory.kv_budget";
        let Ok(budget) = KvBudget::parse(&self.memory.kv_budget) else {
            return;
        };
        let weights = shape.weight_bytes_per_device();
        let device = device_memory_bytes(&self.device);
        if let (KvBudget::ShareOfFree(_), None) = (budget, device) {
            p.push(KeyProblem::new(
                key,
                format!(
                    "a share needs the device's memory size, and device `{}` has none known \
                     (known: {}); give a size such as \"40 GiB\"",
                    self.device,
                    KNOWN_DEVICES.join(", ")
                ),
            ));
            return;
        }
        if let (KvBudget::ShareOfFree(_), Some(dev)) = (budget, device) {
            if weights >= dev {
                p.push(KeyProblem::new(
                    key,
                    format!(
                        "the weights ({}) do not fit in device `{}` ({})",
                        format_bytes(weights),
                        self.device,
                        format_bytes(dev)
                    ),
                ));
                return;
            }
        }
        let Some(bytes) = budget.resolve(device, weights) else {
            return;
        };
        if let (KvBudget::Bytes(_), Some(dev)) = (budget, device) {
            let workspace = self
                .memory
                .workspace
                .as_deref()
                .and_then(|w| crate::units::parse_bytes(w).ok())
                .unwrap_or(0);
            let total = weights.saturating_add(workspace).saturating_add(bytes);
            if total > dev {
                p.push(KeyProblem::new(
                    key,
                    format!(
                        "weights {} + workspace {} + KV budget {} = {} do not fit in device \
                         `{}` ({})",
                        format_bytes(weights),
                        format_bytes(workspace),
                        format_bytes(bytes),
                        format_bytes(total),
                        self.device,
                        format_bytes(dev)
                    ),
                ));
                return;
            }
        }
        let need = match request_need(self, shape) {
            Ok(n) => n,
            Err(k) => {
                p.push(k);
                return;
            }
        };
        // FP8 scales per tensor or per head are held once, outside the slots (see `setup`).
        let scale_fixed_bytes = shape.kv_scale_fixed_bytes().unwrap_or(0);
        if bytes.saturating_sub(scale_fixed_bytes) < need.bytes() {
            p.push(KeyProblem::new(
                key,
                format!(
                    "{bytes} bytes ({}{}) cannot hold one request: the longest ({} tokens x {} \
                     continuation(s)) needs {} bytes ({}) paged and {} bytes ({}) contiguous",
                    format_bytes(bytes),
                    if scale_fixed_bytes > 0 {
                        format!(", of which {scale_fixed_bytes} bytes hold the FP8 scales")
                    } else {
                        String::new()
                    },
                    need.tokens,
                    need.samples,
                    need.paged_bytes,
                    format_bytes(need.paged_bytes),
                    need.contiguous_bytes,
                    format_bytes(need.contiguous_bytes)
                ),
            ));
        }
    }
}

/// A typical length of a distribution (for memory estimates, not for admission): its mean where
/// that is simple, else the middle of its range; always within the range.
pub(super) fn typical_length(d: &LengthDist, r: LengthRange) -> f64 {
    let (lo, hi) = (r.lo as f64, r.hi as f64);
    let mean = match d {
        LengthDist::Fixed { value } => *value as f64,
        LengthDist::Normal { mean, .. } => *mean,
        LengthDist::Lognormal { median, sigma, .. } => median * (sigma * sigma / 2.0).exp(),
        _ => (lo + hi) / 2.0,
    };
    if mean.is_nan() {
        hi
    } else {
        mean.clamp(lo, hi)
    }
}

impl Scenario {
    /// Refuses a run whose host-side state (request list, both modes' stream states as a
    /// streaming run holds them, block metadata, the cpu backend's KV pool) would not fit in the
    /// memory this process can still get. A sweep, whose probes collect records, checks again
    /// with [`super::HostNeed::collected_bytes`] (`sweep::check`).
    pub(super) fn check_host_memory(&self, shape: &ModelShape, p: &mut Vec<KeyProblem>) {
        let Some(need) = self.host_need(shape) else {
            // A trace's lengths are unknown until it is read; its tiers' slots are not.
            self.check_tier_host_memory(shape, p);
            return;
        };
        let bytes = need.bytes();
        let t = &self.traffic;
        let most = super::ranges::MAX_REQUESTS;
        let available = super::host::available_bytes();
        if need.requests > most {
            let have = available.map_or(String::new(), |(a, source)| {
                format!(", and {} is available ({source})", format_bytes(a))
            });
            p.push(KeyProblem::new(
                if t.requests.is_some() {
                    "traffic.requests"
                } else {
                    "traffic.duration_s"
                },
                format!(
                    "{} requests would need about {} of host memory; the limit is {most} \
                     requests{have}",
                    need.requests,
                    format_bytes(bytes)
                ),
            ));
            return;
        }
        let Some((available, source)) = available else {
            return;
        };
        if bytes <= available {
            return;
        }
        let (host_slots, disk_slots) = self.tier_slots(shape);
        let key = if need.tier_bytes() >= bytes / 2 {
            if disk_slots > host_slots {
                "cache.disk_tier.capacity"
            } else {
                "cache.host_tier.capacity"
            }
        } else if need.host_kv_bytes >= bytes / 2 {
            "memory.kv_budget"
        } else if t.requests.is_some() {
            "traffic.requests"
        } else {
            "traffic.duration_s"
        };
        p.push(KeyProblem::new(
            key,
            format!(
                "this run needs about {} of host memory ({} requests, {:.0} output tokens per \
                 stream, {} paged blocks, {} of host KV{}), and {} is available ({source})",
                format_bytes(bytes),
                need.requests,
                need.mean_output_tokens,
                need.paged_blocks,
                format_bytes(need.host_kv_bytes),
                if need.tier_blocks > 0 {
                    format!(
                        ", {} tier slots, {} of host tier",
                        need.tier_blocks,
                        format_bytes(need.host_tier_bytes)
                    )
                } else {
                    String::new()
                },
                format_bytes(available)
            ),
        ));
    }

    /// The inputs of the host-memory estimate; `None` when the scenario is not sound enough to
    /// estimate (other checks report why).
    pub fn host_need(&self, shape: &ModelShape) -> Option<super::host::HostNeed> {
        let t = &self.traffic;
        let msl = self.cache.max_seq_len;
        let requests = match (t.requests, t.duration_s, &t.arrival) {
            (Some(n), _, _) => n as f64,
            (
                None,
                Some(d),
                ArrivalSpec::Poisson { rate_per_s }
                | ArrivalSpec::Gamma { rate_per_s, .. }
                | ArrivalSpec::Constant { rate_per_s },
            ) => (d * rate_per_s).ceil(),
            _ => 0.0,
        };
        // A trace's lengths are unknown until it is read: no estimate (the replay holds them).
        let (Some(prompt_dist), Some(output_dist)) = (&t.prompt_tokens, &t.output_tokens) else {
            return None;
        };
        let prompt = length_range(self, prompt_dist, "traffic.prompt_tokens", msl).ok()?;
        let output = length_range(self, output_dist, "traffic.output_tokens", msl).ok()?;
        let prefix = t
            .shared_prefix
            .as_ref()
            .map_or(0.0, |sp| sp.prefix_tokens as f64 * sp.share);
        let mean_prompt = (typical_length(prompt_dist, prompt) + prefix).min(msl as f64);
        let mean_output = typical_length(output_dist, output).min(msl as f64);
        let mean_samples = t
            .parallel_sampling
            .as_ref()
            .map_or(1.0, |ps| 1.0 + (ps.n.max(1) - 1) as f64 * ps.share);
        let weights = shape.weight_bytes_per_device();
        let budget = KvBudget::parse(&self.memory.kv_budget).ok()?;
        let kv_bytes = budget.resolve(device_memory_bytes(&self.device), weights)?;
        let bpt = shape.kv_bytes_per_token().max(1);
        let block = self.block_size().max(1) as u64;
        let paged_blocks = kv_bytes / bpt / block;
        // The cpu backend holds FP8 KV as dequantised f32: 4 bytes where the budget prices 1.
        let held = if shape.kv_dtype.is_fp8() { 4 } else { 1 };
        let host_kv_bytes = if self.device == "cpu" {
            kv_bytes.saturating_mul(held)
        } else {
            0
        };
        let (host_slots, disk_slots) = self.tier_slots(shape);
        // Both lower tiers are pools in host memory on the cpu backend (the disk's stands for it).
        let host_tier_bytes = if self.device == "cpu" {
            super::tier_block_bytes(shape, self.block_size())
                .and_then(|b| b.checked_mul(host_slots.saturating_add(disk_slots)))
                .map_or(u64::MAX, |b| b.saturating_mul(held))
        } else {
            0
        };
        Some(super::host::HostNeed {
            requests: requests.min(u64::MAX as f64) as u64,
            mean_prompt_tokens: mean_prompt,
            // A trace's prompts are recipes (`workload::Prompt`); its lengths are its own.
            prompts_held: !matches!(t.arrival, ArrivalSpec::Trace(_)),
            mean_output_tokens: mean_output,
            mean_samples,
            paged_blocks,
            block_tokens: block,
            host_kv_bytes,
            // Slot records grow with use: at most the blocks the workload writes.
            tier_blocks: host_slots.saturating_add(disk_slots).min(
                (requests * mean_samples * (mean_prompt + mean_output) / block as f64)
                    .ceil()
                    .min(u64::MAX as f64) as u64,
            ),
            host_tier_bytes,
        })
    }
}
