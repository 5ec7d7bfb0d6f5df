//! The device memory ledger in two halves. The exact half is kvbench's own: every device
//! allocation it makes is counted where it is made and dropped ([`kvbench_cuda::runtime::Owned`]),
//! and a run fails on any byte it still holds that it did not hold before. The other half is
//! `cuMemGetInfo`, which moves for reasons that are not kvbench's (the driver's local-memory
//! reserve growing at a kernel's first launch, library workspaces, module images, another
//! process): it is reconciled as arithmetic with named terms,
//!
//! ```text
//! device used = kvbench's allocations + driver warm-up (measured, stated) + residue
//! ```
//!
//! and a run fails only on a residue beyond a tolerance printed with its derivation, never on
//! the driver's movement alone.

use serde::Serialize;

/// A `cuMemGetInfo` reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeviceMem {
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// What the driver may take beyond kvbench's allocations and its own measured warm-up:
/// module images, the stream, events, kernels first launched after warm-up, a transient use by
/// another process. Plus each allocation's rounding to the driver's 2 MiB granularity.
pub const FIXED_OVERHEAD_BYTES: u64 = 256 << 20;
pub const ALLOCATION_GRANULARITY_BYTES: u64 = 2 << 20;

/// kvbench's own device allocations at one moment (from the runtime seam's count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Owned {
    pub allocations: u64,
    pub bytes: u64,
    pub allocated_bytes: u64,
    pub freed_bytes: u64,
}

/// The readings one reconciliation takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readings {
    /// Before the backend's allocations.
    pub baseline: DeviceMem,
    pub owned_baseline: Owned,
    pub now: DeviceMem,
    pub owned_now: Owned,
    /// Free memory the driver took while every kernel and library path ran once (warm-up).
    pub driver_warmup_bytes: i64,
}

/// The reconciliation, term by term (`summary.json`'s `runs[].memory.device`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct DeviceLedger {
    pub total_bytes: u64,
    /// Free memory before the backend's allocations, and now.
    pub baseline_free_bytes: u64,
    pub free_bytes: u64,
    /// baseline_free − free (negative where another process freed memory meanwhile).
    pub device_used_bytes: i64,
    /// kvbench's live device allocations beyond the baseline: exact, as requested.
    pub kvbench_bytes: u64,
    pub kvbench_allocations: u64,
    /// Allocated and freed by kvbench since the baseline.
    pub kvbench_allocated_bytes: u64,
    pub kvbench_freed_bytes: u64,
    /// The driver's own take while every kernel and library path ran once (stated).
    pub driver_warmup_bytes: i64,
    /// device_used − kvbench (= `device_unaccounted_bytes`): what the driver holds beyond
    /// kvbench's allocations.
    pub unaccounted_bytes: i64,
    /// unaccounted − driver warm-up: what no named term explains.
    pub residue_bytes: i64,
    pub tolerance_bytes: u64,
    /// How the tolerance is made up, in words and figures.
    pub tolerance: String,
    pub residue_ok: bool,
    /// The driver version the device reports (`13.0`) and the event-timing call it takes.
    pub driver_version: String,
    pub event_timing_call: String,
    /// The emulated driver's noise seed (`--emu-driver-noise`); absent without noise or on a GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub emu_driver_noise_seed: Option<u64>,
    /// A planted device leak's bytes (`--inject-fault device-leak`); absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planted_leak_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger sum overflows")]
    Overflow,
    #[error("readings from devices of different sizes ({a} vs {b} bytes)")]
    DifferentDevice { a: u64, b: u64 },
}

/// The tolerance for `allocations` live allocations, and its derivation.
pub fn tolerance(allocations: u64) -> Option<(u64, String)> {
    let t = allocations
        .checked_mul(ALLOCATION_GRANULARITY_BYTES)?
        .checked_add(FIXED_OVERHEAD_BYTES)?;
    Some((
        t,
        format!(
            "{} MiB driver allowance + {allocations} allocations x {} MiB rounding",
            FIXED_OVERHEAD_BYTES >> 20,
            ALLOCATION_GRANULARITY_BYTES >> 20
        ),
    ))
}

/// The named terms of `r`; the driver version and timing call are filled in by the caller.
pub fn reconcile(r: &Readings) -> Result<DeviceLedger, LedgerError> {
    if r.baseline.total_bytes != r.now.total_bytes {
        return Err(LedgerError::DifferentDevice {
            a: r.baseline.total_bytes,
            b: r.now.total_bytes,
        });
    }
    let signed = |x: u64| i64::try_from(x).map_err(|_| LedgerError::Overflow);
    let used = signed(r.baseline.free_bytes)? - signed(r.now.free_bytes)?;
    let kvbench_bytes = r.owned_now.bytes.saturating_sub(r.owned_baseline.bytes);
    let kvbench_allocations = r
        .owned_now
        .allocations
        .saturating_sub(r.owned_baseline.allocations);
    let unaccounted = used
        .checked_sub(signed(kvbench_bytes)?)
        .ok_or(LedgerError::Overflow)?;
    let residue = unaccounted
        .checked_sub(r.driver_warmup_bytes)
        .ok_or(LedgerError::Overflow)?;
    let (tolerance_bytes, derivation) =
        tolerance(kvbench_allocations).ok_or(LedgerError::Overflow)?;
    Ok(DeviceLedger {
        total_bytes: r.now.total_bytes,
        baseline_free_bytes: r.baseline.free_bytes,
        free_bytes: r.now.free_bytes,
        device_used_bytes: used,
        kvbench_bytes,
        kvbench_allocations,
        kvbench_allocated_bytes: r
            .owned_now
            .allocated_bytes
            .saturating_sub(r.owned_baseline.allocated_bytes),
        kvbench_freed_bytes: r
            .owned_now
            .freed_bytes
            .saturating_sub(r.owned_baseline.freed_bytes),
        driver_warmup_bytes: r.driver_warmup_bytes,
        unaccounted_bytes: unaccounted,
        residue_bytes: residue,
        tolerance_bytes,
        tolerance: derivation,
        residue_ok: residue.unsigned_abs() <= tolerance_bytes,
        driver_version: String::new(),
        event_timing_call: String::new(),
        emu_driver_noise_seed: None,
        planted_leak_bytes: None,
    })
}

