//! The GPU model against the CPU model on a real device, where one exists (a developer machine
//! with Rust and a GPU; the GPU check box runs the scenarios through `kvbench run --backend
//! cuda` instead), where it prints `SKIP: no CUDA device` otherwise — and always on the emulated
//! device.
//!
//! Same seeded tiny model, paged layout with a shuffled table: a prefill chunk then a decode
//! must match the CPU's logits (relative L2 ≤ 1e-4) and greedy tokens, and a token's logits must
//! be bit-identical whether it runs alone or beside another sequence (batch invariance). On the
//! emulated device also with a sliding layer (window 3, off the 4-token blocks) beside a full
//! one, against the CPU model's sliding layer.

use kvbench_cuda::device::{DevLayer, Gpu};
use kvbench_cuda::model::batch::{pack, SeqAddr, SeqChunk};
use kvbench_cuda::model::forward::DevModel;
use kvbench_cuda::model::{HostLayer, HostWeights, ModelDims, WeightDtype};
use kvbench_cuda::KvDtype;
use kvbench_kernels::model::rope_inv_freq;
use kvbench_kernels::{rank_token, LayerKind, ModelConfig, PagedTable, StepSeq, Transformer};

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn gpu_logits_match_the_cpu_model_and_do_not_depend_on_the_batch() {
    match Gpu::open() {
        Ok(g) => check_against_cpu(&g, &[0, 0]),
        Err(e) => eprintln!("SKIP: no CUDA device: {e}"),
    }
}

/// The same check on the emulated device (the kernels built for the host, the CPU GemmEx),
/// which every machine has.
#[test]
fn emulated_logits_match_the_cpu_model_and_do_not_depend_on_the_batch() {
    let gpu = Gpu::emulated_open(kvbench_cuda::emu::EmuConfig::new(17)).expect("emulated");
    check_against_cpu(&gpu, &[0, 0]);
}

/// A sliding layer of window 3 before a full one: the device attends the window the CPU's
/// sliding layer attends (a prefill of 5 tokens over two blocks, then a decode).
#[test]
fn emulated_sliding_layers_match_the_cpu_models() {
    let gpu = Gpu::emulated_open(kvbench_cuda::emu::EmuConfig::new(19)).expect("emulated");
    check_against_cpu(&gpu, &[3, 0]);
}

/// `windows`: per layer, its sliding window (0: full attention).
fn check_against_cpu(gpu: &Gpu, windows: &[usize]) {
    let cfg = ModelConfig {
        layers: 2,
        q_heads: 8,
        kv_heads: 2,
        head_dim: 32,
        d_model: 256,
        ffn_dim: 512,
        vocab: 512,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
    };
    let kinds: Vec<LayerKind> = windows
        .iter()
        .map(|&w| match w {
            0 => LayerKind::Full,
            window => LayerKind::Sliding { window },
        })
        .collect();
    let m = Transformer::seeded_with_kinds(cfg.clone(), kinds, 5).expect("seeded");
    let dims = ModelDims {
        layers: cfg.layers,
        q_heads: cfg.q_heads,
        kv_heads: cfg.kv_heads,
        head_dim: cfg.head_dim,
        d_model: cfg.d_model,
        ffn_dim: cfg.ffn_dim,
        vocab: cfg.vocab,
        norm_eps: cfg.norm_eps,
    };
    let w = &m.weights;
    let hw = HostWeights {
        embed: &w.embed,
        layers: w
            .layers
            .iter()
            .map(|l| HostLayer {
                attn_norm: &l.attn_norm,
                wq: &l.wq,
                wk: &l.wk,
                wv: &l.wv,
                wo: &l.wo,
                mlp_norm: &l.mlp_norm,
                w_gate: &l.w_gate,
                w_up: &l.w_up,
                w_down: &l.w_down,
            })
            .collect(),
        final_norm: &w.final_norm,
        lm_head: &w.lm_head,
    };
    let slots = 64;
    let mut dm = DevModel::new(gpu, dims, WeightDtype::F32, &hw, 64, slots / 4).expect("model");
    assert!(dm.set_windows(&[3]).is_err(), "one window a layer");
    dm.set_windows(windows).expect("windows");
    assert_eq!(dm.windows(), windows);
    let mut kv: Vec<DevLayer> = (0..cfg.layers)
        .map(|_| {
            gpu.new_layer(KvDtype::F32, slots, dims.attn_shape())
                .expect("layer")
        })
        .collect();
    let inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta);
    let blocks_a = [3u32, 1];
    let blocks_b = [0u32, 2];
    let a = SeqAddr::Paged {
        block_size: 4,
        blocks: &blocks_a,
    };
    let b = SeqAddr::Paged {
        block_size: 4,
        blocks: &blocks_b,
    };
    let toks: [u32; 6] = [5, 17, 300, 2, 99, 7];
    let mut run = |chunks: &[SeqChunk<'_>], ring: usize| {
        let batch = pack(chunks, slots, cfg.vocab, &inv).expect("packed");
        let n = batch.logit_rows.len();
        dm.forward(gpu, &mut kv, &batch, ring).expect("forward");
        dm.enqueue_fetch(gpu, ring, n).expect("fetch");
        gpu.sync().expect("sync");
        let (l, t) = dm.read_fetched(ring, n).expect("read");
        let rows: Vec<Vec<f32>> = l.chunks_exact(cfg.vocab).map(|r| r.to_vec()).collect();
        (rows, t.to_vec())
    };
    let prefill = SeqChunk {
        addr: a,
        start_pos: 0,
        tokens: &toks[..5],
        want_logits: true,
    };
    let decode = SeqChunk {
        addr: a,
        start_pos: 5,
        tokens: &toks[5..],
        want_logits: true,
    };
    let (l1, t1) = run(&[prefill], 0);
    let (l2, t2) = run(&[decode], 1);
    let other = SeqChunk {
        addr: b,
        start_pos: 0,
        tokens: &toks[..3],
        want_logits: true,
    };
    let (l3, _) = run(&[other, decode], 0);

    let mut cache = m.new_cache::<f32>(slots);
    let table = PagedTable {
        block_size: 4,
        blocks: &blocks_a,
    };
    let cpu = |cache: &mut kvbench_kernels::KvCache<f32>, start: usize, t: &[u32]| {
        m.forward(
            cache,
            &[StepSeq {
                addr: &table,
                start_pos: start,
                tokens: t,
                want_logits: true,
            }],
        )
        .expect("cpu forward")
        .remove(0)
        .expect("logits")
    };
    let c1 = cpu(&mut cache, 0, &toks[..5]);
    let c2 = cpu(&mut cache, 5, &toks[5..]);
    for (gpu_l, cpu_l, t) in [(&l1[0], &c1, t1[0]), (&l2[0], &c2, t2[0])] {
        let e = rel_l2(gpu_l, cpu_l);
        eprintln!("rel L2 vs cpu: {e:.3e}");
        assert!(e <= 1e-4, "rel err {e}");
        assert_eq!(Some(t as u32), rank_token(cpu_l, 0));
    }
    assert_eq!(
        l3[1], l2[0],
        "decode logits changed when batched with another sequence"
    );
}
