//! The K/V traffic of the attention kernels, counted by the emulated device: decode reads each
//! sequence's K/V at most 1.05x (once, whatever the partitioning), prefill at most 1.1x the
//! tiling bound (each query tile reads the causal prefix of its last row once), where one block
//! per query row would read every prefix once per row. Its own test binary: the emulator's
//! counter is process-wide, so no other test may launch kernels meanwhile.

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
}
