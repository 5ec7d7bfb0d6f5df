//! The `cpu` backend's lower tiers move real K/V: a block offloaded to the host (or on to the
//! disk), overwritten on the device, and onloaded into another sequence gives that sequence
//! the oracle's logits; an onload left out or read from the wrong slot gives wrong ones, and
//! the check says so. Every KV element type the cpu backend stores is covered.

mod tier_cpu_support;

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
            let o = run(&mut b, from, Onload::Correct);
            assert_eq!(o.onloads, 2, "{kv:?} {from:?}");
            assert!(
                o.numerics.ok && o.numerics.checked_steps >= 3,
                "{kv:?} {from:?}: {:?}",
                o.numerics
            );
            assert!(
                o.onload_wait_s > 0.0,
                "{kv:?} {from:?}: onloads took no time"
            );
        }
    }
}

#[test]
fn an_omitted_onload_fails_the_oracle() {
    for kv in DTYPES {
        for from in [From::Host, From::Disk] {
            let mut b = backend(kv);
            let o = run(&mut b, from, Onload::Omitted);
            assert!(!o.numerics.ok, "{kv:?} {from:?}: {:?}", o.numerics);
            assert!(o.numerics.max_rel_err > o.numerics.tolerance);
        }
    }
}

#[test]
fn an_onload_from_the_wrong_slot_fails_the_oracle() {
    for kv in DTYPES {
        for from in [From::Host, From::Disk] {
            let mut b = backend(kv);
            let o = run(&mut b, from, Onload::Duplicated);
            assert!(!o.numerics.ok, "{kv:?} {from:?}: {:?}", o.numerics);
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
    let cache = kvbench::cache::build(
        kvbench_cache_api::CacheMode::Paged,
        tier_cpu_support::CACHE_SLOTS,
        BLOCK,
        false,
    );
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
