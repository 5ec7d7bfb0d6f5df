//! The `cuda` backend's lower tiers on the emulated device: offloads and onloads are
//! asynchronous copies between device KV and page-locked host memory on the step's stream, a
//! host → disk move waits for the event of the step that filled the host slot (on the emulated
//! device a read before that event sees NaN, which the oracle would catch), and a block that
//! comes back from the host or the disk gives the oracle's logits — and a wrong onload does not.

#[path = "it/support/tier_cpu/mod.rs"]
mod tier_cpu_support;

use kvbench::backend::cuda::backend::{take_teardowns, CudaBackend};
use kvbench::backend::Backend;
use kvbench::model::Dtype;
use tier_cpu_support::{run, setup, From, Onload, BLOCK, HOST_BLOCKS};

fn backend(kv: Dtype) -> CudaBackend {
    kvbench::backend::cuda::set_emu_seed(11);
    CudaBackend::new(&setup(kv), true).expect("cuda-emu backend with tiers")
}

#[test]
fn blocks_onloaded_from_pinned_host_memory_and_from_disk_pass_the_oracle() {
    take_teardowns();
    for kv in [Dtype::F32, Dtype::Bf16] {
        for from in [From::Host, From::Disk] {
            let mut b = backend(kv);
            run(&mut b, from, Onload::Correct).assert_onloaded(&format!("{kv:?} {from:?}"));
            drop(b);
            let t = take_teardowns();
            assert!(t.len() == 1 && t[0].ok(), "{kv:?} {from:?}: {t:?}");
        }
    }
}

#[test]
fn a_wrong_onload_fails_the_oracle_on_the_emulated_device() {
    take_teardowns();
    for onload in [Onload::Omitted, Onload::Duplicated] {
        for from in [From::Host, From::Disk] {
            let mut b = backend(Dtype::F32);
            run(&mut b, from, onload).assert_caught(&format!("{onload:?} {from:?}"));
        }
    }
    take_teardowns();
}

/// The pinned host pool is in the ledger (K and V rows of every layer per slot); it is host
/// memory, so the device's free memory does not move for it (the teardown reconciles).
#[test]
fn the_pinned_host_pool_is_reported_and_the_device_ledger_still_reconciles() {
    take_teardowns();
    let m = tier_cpu_support::shape(Dtype::Bf16);
    let block = 2 * m.layers as u64 * BLOCK as u64 * (m.kv_heads * m.head_dim) as u64 * 2;
    let b = backend(Dtype::Bf16);
    assert_eq!(b.memory().host_tier_bytes, HOST_BLOCKS as u64 * block);
    let r = b.reconciliation().expect("reconciliation");
    assert!(r.residue_ok, "{r:?}");
    drop(b);
    assert!(take_teardowns().iter().all(|t| t.ok()));
}

/// The tiered paged manager decides the moves; the emulated device performs them with its
/// seeded completion delays, and every sequence passes the oracle with host and disk hits.
#[test]
fn tiered_manager_runs_pass_the_oracle_on_the_emulated_device() {
    use kvbench_cache_api::OffloadMode;
    use tier_cpu_support::driver::{drive, tiers, DEVICE_BLOCKS};
    take_teardowns();
    let seed = 0x71e5;
    eprintln!("tier driver seed {seed}, emulator delay seed 11");
    for (kv, host, disk, offload) in [
        (Dtype::F32, 2, 4, OffloadMode::OnEvict),
        (Dtype::Bf16, 3, 3, OffloadMode::WriteThrough),
    ] {
        let mut s = setup(kv);
        s.cache_slots = DEVICE_BLOCKS * BLOCK as u64;
        s.tiers.host_blocks = host;
        s.tiers.disk_blocks = disk;
        kvbench::backend::cuda::set_emu_seed(11);
        let mut b = CudaBackend::new(&s, true).expect("cuda-emu backend");
        let d = drive(&mut b, seed, 20, tiers(host, disk, offload), None);
        let label = format!("{kv:?} host {host} disk {disk} {offload:?}");
        d.assert_passed_with_host_and_disk_hits(&label);
        assert!(d.offloads > 0 && d.moves_to_disk > 0, "{label}");
        drop(b);
        let t = take_teardowns();
        assert!(t.len() == 1 && t[0].ok(), "{label}: {t:?}");
    }
}

/// Two requests per step on the emulated device: one start's onloads and the other's offloads
/// queued on the stream in one step.
#[test]
fn batched_tiered_runs_pass_the_oracle_on_the_emulated_device() {
    use kvbench_cache_api::OffloadMode;
    use tier_cpu_support::driver::{drive_batched, tiers, DEVICE_BLOCKS};
    take_teardowns();
    let mut s = setup(Dtype::F32);
    s.cache_slots = 2 * DEVICE_BLOCKS * BLOCK as u64;
    s.tiers.host_blocks = 3;
    s.tiers.disk_blocks = 3;
    let mut b = backend_with(&s);
    let d = drive_batched(
        &mut b,
        0x71e5,
        24,
        2,
        tiers(3, 3, OffloadMode::OnEvict),
        None,
    );
    d.assert_passed_with_host_and_disk_hits("batched");
    drop(b);
    let t = take_teardowns();
    assert!(t.len() == 1 && t[0].ok(), "{t:?}");
}

#[test]
fn a_stale_onload_is_caught_on_the_emulated_device() {
    use kvbench_cache_api::{Fault, OffloadMode};
    use tier_cpu_support::driver::{drive, tiers, DEVICE_BLOCKS};
    take_teardowns();
    let mut s = setup(Dtype::F32);
    s.cache_slots = DEVICE_BLOCKS * BLOCK as u64;
    s.tiers.host_blocks = 2;
    s.tiers.disk_blocks = 0;
    let mut b = backend_with(&s);
    let d = drive(
        &mut b,
        0x71e5,
        24,
        tiers(2, 0, OffloadMode::OnEvict),
        Some(Fault::StaleOnload),
    );
    assert!(d.fault_fired > 0, "never fired");
    assert!(!d.numerics.ok, "not caught: {:?}", d.numerics);
    drop(b);
    take_teardowns();
}

fn backend_with(s: &kvbench::backend::RunSetup) -> CudaBackend {
    kvbench::backend::cuda::set_emu_seed(11);
    CudaBackend::new(s, true).expect("cuda-emu backend")
}
