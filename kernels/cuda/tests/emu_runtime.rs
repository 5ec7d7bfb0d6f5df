//! The emulated device's runtime: what it catches that a GPU would only show as wrong numbers —
//! host reads before the copy completed, copies of more than is read, copies past an allocation,
//! kernels faulting on guard pages, GEMM arguments in the wrong order, leaked allocations.

use kvbench_cuda::device::Gpu;
use kvbench_cuda::emu::EmuConfig;
use kvbench_cuda::model::blas::{Blas, WeightBuf};
use kvbench_cuda::model::forward::DevModel;
use kvbench_cuda::model::{HostLayer, HostWeights, ModelDims, WeightDtype};
use kvbench_cuda::runtime::{Arg, GemmArgs, GemmIn};

/// A device whose every operation completes at least `min_ms` late, so a read that does not wait
/// for its copy always sees the poison.
fn slow_gpu(min_ms: u64) -> Gpu {
    Gpu::emulated_open(EmuConfig {
        min_delay_us: min_ms * 1000,
        max_delay_us: min_ms * 1000,
        delay_one_in: 1,
        ..EmuConfig::new(3)
    })
    .expect("emulated device")
}

struct Zeros {
    embed: Vec<f32>,
    norm: Vec<f32>,
    qd: Vec<f32>,
    kvd: Vec<f32>,
    od: Vec<f32>,
    ff: Vec<f32>,
    lm: Vec<f32>,
}

fn zeros_for(d: &ModelDims) -> Zeros {
    Zeros {
        embed: vec![0.0; d.vocab * d.d_model],
        norm: vec![1.0; d.d_model],
        qd: vec![0.0; d.d_model * d.q_dim()],
        kvd: vec![0.0; d.d_model * d.kv_dim()],
        od: vec![0.0; d.q_dim() * d.d_model],
        ff: vec![0.0; d.d_model * d.ffn_dim],
        lm: vec![0.0; d.d_model * d.vocab],
    }
}

fn weights<'a>(d: &ModelDims, z: &'a Zeros) -> HostWeights<'a> {
    HostWeights {
        embed: &z.embed,
        layers: (0..d.layers)
            .map(|_| HostLayer {
                attn_norm: &z.norm,
                wq: &z.qd,
                wk: &z.kvd,
                wv: &z.kvd,
                wo: &z.od,
                mlp_norm: &z.norm,
                w_gate: &z.ff,
                w_up: &z.ff,
                w_down: &z.ff,
            })
            .collect(),
        final_norm: &z.norm,
        lm_head: &z.lm,
    }
}

fn dims(vocab: usize) -> ModelDims {
    ModelDims {
        layers: 1,
        q_heads: 8,
        kv_heads: 2,
        head_dim: 32,
        d_model: 64,
        ffn_dim: 64,
        vocab,
        norm_eps: 1e-5,
    }
}

/// Writes known logits and tokens into buffer `ring` as the forward pass would (in stream order).
fn plant_logits(gpu: &Gpu, m: &mut DevModel, ring: usize, rows: usize) -> Vec<f32> {
    let v = m.dims.vocab;
    let want: Vec<f32> = (0..rows * v).map(|i| (i % 97) as f32 * 0.5).collect();
    gpu.htod(&want, m.logits_buffer(ring).expect("ring"), 0)
        .expect("plant");
    want
}

