//! The host build of the real `.cu` kernels (the emulated device's kernels) against the f64
//! attention reference and plain Rust computations, on small seeded inputs: every kernel NVRTC
//! knows has a host build, the launch limits are the device's, and a kernel that runs into a
//! guard page returns `Fault` instead of crashing.

use std::ffi::c_void;

use kvbench_cuda::device::tile_rows;
use kvbench_cuda::emu::kernels::{kernel_names, launch, Dim3, EmuKernelError};
use kvbench_cuda::launch::{fixed_partitions, window_start};
use kvbench_cuda::model::batch::tiles;
use kvbench_cuda::reference::{attention_row, round_to};
use kvbench_cuda::rng::Rng;
use kvbench_cuda::source::{attn_kernel_name, kv_write_kernel_name, GROUPS, HEAD_DIMS};
use kvbench_cuda::{KvDtype, ProgramId};

/// A kernel argument, stored in 8 bytes (little-endian: a 4-byte value sits at the start).
fn ptr<T>(p: *const T) -> u64 {
    p as usize as u64
}
fn int(x: i32) -> u64 {
    x as u32 as u64
}
fn long(x: i64) -> u64 {
    x as u64
}
fn float(x: f32) -> u64 {
    x.to_bits() as u64
}

fn run(
    kernel: &str,
    grid: (u32, u32, u32),
    block: u32,
    args: &[u64],
) -> Result<(), EmuKernelError> {
    let mut slots: Vec<u64> = args.to_vec();
    let params: Vec<*mut c_void> = slots
        .iter_mut()
        .map(|s| s as *mut u64 as *mut c_void)
        .collect();
    // SAFETY: every pointer argument of these tests points at a buffer sized for the launch.
    unsafe {
        launch(
            kernel,
            Dim3::new(grid.0, grid.1, grid.2),
            Dim3::new(block, 1, 1),
            0,
            &params,
        )
    }
}

