//! The emulated device runs a launch's blocks as a GPU may: in a seeded order, two in flight,
//! interleaved at barriers; a shuffle from a lane the warp lacks reads poison. Planted test
//! kernels (`emu/test_kernels.cu`, host build only) that assume otherwise compute something
//! else. Its own test binary: the block order is process-wide.

use std::ffi::c_void;

use kvbench_cuda::emu::kernels::{launch, set_block_order, BlockOrder, Dim3};

fn run(kernel: &str, blocks: u32, threads: u32, args: &[u64]) {
    let mut slots: Vec<u64> = args.to_vec();
    let params: Vec<*mut c_void> = slots
        .iter_mut()
        .map(|s| s as *mut u64 as *mut c_void)
        .collect();
    // SAFETY: every pointer argument points at a buffer sized for the launch.
    unsafe {
        launch(
            kernel,
            Dim3::new(blocks, 1, 1),
            Dim3::new(threads, 1, 1),
            0,
            &params,
        )
    }
    .unwrap_or_else(|e| panic!("{kernel}: {e}"));
}

fn chain(n: usize) -> Vec<i32> {
    let mut out = vec![0i32; n];
    run(
        "emu_test_block_chain",
        n as u32,
        32,
        &[out.as_mut_ptr() as u64],
    );
    out
}

fn overlaps(n: usize) -> i32 {
    let mut state = vec![0i32; n];
    let mut seen = vec![0i32; n];
    run(
        "emu_test_block_overlap",
        n as u32,
        64,
        &[state.as_mut_ptr() as u64, seen.as_mut_ptr() as u64],
    );
    seen.iter().sum()
}

#[test]
fn a_kernel_that_assumes_block_order_fails_under_the_seeded_order() {
    let n = 16;
    let in_order: Vec<i32> = (1..=n as i32).collect();
    set_block_order(BlockOrder::InOrder);
    assert_eq!(chain(n), in_order, "one block at a time in index order");
    assert_eq!(overlaps(n), 0);
    for seed in [1u64, 2, 3] {
        eprintln!("block seed {seed}");
        set_block_order(BlockOrder::Shuffled { seed });
        assert_ne!(chain(n), in_order, "seed {seed}: blocks ran in index order");
        assert!(
            overlaps(n) > 0,
            "seed {seed}: no two blocks were in flight at once"
        );
    }
    // A seed gives the same order every time.
    set_block_order(BlockOrder::Shuffled { seed: 9 });
    let a = chain(n);
    set_block_order(BlockOrder::Shuffled { seed: 9 });
    assert_eq!(chain(n), a);

    // A shuffle whose partner lane the partial warp lacks reads NaN.
    let mut out = vec![0f32; 40];
    run("emu_test_shfl_partial", 1, 40, &[out.as_mut_ptr() as u64]);
    assert_eq!(out[0], 16.0, "full warp: lane 0 reads lane 16");
    assert!(
        out[32].is_nan(),
        "lane 32's partner, lane 48, does not exist: {}",
        out[32]
    );
    assert!(BlockOrder::parse("x").is_err());
    assert_eq!(BlockOrder::parse("off"), Ok(BlockOrder::InOrder));
}
