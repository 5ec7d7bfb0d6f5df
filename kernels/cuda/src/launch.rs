//! Host-side rules of the attention kernels, as pure functions: which shapes have a kernel, how a
//! row is split into partitions, and the checks that keep every device index in range. The
//! device code trusts these (it does no bounds checks of its own).

use crate::error::CudaError;
use crate::source::{GROUPS, HEAD_DIMS};

/// Threads per attention block (`ATTN_THREADS` in attention.cu).
pub const ATTN_THREADS: u32 = 128;
/// Largest partition the attention kernel's shared memory holds (`ATTN_MAX_PART`).
pub const ATTN_MAX_PART_TOKENS: u32 = 512;
/// Smallest partition the planner picks: below it the merge costs more than the parallelism buys.
pub const ATTN_MIN_PART_TOKENS: u32 = 64;

/// Attention heads of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl AttnShape {
    pub fn group(&self) -> usize {
        self.q_heads / self.kv_heads.max(1)
    }

    /// Elements of one K or V slot row.
    pub fn kv_row(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Elements of one query (or output) row.
    pub fn q_row(&self) -> usize {
        self.q_heads * self.head_dim
    }

    /// Ok when a kernel is instantiated for this shape.
    pub fn check(&self) -> Result<(), CudaError> {
        if self.kv_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return Err(CudaError::Shape(format!(
                "q_heads {} is not a positive multiple of kv_heads {}",
                self.q_heads, self.kv_heads
            )));
        }
        if !GROUPS.contains(&self.group()) {
            return Err(CudaError::Shape(format!(
                "group size {} (q_heads/kv_heads) has no CUDA kernel (built: {GROUPS:?})",
                self.group()
            )));
        }
        if !HEAD_DIMS.contains(&self.head_dim) {
            return Err(CudaError::Shape(format!(
                "head_dim {} has no CUDA kernel (built: {HEAD_DIMS:?})",
                self.head_dim
            )));
        }
        Ok(())
    }
}

/// log2 of a block size, which must be a power of two (the kernel masks and shifts).
pub fn log2_block_size(block_size: usize) -> Result<u32, CudaError> {
    if block_size == 0 || !block_size.is_power_of_two() || block_size > 1 << 20 {
        return Err(CudaError::Shape(format!(
            "block size {block_size}: the CUDA kernels take a power of two"
        )));
    }
    Ok(block_size.trailing_zeros())
}

/// How rows are split: `part_tokens` per partition, `parts` partitions (grid z).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partitions {
    pub part_tokens: u32,
    pub parts: u32,
}

/// The partition size for a launch: the largest power of two in [64, 512] that still gives
/// about two blocks per SM, so a small batch of long rows fills the GPU, and a large batch is
/// not split more than it needs.
pub fn plan_partitions(
    rows: usize,
    kv_heads: usize,
    max_len: usize,
    sm_count: usize,
) -> Partitions {
    let blocks = |p: u32| rows * kv_heads * max_len.div_ceil(p as usize).max(1);
    let mut p = ATTN_MAX_PART_TOKENS;
    while p > ATTN_MIN_PART_TOKENS && blocks(p) < 2 * sm_count {
        p /= 2;
    }
    fixed_partitions(max_len, p)
}

/// Partitions of a given size (tests force small ones to exercise the merge).
pub fn fixed_partitions(max_len: usize, part_tokens: u32) -> Partitions {
    let p = part_tokens.clamp(1, ATTN_MAX_PART_TOKENS);
    Partitions {
        part_tokens: p,
        parts: (max_len.div_ceil(p as usize)).max(1) as u32,
    }
}

/// The first position a query row of `len_tokens` attends under a sliding `window` (0: none,
/// the row attends from position 0): the query at position `p = len − 1` sees `(p − window, p]`,
/// as `kvbench-kernels`' sliding layers and the oracle do. The kernels compute the same bound
/// (`attn_row_lo` in attention.cu); the host uses it for what a launch must have mapped.
pub fn window_start(len_tokens: usize, window: usize) -> usize {
    if window == 0 {
        0
    } else {
        len_tokens.saturating_sub(window)
    }
}

/// A sliding window as the kernels take it (an `int`; 0 = none). A row then reads only the
/// partitions from the one holding [`window_start`] on, and a key tile only from the tile's
/// earliest window start: positions before it are never looked up, so a block table may map
/// anything there (blocks released behind the window).
pub fn window_arg(window: usize) -> Result<i32, CudaError> {
    i32::try_from(window).map_err(|_| {
        CudaError::Shape(format!(
            "sliding window of {window} tokens: the kernels take at most {}",
            i32::MAX
        ))
    })
}