fn seed() -> u64 {
    let s = std::env::var("EMU_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_cafe);
    eprintln!("seed {s} (replay: EMU_TEST_SEED={s})");
    s
}

#[test]
fn every_kernel_nvrtc_compiles_has_a_host_build() {
    let mut nvrtc: Vec<String> = ProgramId::ALL.iter().flat_map(|p| p.kernels()).collect();
    nvrtc.sort();
    let mut host: Vec<String> = kernel_names().iter().map(|s| s.to_string()).collect();
    host.sort();
    assert_eq!(host, nvrtc);
    assert!(matches!(
        run("no_such_kernel", (1, 1, 1), 1, &[]),
        Err(EmuKernelError::UnknownKernel(_))
    ));
}

/// One attention case: sequences of given lengths stored in a paged (shuffled table) or
/// contiguous cache, decode rows for every sequence plus a causal prefill chunk of sequence 0.
/// With a sliding `window` (0: none), every position before the earliest window start of a
/// sequence's rows is NaN in storage (contiguous) or its whole block mapped to a never-written
/// NaN block (paged, blocks wholly before it): a kernel that reads one poisons its output.
struct AttnCase {
    dtype: KvDtype,
    paged: bool,
    head_dim: usize,
    group: usize,
    part_tokens: Option<u32>,
    window: usize,
}

fn check_attention(c: &AttnCase, rng: &mut Rng) {
    let (kv_heads, d) = (2usize, c.head_dim);
    let q_heads = kv_heads * c.group;
    let lens = [37usize, 1, 70];
    let row = kv_heads * d;
    // Logical K/V per sequence, already rounded to the storage type.
    let logical: Vec<(Vec<f32>, Vec<f32>)> = lens
        .iter()
        .map(|&l| {
            let mut gen = |_| round_to(c.dtype, rng.unit());
            (
                (0..l * row).map(&mut gen).collect(),
                (0..l * row).map(&mut gen).collect(),
            )
        })
        .collect();
    let block_size = 8usize;
    let max_len = *lens.iter().max().expect("lens");
    let max_blocks = max_len.div_ceil(block_size);
    let num_blocks = lens.len() * max_blocks + 3;
    let num_slots = num_blocks * block_size;
    // Slot of (sequence, position) in each layout.
    let mut free: Vec<u32> = (0..num_blocks as u32).collect();
    rng.shuffle(&mut free);
    let mut tables: Vec<i32> = (0..lens.len() * max_blocks)
        .map(|i| free[i] as i32)
        .collect();
    // A block no table maps: never written, NaN.
    let poison_block = free[lens.len() * max_blocks] as i32;
    let seq_base: Vec<i64> = (0..lens.len())
        .map(|s| (s * (max_len + 5)) as i64)
        .collect();
    let slot = |s: usize, t: usize| -> usize {
        if c.paged {
            tables[s * max_blocks + t / block_size] as usize * block_size + t % block_size
        } else {
            seq_base[s] as usize + t
        }
    };
    // Rows: one decode row per sequence, a causal chunk of 4 tokens of sequence 0, and the
    // whole of sequence 2 as one prefill chunk (several query tiles and key tiles).
    let mut row_seq: Vec<i32> = (0..lens.len() as i32).collect();
    let mut row_len: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
    for l in lens[0] - 3..=lens[0] {
        row_seq.push(0);
        row_len.push(l as i32);
    }
    for l in 1..=lens[2] {
        row_seq.push(2);
        row_len.push(l as i32);
    }
    // The first position any row of each sequence reads.
    let first_read: Vec<usize> = (0..lens.len())
        .map(|s| {
            row_seq
                .iter()
                .zip(&row_len)
                .filter(|(&rs, _)| rs as usize == s)
                .map(|(_, &l)| window_start(l as usize, c.window))
                .min()
                .unwrap_or(0)
        })
        .collect();
    let mut k32 = vec![f32::NAN; num_slots * row];
    let mut v32 = vec![f32::NAN; num_slots * row];
    for (s, (k, v)) in logical.iter().enumerate() {
        for t in first_read[s]..lens[s] {
            let at = slot(s, t) * row;
            k32[at..at + row].copy_from_slice(&k[t * row..(t + 1) * row]);
            v32[at..at + row].copy_from_slice(&v[t * row..(t + 1) * row]);
        }
    }
    if c.paged {
        for (s, &from) in first_read.iter().enumerate() {
            for b in 0..from / block_size {
                tables[s * max_blocks + b] = poison_block;
            }
        }
    }
    let to16 = |x: &[f32]| -> Vec<u16> {
        x.iter()
            .map(|&f| half::bf16::from_f32(f).to_bits())
            .collect()
    };
    let (k16, v16) = (to16(&k32), to16(&v32));
    let (kp, vp): (*const c_void, *const c_void) = match c.dtype {
        KvDtype::F32 => (k32.as_ptr().cast(), v32.as_ptr().cast()),
        KvDtype::Bf16 => (k16.as_ptr().cast(), v16.as_ptr().cast()),
    };
    let rows = row_seq.len();
    let tile_row0 = tiles(&row_seq, &row_len, tile_rows(c.group));
    let q: Vec<f32> = (0..rows * q_heads * d).map(|_| rng.unit()).collect();
    let parts = match c.part_tokens {
        Some(p) => fixed_partitions(max_len, p),
        None => fixed_partitions(max_len, 512),
    };
    let np = parts.parts as usize;
    let scale = 1.0 / (d as f32).sqrt();
    let name = attn_kernel_name(c.paged, c.dtype, d, c.group);
    // Once one row per block, once in query tiles: the outputs must be bit-identical.
    let mut outs = Vec::new();
    for tiled in [false, true] {
        let mut out = vec![f32::NAN; rows * q_heads * d];
        let mut part_out = vec![f32::NAN; rows * q_heads * np * d];
        let mut part_max = vec![f32::NAN; rows * q_heads * np];
        let mut part_sum = vec![f32::NAN; rows * q_heads * np];
        let grid_y = if tiled { tile_row0.len() - 1 } else { rows };
        run(
            &name,
            (kv_heads as u32, grid_y as u32, parts.parts),
            128,
            &[
                ptr(out.as_mut_ptr()),
                ptr(part_out.as_mut_ptr()),
                ptr(part_max.as_mut_ptr()),
                ptr(part_sum.as_mut_ptr()),
                ptr(q.as_ptr()),
                ptr(kp),
                ptr(vp),
                ptr(row_seq.as_ptr()),
                ptr(row_len.as_ptr()),
                ptr(tables.as_ptr()),
                int(max_blocks as i32),
                int(block_size.trailing_zeros() as i32),
                ptr(seq_base.as_ptr()),
                int(kv_heads as i32),
                int(parts.part_tokens as i32),
                float(scale),
                ptr(tile_row0.as_ptr()),
                int(tiled as i32),
                int(c.window as i32),
            ],
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        if np > 1 {
            run(
                "attn_merge",
                (q_heads as u32, rows as u32, 1),
                d as u32,
                &[
                    ptr(out.as_mut_ptr()),
                    ptr(part_out.as_ptr()),
                    ptr(part_max.as_ptr()),
                    ptr(part_sum.as_ptr()),
                    ptr(row_len.as_ptr()),
                    int(np as i32),
                    int(parts.part_tokens as i32),
                    int(d as i32),
                    int(c.window as i32),
                ],
            )
            .expect("attn_merge");
        }
        outs.push(out);
    }
    let out = &outs[1];
    for (i, (a, b)) in outs[0].iter().zip(out.iter()).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "{name} parts {np} window {}: element {i} differs between one row per block and tiles",
            c.window
        );
    }
    for r in 0..rows {
        let s = row_seq[r] as usize;
        let len = row_len[r] as usize;
        let (k, v) = &logical[s];
        let lo = window_start(len, c.window);
        let qr = &q[r * q_heads * d..(r + 1) * q_heads * d];
        // The reference over the window's positions only, as logical data from `lo` on.
        let want = attention_row(
            qr,
            &k[lo * row..],
            &v[lo * row..],
            len - lo,
            q_heads,
            kv_heads,
            d,
            scale as f64,
        );
        let got = &out[r * q_heads * d..(r + 1) * q_heads * d];
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g as f64 - w).abs() <= 2e-5,
                "{name} parts {np} window {}: row {r} (len {len}) elem {i}: {g} vs {w}",
                c.window
            );
        }
    }
}

