//! `sim` charges a step's tier transfers (`backend/sim/link.rs`): through `SimBackend::submit`
//! a step's duration and onload wait are the hand-computed figures, a step without tier ops
//! costs what it always did, an op the run's tiers cannot perform is refused, and `kvbench
//! plan --host-tier` prices an onload with the very figure a blocking step is charged.

use kvbench::backend::sim::cost::CostModel;
use kvbench::backend::sim::profile::DeviceProfile;
use kvbench::backend::sim::SimBackend;
use kvbench::backend::{
    Backend, DiskLink, RunSetup, SeqWork, StepPlan, SwapDirection, SwapOp, TierSetup,
};
use kvbench::cache::{build, CacheSpec};
use kvbench::model::ModelShape;
use kvbench::plan::{PlanInput, TierPlan};
use kvbench::scenario::Reservation;
use kvbench_cache_api::{BlockLoc, CacheMode, OnloadMode, Tier, TierOp};

const BPT: f64 = 131_072.0;

fn setup(device: &str, tiers: TierSetup) -> RunSetup {
    RunSetup {
        model: ModelShape::llama3_8b(),
        device: device.into(),
        scenario_dir: None,
        cache_slots: 1 << 16,
        block_size: 16,
        seed: 1,
        max_step_tokens: 4096,
        swap_gbytes_per_s: None,
        workspace_bytes: None,
        profile: None,
        clock: Default::default(),
        tiers,
    }
}

fn host_tier(onload: OnloadMode) -> TierSetup {
    TierSetup {
        host_blocks: 1024,
        disk_blocks: 0,
        onload,
        disk: None,
    }
}

fn onload(slot: u32, seq: u64) -> TierOp {
    TierOp {
        from: BlockLoc {
            tier: Tier::Host,
            slot,
        },
        to: BlockLoc {
            tier: Tier::Device,
            slot: 100 + slot,
        },
        tokens: 16,
        seq: Some(seq),
    }
}

fn prefill(seq: u64, context: u32, new: u32) -> SeqWork {
    SeqWork {
        seq,
        context_tokens: context,
        new_tokens: new,
        sample: true,
    }
}

/// (duration, onload wait) of one step through the backend.
fn step(backend: &mut SimBackend, plan: &StepPlan) -> (f64, f64) {
    let cache = build(&CacheSpec::new(CacheMode::Paged, 1 << 16, 16, true));
    backend.submit(plan, cache.as_ref()).expect("submit");
    let out = backend.complete().expect("complete");
    (out.duration_s, out.onload_wait_s)
}

fn close(a: f64, b: f64) {
    assert!((a - b).abs() <= 1e-12 * b.abs(), "{a} vs {b}");
}

#[test]
fn a_step_without_tier_ops_costs_what_the_cost_model_says_bit_for_bit() {
    let plan = StepPlan {
        seqs: vec![prefill(1, 512, 256), prefill(2, 2000, 1)],
        swaps: vec![SwapOp {
            seq: 3,
            direction: SwapDirection::Out,
            tokens: 300,
            bytes: None,
        }],
        ..Default::default()
    };
    for onload in [OnloadMode::Blocking, OnloadMode::Overlap] {
        let mut b = SimBackend::new(&setup("h200", host_tier(onload))).expect("sim");
        let (d, wait) = step(&mut b, &plan);
        let cost = CostModel::new(&ModelShape::llama3_8b(), b.profile(), None);
        let want = cost
            .step(&plan.seqs, &plan.copies, &plan.swaps, true)
            .total_s;
        assert_eq!(d.to_bits(), want.to_bits());
        assert_eq!(wait, 0.0);
    }
}

#[test]
fn a_blocking_onload_of_a_prefix_delays_the_step_by_its_transfer() {
    // 256 blocks (4,096 tokens, 512 MiB) onloaded before a 64-token prefill continues them.
    let ops: Vec<TierOp> = (0..256).map(|i| onload(i, 1)).collect();
    let plan = StepPlan {
        tier_ops: ops,
        seqs: vec![prefill(1, 4096, 64)],
        ..Default::default()
    };
    let mut b = SimBackend::new(&setup("h200", host_tier(OnloadMode::Blocking))).expect("sim");
    let (d, wait) = step(&mut b, &plan);
    let cost = CostModel::new(&ModelShape::llama3_8b(), b.profile(), None);
    let compute = cost.step(&plan.seqs, &[], &[], true).total_s;
    // PCIe 5.0: 10 us + 4,096 × 131,072 B ÷ 50 GB/s = 10 + 10,737.41824 us.
    let transfer = 10e-6 + 4096.0 * BPT / 50e9;
    close(transfer, 10.747_418_24e-3);
    close(wait, transfer);
    close(d, compute + transfer);

    // The same step overlapped: the transfer outlasts this short prefill (about 4 ms, most of
    // it reading 16 GB of weights), so the step is the transfer and the wait what it took
    // beyond the compute.
    let mut b = SimBackend::new(&setup("h200", host_tier(OnloadMode::Overlap))).expect("sim");
    let (d, wait) = step(&mut b, &plan);
    assert!(compute < transfer, "{compute} vs {transfer}");
    close(d, transfer);
    close(wait, transfer - compute);

    // On a GH200 the C2C link carries it seven times faster (351.6 GB/s).
    let mut b = SimBackend::new(&setup("gh200", host_tier(OnloadMode::Blocking))).expect("sim");
    let (_, wait) = step(&mut b, &plan);
    close(wait, 10e-6 + 4096.0 * BPT / 351.6e9);
}

