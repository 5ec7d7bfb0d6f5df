//! Reconciling the memory ledger with what the device reports (`cuMemGetInfo`), as arithmetic:
//! the device memory a run uses (free before the run − free now) must cover what the ledger
//! accounts (weights + KV pool + workspace + other) and exceed it by no more than a stated
//! overhead; after teardown the free figure must return to its pre-run value within the same
//! allowance (the reclamation check on the device).

use serde::Serialize;

/// A `cuMemGetInfo` reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeviceMem {
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// The ledger's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Accounted {
    pub weights_bytes: u64,
    pub kv_pool_bytes: u64,
    pub workspace_bytes: u64,
    pub other_bytes: u64,
    /// Device allocations made (each may be rounded up to the allocation granularity).
    pub allocations: u64,
}

/// What the driver may hold beyond the ledger: module images, the stream, events, cuBLAS's
/// workspace — a fixed allowance — plus rounding of every allocation to the 2 MiB granularity.
pub const FIXED_OVERHEAD_BYTES: u64 = 256 << 20;
pub const ALLOCATION_GRANULARITY_BYTES: u64 = 2 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Reconciliation {
    pub accounted_bytes: u64,
    pub device_used_bytes: u64,
    /// device_used − accounted; negative means the ledger claims memory the device never gave.
    pub unaccounted_bytes: i64,
    pub allowed_overhead_bytes: u64,
    pub ok: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("device free memory rose during the run ({before} -> {now} bytes): another process freed memory, so the reading cannot be reconciled")]
    FreeRose { before: u64, now: u64 },
    #[error("ledger sum overflows u64")]
    Overflow,
    #[error("readings from devices of different sizes ({a} vs {b} bytes)")]
    DifferentDevice { a: u64, b: u64 },
}

pub fn allowed_overhead(allocations: u64) -> Option<u64> {
    allocations
        .checked_mul(ALLOCATION_GRANULARITY_BYTES)?
        .checked_add(FIXED_OVERHEAD_BYTES)
}

/// The run's device use against the ledger.
pub fn reconcile(
    before: DeviceMem,
    now: DeviceMem,
    acc: &Accounted,
) -> Result<Reconciliation, LedgerError> {
    if before.total_bytes != now.total_bytes {
        return Err(LedgerError::DifferentDevice {
            a: before.total_bytes,
            b: now.total_bytes,
        });
    }
    let used = before
        .free_bytes
        .checked_sub(now.free_bytes)
        .ok_or(LedgerError::FreeRose {
            before: before.free_bytes,
            now: now.free_bytes,
        })?;
    let accounted = [
        acc.weights_bytes,
        acc.kv_pool_bytes,
        acc.workspace_bytes,
        acc.other_bytes,
    ]
    .iter()
    .try_fold(0u64, |s, &x| s.checked_add(x))
    .ok_or(LedgerError::Overflow)?;
    let allowed = allowed_overhead(acc.allocations).ok_or(LedgerError::Overflow)?;
    let unaccounted = used as i128 - accounted as i128;
    let unaccounted_bytes = i64::try_from(unaccounted).map_err(|_| LedgerError::Overflow)?;
    Ok(Reconciliation {
        accounted_bytes: accounted,
        device_used_bytes: used,
        unaccounted_bytes,
        allowed_overhead_bytes: allowed,
        ok: unaccounted >= 0 && unaccounted <= allowed as i128,
    })
}

/// After teardown: did the device's free memory come back to its pre-run figure (within the
/// fixed allowance — the driver keeps module images until the context goes)?
pub fn returned_to_baseline(before: DeviceMem, after: DeviceMem) -> bool {
    before.total_bytes == after.total_bytes
        && before.free_bytes.saturating_sub(after.free_bytes) <= FIXED_OVERHEAD_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn mem(free: u64) -> DeviceMem {
        DeviceMem {
            free_bytes: free,
            total_bytes: 141 * GIB,
        }
    }

    fn acc() -> Accounted {
        Accounted {
            weights_bytes: 16 * GIB,
            kv_pool_bytes: 100 * GIB,
            workspace_bytes: GIB,
            other_bytes: 0,
            allocations: 300,
        }
    }

    #[test]
    fn use_within_the_stated_overhead_reconciles() {
        // 117 GiB accounted, 117 GiB + 700 MiB used; allowance 256 MiB + 300 x 2 MiB = 856 MiB.
        let r = reconcile(mem(140 * GIB), mem(23 * GIB - (700 << 20)), &acc()).expect("valid");
        assert_eq!(r.accounted_bytes, 117 * GIB);
        assert_eq!(r.unaccounted_bytes, 700 << 20);
        assert_eq!(r.allowed_overhead_bytes, 856 << 20);
        assert!(r.ok);
    }

    #[test]
    fn a_leak_beyond_the_allowance_or_a_ledger_overclaim_fails() {
        let leak = reconcile(mem(140 * GIB), mem(22 * GIB), &acc()).expect("valid");
        assert!(!leak.ok, "1 GiB unaccounted passed: {leak:?}");
        let over = reconcile(mem(140 * GIB), mem(24 * GIB), &acc()).expect("valid");
        assert!(over.unaccounted_bytes < 0 && !over.ok, "{over:?}");
    }

    #[test]
    fn unreconcilable_readings_are_errors() {
        assert!(matches!(
            reconcile(mem(10 * GIB), mem(11 * GIB), &acc()),
            Err(LedgerError::FreeRose { .. })
        ));
        let other = DeviceMem {
            free_bytes: GIB,
            total_bytes: 80 * GIB,
        };
        assert!(matches!(
            reconcile(mem(10 * GIB), other, &acc()),
            Err(LedgerError::DifferentDevice { .. })
        ));
        let huge = Accounted {
            weights_bytes: u64::MAX,
            kv_pool_bytes: 1,
            ..acc()
        };
        assert_eq!(
            reconcile(mem(10 * GIB), mem(GIB), &huge),
            Err(LedgerError::Overflow)
        );
    }

    #[test]
    fn reclamation_on_the_device_means_free_memory_comes_back() {
        assert!(returned_to_baseline(
            mem(140 * GIB),
            mem(140 * GIB - (100 << 20))
        ));
        assert!(!returned_to_baseline(mem(140 * GIB), mem(139 * GIB)));
    }
}
