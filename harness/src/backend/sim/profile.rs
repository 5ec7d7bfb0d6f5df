//! Device profiles for the `sim` cost model: files in `scenarios/devices/`, each constant with
//! its source in a comment. The shipped profiles are also compiled in, so `sim` works from any
//! working directory; a `devices/<name>.toml` beside the scenario file takes precedence.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::backend::BackendError;

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
}

const BUILTIN: &[(&str, &str)] = &[
    (
        "h200",
        include_str!("../../../../scenarios/devices/h200.toml"),
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
        if let Some(dir) = scenario_dir {
            let path = dir.join("devices").join(format!("{name}.toml"));
            if path.is_file() {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| BackendError::Config(format!("{}: {e}", path.display())))?;
                return Self::parse(&text, &path.display().to_string());
            }
        }
        match BUILTIN.iter().find(|(n, _)| *n == name) {
            Some((n, text)) => Self::parse(text, &format!("scenarios/devices/{n}.toml")),
            None => Err(BackendError::Config(format!(
                "device: unknown device profile {name:?} (known: {})",
                BUILTIN
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    pub fn builtin_names() -> impl Iterator<Item = &'static str> {
        BUILTIN.iter().map(|(n, _)| *n)
    }

    fn parse(text: &str, origin: &str) -> Result<DeviceProfile, BackendError> {
        let p: DeviceProfile =
            toml::from_str(text).map_err(|e| BackendError::Config(format!("{origin}: {e}")))?;
        let positive = [
            ("hbm_datasheet_bytes_per_s", p.hbm_datasheet_bytes_per_s),
            ("hbm_effective_bytes_per_s", p.hbm_effective_bytes_per_s),
            ("peak_flops_per_s", p.peak_flops_per_s),
            ("host_link_bytes_per_s", p.host_link_bytes_per_s),
            ("paged_attention_efficiency", p.paged_attention_efficiency),
        ];
        for (key, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(BackendError::Config(format!(
                    "{origin}: {key}: must be > 0, got {v}"
                )));
            }
        }
        if !(p.step_overhead_s.is_finite() && p.step_overhead_s >= 0.0) {
            return Err(BackendError::Config(format!(
                "{origin}: step_overhead_s: must be >= 0"
            )));
        }
        if p.paged_attention_efficiency > 1.0 {
            return Err(BackendError::Config(format!(
                "{origin}: paged_attention_efficiency: must be <= 1"
            )));
        }
        Ok(p)
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
}