#[test]
fn attention_matches_the_f64_reference_in_every_variant() {
    let mut rng = Rng::new(seed());
    for dtype in KvDtype::ALL {
        for paged in [true, false] {
            for &head_dim in &HEAD_DIMS {
                for &group in &GROUPS {
                    for part_tokens in [None, Some(16)] {
                        check_attention(
                            &AttnCase {
                                dtype,
                                paged,
                                head_dim,
                                group,
                                part_tokens,
                                window: 0,
                            },
                            &mut rng,
                        );
                    }
                }
            }
        }
    }
}

/// Sliding windows at their edges: 1 (the token itself), shorter than a block and off its
/// boundary (5, 12 with 8-token blocks), exactly a block (8), crossing the 16-token partitions
/// and several blocks (45), and at least every length (70, 200: the window changes nothing).
/// Each against the windowed reference, with the positions before it poisoned, and tiles
/// against one row per block bit for bit; storage types, layouts, head dims and group sizes
/// rotate over the cases.
#[test]
fn windowed_attention_matches_the_reference_and_reads_nothing_before_the_window() {
    let mut rng = Rng::new(seed());
    let mut i = 0usize;
    for window in [1usize, 5, 8, 12, 45, 70, 200] {
        for paged in [true, false] {
            for part_tokens in [None, Some(16)] {
                let dtype = KvDtype::ALL[i % KvDtype::ALL.len()];
                let head_dim = HEAD_DIMS[i % HEAD_DIMS.len()];
                let group = GROUPS[(i / 2) % GROUPS.len()];
                i += 1;
                check_attention(
                    &AttnCase {
                        dtype,
                        paged,
                        head_dim,
                        group,
                        part_tokens,
                        window,
                    },
                    &mut rng,
                );
            }
        }
    }
}

