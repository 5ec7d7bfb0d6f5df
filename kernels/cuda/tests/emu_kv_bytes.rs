//! The K/V traffic of the attention kernels, counted by the emulated device: decode reads each
//! sequence's K/V at most 1.05x (once, whatever the partitioning), prefill at most 1.1x the
//! tiling bound (each query tile reads the causal prefix of its last row once), where one block
//! per query row would read every prefix once per row. A sliding window reads its window only:
//! decode exactly `window` tokens a row, prefill each tile from its first row's window start.
//! Its own test binary, one test: the emulator's counter is process-wide, so no other test may
//! launch kernels meanwhile.

use kvbench_cuda::bench::{count_bytes, GpuBenchConfig};
use kvbench_cuda::device::Gpu;
use kvbench_cuda::emu::EmuConfig;
use kvbench_cuda::launch::AttnShape;
use kvbench_cuda::KvDtype;

#[test]
fn decode_reads_the_kv_once_and_prefill_once_per_query_tile() {
    let gpu = Gpu::emulated_open(EmuConfig::new(7)).expect("emulated device");
    for (dtype, shape) in [
        (
            KvDtype::Bf16,
            AttnShape {
                q_heads: 8,
                kv_heads: 2,
                head_dim: 64,
            },
        ),
        (
            KvDtype::F32,
            AttnShape {
                q_heads: 4,
                kv_heads: 4,
                head_dim: 32,
            },
        ),
    ] {
        let cfg = GpuBenchConfig {
            batches: vec![2],
            contexts: vec![600],
            block_sizes: vec![16],
            shape,
            dtype,
            reps: 1,
            max_kv_bytes: 1 << 30,
            seed: 3,
            window: 0,
        };
        let rows = count_bytes(&gpu, &cfg).expect("counts");
        assert_eq!(rows.len(), 4, "paged and contiguous, decode and prefill");
        for r in &rows {
            eprintln!("{dtype:?} {r:?} ratio {:.4}", r.ratio());
            assert!(r.kv_bytes_read > 0, "{r:?}");
            let bound = if r.phase == "decode" { 1.05 } else { 1.1 };
            assert!(r.ratio() <= bound, "{r:?}: ratio {} > {bound}", r.ratio());
            if r.phase == "decode" {
                // 600 tokens plan into several partitions on 132 SMs: split-K still reads once.
                assert!(r.partitions > 1, "{r:?}");
            } else {
                // Tiles share reads: far below one block per row.
                assert!(r.kv_bytes_read * 4 < r.kv_bytes_per_row, "{r:?}");
            }
        }
    }
    windowed_layers_read_their_window_only(&gpu);
}

/// A sliding layer's attention over contexts of 600 tokens: decode reads exactly `window`
/// tokens of K/V a row (at most the window's worth, whatever the partitions: those before the
/// window are skipped whole), prefill at most 1.1x the windowed tiling bound and far below the
/// same prompt without a window. Windows off the block and tile boundaries (100, 37) and one
/// past the context (800: a full row).
fn windowed_layers_read_their_window_only(gpu: &Gpu) {
    let shape = AttnShape {
        q_heads: 8,
        kv_heads: 2,
        head_dim: 64,
    };
    let (batch, context) = (2usize, 600usize);
    let row_bytes = (2 * shape.kv_row() * KvDtype::Bf16.bytes()) as u64;
    let cfg = |window: usize| GpuBenchConfig {
        batches: vec![batch],
        contexts: vec![context],
        block_sizes: vec![8, 16],
        shape,
        dtype: KvDtype::Bf16,
        reps: 1,
        max_kv_bytes: 1 << 30,
        seed: 5,
        window,
    };
    let full = count_bytes(gpu, &cfg(0)).expect("counts");
    for window in [100usize, 37, 800] {
        let rows = count_bytes(gpu, &cfg(window)).expect("counts");
        assert_eq!(
            rows.len(),
            8,
            "two block sizes, paged and contiguous, two phases"
        );
        for (r, f) in rows.iter().zip(&full) {
            eprintln!("window {window}: {r:?} ratio {:.4}", r.ratio());
            let attended = window.min(context) as u64;
            if r.phase == "decode" {
                assert!(
                    r.kv_bytes_read <= batch as u64 * attended * row_bytes,
                    "window {window}: decode read {} bytes, past the window's {}",
                    r.kv_bytes_read,
                    batch as u64 * attended * row_bytes
                );
                assert_eq!(r.kv_bytes_read, r.kv_bytes_ideal, "{r:?}");
            } else {
                assert!(r.ratio() <= 1.1, "{r:?}: ratio {}", r.ratio());
                if window < context {
                    assert!(r.kv_bytes_read < f.kv_bytes_read, "{r:?} vs {f:?}");
                } else {
                    assert_eq!(r.kv_bytes_read, f.kv_bytes_read, "{r:?}");
                }
            }
        }
    }
}
