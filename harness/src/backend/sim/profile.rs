//! Device profiles for the `sim` cost model: files in `scenarios/devices/`, each constant with
//! its source in a comment. The shipped profiles are also compiled in, so `sim` works from any
//! working directory; a `devices/<name>.toml` beside the scenario file takes precedence.
//!
//! A profile is input like a scenario and is validated the same way (`scenario::parse_document`):
//! unknown and missing keys, wrong types and every constant outside a physical range are refused
//! as `FILE:LINE:COL: KEY: message`. The ranges keep every step time the cost model can produce
//! finite and far from the clock's limits: a 1e-300 bytes/s device or a 20 s step overhead is a
//! typo, not a device.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::backend::BackendError;
use crate::scenario::{self, KeyProblem};

/// How a step's memory time and compute time combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Combine {
    /// The roofline: memory traffic and arithmetic overlap, the slower one sets the time (a GPU
    /// with enough warps in flight).
    #[default]
    Max,
    /// They add: a core that streams and computes in turn (a CPU running small GEMMs and
    /// attention one after another). Fitted profiles of measured CPUs use this; it keeps the
    /// model linear in its constants, so least squares fits it exactly.
    Sum,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    pub name: String,
    pub memory_bytes: u64,
    pub hbm_datasheet_bytes_per_s: f64,
    /// Sustained streaming bandwidth (the roofline's memory slope).
    pub hbm_effective_bytes_per_s: f64,
    pub peak_flops_per_s: f64,
    pub host_link_bytes_per_s: f64,
    pub step_overhead_s: f64,
    /// Paged attention's KV-read bandwidth relative to contiguous (1.0 = no penalty).
    pub paged_attention_efficiency: f64,
    /// Fixed cost per scheduled sequence (its attention launch, sampling, block-table walk).
    /// Absent = 0. Together with `step_overhead_s` it also stands for a GEMM whose efficiency
    /// grows with its row count: efficiency m/(m + m½) costs exactly m½ rows extra per GEMM, a
    /// constant per step (batched GEMMs) or per sequence (per-sequence work).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seq_overhead_s: f64,
    /// Attention FLOPs run at their own rate, apart from the dense GEMMs. Absent = peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_flops_per_s: Option<f64>,
    /// The attended length, in tokens, at which the attention kernel reaches half its plateau
    /// rate: a sequence attending to `L` tokens computes at `rate × L ÷ (L + L½)`, because a
    /// short sequence gives the kernel too few key tiles to hide its prologue and softmax behind
    /// the tensor cores (FlashAttention-3's measured forward speed climbs from 467 TFLOP/s at
    /// 512 tokens to 648 at 16k on an H100). Absent = 0: one rate at every length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_half_tokens: Option<f64>,
    /// Weight streaming bandwidth. Absent = `hbm_effective_bytes_per_s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_bytes_per_s: Option<f64>,
    /// Copy-on-write / fork copy bandwidth (bytes read + written). Absent = effective HBM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_bytes_per_s: Option<f64>,
    /// Absent = `max` (the roofline).
    #[serde(default, skip_serializing_if = "is_max")]
    pub combine: Combine,
    /// Host-link latency per transfer (a DMA's issue and round trip), added once to each
    /// onload `kvbench plan` prices. Absent = 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_link_latency_s: Option<f64>,
    /// Device-to-device link bandwidth one device sends at, per direction (NVLink, Infinity
    /// Fabric, or PCIe peer to peer): what a tensor-parallel all-reduce moves its bytes at.
    /// Absent = the device has no such link stated, and a `tp > 1` model is refused on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_bytes_per_s: Option<f64>,
    /// Fixed cost of one all-reduce (its launch and the link's hops), added to each. Absent = 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_latency_s: Option<f64>,
}

