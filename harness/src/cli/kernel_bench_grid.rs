//! What both branches of `kvbench kernel-bench` (cpu in `kernel_bench.rs`, cuda in
//! `kernel_bench_cuda.rs`) share: the grid's axes and where `kernel_bench.csv` goes. Below both,
//! so neither imports the other's internals.

use anyhow::{bail, Context};

/// One axis of the grid: the values given on the command line, else the quick or the full set.
pub(super) fn grid_axis(
    quick_grid: bool,
    given: &[usize],
    quick: &[usize],
    full: &[usize],
) -> Vec<usize> {
    if !given.is_empty() {
        given.to_vec()
    } else if quick_grid {
        quick.to_vec()
    } else {
        full.to_vec()
    }
}

/// Where `kernel_bench.csv` goes, with its folder made (or refused) before minutes of
/// measurement, not after.
pub(super) fn csv_target(
    out: Option<&std::path::Path>,
) -> anyhow::Result<Option<std::path::PathBuf>> {
    let Some(dir) = out else {
        return Ok(None);
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("kernel_bench.csv");
    if path.symlink_metadata().is_ok_and(|m| !m.is_file()) {
        bail!(
            "{}: is not a regular file; refusing to replace it",
            path.display()
        );
    }
    Ok(Some(path))
}