#[test]
fn kv_write_and_copy_slots_move_exactly_the_named_rows() {
    let mut rng = Rng::new(seed());
    let (num_slots, row) = (24usize, 40usize);
    let slots: Vec<i64> = vec![5, -1, 17, 0];
    let k_new: Vec<f32> = (0..slots.len() * row).map(|_| rng.unit()).collect();
    let v_new: Vec<f32> = (0..slots.len() * row).map(|_| rng.unit()).collect();
    for dtype in KvDtype::ALL {
        let mut k = vec![0xdeadu16 as u32; num_slots * row];
        let mut v = vec![0xdeadu16 as u32; num_slots * row];
        // Both storage types in u32 words; bf16 uses the first half of the buffer as u16.
        run(
            kv_write_kernel_name(dtype),
            (slots.len() as u32, 1, 1),
            32,
            &[
                ptr(k.as_mut_ptr()),
                ptr(v.as_mut_ptr()),
                ptr(k_new.as_ptr()),
                ptr(v_new.as_ptr()),
                ptr(slots.as_ptr()),
                int(row as i32),
            ],
        )
        .expect("kv_write");
        for (buf, new) in [(&k, &k_new), (&v, &v_new)] {
            let read = |i: usize| -> f32 {
                match dtype {
                    KvDtype::F32 => f32::from_bits(buf[i]),
                    KvDtype::Bf16 => {
                        let w = buf[i / 2];
                        half::bf16::from_bits(if i.is_multiple_of(2) {
                            w as u16
                        } else {
                            (w >> 16) as u16
                        })
                        .to_f32()
                    }
                }
            };
            for s in 0..num_slots {
                let src = slots.iter().position(|&x| x == s as i64);
                for e in 0..row {
                    match src {
                        Some(i) => assert_eq!(read(s * row + e), round_to(dtype, new[i * row + e])),
                        None if dtype == KvDtype::F32 => assert_eq!(buf[s * row + e], 0xdead),
                        None => {}
                    }
                }
            }
        }
    }
    // copy_slots: pairs (src, dst) of row_words-word rows.
    let row_words = 9usize;
    let mut k: Vec<u32> = (0..num_slots * row_words).map(|i| i as u32).collect();
    let mut v: Vec<u32> = (0..num_slots * row_words)
        .map(|i| 1_000_000 + i as u32)
        .collect();
    let (k0, v0) = (k.clone(), v.clone());
    let pairs: Vec<i64> = vec![3, 20, 4, 21, 11, 2];
    run(
        "copy_slots",
        (3, 1, 1),
        128,
        &[
            ptr(k.as_mut_ptr()),
            ptr(v.as_mut_ptr()),
            ptr(pairs.as_ptr()),
            int(row_words as i32),
        ],
    )
    .expect("copy_slots");
    for s in 0..num_slots {
        let from = pairs
            .chunks(2)
            .find(|p| p[1] == s as i64)
            .map_or(s, |p| p[0] as usize);
        for w in 0..row_words {
            assert_eq!(k[s * row_words + w], k0[from * row_words + w]);
            assert_eq!(v[s * row_words + w], v0[from * row_words + w]);
        }
    }
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

#[test]
fn model_ops_match_plain_rust() {
    let mut rng = Rng::new(seed());
    let (n, d, vocab) = (5usize, 96usize, 300usize);
    let x: Vec<f32> = (0..n * d).map(|_| rng.unit() * 3.0).collect();
    let y: Vec<f32> = (0..n * d).map(|_| rng.unit()).collect();

    // embed_rows
    let embed: Vec<f32> = (0..vocab * d).map(|_| rng.unit()).collect();
    let tokens: Vec<i32> = vec![7, 299, 0, 7, 150];
    let mut e = vec![f32::NAN; n * d];
    run(
        "embed_rows",
        (n as u32, 1, 1),
        64,
        &[
            ptr(e.as_mut_ptr()),
            ptr(embed.as_ptr()),
            ptr(tokens.as_ptr()),
            int(d as i32),
        ],
    )
    .expect("embed_rows");
    for (i, &t) in tokens.iter().enumerate() {
        assert_eq!(
            &e[i * d..(i + 1) * d],
            &embed[t as usize * d..(t as usize + 1) * d]
        );
    }

    // rms_norm and rms_norm_gather (block of 64 threads: two warps meet in block_sum).
    let gain: Vec<f32> = (0..d).map(|_| 1.0 + rng.unit() * 0.5).collect();
    let eps = 1e-5f32;
    let norm = |r: usize| -> Vec<f64> {
        let xr = &x[r * d..(r + 1) * d];
        let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        xr.iter()
            .zip(&gain)
            .map(|(&v, &g)| v as f64 * inv * g as f64)
            .collect()
    };
    let mut out = vec![f32::NAN; n * d];
    run(
        "rms_norm",
        (n as u32, 1, 1),
        64,
        &[
            ptr(out.as_mut_ptr()),
            ptr(x.as_ptr()),
            ptr(gain.as_ptr()),
            int(d as i32),
            float(eps),
        ],
    )
    .expect("rms_norm");
    let want: Vec<f64> = (0..n).flat_map(norm).collect();
    assert_close(&out, &want, 1e-5, "rms_norm");
    let rows: Vec<i32> = vec![4, 1];
    let mut g_out = vec![f32::NAN; rows.len() * d];
    run(
        "rms_norm_gather",
        (rows.len() as u32, 1, 1),
        96,
        &[
            ptr(g_out.as_mut_ptr()),
            ptr(x.as_ptr()),
            ptr(gain.as_ptr()),
            ptr(rows.as_ptr()),
            int(d as i32),
            float(eps),
        ],
    )
    .expect("rms_norm_gather");
    let want: Vec<f64> = rows.iter().flat_map(|&r| norm(r as usize)).collect();
    assert_close(&g_out, &want, 1e-5, "rms_norm_gather");

    // rope: x as [n, heads, head_dim], NeoX pairing.
    let (heads, hd) = (3usize, 32usize);
    let half_d = hd / 2;
    let xr: Vec<f32> = (0..n * heads * hd).map(|_| rng.unit()).collect();
    let ang: Vec<f64> = (0..n * half_d).map(|i| (i as f64) * 0.37).collect();
    let cos_t: Vec<f32> = ang.iter().map(|a| a.cos() as f32).collect();
    let sin_t: Vec<f32> = ang.iter().map(|a| a.sin() as f32).collect();
    let mut xo = xr.clone();
    run(
        "rope",
        (n as u32, 1, 1),
        32,
        &[
            ptr(xo.as_mut_ptr()),
            ptr(cos_t.as_ptr()),
            ptr(sin_t.as_ptr()),
            int(heads as i32),
            int(hd as i32),
        ],
    )
    .expect("rope");
    let mut want = vec![0f64; xr.len()];
    for r in 0..n {
        for h in 0..heads {
            for i in 0..half_d {
                let b = r * heads * hd + h * hd;
                let (c, s) = (cos_t[r * half_d + i] as f64, sin_t[r * half_d + i] as f64);
                let (x0, x1) = (xr[b + i] as f64, xr[b + i + half_d] as f64);
                want[b + i] = x0 * c - x1 * s;
                want[b + i + half_d] = x0 * s + x1 * c;
            }
        }
    }
    assert_close(&xo, &want, 1e-6, "rope");

    // silu_mul, add_in_place, to_bf16: grid-stride loops with a grid smaller than the data.
    let m = (n * d) as i64;
    let mut gate = x.clone();
    run(
        "silu_mul",
        (2, 1, 1),
        64,
        &[ptr(gate.as_mut_ptr()), ptr(y.as_ptr()), long(m)],
    )
    .expect("silu_mul");
    let want: Vec<f64> = x
        .iter()
        .zip(&y)
        .map(|(&g, &u)| g as f64 / (1.0 + (-g as f64).exp()) * u as f64)
        .collect();
    assert_close(&gate, &want, 1e-6, "silu_mul");
    let mut acc = x.clone();
    run(
        "add_in_place",
        (3, 1, 1),
        32,
        &[ptr(acc.as_mut_ptr()), ptr(y.as_ptr()), long(m)],
    )
    .expect("add_in_place");
    assert!(acc
        .iter()
        .zip(x.iter().zip(&y))
        .all(|(&a, (&p, &q))| a == p + q));
    let mut b16 = vec![0u16; n * d];
    run(
        "to_bf16",
        (1, 1, 1),
        128,
        &[ptr(b16.as_mut_ptr()), ptr(x.as_ptr()), long(m)],
    )
    .expect("to_bf16");
    assert!(b16
        .iter()
        .zip(&x)
        .all(|(&b, &f)| b == half::bf16::from_f32(f).to_bits()));

    // argmax_rows: ties go to the lower id, NaN ranks as -inf.
    let mut logits: Vec<f32> = (0..3 * vocab).map(|_| rng.unit()).collect();
    logits[17] = 5.0;
    logits[250] = 5.0; // tie in row 0: 17 wins
    logits[vocab] = f32::NAN;
    logits[vocab + 3] = 9.0;
    for v in &mut logits[2 * vocab..] {
        *v = f32::NAN;
    }
    logits[2 * vocab + 299] = -1e30;
    let mut am = vec![-1i32; 3];
    run(
        "argmax_rows",
        (3, 1, 1),
        256,
        &[
            ptr(am.as_mut_ptr()),
            ptr(logits.as_ptr()),
            int(vocab as i32),
        ],
    )
    .expect("argmax_rows");
    assert_eq!(am, vec![17, 3, 299]);

    // fill_words and read_ceiling (the XOR of every word, folded per block).
    let mut words = vec![0u32; 1000];
    run(
        "fill_words",
        (3, 1, 1),
        64,
        &[ptr(words.as_mut_ptr()), long(999), int(0x7fc0_0001)],
    )
    .expect("fill_words");
    assert!(words[..999].iter().all(|&w| w == 0x7fc0_0001) && words[999] == 0);
    let buf: Vec<u32> = (0..4096).map(|_| rng.next_u64() as u32).collect();
    let mut folded = vec![0u32; 1];
    run(
        "read_ceiling",
        (1, 1, 1),
        256,
        &[ptr(buf.as_ptr()), long(1024), ptr(folded.as_mut_ptr())],
    )
    .expect("read_ceiling");
    assert_eq!(folded[0], buf.iter().fold(0, |a, &w| a ^ w));
}

#[test]
fn launches_outside_the_device_limits_are_refused() {
    let mut words = vec![0u32; 64];
    let args = [ptr(words.as_mut_ptr()), long(64), int(1)];
    let bad = |grid: (u32, u32, u32), block: Dim3, args: &[u64]| {
        let mut slots = args.to_vec();
        let params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: refused before any thread runs.
        let r = unsafe {
            launch(
                "fill_words",
                Dim3::new(grid.0, grid.1, grid.2),
                block,
                0,
                &params,
            )
        };
        match r {
            Err(EmuKernelError::BadLaunch { reason, .. }) => reason,
            other => panic!("{grid:?} {block:?}: expected BadLaunch, got {other:?}"),
        }
    };
    assert!(bad((1, 1, 1), Dim3::new(1025, 1, 1), &args).contains("1024"));
    assert!(bad((1, 1, 1), Dim3::new(32, 33, 1), &args).contains("1024"));
    assert!(bad((1, 65_536, 1), Dim3::new(32, 1, 1), &args).contains("grid.y"));
    assert!(bad((1, 1, 65_536), Dim3::new(32, 1, 1), &args).contains("grid.z"));
    assert!(bad((0, 1, 1), Dim3::new(32, 1, 1), &args).contains("zero"));
    assert!(bad((1, 1, 1), Dim3::new(32, 1, 1), &args[..2]).contains("parameters"));
    // The largest legal shapes run.
    run("fill_words", (1, 65_535, 1), 1, &args).expect("grid.y 65535");
    run("fill_words", (1, 1, 1), 1024, &args).expect("1024 threads");
    assert!(words.iter().all(|&w| w == 1));
}

/// Three pages: guard, data, guard (the data's end against the trailing guard), as the emulated
/// runtime allocates.
struct Guarded {
    base: *mut u8,
    page: usize,
}

impl Guarded {
    fn new() -> Guarded {
        // SAFETY: plain anonymous mapping and protection changes of our own pages.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
            let base = libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED);
            let base = base as *mut u8;
            assert_eq!(
                libc::mprotect(
                    base.add(page).cast(),
                    page,
                    libc::PROT_READ | libc::PROT_WRITE
                ),
                0
            );
            Guarded { base, page }
        }
    }
    /// `n` words ending at the trailing guard page.
    fn words(&self, n: usize) -> *mut u32 {
        // SAFETY: inside the data page.
        unsafe { self.base.add(2 * self.page - 4 * n) as *mut u32 }
    }
    fn trailing_guard(&self) -> std::ops::Range<usize> {
        let g = self.base as usize + 2 * self.page;
        g..g + self.page
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: our mapping.
        unsafe { libc::munmap(self.base.cast(), 3 * self.page) };
    }
}

