//! Shared helpers for the kernel tests: seeds, random non-zero data, a plain f64 reference.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The run's seed: `KVBENCH_SEED` to replay, else fresh from the clock. Printed either way.
pub fn seed(test: &str) -> u64 {
    let seed = match std::env::var("KVBENCH_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("KVBENCH_SEED must be an integer, got {s:?}")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    };
    eprintln!("{test}: seed {seed} (replay with KVBENCH_SEED={seed})");
    seed
}

pub fn rng(seed: u64, case: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed ^ case.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Uniform in ±[0.05, 1]: never zero, so an unwritten or skipped element cannot pass by luck.
pub fn nonzero(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let m: f32 = rng.gen_range(0.05..1.0);
            if rng.gen_bool(0.5) {
                m
            } else {
                -m
            }
        })
        .collect()
}

/// Reference attention for one query group in f64 over logical K/V `[ctx, kv_heads, hd]`.
pub fn reference_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    ctx: usize,
    q_heads: usize,
    kv_heads: usize,
    hd: usize,
) -> Vec<f64> {
    let g = q_heads / kv_heads;
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f64; q_heads * hd];
    for qh in 0..q_heads {
        let kh = qh / g;
        let qv = &q[qh * hd..(qh + 1) * hd];
        let mut s: Vec<f64> = (0..ctx)
            .map(|t| {
                let kr = &k[(t * kv_heads + kh) * hd..][..hd];
                qv.iter()
                    .zip(kr)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = s
            .iter_mut()
            .map(|x| {
                *x = (*x - m).exp();
                *x
            })
            .sum();
        for t in 0..ctx {
            let vr = &v[(t * kv_heads + kh) * hd..][..hd];
            for i in 0..hd {
                out[qh * hd + i] += s[t] / sum * vr[i] as f64;
            }
        }
    }
    out
}

pub fn rel_err(out: &[f32], reference: &[f64]) -> f64 {
    let mut d = 0f64;
    let mut n = 0f64;
    for (o, r) in out.iter().zip(reference) {
        d += (*o as f64 - r).powi(2);
        n += r * r;
    }
    (d / n).sqrt()
}