#[test]
fn a_disk_hit_pays_the_disk_then_the_link() {
    let disk = DiskLink {
        read_bytes_per_s: 3e9,
        write_bytes_per_s: 2e9,
        latency_s: 100e-6,
    };
    let tiers = TierSetup {
        host_blocks: 16,
        disk_blocks: 64,
        onload: OnloadMode::Blocking,
        disk: Some(disk),
    };
    let from_disk = TierOp {
        from: BlockLoc {
            tier: Tier::Disk,
            slot: 9,
        },
        ..onload(0, 2)
    };
    let plan = StepPlan {
        tier_ops: vec![from_disk, from_disk],
        seqs: vec![prefill(2, 32, 8)],
        ..Default::default()
    };
    let mut b = SimBackend::new(&setup("h200", tiers)).expect("sim");
    let (d, wait) = step(&mut b, &plan);
    let cost = CostModel::new(&ModelShape::llama3_8b(), b.profile(), None);
    let compute = cost.step(&plan.seqs, &[], &[], true).total_s;
    let bytes = 32.0 * BPT;
    let transfer = (100e-6 + bytes / 3e9) + (10e-6 + bytes / 50e9);
    close(wait, transfer);
    close(d, compute + transfer);

    // Without a disk tier the same op is a seam violation, refused.
    let mut b = SimBackend::new(&setup("h200", host_tier(OnloadMode::Blocking))).expect("sim");
    let cache = build(&CacheSpec::new(CacheMode::Paged, 1 << 16, 16, true));
    let err = b.submit(&plan, cache.as_ref()).expect_err("no disk tier");
    assert!(err.to_string().contains("disk tier"), "{err}");
}

/// `kvbench plan --host-tier` and `sim` read the host link through one function: the plan's
/// onload time of a 4,096-token prefix is the onload wait `sim` charges a blocking step that
/// onloads it from the host tier, on every shipped profile with a host link latency.
#[test]
fn plan_prices_an_onload_exactly_as_sim_charges_it() {
    for device in ["h200", "gh200", "h100", "b200", "mi300x"] {
        let profile = DeviceProfile::load(device, None).expect("profile");
        let input = PlanInput {
            shape: ModelShape::llama3_8b(),
            block_size: 16,
            max_seq_len: 8192,
            reservation: Reservation::MaxSeqLen,
            budget_bytes: None,
        };
        let plan = TierPlan::compute(&input, &profile, 64 << 30, 4096).expect("tier plan");
        let ops: Vec<TierOp> = (0..256).map(|i| onload(i, 1)).collect();
        let step_plan = StepPlan {
            tier_ops: ops,
            seqs: vec![prefill(1, 4096, 1)],
            ..Default::default()
        };
        let mut b = SimBackend::new(&setup(device, host_tier(OnloadMode::Blocking))).expect("sim");
        let (_, wait) = step(&mut b, &step_plan);
        assert_eq!(
            plan.onload_s.to_bits(),
            wait.to_bits(),
            "{device}: plan {} s, sim {} s",
            plan.onload_s,
            wait
        );
    }
}

/// A scenario's `scheduler.swap_gbytes_per_s` restates its host link for `plan --host-tier` as
/// it does for `sim`: the slow-link scenario is priced at 2 GB/s, where onloading a token costs
/// more than recomputing it and no prefix breaks even.
#[test]
fn plan_of_a_scenario_reads_the_link_its_run_is_charged_on() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .args([
            "plan",
            "--scenario",
            concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/tier-no-pay-8b.toml"),
            "--host-tier",
            "4 GiB",
            "--json",
        ])
        .output()
        .expect("run kvbench plan");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let t = &v["host_tier"];
    assert_eq!(t["host_link_bytes_per_s"].as_f64(), Some(2e9), "{t}");
    let f = |k: &str| t[k].as_f64().unwrap_or(f64::NAN);
    close(f("onload_s"), 10e-6 + 4096.0 * BPT / 2e9);
    assert!(f("onload_s") > f("recompute_s"), "{t}");
    assert!(t["break_even_tokens"].is_null(), "{t}");
}
