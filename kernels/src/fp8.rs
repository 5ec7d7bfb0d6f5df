//! The two 8-bit float formats a KV cache is stored in (OCP FP8): `e4m3` (4 exponent bits, 3
//! mantissa bits, bias 7, no infinities, largest finite 448) and `e5m2` (5, 2, bias 15, IEEE
//! infinities, largest finite 57344). Written here rather than taken from a crate so that the
//! rounding (to nearest, ties to even, saturating at the largest finite value, as hardware
//! `cvt.satfinite` does) is stated and tested against every code.

/// An 8-bit float format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    E4m3,
    E5m2,
}

/// The quiet NaN code of both formats (positive sign).
const NAN_CODE: u8 = 0x7F;

impl Fp8Format {
    pub const ALL: [Fp8Format; 2] = [Fp8Format::E4m3, Fp8Format::E5m2];

    pub fn name(self) -> &'static str {
        match self {
            Fp8Format::E4m3 => "fp8_e4m3",
            Fp8Format::E5m2 => "fp8_e5m2",
        }
    }

    /// Mantissa (fraction) bits.
    pub fn mantissa_bits(self) -> u32 {
        match self {
            Fp8Format::E4m3 => 3,
            Fp8Format::E5m2 => 2,
        }
    }

    fn bias(self) -> i32 {
        match self {
            Fp8Format::E4m3 => 7,
            Fp8Format::E5m2 => 15,
        }
    }

    /// The largest finite value: where encoding saturates.
    pub fn max_finite(self) -> f32 {
        match self {
            Fp8Format::E4m3 => 448.0,
            Fp8Format::E5m2 => 57344.0,
        }
    }

    /// The code of [`max_finite`](Self::max_finite) (positive sign).
    fn max_code(self) -> u8 {
        match self {
            Fp8Format::E4m3 => 0x7E,
            Fp8Format::E5m2 => 0x7B,
        }
    }

    /// Exponent of the smallest normal value (`1 − bias`).
    pub fn min_normal_exp(self) -> i32 {
        1 - self.bias()
    }

    /// The value of a code; NaN codes decode to NaN, e5m2's infinity codes to ±∞.
    pub fn decode(self, code: u8) -> f32 {
        let m_bits = self.mantissa_bits();
        let sign = if code & 0x80 != 0 { -1.0f64 } else { 1.0 };
        let e = ((code & 0x7F) >> m_bits) as i32;
        let m = (code & ((1 << m_bits) - 1)) as i32;
        let e_max = (1i32 << (7 - m_bits)) - 1;
        match self {
            Fp8Format::E4m3 if e == e_max && m == (1 << m_bits) - 1 => return f32::NAN,
            Fp8Format::E5m2 if e == e_max => {
                return if m == 0 {
                    (sign * f64::INFINITY) as f32
                } else {
                    f32::NAN
                }
            }
            _ => {}
        }
        let frac = m as f64 / (1u32 << m_bits) as f64;
        let mag = if e == 0 {
            frac * 2f64.powi(self.min_normal_exp())
        } else {
            (1.0 + frac) * 2f64.powi(e - self.bias())
        };
        (sign * mag) as f32
    }

    /// The nearest code to `x` (ties to the even code), saturating to ± the largest finite value
    /// (infinities included); NaN to NaN.
    pub fn encode(self, x: f32) -> u8 {
        if x.is_nan() {
            return NAN_CODE;
        }
        let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = (x as f64).abs();
        if a >= self.max_finite() as f64 {
            return sign | self.max_code();
        }
        let m_bits = self.mantissa_bits() as i32;
        let emin = self.min_normal_exp();
        // Exact in f64: every f32 is a normal f64 and the divisions are by powers of two.
        let code = if a < 2f64.powi(emin) {
            // Subnormal: the code is the count of the smallest steps; rounding up to 2^m_bits
            // steps is the smallest normal, whose code is that same integer.
            (a / 2f64.powi(emin - m_bits)).round_ties_even() as u32
        } else {
            let e = ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023;
            let mut r = (a / 2f64.powi(e - m_bits)).round_ties_even() as u32;
            let mut e = e;
            if r == 1 << (m_bits + 1) {
                e += 1;
                r = 1 << m_bits;
            }
            (((e + self.bias()) as u32) << m_bits) | (r - (1 << m_bits))
        };
        // Below the largest finite value, rounding reaches it at most; the guard keeps that so.
        sign | (code.min(self.max_code() as u32) as u8)
    }

    /// `x` rounded to this format (encode then decode).
    pub fn round(self, x: f32) -> f32 {
        self.decode(self.encode(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code's value from the format's definition, written independently of `decode`:
    /// (−1)^s × 2^(E − bias) × (1 + M / 2^m) for E > 0, (−1)^s × 2^(1 − bias) × M / 2^m for
    /// E = 0; e4m3's S.1111.111 is NaN, e5m2's S.11111.00 is ∞ and S.11111.xx NaN.
    fn reference(f: Fp8Format) -> Vec<f64> {
        let (eb, mb, bias) = match f {
            Fp8Format::E4m3 => (4u32, 3u32, 7i32),
            Fp8Format::E5m2 => (5, 2, 15),
        };
        (0u32..256)
            .map(|c| {
                let s = if c >> 7 == 1 { -1.0 } else { 1.0 };
                let e = (c >> mb) & ((1 << eb) - 1);
                let m = c & ((1 << mb) - 1);
                let all_ones = e == (1 << eb) - 1;
                match f {
                    Fp8Format::E4m3 if all_ones && m == 7 => f64::NAN,
                    Fp8Format::E5m2 if all_ones && m == 0 => s * f64::INFINITY,
                    Fp8Format::E5m2 if all_ones => f64::NAN,
                    _ if e == 0 => s * (m as f64 / (1 << mb) as f64) * 2f64.powi(1 - bias),
                    _ => s * (1.0 + m as f64 / (1 << mb) as f64) * 2f64.powi(e as i32 - bias),
                }
            })
            .collect()
    }

    #[test]
    fn every_code_decodes_to_the_reference_table() {
        for f in Fp8Format::ALL {
            let table = reference(f);
            for (c, want) in table.iter().enumerate() {
                let got = f.decode(c as u8) as f64;
                assert!(
                    (got.is_nan() && want.is_nan()) || got == *want,
                    "{} code {c:#04x}: decoded {got}, definition says {want}",
                    f.name()
                );
            }
        }
        assert_eq!(Fp8Format::E4m3.decode(0x7E), 448.0);
        assert_eq!(Fp8Format::E5m2.decode(0x7B), 57344.0);
        assert_eq!(Fp8Format::E4m3.decode(0x01), 2f32.powi(-9));
        assert_eq!(Fp8Format::E5m2.decode(0x01), 2f32.powi(-16));
    }

    #[test]
    fn every_finite_code_round_trips() {
        for f in Fp8Format::ALL {
            let mut finite = 0;
            for c in 0u8..=255 {
                let v = f.decode(c);
                if !v.is_finite() {
                    continue;
                }
                finite += 1;
                let back = f.encode(v);
                // ±0 are two codes of one value; every other finite code is its value's only one.
                let same = back == c || (v == 0.0 && f.decode(back) == 0.0);
                assert!(
                    same,
                    "{} code {c:#04x} = {v} encodes to {back:#04x}",
                    f.name()
                );
            }
            assert_eq!(finite, if f == Fp8Format::E4m3 { 254 } else { 248 });
        }
    }

    #[test]
    fn saturates_and_keeps_nan() {
        for f in Fp8Format::ALL {
            let max = f.max_finite();
            assert_eq!(f.round(max * 4.0), max);
            assert_eq!(f.round(-f32::INFINITY), -max);
            assert_eq!(f.round(f32::INFINITY), max);
            assert!(f.round(f32::NAN).is_nan());
        }
        // Ties go to the even code: 1 + 1/16 lies halfway between 1 and 1.125 in e4m3.
        assert_eq!(Fp8Format::E4m3.round(1.0625), 1.0);
        assert_eq!(Fp8Format::E4m3.round(1.1875), 1.25);
        assert_eq!(Fp8Format::E5m2.round(1.125), 1.0);
    }

    /// Encoding is the nearest finite value of the table (ties to the even code), checked by
    /// brute force over seeded random f32s spanning the subnormals to beyond saturation; and
    /// the error is at most half an ulp of the format at that value.
    #[test]
    fn encode_is_nearest_even_within_half_an_ulp() {
        use rand::{Rng, SeedableRng};
        let seed: u64 = std::env::var("FP8_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x0F8_5EED);
        println!("fp8 property seed {seed} (replay: FP8_SEED={seed})");
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
        for f in Fp8Format::ALL {
            let table = reference(f);
            let finite: Vec<(u8, f64)> = (0u8..=255)
                .map(|c| (c, table[c as usize]))
                .filter(|(_, v)| v.is_finite())
                .collect();
            let max = f.max_finite() as f64;
            for _ in 0..20_000 {
                let exp = rng.gen_range(-20.0..(max.log2() + 1.0));
                let sign = if rng.gen_bool(0.5) { -1.0 } else { 1.0 };
                let x = (sign * 2f64.powf(exp)) as f32;
                let xd = x as f64;
                let got = f.encode(x);
                let best = finite
                    .iter()
                    .map(|&(_, v)| (v - xd).abs())
                    .fold(f64::INFINITY, f64::min);
                let gv = table[got as usize];
                assert!(
                    (gv - xd).abs() == best,
                    "seed {seed}: {} encode({x}) = {gv}, nearest is {best} away",
                    f.name()
                );
                if (gv - xd).abs() == best && xd.abs() < max {
                    // A tie between two codes resolves to the even one.
                    let ties: Vec<u8> = finite
                        .iter()
                        .filter(|&&(_, v)| (v - xd).abs() == best)
                        .map(|&(c, _)| c)
                        .collect();
                    if ties.len() == 2 && ties.iter().all(|&c| table[c as usize] != 0.0) {
                        assert_eq!(got % 2, 0, "seed {seed}: tie at {x} not to even");
                    }
                    // Half an ulp: the spacing at |x| is 2^(max(e, emin) − m).
                    let e = xd.abs().log2().floor().max(f.min_normal_exp() as f64);
                    let half_ulp = 2f64.powf(e - f.mantissa_bits() as f64) / 2.0;
                    assert!(
                        (gv - xd).abs() <= half_ulp,
                        "seed {seed}: {} error at {x} is {} > half ulp {half_ulp}",
                        f.name(),
                        (gv - xd).abs()
                    );
                }
            }
        }
    }
}