#[test]
fn the_step_end_event_covers_the_logits_copies_and_the_old_order_reads_poison() {
    let gpu = slow_gpu(20);
    let d = dims(512);
    let z = zeros_for(&d);
    let mut m = DevModel::new(&gpu, d, WeightDtype::F32, &weights(&d, &z), 8, 4).expect("model");
    let rows = 3;
    // The order the backend uses: fetch queued, then the end event recorded after it.
    let end = gpu.new_event().expect("event");
    let want = plant_logits(&gpu, &mut m, 0, rows);
    m.finish_step(&gpu, 0, rows, &end).expect("finish");
    end.synchronize().expect("sync");
    let (l, _) = m.read_fetched(0, rows).expect("read");
    let nan = l.iter().filter(|x| x.is_nan()).count();
    assert!(
        nan == 0 && l == &want[..],
        "logits read after the step's end event: {nan} of {} still poisoned",
        l.len()
    );
    // The old order — end event recorded, then the fetch queued — must be caught: the event
    // completes before the copy, and the read sees the poison placed at enqueue.
    gpu.sync().expect("sync");
    let end2 = gpu.new_event().expect("event");
    let want = plant_logits(&gpu, &mut m, 1, rows);
    gpu.record(&end2).expect("record");
    m.enqueue_fetch(&gpu, 1, rows).expect("fetch");
    end2.synchronize().expect("sync");
    let (l, t) = m.read_fetched(1, rows).expect("read");
    assert!(
        l.iter().all(|x| x.is_nan()) && l.len() == want.len(),
        "a read ordered only by an event recorded before the copy must see the poison"
    );
    assert!(
        t.iter().all(|&t| t as u32 == 0x7fc0_7fc0),
        "tokens poisoned too"
    );
    gpu.sync().expect("sync");
}

#[test]
fn a_step_copies_only_the_logits_rows_it_reads_at_the_8b_vocabulary() {
    let gpu = Gpu::emulated_open(EmuConfig::new(5)).expect("emulated device");
    let d = dims(128_256);
    let z = zeros_for(&d);
    let mut m = DevModel::new(&gpu, d, WeightDtype::F32, &weights(&d, &z), 64, 4).expect("model");
    assert_eq!(m.plan.logit_rows, 64, "the buffers hold 64 rows");
    let dev = gpu.emulated().expect("emulated").clone();
    for rows in [1usize, 3, 64] {
        gpu.sync().expect("sync");
        let end = gpu.new_event().expect("event");
        let before = dev.copied_bytes();
        m.finish_step(&gpu, 0, rows, &end).expect("finish");
        let copied = dev.copied_bytes() - before;
        let read_bytes = (rows * d.vocab * 4 + rows * 4) as u64;
        assert_eq!(
            copied,
            read_bytes,
            "{rows} rows: {copied} bytes copied, {read_bytes} read (whole buffer {} bytes)",
            64 * d.vocab * 4
        );
        end.synchronize().expect("sync");
    }
}

#[test]
fn pinned_reads_before_completion_see_nan_and_a_freed_source_fails_the_stream() {
    let gpu = slow_gpu(10);
    let src = gpu.upload(&[1.0f32, 2.0, 3.0, 4.0]).expect("upload");
    let mut host = gpu.pinned_buf::<f32>(4).expect("pinned");
    gpu.dtoh_async(&src, 0, &mut host, 0, 4).expect("copy");
    assert!(
        host.as_slice().expect("read").iter().all(|x| x.is_nan()),
        "an early read sees NaN"
    );
    gpu.sync().expect("sync");
    assert_eq!(host.as_slice().expect("read"), &[1.0, 2.0, 3.0, 4.0]);
    // A swap-in source freed while its copy is queued: a use after free on the stream.
    let mut dst = gpu.zeros::<f32>(4).expect("alloc");
    let tmp = gpu.pinned_buf::<f32>(4).expect("pinned");
    gpu.htod_async(&tmp, 0, &mut dst, 0, 4).expect("queued");
    drop(tmp);
    let e = gpu.sync().expect_err("use after free").to_string();
    assert!(e.contains("use after free of pinned host buffer"), "{e}");
}

#[test]
fn copies_past_an_allocation_are_errors_and_kernel_faults_name_kernel_and_parameter() {
    let gpu = Gpu::emulated_open(EmuConfig::new(9)).expect("emulated device");
    let mut small = gpu.zeros::<u32>(4).expect("alloc");
    let e = gpu.htod(&[1u32; 5], &mut small, 0).expect_err("too long");
    assert!(
        e.to_string().contains("elements [0, 0+5) of a buffer of 4"),
        "{e}"
    );
    let mut host = gpu.pinned_buf::<u32>(2).expect("pinned");
    assert!(gpu.dtoh_async(&small, 2, &mut host, 0, 4).is_err());
    // fill_words told to write 1,000 words into 4: the fifth lands on the guard page.
    gpu.launch(
        "fill_words",
        (1, 1, 1),
        (256, 1, 1),
        0,
        &[Arg::Buf(&small), Arg::I64(1000), Arg::U32(0)],
    )
    .expect("queued");
    let e = gpu.sync().expect_err("fault").to_string();
    assert!(
        e.contains("fill_words")
            && e.contains("past the end of device allocation")
            && e.contains("parameter 0"),
        "{e}"
    );
}

