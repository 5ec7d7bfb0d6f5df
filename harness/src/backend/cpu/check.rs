//! The oracle check: each checked sequence's logits at every sampled step against the f64
//! oracle's over the same token history, recomputed from scratch with no cache.
//!
//! Histories are checked when the sequence is forgotten (its history is final then), outside
//! the timed compute. A sequence still live at the end is checked by [`Checker::report`].

use kvbench_cache_api::SeqId;

/// f32 KV: ‖out − ref‖/‖ref‖ ≤ 1e-4. Observed errors are ~1e-6 (f32 accumulation over a few
/// hundred terms); a wrong block, a missed copy-on-write or a stale slot moves logits by O(1).
pub const F32_TOLERANCE: f64 = 1e-4;
/// bf16 KV: every stored K/V element is rounded to 8 significant bits (≤ 2^-9 relative); the
/// logits observed move by ~1e-3, so 1e-2 keeps a margin while still catching any real fault.
pub const BF16_TOLERANCE: f64 = 1e-2;

/// FP8 e4m3 KV: every stored K/V value is its f32 value divided by its scale, rounded to 3
/// mantissa bits and multiplied back, so within half an ulp — 2^-4 relative — of it (the
/// scales' headroom keeps values out of the subnormals). Logits are a smooth function of K/V in
/// which the errors of independent elements average rather than add: measured max 2.5e-2 on
/// `quick-basic` at every scale granularity (2.4e-2 per tensor, 2.5e-2 per head and per block).
/// The tolerance is the per-element bound 2^-4: 2.5× the measurement, and still far below the
/// O(1) a wrong block, a missed copy-on-write or a stale slot moves logits by.
pub const FP8_E4M3_TOLERANCE: f64 = 0.0625;
/// FP8 e5m2 KV: the same argument with 2 mantissa bits, so twice e4m3's step: half an ulp =
/// 2^-3. Measured max 5.2e-2 on `quick-basic` (4.7e-2 per tensor, 4.8e-2 per head, 5.2e-2 per
/// block); on the layer-group variants (per tensor, seed 7) 7.2e-2 `tiny-sliding`, 3.4e-2
/// `tiny-mla`, 6.3e-2 `tiny-hybrid` — each about twice its e4m3 figure, the closest 1.7×
/// inside the bound. A planted fault still moves logits by 0.33–0.83 there, past it.
pub const FP8_E5M2_TOLERANCE: f64 = 0.125;

/// The oracle tolerance for a KV dtype (weights are f32 on cpu).
pub fn kv_tolerance(kv: crate::model::Dtype) -> f64 {
    use crate::model::Dtype;
    match kv {
        Dtype::F32 => F32_TOLERANCE,
        Dtype::F16 | Dtype::Bf16 => BF16_TOLERANCE,
        Dtype::Fp8E4m3 => FP8_E4M3_TOLERANCE,
        Dtype::Fp8E5m2 => FP8_E5M2_TOLERANCE,
    }
}

/// Every sequence among the first this many registered is checked; later ones are sampled.
pub const CHECK_ALL_FIRST: u64 = 256;
/// Beyond that, one sequence in this many (by a hash of its id) is checked, plus every fork of a
/// checked sequence.
pub const SAMPLE_ONE_IN: u64 = 8;

/// Whether `seq`, the `nth` registered, is checked.
pub fn sampled(seq: SeqId, nth: u64) -> bool {
    if nth < CHECK_ALL_FIRST {
        return true;
    }
    // splitmix64 finaliser: a fixed, well-mixed choice independent of arrival order.
    let mut z = seq.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).is_multiple_of(SAMPLE_ONE_IN)
}

/// The oracle comparison itself is shared with the `cuda` backend's check.
pub type Checker = crate::backend::logit_check::Checker<kvbench_oracle::Model>;
