//! What moving KV between the device and its lower tiers costs: the host link (PCIe, or a
//! GH200-class NVLink-C2C) and a disk tier's own link. One pricing for `sim`, for `--clock model`
//! on the compute backends and for `kvbench plan --host-tier`.
//!
//! **The link model.** The host link is full duplex: host→device (onloads, swap-ins) and
//! device→host (offloads, swap-outs) are two queues, each at `host_link_bytes_per_s` (a profile
//! states one direction's figure), and each pays `host_link_latency_s` once in a step that uses
//! it. The disk is one queue: a step's reads at `read_bytes_per_s` and writes at
//! `write_bytes_per_s` follow each other, after the disk's latency once. A step's tier transfers
//! run in two stages — the disk first (a disk→device onload is read into host memory, a
//! host→disk move frees the host slot an offload then fills), then both link directions at once:
//!
//! ```text
//! disk_s     = latency_s + read_bytes ÷ read_bytes_per_s + write_bytes ÷ write_bytes_per_s   (0 without disk traffic)
//! up_s       = host_latency_s + onload_bytes ÷ host_link_bytes_per_s                          (0 without onloads)
//! down_s     = host_latency_s + offload_bytes ÷ host_link_bytes_per_s                         (0 without offloads)
//! transfer_s = disk_s + max(up_s, down_s)
//! onload_s   = disk_s + up_s                                                    (when the last onload landed)
//! ```
//!
//! `onload = "blocking"`: the step's compute starts after its transfers, so
//! `step = transfer_s + compute` (compute = the step's cost without tiers: copies, swaps,
//! arithmetic) and the onload wait is `onload_s`. `onload = "overlap"`: transfers run beside the
//! step's compute and swaps; the link is shared with the swaps, so each direction is busy for
//! its tier bytes plus that direction's swap bytes, and
//! `step = max(compute, disk_s + max(up_busy_s, down_busy_s))` — offloads never delay compute but
//! hold the link; the onload wait is what `disk_s + up_busy_s` took beyond the compute. Swaps
//! themselves are priced as before (their bytes over the link, added to the step), so a step
//! without tier transfers costs exactly what it cost before tiers existed.

use kvbench_cache_api::{OnloadMode, Tier, TierOp};

use crate::backend::sim::profile::DeviceProfile;
use crate::backend::{DiskLink, SwapDirection, SwapOp};

/// One direction of the device's host link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostLink {
    pub bytes_per_s: f64,
    pub latency_s: f64,
}

impl HostLink {
    /// The profile's host link; `swap_bytes_per_s` (`scheduler.swap_gbytes_per_s`) restates its
    /// bandwidth for everything that crosses it (one link: swaps and tier transfers alike).
    pub fn of(profile: &DeviceProfile, swap_bytes_per_s: Option<f64>) -> HostLink {
        HostLink {
            bytes_per_s: swap_bytes_per_s.unwrap_or(profile.host_link_bytes_per_s),
            latency_s: profile.host_link_latency_s.unwrap_or(0.0),
        }
    }

    /// Seconds to move `bytes` one way in one step: the latency once, then the bytes; nothing
    /// for no bytes.
    pub fn transfer_s(&self, bytes: f64) -> f64 {
        if bytes > 0.0 {
            self.latency_s + bytes / self.bytes_per_s
        } else {
            0.0
        }
    }
}

impl DiskLink {
    /// Seconds of one step's disk traffic: the latency once, then reads and writes in turn.
    pub fn transfer_s(&self, read_bytes: f64, write_bytes: f64) -> f64 {
        if read_bytes > 0.0 || write_bytes > 0.0 {
            self.latency_s
                + read_bytes / self.read_bytes_per_s
                + write_bytes / self.write_bytes_per_s
        } else {
            0.0
        }
    }
}

/// One step's tier transfers, in bytes by the queue they cross.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TierLoad {
    /// Host→device: every onload (from the host tier, or from disk through host memory).
    pub up_bytes: f64,
    /// Device→host: every offload leaving the device.
    pub down_bytes: f64,
    pub disk_read_bytes: f64,
    pub disk_write_bytes: f64,
}

impl TierLoad {
    /// Sums `ops` at `kv_bytes_per_token`. An op within one tier, or a disk op without a disk
    /// link, is a seam violation.
    pub fn of(
        ops: &[TierOp],
        kv_bytes_per_token: f64,
        disk: Option<&DiskLink>,
    ) -> Result<TierLoad, String> {
        let mut load = TierLoad::default();
        for op in ops {
            let (from, to) = (op.from.tier, op.to.tier);
            if from == to {
                return Err(format!("tier op {op:?} moves a block within one tier"));
            }
            if (from == Tier::Disk || to == Tier::Disk) && disk.is_none() {
                return Err(format!(
                    "tier op {op:?} uses a disk tier this run does not have"
                ));
            }
            let bytes = op.tokens as f64 * kv_bytes_per_token;
            if to == Tier::Device {
                load.up_bytes += bytes;
            }
            if from == Tier::Device {
                load.down_bytes += bytes;
            }
            if from == Tier::Disk {
                load.disk_read_bytes += bytes;
            }
            if to == Tier::Disk {
                load.disk_write_bytes += bytes;
            }
        }
        Ok(load)
    }
}