/// The partitions `[first, used)` a row of `len_tokens` has under `window` with `part_tokens`
/// per partition: what `attn_merge` reads and the attention kernel writes for it.
pub fn row_partitions(len_tokens: usize, window: usize, part_tokens: u32) -> (usize, usize) {
    let p = part_tokens.max(1) as usize;
    (window_start(len_tokens, window) / p, len_tokens.div_ceil(p))
}

/// Every slot of a KV write in range (negative = padding, skipped).
pub fn check_slots(slots: &[i64], num_slots: usize) -> Result<(), CudaError> {
    match slots.iter().find(|&&s| s >= num_slots as i64) {
        Some(bad) => Err(CudaError::Shape(format!(
            "slot {bad} out of range (cache has {num_slots} slots)"
        ))),
        None => Ok(()),
    }
}

/// A copy list the one-block-per-pair kernel performs exactly: every index in range, and no
/// destination also read or written by another pair (so the order of the pairs cannot matter).
pub fn check_copy_pairs(pairs: &[(i64, i64)], num_slots: usize) -> Result<(), CudaError> {
    let in_range = |s: i64| s >= 0 && (s as u64) < num_slots as u64;
    if let Some(&(s, d)) = pairs.iter().find(|&&(s, d)| !in_range(s) || !in_range(d)) {
        return Err(CudaError::Shape(format!(
            "copy {s} -> {d} out of range (cache has {num_slots} slots)"
        )));
    }
    let mut dsts: Vec<i64> = pairs.iter().map(|p| p.1).collect();
    dsts.sort_unstable();
    if let Some(w) = dsts.windows(2).find(|w| w[0] == w[1]) {
        return Err(CudaError::Shape(format!(
            "slot {} is the destination of two copies",
            w[0]
        )));
    }
    if let Some(&(s, _)) = pairs.iter().find(|p| dsts.binary_search(&p.0).is_ok()) {
        return Err(CudaError::Shape(format!(
            "slot {s} is both copied from and copied to in one step"
        )));
    }
    Ok(())
}

/// Expands `(src, dst, len)` slot ranges into the kernel's pairs.
pub fn copy_pairs(ops: &[(usize, usize, usize)]) -> Vec<(i64, i64)> {
    ops.iter()
        .flat_map(|&(s, d, n)| (0..n).map(move |i| ((s + i) as i64, (d + i) as i64)))
        .collect()
}

/// A block table row checked against the cache: every block the row's length needs is mapped
/// and inside `num_slots`.
pub fn check_table(
    blocks: &[u32],
    len_tokens: usize,
    block_size: usize,
    num_slots: usize,
) -> Result<(), CudaError> {
    let need = len_tokens.div_ceil(block_size.max(1));
    if need > blocks.len() {
        return Err(CudaError::Shape(format!(
            "length {len_tokens} needs {need} blocks, table maps {}",
            blocks.len()
        )));
    }
    let num_blocks = num_slots / block_size.max(1);
    if let Some(b) = blocks[..need].iter().find(|&&b| b as usize >= num_blocks) {
        return Err(CudaError::Shape(format!(
            "block {b} out of range (cache has {num_blocks} blocks)"
        )));
    }
    Ok(())
}

/// Grid limits of every CUDA device since compute capability 3.0: x up to 2^31 - 1 blocks,
/// y and z up to 65,535. A launch past them fails at run time, so it is refused on the host.
pub const GRID_X_MAX: usize = (1 << 31) - 1;
pub const GRID_YZ_MAX: usize = 65_535;

