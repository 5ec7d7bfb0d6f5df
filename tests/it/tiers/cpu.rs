//! The `cpu` backend's lower tiers move real K/V: a block offloaded to the host (or on to the
//! disk), overwritten on the device, and onloaded into another sequence gives that sequence
//! the oracle's logits; an onload left out or read from the wrong slot gives wrong ones, and
//! the check says so. Every KV element type the cpu backend stores is covered.

use crate::support::tier_cpu as tier_cpu_support;

use kvbench::backend::cpu::CpuBackend;
use kvbench::backend::{Backend, StepPlan};
use kvbench::model::Dtype;
use kvbench_cache_api::{BlockLoc, Tier, TierOp};
use tier_cpu_support::{run, setup, From, Onload, BLOCK, HOST_BLOCKS};

const DTYPES: [Dtype; 4] = [Dtype::F32, Dtype::Bf16, Dtype::Fp8E4m3, Dtype::Fp8E5m2];

fn backend(kv: Dtype) -> CpuBackend {
    CpuBackend::new(&setup(kv)).expect("cpu backend with tiers")
}

#[test]
fn blocks_onloaded_from_the_host_and_from_disk_pass_the_oracle() {
    for kv in DTYPES {
        for from in [From::Host, From::Disk] {
            let mut b = backend(kv);
            run(&mut b, from, Onload::Correct).assert_onloaded(&format!("{kv:?} {from:?}"));
        }
    }
}

#[test]
fn an_omitted_onload_fails_the_oracle() {
    for kv in DTYPES {
        for from in [From::Host, From::Disk] {
            let mut b = backend(kv);
            let o = run(&mut b, from, Onload::Omitted);
            o.assert_caught(&format!("{kv:?} {from:?}"));
            assert!(o.numerics.max_rel_err > o.numerics.tolerance);
        }
    }
}

#[test]
fn an_onload_from_the_wrong_slot_fails_the_oracle() {
    for kv in DTYPES {
        for from in [From::Host, From::Disk] {
            let mut b = backend(kv);
            run(&mut b, from, Onload::Duplicated).assert_caught(&format!("{kv:?} {from:?}"));
        }
    }
}

/// The host pool is reported in the ledger: its slots × one block's bytes, computed here from
/// the model's shape (K and V per layer per KV head, plus FP8's f32 scale per slot per head,
/// stored beside dequantised f32 values as the device store keeps them).
#[test]
fn the_host_pool_is_reported_at_its_size() {
    for kv in DTYPES {
        let m = tier_cpu_support::shape(kv);
        let (elem, scales) = match kv {
            Dtype::F32 => (4, 0),
            Dtype::Bf16 => (2, 0),
            _ => (4, m.kv_heads as u64),
        };
        let row = (m.kv_heads * m.head_dim) as u64;
        let block = 2 * m.layers as u64 * BLOCK as u64 * (row + scales) * elem;
        let parts = backend(kv).memory();
        assert_eq!(parts.host_tier_bytes, HOST_BLOCKS as u64 * block, "{kv:?}");
    }
    let mut none = setup(Dtype::F32);
    none.tiers = Default::default();
    let b = CpuBackend::new(&none).expect("cpu backend");
    assert_eq!(b.memory().host_tier_bytes, 0);
}

fn one_op(from: (Tier, u32), to: (Tier, u32), tokens: u32) -> StepPlan {
    StepPlan {
        tier_ops: vec![TierOp {
            from: BlockLoc {
                tier: from.0,
                slot: from.1,
            },
            to: BlockLoc {
                tier: to.0,
                slot: to.1,
            },
            tokens,
            seq: None,
        }],
        ..StepPlan::default()
    }
}

#[test]
fn malformed_tier_ops_are_refused_with_a_step_error() {
    let cache = kvbench::cache::build(&kvbench::cache::CacheSpec::new(
        kvbench_cache_api::CacheMode::Paged,
        tier_cpu_support::CACHE_SLOTS,
        BLOCK,
        false,
    ));
    let bad = [
        (
            one_op((Tier::Device, 0), (Tier::Host, HOST_BLOCKS), BLOCK),
            "past the pool",
        ),
        (
            one_op((Tier::Device, 0), (Tier::Host, 0), BLOCK - 1),
            "one block of",
        ),
        (
            one_op((Tier::Device, 999), (Tier::Host, 0), BLOCK),
            "outside the cache",
        ),
        (
            one_op((Tier::Device, 0), (Tier::Device, 1), BLOCK),
            "device to device",
        ),
    ];
    for (plan, want) in bad {
        let mut b = backend(Dtype::F32);
        let e = b.submit(&plan, cache.as_ref()).expect_err("refused");
        assert!(e.to_string().contains(want), "{e} (wanted {want:?})");
    }
    let mut none = setup(Dtype::F32);
    none.tiers = Default::default();
    let mut b = CpuBackend::new(&none).expect("cpu backend");
    let e = b
        .submit(
            &one_op((Tier::Device, 0), (Tier::Host, 0), BLOCK),
            cache.as_ref(),
        )
        .expect_err("no tier set up");
    assert!(e.to_string().contains("no lower tier"), "{e}");
}

#[test]
fn a_host_pool_too_large_for_the_machine_is_refused() {
    let mut s = setup(Dtype::F32);
    s.tiers.host_blocks = u32::MAX;
    let e = CpuBackend::new(&s).err().expect("refused");
    assert!(e.to_string().contains("host tier of"), "{e}");
}