impl DeviceLedger {
    /// The printed reconciliation: the same figures `summary.json` holds.
    pub fn line(&self, backend: &str) -> String {
        format!(
            "{backend} device memory: used {} B = kvbench {} B ({} allocations) + driver warm-up {} B \
             (measured) + residue {} B; unaccounted {} B; tolerance {} B ({}): {}",
            self.device_used_bytes,
            self.kvbench_bytes,
            self.kvbench_allocations,
            self.driver_warmup_bytes,
            self.residue_bytes,
            self.unaccounted_bytes,
            self.tolerance_bytes,
            self.tolerance,
            if self.residue_ok {
                "reconciled"
            } else {
                "RESIDUE BEYOND TOLERANCE"
            }
        )
    }
}

/// After teardown: kvbench holds exactly what it held before the backend (the exact check), and
/// the device's free memory is back at its pre-run figure less the driver's stated warm-up take,
/// within the fixed allowance (the driver keeps module images until the context goes).
pub fn returned_to_baseline(before: DeviceMem, after: DeviceMem, driver_warmup_bytes: i64) -> bool {
    let drop = before.free_bytes as i128 - after.free_bytes as i128 - driver_warmup_bytes as i128;
    before.total_bytes == after.total_bytes && drop.unsigned_abs() <= FIXED_OVERHEAD_BYTES as u128
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn mem(free: u64) -> DeviceMem {
        DeviceMem {
            free_bytes: free,
            total_bytes: 141 * GIB,
        }
    }

    fn owned(bytes: u64, allocations: u64) -> Owned {
        Owned {
            allocations,
            bytes,
            allocated_bytes: bytes,
            freed_bytes: 0,
        }
    }

    fn readings(now_free: u64) -> Readings {
        Readings {
            baseline: mem(140 * GIB),
            owned_baseline: owned(3 * 4, 3),
            now: mem(now_free),
            owned_now: owned(117 * GIB + 12, 303),
            driver_warmup_bytes: (100 * MIB) as i64,
        }
    }

    #[test]
    fn use_is_split_into_kvbench_warmup_and_a_residue_within_the_stated_tolerance() {
        // 117 GiB of kvbench's, 100 MiB warm-up, 600 MiB residue; 256 MiB + 300 x 2 MiB.
        let r = reconcile(&readings(23 * GIB - 700 * MIB)).expect("valid");
        assert_eq!(r.kvbench_bytes, 117 * GIB);
        assert_eq!(r.kvbench_allocations, 300);
        assert_eq!(r.unaccounted_bytes, (700 * MIB) as i64);
        assert_eq!(r.residue_bytes, (600 * MIB) as i64);
        assert_eq!(r.tolerance_bytes, 856 * MIB);
        assert!(r.tolerance.contains("256 MiB") && r.tolerance.contains("300 allocations"));
        assert!(r.residue_ok);
        let line = r.line("cuda");
        assert!(line.contains(&format!("residue {} B", 600 * MIB)), "{line}");
    }

    #[test]
    fn a_residue_beyond_the_tolerance_fails_either_way_and_a_rise_is_a_figure_not_an_error() {
        let leak = reconcile(&readings(22 * GIB)).expect("valid");
        assert!(!leak.residue_ok, "1 GiB residue passed: {leak:?}");
        let over = reconcile(&readings(24 * GIB)).expect("valid");
        assert!(over.residue_bytes < 0 && !over.residue_ok, "{over:?}");
        // Another process freed memory: free rose; a figure, never an error.
        let r = Readings {
            owned_now: owned(12, 3),
            driver_warmup_bytes: 0,
            ..readings(140 * GIB + MIB)
        };
        let rose = reconcile(&r).expect("valid");
        assert_eq!(rose.device_used_bytes, -(MIB as i64));
        assert!(rose.residue_ok);
    }

    #[test]
    fn unreconcilable_readings_are_errors() {
        let r = Readings {
            now: DeviceMem {
                free_bytes: GIB,
                total_bytes: 80 * GIB,
            },
            ..readings(GIB)
        };
        assert!(matches!(
            reconcile(&r),
            Err(LedgerError::DifferentDevice { .. })
        ));
        let r = Readings {
            owned_now: owned(u64::MAX, 3),
            ..readings(GIB)
        };
        assert_eq!(reconcile(&r), Err(LedgerError::Overflow));
    }

    #[test]
    fn reclamation_on_the_device_allows_for_the_stated_warmup() {
        let warm = (300 * MIB) as i64;
        assert!(returned_to_baseline(
            mem(140 * GIB),
            mem(140 * GIB - 300 * MIB - 100 * MIB),
            warm
        ));
        assert!(!returned_to_baseline(mem(140 * GIB), mem(139 * GIB), 0));
    }
}