/// A launch grid `(x, y, z)`, each dimension checked against the device limits and at least 1;
/// `what` names the dimensions in the error (`"heads, rows, partitions"`).
pub fn grid(x: usize, y: usize, z: usize, what: &str) -> Result<(u32, u32, u32), CudaError> {
    let ok = |n: usize, max: usize| (1..=max).contains(&n);
    if !ok(x, GRID_X_MAX) || !ok(y, GRID_YZ_MAX) || !ok(z, GRID_YZ_MAX) {
        return Err(CudaError::Shape(format!(
            "launch grid ({x}, {y}, {z}) of ({what}) outside the device limits \
             (x 1..={GRID_X_MAX}, y and z 1..={GRID_YZ_MAX})"
        )));
    }
    // In range of u32 by the checks above.
    Ok((x as u32, y as u32, z as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_without_a_kernel_are_refused() {
        let ok = AttnShape {
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
        };
        assert!(ok.check().is_ok());
        for bad in [
            AttnShape {
                q_heads: 32,
                kv_heads: 0,
                head_dim: 128,
            },
            AttnShape {
                q_heads: 30,
                kv_heads: 8,
                head_dim: 128,
            },
            AttnShape {
                q_heads: 48,
                kv_heads: 3,
                head_dim: 128,
            },
            AttnShape {
                q_heads: 32,
                kv_heads: 8,
                head_dim: 96,
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn grids_past_the_device_limits_are_errors() {
        assert_eq!(grid(8, 65_535, 2, "t").unwrap(), (8, 65_535, 2));
        let e = grid(8, 65_536, 1, "heads, rows, partitions").unwrap_err();
        assert!(e.to_string().contains("rows"), "{e}");
        assert!(grid(8, 1, 65_536, "t").is_err());
        assert!(grid(1 << 31, 1, 1, "t").is_err());
        assert!(grid(0, 1, 1, "t").is_err());
    }

    #[test]
    fn block_sizes_must_be_powers_of_two() {
        assert_eq!(log2_block_size(16).ok(), Some(4));
        assert_eq!(log2_block_size(1).ok(), Some(0));
        for bad in [0, 12, 48] {
            assert!(log2_block_size(bad).is_err());
        }
    }

    #[test]
    fn partitions_shrink_until_the_gpu_is_filled_and_cover_the_longest_row() {
        // 64 rows x 8 kv heads already fill 132 SMs: no split below 512.
        assert_eq!(
            plan_partitions(64, 8, 2048, 132),
            Partitions {
                part_tokens: 512,
                parts: 4
            }
        );
        // One row: shrink to the 64-token floor.
        assert_eq!(
            plan_partitions(1, 8, 512, 132),
            Partitions {
                part_tokens: 64,
                parts: 8
            }
        );
        // 512 gives 4 x 8 x 8 = 256 blocks < 264; 256 gives 512.
        let p = plan_partitions(4, 8, 4096, 132);
        assert_eq!(
            p,
            Partitions {
                part_tokens: 256,
                parts: 16
            }
        );
        for (rows, len) in [(1usize, 1usize), (3, 17), (2, 4097)] {
            let p = plan_partitions(rows, 2, len, 132);
            assert!(p.part_tokens as usize * p.parts as usize >= len);
            assert!(p.part_tokens <= ATTN_MAX_PART_TOKENS && p.parts >= 1);
        }
    }

    #[test]
    fn copy_lists_with_chains_or_double_targets_are_refused() {
        assert!(check_copy_pairs(&copy_pairs(&[(0, 16, 16), (32, 48, 5)]), 64).is_ok());
        assert!(
            check_copy_pairs(&[(0, 1), (2, 1)], 8).is_err(),
            "two writers"
        );
        assert!(check_copy_pairs(&[(0, 1), (1, 2)], 8).is_err(), "chain");
        assert!(check_copy_pairs(&[(0, 8)], 8).is_err(), "range");
        assert!(check_copy_pairs(&[(-1, 2)], 8).is_err(), "negative");
    }

    #[test]
    fn a_window_starts_window_positions_before_the_row_end_and_picks_its_partitions() {
        assert_eq!(window_start(100, 0), 0, "no window");
        assert_eq!(window_start(100, 12), 88, "positions 88..=99");
        assert_eq!(window_start(5, 12), 0, "a window longer than the row");
        assert_eq!(window_start(12, 12), 0);
        assert_eq!(window_start(13, 12), 1);
        assert_eq!(window_start(1, 1), 0);
        assert_eq!(window_start(7, 1), 6, "window 1: the token itself");
        assert_eq!(row_partitions(1200, 0, 512), (0, 3));
        assert_eq!(row_partitions(1200, 100, 512), (2, 3), "keys 1100..1200");
        assert_eq!(row_partitions(1200, 700, 512), (0, 3), "keys 500..1200");
        assert_eq!(row_partitions(1024, 512, 512), (1, 2), "keys 512..1024");
        assert_eq!(window_arg(4096).ok(), Some(4096));
        assert!(window_arg(1 << 31).is_err());
    }

    #[test]
    fn tables_and_slots_are_checked_against_the_cache() {
        assert!(check_table(&[3, 1], 17, 16, 64).is_ok());
        assert!(check_table(&[3], 17, 16, 64).is_err());
        assert!(check_table(&[3, 4], 17, 16, 64).is_err());
        assert!(check_slots(&[-1, 0, 63], 64).is_ok());
        assert!(check_slots(&[64], 64).is_err());
    }
}