fn seed() -> u64 {
    let seed = std::env::var("KVBENCH_TIER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x71e5);
    eprintln!("tier driver seed {seed} (replay: KVBENCH_TIER_SEED={seed})");
    seed
}

/// The tiered manager decides every move; the backend performs them on real bytes, and every
/// sequence — those whose prefix came back from the host or the disk included — passes the
/// oracle. The hit counts show the tiers were used (not a vacuous pass).
#[test]
fn tiered_manager_runs_pass_the_oracle_with_host_and_disk_hits() {
    use kvbench_cache_api::OffloadMode;
    use tier_cpu_support::driver::{drive, tiers};
    let seed = seed();
    // bf16 and e5m2 pools move bytes the same way (the hand-made tests above cover them).
    for kv in [Dtype::F32, Dtype::Fp8E4m3] {
        for (host, disk, offload) in [
            (4, 0, OffloadMode::OnEvict),
            (2, 4, OffloadMode::OnEvict),
            (3, 3, OffloadMode::WriteThrough),
        ] {
            let mut s = setup(kv);
            s.cache_slots = tier_cpu_support::driver::DEVICE_BLOCKS * BLOCK as u64;
            s.tiers.host_blocks = host;
            s.tiers.disk_blocks = disk;
            let mut b = CpuBackend::new(&s).expect("cpu backend");
            let d = drive(&mut b, seed, 24, tiers(host, disk, offload), None);
            let label = format!("{kv:?} host {host} disk {disk} {offload:?}");
            assert!(d.numerics.ok, "{label}: {:?}", d.numerics);
            assert!(
                d.numerics.checked_steps >= 24 * 4,
                "{label}: {:?}",
                d.numerics
            );
            assert!(
                d.host_hit_tokens > 0 && d.onloads > 0,
                "{label}: no host hit"
            );
            assert!(d.offloads > 0, "{label}: nothing offloaded");
            if disk > 0 {
                assert!(
                    d.disk_hit_tokens > 0 && d.moves_to_disk > 0,
                    "{label}: no disk hit"
                );
            }
            assert_eq!(
                d.onloads * u64::from(BLOCK),
                d.host_hit_tokens + d.disk_hit_tokens,
                "{label}: one onload per block hit"
            );
        }
    }
}

/// Two requests per step: one start's onloads and the other's evictions and offloads share
/// the step's tier ops.
#[test]
fn batched_tiered_runs_pass_the_oracle() {
    use kvbench_cache_api::OffloadMode;
    use tier_cpu_support::driver::{drive_batched, tiers, DEVICE_BLOCKS};
    let seed = seed();
    for (host, disk, offload) in [
        (3, 3, OffloadMode::OnEvict),
        (4, 2, OffloadMode::WriteThrough),
    ] {
        let mut s = setup(Dtype::F32);
        s.cache_slots = 2 * DEVICE_BLOCKS * BLOCK as u64;
        s.tiers.host_blocks = host;
        s.tiers.disk_blocks = disk;
        let mut b = CpuBackend::new(&s).expect("cpu backend");
        let d = drive_batched(&mut b, seed, 24, 2, tiers(host, disk, offload), None);
        d.assert_passed_with_host_and_disk_hits(&format!("host {host} disk {disk} {offload:?}"));
    }
}

/// Planted fault `stale-onload`: the manager hands a host slot out again while an onload from
/// it has not run; the onload copies the new content, and the oracle check fails.
#[test]
fn a_stale_onload_is_caught_by_the_oracle() {
    use kvbench_cache_api::{Fault, OffloadMode};
    use tier_cpu_support::driver::{drive, tiers};
    let seed = seed();
    for (host, disk) in [(2, 0), (2, 2)] {
        let mut s = setup(Dtype::F32);
        s.cache_slots = tier_cpu_support::driver::DEVICE_BLOCKS * BLOCK as u64;
        s.tiers.host_blocks = host;
        s.tiers.disk_blocks = disk;
        let mut b = CpuBackend::new(&s).expect("cpu backend");
        let d = drive(
            &mut b,
            seed,
            24,
            tiers(host, disk, OffloadMode::OnEvict),
            Some(Fault::StaleOnload),
        );
        assert!(d.fault_fired > 0, "host {host} disk {disk}: never fired");
        assert!(
            !d.numerics.ok,
            "host {host} disk {disk}: not caught: {:?}",
            d.numerics
        );
    }
}

#[test]
fn onloads_run_as_late_as_the_op_order_allows() {
    use kvbench::backend::cpu::late_onload_order;
    let op = |from: (Tier, u32), to: (Tier, u32)| TierOp {
        from: BlockLoc {
            tier: from.0,
            slot: from.1,
        },
        to: BlockLoc {
            tier: to.0,
            slot: to.1,
        },
        tokens: BLOCK,
        seq: None,
    };
    let (d, h, k) = (Tier::Device, Tier::Host, Tier::Disk);
    // An offload into the slot an onload reads (a stale reuse) lands first.
    let ops = [op((d, 1), (h, 0)), op((h, 1), (d, 2)), op((d, 3), (h, 1))];
    assert_eq!(late_onload_order(&ops), vec![0, 2, 1]);
    // An op reading the onload's device block waits for it.
    let ops = [op((h, 0), (d, 5)), op((d, 5), (h, 1))];
    assert_eq!(late_onload_order(&ops), vec![0, 1]);
    // Two onloads into one block keep their order; a disk move passes an onload.
    let ops = [op((h, 0), (d, 5)), op((k, 1), (d, 5)), op((h, 2), (k, 0))];
    assert_eq!(late_onload_order(&ops), vec![0, 2, 1]);
    let ops = [op((h, 0), (d, 2)), op((h, 1), (k, 0)), op((d, 4), (h, 1))];
    assert_eq!(late_onload_order(&ops), vec![1, 2, 0]);
}