/// One step's time with its tier transfers (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TierCost {
    pub disk_s: f64,
    pub up_s: f64,
    pub down_s: f64,
    /// `disk_s + max(up_s, down_s)`.
    pub transfer_s: f64,
    /// The step's whole duration.
    pub total_s: f64,
    /// The part of `total_s` the step's compute waited for its onloads.
    pub onload_wait_s: f64,
}

/// Prices a step's tier transfers around `compute_s`, the step's cost without them.
pub fn price(
    load: &TierLoad,
    compute_s: f64,
    swaps: &[SwapOp],
    kv_bytes_per_token: f64,
    link: &HostLink,
    disk: Option<&DiskLink>,
    mode: OnloadMode,
) -> TierCost {
    let disk_s = disk.map_or(0.0, |d| {
        d.transfer_s(load.disk_read_bytes, load.disk_write_bytes)
    });
    let up_s = link.transfer_s(load.up_bytes);
    let down_s = link.transfer_s(load.down_bytes);
    let transfer_s = disk_s + up_s.max(down_s);
    let onloads = load.up_bytes > 0.0;
    let (total_s, onload_wait_s) = match mode {
        OnloadMode::Blocking => (
            transfer_s + compute_s,
            if onloads { disk_s + up_s } else { 0.0 },
        ),
        OnloadMode::Overlap => {
            let swapped = |dir: SwapDirection| -> f64 {
                swaps
                    .iter()
                    .filter(|s| s.direction == dir)
                    .map(|s| {
                        s.bytes
                            .map_or(s.tokens as f64 * kv_bytes_per_token, |b| b as f64)
                    })
                    .sum::<f64>()
                    / link.bytes_per_s
            };
            let up_busy_s = up_s + swapped(SwapDirection::In);
            let down_busy_s = down_s + swapped(SwapDirection::Out);
            let busy_s = disk_s + up_busy_s.max(down_busy_s);
            let wait = if onloads {
                (disk_s + up_busy_s - compute_s).max(0.0)
            } else {
                0.0
            };
            (compute_s.max(busy_s), wait)
        }
    };
    let finite = |v: f64| if v.is_finite() { v } else { f64::MAX };
    TierCost {
        disk_s,
        up_s,
        down_s,
        transfer_s,
        total_s: finite(total_s),
        onload_wait_s: finite(onload_wait_s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvbench_cache_api::BlockLoc;

    /// Llama-3-8B: 131,072 bytes a token; a block of 16 tokens is 2 MiB.
    const BPT: f64 = 131_072.0;
    const BLOCK: f64 = 16.0 * BPT;
    /// The H200 profile's PCIe 5.0 link: 50 GB/s a direction, 10 us a step.
    const PCIE: HostLink = HostLink {
        bytes_per_s: 50e9,
        latency_s: 10e-6,
    };
    const NVME: DiskLink = DiskLink {
        read_bytes_per_s: 7e9,
        write_bytes_per_s: 5e9,
        latency_s: 80e-6,
    };

    fn op(from: Tier, from_slot: u32, to: Tier, to_slot: u32, seq: Option<u64>) -> TierOp {
        TierOp {
            from: BlockLoc {
                tier: from,
                slot: from_slot,
            },
            to: BlockLoc {
                tier: to,
                slot: to_slot,
            },
            tokens: 16,
            seq,
        }
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() <= 1e-12 * b.abs().max(1e-9), "{a} vs {b}");
    }

    fn priced(ops: &[TierOp], compute_s: f64, swaps: &[SwapOp], mode: OnloadMode) -> TierCost {
        let load = TierLoad::of(ops, BPT, Some(&NVME)).expect("load");
        price(&load, compute_s, swaps, BPT, &PCIE, Some(&NVME), mode)
    }

    #[test]
    fn the_profiles_state_the_links_this_prices() {
        let h200 = DeviceProfile::load("h200", None).expect("h200");
        assert_eq!(HostLink::of(&h200, None), PCIE);
        // GH200's NVLink-C2C: 450 GB/s a direction derated by PCIe's 50/64 (its profile's
        // stated assumption), seven times the H200's PCIe link.
        let gh200 = DeviceProfile::load("gh200", None).expect("gh200");
        let c2c = HostLink::of(&gh200, None);
        assert_eq!(c2c.bytes_per_s, 351.6e9);
        assert!((c2c.bytes_per_s / (450e9 * 50.0 / 64.0) - 1.0).abs() < 1e-3);
        // A swap bandwidth restates the one link.
        assert_eq!(HostLink::of(&h200, Some(25e9)).bytes_per_s, 25e9);
        assert_eq!(PCIE.transfer_s(0.0), 0.0);
    }

    #[test]
    fn a_blocking_onload_from_the_host_adds_latency_and_bytes_over_the_link() {
        let onload = op(Tier::Host, 3, Tier::Device, 7, Some(1));
        let c = priced(&[onload, onload], 1e-3, &[], OnloadMode::Blocking);
        // 10 us + 2 × 2,097,152 B ÷ 50 GB/s = 10 + 83.88608 us.
        close(c.up_s, 93.88608e-6);
        assert_eq!((c.down_s, c.disk_s), (0.0, 0.0));
        close(c.total_s, 1e-3 + 93.88608e-6);
        close(c.onload_wait_s, 93.88608e-6);
    }

    #[test]
    fn offloads_and_onloads_cross_the_link_in_opposite_directions_at_once() {
        let off = op(Tier::Device, 1, Tier::Host, 0, None);
        let on = op(Tier::Host, 2, Tier::Device, 9, Some(4));
        let c = priced(&[off, off, off, on], 2e-3, &[], OnloadMode::Blocking);
        // Down: 10 + 3 × 41.94304 us; up: 10 + 41.94304 us; the longer one bounds the stage.
        close(c.down_s, 135.82912e-6);
        close(c.up_s, 51.94304e-6);
        close(c.transfer_s, 135.82912e-6);
        close(c.total_s, 2e-3 + 135.82912e-6);
        // The request waited for its onload only.
        close(c.onload_wait_s, 51.94304e-6);
        // Offloads alone: no onload wait, but a blocking step still waits for the link.
        let c = priced(&[off], 2e-3, &[], OnloadMode::Blocking);
        assert_eq!(c.onload_wait_s, 0.0);
        close(c.total_s, 2e-3 + 51.94304e-6);
    }

    #[test]
    fn a_disk_onload_reads_the_disk_then_crosses_the_host_link() {
        let from_disk = op(Tier::Disk, 5, Tier::Device, 2, Some(8));
        let spill = op(Tier::Host, 0, Tier::Disk, 6, None);
        let off = op(Tier::Device, 4, Tier::Host, 0, None);
        let c = priced(&[spill, off, from_disk], 1e-3, &[], OnloadMode::Blocking);
        // Disk: 80 us + 2 MiB ÷ 7 GB/s (299.593142857 us) + 2 MiB ÷ 5 GB/s (419.4304 us).
        let disk = 80e-6 + BLOCK / 7e9 + BLOCK / 5e9;
        close(disk, 799.023542857e-6);
        close(c.disk_s, disk);
        close(c.up_s, 51.94304e-6);
        close(c.down_s, 51.94304e-6);
        close(c.transfer_s, disk + 51.94304e-6);
        close(c.total_s, 1e-3 + disk + 51.94304e-6);
        close(c.onload_wait_s, disk + 51.94304e-6);
    }

    #[test]
    fn overlap_hides_transfers_under_compute_and_shares_the_link_with_swaps() {
        let on = op(Tier::Host, 2, Tier::Device, 9, Some(4));
        // Compute longer than the transfer: the step is the compute, nothing waited.
        let c = priced(&[on], 1e-3, &[], OnloadMode::Overlap);
        close(c.total_s, 1e-3);
        assert_eq!(c.onload_wait_s, 0.0);
        // Compute shorter: the step lasts the transfer, the onload wait is the difference.
        let c = priced(&[on], 20e-6, &[], OnloadMode::Overlap);
        close(c.total_s, 51.94304e-6);
        close(c.onload_wait_s, 51.94304e-6 - 20e-6);
        // A swap-in of 1,000 tokens (131.072 MB, 2,621.44 us) queues on the same direction;
        // compute_s already holds the swap (it blocks compute), the link's busy time holds both.
        let swap_in = SwapOp {
            seq: 3,
            direction: SwapDirection::In,
            tokens: 1000,
            bytes: None,
        };
        let compute = 2.65e-3;
        let c = priced(&[on], compute, &[swap_in], OnloadMode::Overlap);
        let busy = 51.94304e-6 + 2_621.44e-6;
        close(c.total_s, busy);
        close(c.onload_wait_s, busy - compute);
        // A swap-out goes the other way and leaves the onload's direction alone.
        let swap_out = SwapOp {
            direction: SwapDirection::Out,
            ..swap_in
        };
        let c = priced(&[on], compute, &[swap_out], OnloadMode::Overlap);
        close(c.total_s, compute);
        assert_eq!(c.onload_wait_s, 0.0);
        // Offloads never delay compute but hold the link.
        let off = op(Tier::Device, 1, Tier::Host, 0, None);
        let c = priced(&[off; 4], 30e-6, &[], OnloadMode::Overlap);
        close(c.total_s, 10e-6 + 4.0 * 41.94304e-6);
        assert_eq!(c.onload_wait_s, 0.0);
    }

    #[test]
    fn ops_the_run_cannot_perform_are_refused() {
        let within = op(Tier::Host, 1, Tier::Host, 2, None);
        assert!(TierLoad::of(&[within], BPT, Some(&NVME)).is_err());
        let disk = op(Tier::Host, 1, Tier::Disk, 2, None);
        let err = TierLoad::of(&[disk], BPT, None).expect_err("no disk");
        assert!(err.contains("disk tier"), "{err}");
    }
}
