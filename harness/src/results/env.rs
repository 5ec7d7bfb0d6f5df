//! `environment.json`: where a result came from (git revision, CPU, GPU, driver, toolchain,
//! date). The one results file that is not byte-identical between runs.

use std::path::Path;
use std::process::Command;

use serde::Serialize;

use crate::backend::sim::profile::DeviceProfile;
use crate::scenario::Scenario;

#[derive(Debug, Serialize)]
pub struct Environment {
    pub kvbench_version: &'static str,
    pub git_revision: Option<String>,
    pub git_dirty: Option<bool>,
    pub cpu: Option<String>,
    pub cpu_threads: usize,
    pub gpu: Option<String>,
    pub driver: Option<String>,
    pub toolchain: Option<String>,
    pub os: &'static str,
    pub arch: &'static str,
    pub date_utc: String,
    pub backend: String,
    /// The device profile the scenario's figures are priced with ([`device_identity`]):
    /// `kvbench gate` refuses to compare figures of two profiles.
    pub device_profile: Option<String>,
}

fn cmd(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// The device profile `scenario`'s figures are priced with, as a folder records it
/// ([`crate::stats::device_identity`]). `None` when the profile cannot be loaded (the run
/// refuses it anyway on `sim`).
pub fn device_identity(scenario: &Scenario) -> Option<String> {
    let dir = scenario.source.as_deref().and_then(Path::parent);
    let profile = DeviceProfile::load(&scenario.device, dir).ok()?;
    crate::stats::device_identity(&profile.name, &profile)
}

pub fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
}

/// Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

pub fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (y, m, d) = civil(secs.div_euclid(86_400));
    let t = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        t / 3600,
        t % 3600 / 60,
        t % 60
    )
}

pub fn collect(backend: &str) -> Environment {
    let gpu = cmd("nvidia-smi", &["--query-gpu=name", "--format=csv,noheader"]);
    let driver = cmd(
        "nvidia-smi",
        &["--query-gpu=driver_version", "--format=csv,noheader"],
    );
    Environment {
        kvbench_version: env!("CARGO_PKG_VERSION"),
        git_revision: cmd("git", &["rev-parse", "HEAD"]),
        git_dirty: cmd("git", &["status", "--porcelain"])
            .map(|s| !s.is_empty())
            .or(Some(false)),
        cpu: cpu_model(),
        cpu_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        gpu,
        driver,
        toolchain: cmd("rustc", &["--version"]),
        os: std::env::consts::OS,
        arch: std::env::consts::ARCH,
        date_utc: now_utc(),
        backend: backend.to_string(),
        device_profile: None,
    }
}

#[cfg(test)]
mod tests {
    use super::civil;

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_723), (2024, 1, 1));
        assert_eq!(civil(11_016), (2000, 2, 29));
    }
}
