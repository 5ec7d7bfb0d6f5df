//! Hand-vectorized micro-kernels for f32 or bf16 K/V on AVX2 + FMA.
//!
//! Pass 1: four query heads against two key rows at once. The portable `dot` loads a query and
//! a key vector per FMA and ends every dot with a 16-lane scalar sum; here six loads feed eight
//! FMAs and eight dots share one horizontal-add tree. Pass 2: two query heads per V load.

#[cfg(target_arch = "x86_64")]
use crate::elem::{KvElem, Storage};

/// Eight elements from `p` as f32. Only for [`Storage::F32`] and [`Storage::Bf16`].
///
/// # Safety
/// The CPU must support AVX2; `p .. p + 8` must be readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn load8<E: KvElem>(p: *const E) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    match E::STORAGE {
        Storage::Bf16 => {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
        Storage::F32 => _mm256_loadu_ps(p as *const f32),
        Storage::Other => unreachable!("no vectorized load for {}", E::NAME),
    }
}

/// Whether `E` has a vectorized load.
#[cfg(target_arch = "x86_64")]
pub(super) fn simd_storage<E: KvElem>() -> bool {
    matches!(E::STORAGE, Storage::F32 | Storage::Bf16)
}

/// `out[2·a + r] = q_a · k_r` for query heads `a = 0..4` (rows of `q`, each `hd` long) and key
/// rows `k0`, `k1` (each `hd` long). `hd` must be a multiple of 8.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn dots_4x2<E: KvElem>(q: &[f32], hd: usize, k0: &[E], k1: &[E]) -> [f32; 8] {
    use std::arch::x86_64::*;
    assert!(hd.is_multiple_of(8) && q.len() >= 4 * hd && k0.len() >= hd && k1.len() >= hd);
    assert!(simd_storage::<E>());
    let (qp, p0, p1) = (q.as_ptr(), k0.as_ptr(), k1.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut c = 0;
    while c < hd {
        // SAFETY (all loads): c + 8 <= hd and the lengths were asserted above.
        let ka = load8(p0.add(c));
        let kb = load8(p1.add(c));
        for a in 0..4 {
            let qa = _mm256_loadu_ps(qp.add(a * hd + c));
            acc[2 * a] = _mm256_fmadd_ps(qa, ka, acc[2 * a]);
            acc[2 * a + 1] = _mm256_fmadd_ps(qa, kb, acc[2 * a + 1]);
        }
        c += 8;
    }
    // Horizontal sums of all eight accumulators at once: result lane i = Σ acc[i].
    let t0 = _mm256_hadd_ps(acc[0], acc[1]);
    let t1 = _mm256_hadd_ps(acc[2], acc[3]);
    let t2 = _mm256_hadd_ps(acc[4], acc[5]);
    let t3 = _mm256_hadd_ps(acc[6], acc[7]);
    let u0 = _mm256_hadd_ps(t0, t1);
    let u1 = _mm256_hadd_ps(t2, t3);
    let lo = _mm256_permute2f128_ps::<0x20>(u0, u1);
    let hi = _mm256_permute2f128_ps::<0x31>(u0, u1);
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(lo, hi));
    out
}

