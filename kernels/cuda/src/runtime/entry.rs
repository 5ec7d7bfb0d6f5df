//! The driver entry points kvbench calls that not every driver exports, and which one each run
//! takes. cudarc (built for CUDA 13.0) binds every call by name lazily and panics at the first
//! call of a symbol the driver lacks — in the middle of a run. So the driver's version is read
//! (`cuDriverGetVersion`) and each such symbol looked up before any work: a call with an older
//! equivalent falls back to it, and one with none refuses the device in one line that names the
//! version and the missing call.
//!
//! The emulated device reports a version too (`--emu-driver`), and hides the entry points that
//! version lacks by [`FIRST_VERSION`], so both paths are exercised without a GPU.

use crate::error::CudaError;

/// Each entry point this table knows, with the first driver version exporting it (13000 = 13.0).
pub const FIRST_VERSION: &[(&str, i32)] = &[
    ("cuEventElapsedTime", 2000),
    ("cuMemAllocAsync", 11020),
    ("cuMemPoolTrimTo", 11020),
    ("cuDeviceGetDefaultMemPool", 11020),
    ("cuEventElapsedTime_v2", 12080),
];

/// Driver versions `--emu-driver` offers.
pub const EMULATED_VERSIONS: &[&str] = &["12.4", "12.8", "13.0"];

/// How step times are read from events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElapsedCall {
    /// `cuEventElapsedTime_v2` (drivers from 12.8; what cudarc's bindings for 13.0 call).
    V2,
    /// `cuEventElapsedTime`, the call every older driver has.
    V1,
}

impl ElapsedCall {
    pub fn name(self) -> &'static str {
        match self {
            ElapsedCall::V2 => "cuEventElapsedTime_v2",
            ElapsedCall::V1 => "cuEventElapsedTime",
        }
    }
}

/// The entry points one device's runs take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryPoints {
    /// `cuDriverGetVersion`'s figure.
    pub driver_version: i32,
    pub elapsed: ElapsedCall,
}

/// `12080` as `12.8`.
pub fn version_name(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// `12.8` as `12080`; `None` for anything that is not MAJOR.MINOR.
pub fn parse_version(s: &str) -> Option<i32> {
    let (a, b) = s.trim().split_once('.')?;
    let (a, b): (i32, i32) = (a.parse().ok()?, b.parse().ok()?);
    ((0..100).contains(&a) && (0..100).contains(&b)).then(|| a * 1000 + b * 10)
}

/// Whether a driver of `version` exports `name` (by [`FIRST_VERSION`]; a name not in the table
/// is taken as present).
pub fn emulated_has(version: i32, name: &str) -> bool {
    FIRST_VERSION
        .iter()
        .find(|(n, _)| *n == name)
        .is_none_or(|&(_, since)| version >= since)
}

/// The entry points to use on a driver of `version` where `has(name)` says whether the driver
/// exports `name`; an error (one line: the version and every call missing) where a needed call
/// has no equivalent.
pub fn resolve(version: i32, has: impl Fn(&str) -> bool) -> Result<EntryPoints, CudaError> {
    let elapsed = if has(ElapsedCall::V2.name()) {
        ElapsedCall::V2
    } else if has(ElapsedCall::V1.name()) {
        ElapsedCall::V1
    } else {
        return Err(missing(
            version,
            "cuEventElapsedTime_v2 nor cuEventElapsedTime",
        ));
    };
    for call in [
        "cuMemAllocAsync",
        "cuMemPoolTrimTo",
        "cuDeviceGetDefaultMemPool",
    ] {
        if !has(call) {
            return Err(missing(version, call));
        }
    }
    Ok(EntryPoints {
        driver_version: version,
        elapsed,
    })
}

fn missing(version: i32, what: &str) -> CudaError {
    CudaError::NoDevice(format!(
        "the driver (CUDA {}) exports no {what}, which kvbench calls; install a newer driver",
        version_name(version)
    ))
}

/// NVRTC against the driver. kvbench loads cubins (SASS), which a driver of the same CUDA major
/// version loads even when NVRTC's minor version is newer (minor-version compatibility), but a
/// driver of an older major version cannot: `Err` refuses in one line, `Ok(Some(_))` is the
/// warning for a newer minor version, `Ok(None)` nothing to say.
pub fn check_nvrtc(driver_version: i32, nvrtc: (i32, i32)) -> Result<Option<String>, String> {
    let nvrtc_version = nvrtc.0 * 1000 + nvrtc.1 * 10;
    let says = format!(
        "NVRTC {}.{} is newer than the driver's CUDA {}",
        nvrtc.0,
        nvrtc.1,
        version_name(driver_version)
    );
    if nvrtc.0 > driver_version / 1000 {
        Err(format!(
            "{says}: the modules it compiles cannot load; use an NVRTC of CUDA {}.x or a newer \
             driver",
            driver_version / 1000
        ))
    } else if nvrtc_version > driver_version {
        Ok(Some(format!(
            "{says}: its cubins load by minor-version compatibility; a module that fails to load \
             names this mismatch first"
        )))
    } else {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_print() {
        assert_eq!(parse_version("12.4"), Some(12040));
        assert_eq!(parse_version("13.0"), Some(13000));
        assert_eq!(parse_version("13"), None);
        assert_eq!(parse_version("x.1"), None);
        assert_eq!(version_name(12080), "12.8");
        for v in EMULATED_VERSIONS {
            assert_eq!(version_name(parse_version(v).unwrap()), *v);
        }
    }

    #[test]
    fn a_driver_before_12_8_times_events_with_the_older_call() {
        let on = |v: i32| resolve(v, |n| emulated_has(v, n)).unwrap().elapsed;
        assert_eq!(on(12040), ElapsedCall::V1);
        assert_eq!(on(12080), ElapsedCall::V2);
        assert_eq!(on(13000), ElapsedCall::V2);
    }

    #[test]
    fn a_missing_call_without_an_equivalent_refuses_in_one_line_naming_it() {
        let e = resolve(12040, |n| !n.starts_with("cuEventElapsedTime")).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("12.4") && msg.contains("cuEventElapsedTime") && !msg.contains('\n'),
            "{msg}"
        );
        let e = resolve(11010, |n| emulated_has(11010, n)).unwrap_err();
        assert!(e.to_string().contains("cuMemAllocAsync"), "{e}");
    }

    #[test]
    fn an_nvrtc_newer_than_the_driver_is_named() {
        assert_eq!(check_nvrtc(13000, (12, 9)), Ok(None));
        assert_eq!(check_nvrtc(12080, (12, 8)), Ok(None));
        let w = check_nvrtc(12040, (12, 8)).unwrap().unwrap();
        assert!(w.contains("NVRTC 12.8") && w.contains("CUDA 12.4"), "{w}");
        let e = check_nvrtc(12040, (13, 0)).unwrap_err();
        assert!(e.contains("NVRTC 13.0") && e.contains("cannot load"), "{e}");
    }
}
