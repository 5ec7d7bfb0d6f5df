//! The quick correctness grid on a real GPU, where one exists (a developer machine with Rust and
//! a GPU; the GPU check box runs the full grid through `kvbench cuda-check` instead). Elsewhere
//! it prints `SKIP: no CUDA device` and checks nothing.

use kvbench_cuda::check::{self, GridSize};
use kvbench_cuda::device::Gpu;

#[test]
fn quick_grid_passes_on_the_device() {
    let gpu = match Gpu::open() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("SKIP: no CUDA device: {e}");
            return;
        }
    };
    let seed = std::env::var("KVBENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    eprintln!(
        "{} seed {seed} (replay: KVBENCH_SEED={seed})",
        gpu.info.name
    );
    let rows = check::run(&gpu, seed, GridSize::Quick).expect("grid ran");
    assert!(rows.len() > 6, "grid is not empty");
    let bad: Vec<_> = rows.iter().filter(|r| !r.ok).collect();
    assert!(bad.is_empty(), "failed: {bad:#?}");
}