/// Pass 2 for two query heads: `out[o_a + c] += Σ_t p_a[t] · v[bases[t] + c]` for `a = 0, 1`
/// and `c < hd`, tokens in order (the same fused additions, in the same order, as the portable
/// FMA path). A 32-lane slice of both heads stays in eight registers across the block; each V
/// load feeds two FMAs. `hd` must be a multiple of 32.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn accumulate_2x32<E: KvElem>(
    out: &mut [f32],
    o0: usize,
    o1: usize,
    p0: &[f32],
    p1: &[f32],
    v: &[E],
    bases: &[usize],
    hd: usize,
) {
    use std::arch::x86_64::*;
    let n = bases.len();
    assert!(hd.is_multiple_of(32) && p0.len() >= n && p1.len() >= n);
    assert!(o0.max(o1) + hd <= out.len() && o0.abs_diff(o1) >= hd);
    assert!(bases.iter().all(|&b| b + hd <= v.len()) && simd_storage::<E>());
    let (op, vp) = (out.as_mut_ptr(), v.as_ptr());
    let mut c = 0;
    while c < hd {
        // SAFETY (all loads and stores): every offset is below o_a + hd or bases[t] + hd,
        // asserted in bounds above; the two heads' slices do not overlap.
        let mut acc = [_mm256_setzero_ps(); 8];
        for i in 0..4 {
            acc[i] = _mm256_loadu_ps(op.add(o0 + c + 8 * i));
            acc[4 + i] = _mm256_loadu_ps(op.add(o1 + c + 8 * i));
        }
        for (t, &b) in bases.iter().enumerate() {
            let (w0, w1) = (_mm256_set1_ps(p0[t]), _mm256_set1_ps(p1[t]));
            for i in 0..4 {
                let x = load8(vp.add(b + c + 8 * i));
                acc[i] = _mm256_fmadd_ps(w0, x, acc[i]);
                acc[4 + i] = _mm256_fmadd_ps(w1, x, acc[4 + i]);
            }
        }
        for i in 0..4 {
            _mm256_storeu_ps(op.add(o0 + c + 8 * i), acc[i]);
            _mm256_storeu_ps(op.add(o1 + c + 8 * i), acc[4 + i]);
        }
        c += 32;
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn dots_4x2_match_plain_dots() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            eprintln!("SKIP: dots_4x2_match_plain_dots: this CPU lacks AVX2+FMA");
            return;
        }
        for hd in [8usize, 64, 128] {
            let q: Vec<f32> = (0..4 * hd)
                .map(|i| ((i * 37) % 23) as f32 / 7.0 - 1.5)
                .collect();
            let k0: Vec<f32> = (0..hd)
                .map(|i| ((i * 11) % 19) as f32 / 5.0 - 1.0)
                .collect();
            let k1: Vec<f32> = (0..hd)
                .map(|i| ((i * 13) % 17) as f32 / 3.0 - 2.0)
                .collect();
            // SAFETY: features checked above.
            let got = unsafe { dots_4x2(&q, hd, &k0, &k1) };
            for a in 0..4 {
                for (r, k) in [&k0, &k1].into_iter().enumerate() {
                    let want: f64 = (0..hd).map(|i| q[a * hd + i] as f64 * k[i] as f64).sum();
                    let g = got[2 * a + r] as f64;
                    assert!(
                        (g - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "hd {hd} a {a} r {r}: {g} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn bf16_rows_are_widened_exactly() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            eprintln!("SKIP: bf16_rows_are_widened_exactly: this CPU lacks AVX2+FMA");
            return;
        }
        let hd = 64;
        let q: Vec<f32> = (0..4 * hd)
            .map(|i| ((i * 29) % 31) as f32 / 9.0 - 1.5)
            .collect();
        let k0: Vec<half::bf16> = (0..hd)
            .map(|i| half::bf16::from_f32(i as f32 * 0.37 - 11.0))
            .collect();
        let k1: Vec<half::bf16> = (0..hd)
            .map(|i| half::bf16::from_f32(3.0 - i as f32 * 0.11))
            .collect();
        // SAFETY: features checked above.
        let got = unsafe { dots_4x2(&q, hd, &k0, &k1) };
        for a in 0..4 {
            for (r, k) in [&k0, &k1].into_iter().enumerate() {
                let want: f64 = (0..hd).map(|i| q[a * hd + i] as f64 * k[i].to_f64()).sum();
                let g = got[2 * a + r] as f64;
                assert!(
                    (g - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "a {a} r {r}: {g} vs {want}"
                );
            }
        }
        let mut out = vec![0.5f32; 2 * hd + 2];
        let (p0, p1) = ([0.25f32, -2.0], [1.5f32, 0.75]);
        // SAFETY: features checked above.
        unsafe {
            accumulate_2x32(
                &mut out,
                0,
                hd + 2,
                &p0,
                &p1,
                &[k0.clone(), k1.clone()].concat(),
                &[0, hd],
                hd,
            )
        };
        for c in 0..hd {
            let w0 = 0.5 + 0.25 * k0[c].to_f32() - 2.0 * k1[c].to_f32();
            let w1 = 0.5 + 1.5 * k0[c].to_f32() + 0.75 * k1[c].to_f32();
            assert!(
                (out[c] - w0).abs() <= 1e-5 * w0.abs().max(1.0),
                "head 0 lane {c}"
            );
            assert!(
                (out[hd + 2 + c] - w1).abs() <= 1e-5 * w1.abs().max(1.0),
                "head 1 lane {c}"
            );
        }
    }
}