/// Row-major `x[rows, k] · w[k, m]`, in f64.
fn host_product(x: &[f32], w: &[f32], rows: usize, k: usize, m: usize) -> Vec<f64> {
    let mut c = vec![0f64; rows * m];
    for r in 0..rows {
        for p in 0..k {
            for j in 0..m {
                c[r * m + j] += x[r * k + p] as f64 * w[p * m + j] as f64;
            }
        }
    }
    c
}

#[test]
fn gemm_follows_the_column_major_contract_and_a_swapped_order_is_caught() {
    let gpu = Gpu::emulated_open(EmuConfig::new(11)).expect("emulated device");
    let (rows, k, m) = (64, 48, 40); // one whole tile
    let x: Vec<f32> = (0..rows * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let w: Vec<f32> = (0..k * m).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
    let want = host_product(&x, &w, rows, k, m);
    let blas = Blas::new(&gpu).expect("blas");
    let a = gpu.upload(&x).expect("x");
    let wb = WeightBuf::F32(gpu.upload(&w).expect("w"));
    let mut c = gpu.zeros::<f32>(rows * m).expect("c");
    blas.gemm(&gpu, &a, None, &wb, &mut c, rows, k, m)
        .expect("gemm");
    let got = gpu.download(&c).expect("download");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(*g as f64, *w, "small integers: exact");
    }
    // bf16 weights: activations rounded to bf16 on the device, products exact in f32 here.
    let wb16 = WeightBuf::Bf16(
        gpu.upload(
            &w.iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect::<Vec<_>>(),
        )
        .expect("w16"),
    );
    let mut staging = gpu.zeros::<u16>(rows * k).expect("staging");
    blas.gemm(&gpu, &a, Some(&mut staging), &wb16, &mut c, rows, k, m)
        .expect("gemm bf16");
    assert_eq!(gpu.download(&c).expect("download"), got);
    // The operands in the other order (A = x, B = W) with the same dimensions: either refused
    // as past a buffer or a different product — never the right answer by accident.
    let (xa, wa) = (
        GemmIn::F32(&a),
        GemmIn::F32(match &wb {
            WeightBuf::F32(b) => b,
            WeightBuf::Bf16(_) => unreachable!(),
        }),
    );
    let swapped = gpu.gemm_ex(GemmArgs {
        trans_a: false,
        trans_b: false,
        m,
        n: rows,
        k,
        alpha: 1.0,
        beta: 0.0,
        a: xa,
        a_off: 0,
        lda: m,
        b: wa,
        b_off: 0,
        ldb: k,
        c: &mut c,
        c_off: 0,
        ldc: m,
    });
    match swapped {
        Err(e) => assert!(e.to_string().contains("GemmEx"), "{e}"),
        Ok(()) => assert_ne!(gpu.download(&c).expect("download"), got),
    }
}

#[test]
fn device_memory_returns_to_its_figure_once_everything_is_freed() {
    let gpu = Gpu::emulated_open(EmuConfig::new(13)).expect("emulated device");
    let (free0, total) = gpu.mem_info().expect("mem");
    let d = dims(512);
    let z = zeros_for(&d);
    let m = DevModel::new(&gpu, d, WeightDtype::F32, &weights(&d, &z), 8, 4).expect("model");
    let layer = gpu
        .new_layer(kvbench_cuda::KvDtype::F32, 64, d.attn_shape())
        .expect("layer");
    let (free1, _) = gpu.mem_info().expect("mem");
    assert!(free1 < free0, "allocations show in mem_info");
    drop(m);
    drop(layer);
    // Frees are stream-ordered: seen once the stream passed them.
    gpu.release_freed().expect("release");
    assert_eq!(gpu.mem_info().expect("mem"), (free0, total));
    let dev = gpu.emulated().expect("emulated");
    assert_eq!(
        dev.leaks().len(),
        3,
        "only the device's own three scratch words stay"
    );
}