#[test]
fn an_access_into_a_guard_page_returns_fault_and_the_guard_stays() {
    let g = Guarded::new();
    let p = g.words(100);
    for round in 0..2 {
        // fill_words over 110 words of a 100-word buffer: writes into the trailing guard.
        match run("fill_words", (2, 1, 1), 32, &[ptr(p), long(110), int(7)]) {
            Err(EmuKernelError::Fault {
                kernel,
                addr,
                write,
            }) => {
                assert_eq!(kernel, "fill_words");
                assert!(
                    g.trailing_guard().contains(&addr),
                    "round {round}: {addr:#x}"
                );
                assert!(write, "a store");
            }
            other => panic!("round {round}: expected Fault, got {other:?}"),
        }
        // The launch finished: every in-bounds word was written.
        // SAFETY: the 100 words are inside the data page.
        let data = unsafe { std::slice::from_raw_parts(p, 100) };
        assert!(data.iter().all(|&w| w == 7), "round {round}");
    }
    // A read past the end (add_in_place reads y beyond its last element).
    let mut x = vec![0f32; 110];
    match run(
        "add_in_place",
        (1, 1, 1),
        64,
        &[ptr(x.as_mut_ptr()), ptr(p as *const f32), long(110)],
    ) {
        Err(EmuKernelError::Fault { addr, write, .. }) => {
            assert!(g.trailing_guard().contains(&addr));
            assert!(!write, "a load");
        }
        other => panic!("expected Fault, got {other:?}"),
    }
    // Freed memory (the data page made inaccessible) faults the same way.
    // SAFETY: our page.
    assert_eq!(
        unsafe { libc::mprotect(g.base.add(g.page).cast(), g.page, libc::PROT_NONE) },
        0
    );
    match run("fill_words", (1, 1, 1), 32, &[ptr(p), long(4), int(1)]) {
        Err(EmuKernelError::Fault { addr, .. }) => assert_eq!(addr, p as usize),
        other => panic!("expected Fault, got {other:?}"),
    }
    // A correct launch afterwards is unaffected.
    let mut ok = vec![0u32; 10];
    run(
        "fill_words",
        (1, 1, 1),
        32,
        &[ptr(ok.as_mut_ptr()), long(10), int(3)],
    )
    .expect("clean launch");
    assert!(ok.iter().all(|&w| w == 3));
}