/// A number as a reader expects it: plain in [1e-3, 1e6), else in exponent form.
fn num(v: f64) -> String {
    if v == 0.0 || (1e-3..1e6).contains(&v.abs()) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

fn is_max(c: &Combine) -> bool {
    *c == Combine::Max
}

/// Physical ranges of every rate and time, inclusive. Bandwidths from 1 MB/s (a slow disk) to
/// 100 TB/s (twenty times an H200); FLOP/s from 1 MFLOP/s to 1 EFLOP/s; a step's fixed cost at
/// most 1 s and a sequence's at most 100 ms, a link's latency at most 1 s (a real device's are
/// microseconds); an attention half-saturation length at most 10M tokens (a kernel that needs
/// more to reach half its rate is a typo, and the bound keeps `1 + L½ ÷ L` finite and small
/// enough that no step time leaves the clock's range).
pub const RANGES: &[(&str, f64, f64)] = &[
    ("hbm_datasheet_bytes_per_s", 1e6, 1e14),
    ("hbm_effective_bytes_per_s", 1e6, 1e14),
    ("peak_flops_per_s", 1e6, 1e18),
    ("host_link_bytes_per_s", 1e6, 1e14),
    ("step_overhead_s", 0.0, 1.0),
    ("paged_attention_efficiency", 0.01, 2.0),
    ("seq_overhead_s", 0.0, 0.1),
    ("attention_flops_per_s", 1e6, 1e18),
    ("attention_half_tokens", 0.0, 1e7),
    ("weight_bytes_per_s", 1e6, 1e14),
    ("copy_bytes_per_s", 1e6, 1e14),
    ("host_link_latency_s", 0.0, 1.0),
    ("nvlink_bytes_per_s", 1e6, 1e14),
    ("nvlink_latency_s", 0.0, 1.0),
];

/// Device memory between 1 MiB and 1 PiB.
pub const MEMORY_RANGE_BYTES: (u64, u64) = (1 << 20, 1 << 50);

const BUILTIN: &[(&str, &str)] = &[
    (
        "h200",
        include_str!("../../../../scenarios/devices/h200.toml"),
    ),
    (
        "a100-40g",
        include_str!("../../../../scenarios/devices/a100-40g.toml"),
    ),
    (
        "a100-80g",
        include_str!("../../../../scenarios/devices/a100-80g.toml"),
    ),
    (
        "h100",
        include_str!("../../../../scenarios/devices/h100.toml"),
    ),
    (
        "gh200",
        include_str!("../../../../scenarios/devices/gh200.toml"),
    ),
    (
        "b200",
        include_str!("../../../../scenarios/devices/b200.toml"),
    ),
    (
        "l40s",
        include_str!("../../../../scenarios/devices/l40s.toml"),
    ),
    (
        "mi300x",
        include_str!("../../../../scenarios/devices/mi300x.toml"),
    ),
    (
        "cpu",
        include_str!("../../../../scenarios/devices/cpu.toml"),
    ),
];

impl DeviceProfile {
    /// The profile called `name`: `<scenario_dir>/devices/<name>.toml` if it exists, else the
    /// built-in copy of `scenarios/devices/<name>.toml`.
    pub fn load(name: &str, scenario_dir: Option<&Path>) -> Result<DeviceProfile, BackendError> {
        Self::find(name, scenario_dir)?
            .ok_or_else(|| BackendError::Config(format!("device: {}", Self::unknown(name))))
    }

    /// [`DeviceProfile::load`], with `None` where no profile has that name: `kvbench validate`
    /// places that at the scenario's `device` key, where a run can only say it.
    pub fn find(
        name: &str,
        scenario_dir: Option<&Path>,
    ) -> Result<Option<DeviceProfile>, BackendError> {
        if let Some(dir) = scenario_dir {
            let path = dir.join("devices").join(format!("{name}.toml"));
            if path.is_file() {
                return Self::load_file(&path).map(Some);
            }
        }
        BUILTIN
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(n, text)| {
                Self::parse(
                    text,
                    Some(Path::new(&format!("scenarios/devices/{n}.toml"))),
                )
            })
            .transpose()
    }

    /// Why `name` is no device profile, with the names that are.
    pub fn unknown(name: &str) -> String {
        format!(
            "unknown device profile {name:?} (known: {})",
            BUILTIN
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// A profile file given by path (`kvbench calibrate --check --profile FILE`).
    pub fn load_file(path: &Path) -> Result<DeviceProfile, BackendError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| BackendError::Config(format!("{}: {e}", path.display())))?;
        Self::parse(&text, Some(path))
    }

    pub fn builtin_names() -> impl Iterator<Item = &'static str> {
        BUILTIN.iter().map(|(n, _)| *n)
    }

    /// Parses and validates profile text; `path` names it in errors.
    pub fn parse(text: &str, path: Option<&Path>) -> Result<DeviceProfile, BackendError> {
        scenario::parse_document(text, path, DeviceProfile::problems)
            .map_err(|e| BackendError::Profile(e.to_string()))
    }

    /// Every constant outside its physical range, by key.
    pub fn problems(&self) -> Vec<KeyProblem> {
        let mut out = Vec::new();
        let name_ok = !self.name.is_empty()
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !name_ok {
            out.push(KeyProblem::new(
                "name",
                format!(
                    "must be letters, digits, '-', '_' or '.', got {:?}",
                    self.name
                ),
            ));
        }
        let (lo, hi) = MEMORY_RANGE_BYTES;
        if !(lo..=hi).contains(&self.memory_bytes) {
            out.push(KeyProblem::new(
                "memory_bytes",
                format!(
                    "must be between {lo} and {hi} bytes, got {}",
                    self.memory_bytes
                ),
            ));
        }
        for &(key, lo, hi) in RANGES {
            let Some(v) = self.value(key) else { continue };
            if !(v.is_finite() && v >= lo && v <= hi) {
                out.push(KeyProblem::new(
                    key,
                    format!(
                        "must be between {} and {}, got {}",
                        num(lo),
                        num(hi),
                        num(v)
                    ),
                ));
            }
        }
        out
    }

    /// Why this profile cannot price a model split over `tp` devices: `None` for `tp = 1`, or
    /// when the profile states the device-to-device link an all-reduce needs.
    pub fn tp_refusal(&self, tp: u32) -> Option<String> {
        (tp > 1 && self.nvlink_bytes_per_s.is_none()).then(|| {
            format!(
                "model.tp: tp = {tp} needs the device-to-device link of device profile {:?}, which states no nvlink_bytes_per_s",
                self.name
            )
        })
    }

    /// The constant called `key` (`None` for an optional one left out).
    pub fn value(&self, key: &str) -> Option<f64> {
        match key {
            "hbm_datasheet_bytes_per_s" => Some(self.hbm_datasheet_bytes_per_s),
            "hbm_effective_bytes_per_s" => Some(self.hbm_effective_bytes_per_s),
            "peak_flops_per_s" => Some(self.peak_flops_per_s),
            "host_link_bytes_per_s" => Some(self.host_link_bytes_per_s),
            "step_overhead_s" => Some(self.step_overhead_s),
            "paged_attention_efficiency" => Some(self.paged_attention_efficiency),
            "seq_overhead_s" => Some(self.seq_overhead_s),
            "attention_flops_per_s" => self.attention_flops_per_s,
            "attention_half_tokens" => self.attention_half_tokens,
            "weight_bytes_per_s" => self.weight_bytes_per_s,
            "copy_bytes_per_s" => self.copy_bytes_per_s,
            "host_link_latency_s" => self.host_link_latency_s,
            "nvlink_bytes_per_s" => self.nvlink_bytes_per_s,
            "nvlink_latency_s" => self.nvlink_latency_s,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_parse_and_carry_the_datasheet_figures() {
        let h = DeviceProfile::load("h200", None).expect("h200");
        assert_eq!(h.memory_bytes, 141_000_000_000);
        assert_eq!(h.hbm_datasheet_bytes_per_s, 4.8e12);
        assert!(h.hbm_effective_bytes_per_s < h.hbm_datasheet_bytes_per_s);
        assert_eq!(h.combine, Combine::Max);
        DeviceProfile::load("cpu", None).expect("cpu");
    }

    #[test]
    fn unknown_profile_is_an_error_naming_it() {
        let err = DeviceProfile::load("tpu9", None).expect_err("unknown");
        assert!(err.to_string().contains("tpu9"), "{err}");
    }

    #[test]
    fn a_file_beside_the_scenario_wins_and_is_validated() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("devices")).expect("mkdir");
        let text = include_str!("../../../../scenarios/devices/h200.toml")
            .replace("peak_flops_per_s = 790e12", "peak_flops_per_s = -1.0");
        std::fs::write(dir.path().join("devices/h200.toml"), text).expect("write");
        let err = DeviceProfile::load("h200", Some(dir.path())).expect_err("negative");
        assert!(err.to_string().contains("peak_flops_per_s"), "{err}");
    }

    #[test]
    fn every_range_bound_is_enforced_at_its_line() {
        let base = include_str!("../../../../scenarios/devices/h200.toml");
        for (line, value) in [
            ("hbm_effective_bytes_per_s = 4.3e12", "1e-300"),
            ("peak_flops_per_s = 790e12", "1e-300"),
            ("paged_attention_efficiency = 0.9", "1e-300"),
            ("step_overhead_s = 40e-6", "20.0"),
            ("host_link_bytes_per_s = 50e9", "inf"),
        ] {
            let key = line.split(' ').next().unwrap_or_default();
            let text = base.replace(line, &format!("{key} = {value}"));
            assert_ne!(text, base, "{line} not in the shipped profile");
            let err = DeviceProfile::parse(&text, Some(Path::new("d.toml")))
                .expect_err(key)
                .to_string();
            let want_line = base.lines().position(|l| l == line).unwrap_or(0) + 1;
            assert!(
                err.contains(&format!("d.toml:{want_line}:1: {key}: must be between")),
                "{err}"
            );
        }
    }
}
