//! Byte sizes with units ("8 GiB", "1.5 GB", "1000000") and shares of free memory ("90%").
//!
//! Scenario files and `kvbench plan` take budgets as humans write them; everything downstream
//! works in whole bytes. Binary prefixes (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones
//! (kB, MB, GB, TB) powers of 1000, because both appear in datasheets and mixing them up is a 7%
//! error at GiB scale.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UnitsError {
    #[error("empty size")]
    Empty,
    #[error("`{0}` is not a number followed by an optional unit (B, KiB, MiB, GiB, TiB, PiB, EiB, kB, MB, GB, TB, PB, EB)")]
    Malformed(String),
    #[error("unknown unit `{unit}` in `{text}` (use B, KiB, MiB, GiB, TiB, PiB, EiB, kB, MB, GB, TB, PB, EB)")]
    UnknownUnit { text: String, unit: String },
    #[error("`{0}` is negative or not finite")]
    OutOfRange(String),
    #[error("`{0}` does not fit in 64 bits")]
    Overflow(String),
    #[error("share `{0}` must be a percentage in (0, 100]")]
    BadShare(String),
}

/// Parses a byte size: a non-negative number with an optional unit, spaces allowed between.
/// Fractions are allowed with a unit ("1.5 GiB") and rounded down to whole bytes.
pub fn parse_bytes(text: &str) -> Result<u64, UnitsError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(UnitsError::Empty);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_' || c == 'e' || c == 'E'))
        .unwrap_or(t.len());
    // "1e9" is a number, but "1 EiB"-like units would start with 'E': only treat e/E as part of
    // the number when a digit follows.
    let (num, unit) = split_number(t, split);
    let num_clean: String = num.chars().filter(|&c| c != '_').collect();
    if num_clean.is_empty() {
        return Err(UnitsError::Malformed(text.to_string()));
    }
    let value: f64 = num_clean
        .parse()
        .map_err(|_| UnitsError::Malformed(text.to_string()))?;
    if !value.is_finite() || value < 0.0 {
        return Err(UnitsError::OutOfRange(text.to_string()));
    }
    let multiplier = unit_multiplier(unit.trim()).ok_or_else(|| UnitsError::UnknownUnit {
        text: text.to_string(),
        unit: unit.trim().to_string(),
    })?;
    // Integers without a fractional part stay exact even above 2^53.
    if !num_clean.contains(['.', 'e', 'E']) {
        let n: u64 = num_clean
            .parse()
            .map_err(|_| UnitsError::Overflow(text.to_string()))?;
        return n
            .checked_mul(multiplier)
            .ok_or_else(|| UnitsError::Overflow(text.to_string()));
    }
    let bytes = value * multiplier as f64;
    if bytes >= u64::MAX as f64 {
        return Err(UnitsError::Overflow(text.to_string()));
    }
    Ok(bytes.floor() as u64)
}

fn split_number(t: &str, first_non_numeric: usize) -> (&str, &str) {
    let bytes = t.as_bytes();
    // Walk back over a trailing 'e'/'E' that is not followed by a digit: it starts the unit.
    let mut end = first_non_numeric;
    while end > 0 {
        let c = bytes[end - 1];
        if (c == b'e' || c == b'E') && !bytes.get(end).is_some_and(|d| d.is_ascii_digit()) {
            end -= 1;
        } else {
            break;
        }
    }
    (&t[..end], &t[end..])
}

fn unit_multiplier(unit: &str) -> Option<u64> {
    let m = match unit.to_ascii_lowercase().as_str() {
        "" | "b" | "bytes" | "byte" => 1,
        "kib" | "ki" => 1 << 10,
        "mib" | "mi" => 1 << 20,
        "gib" | "gi" => 1 << 30,
        "tib" | "ti" => 1 << 40,
        "pib" | "pi" => 1 << 50,
        "eib" | "ei" => 1 << 60,
        "kb" | "k" => 1_000,
        "mb" | "m" => 1_000_000,
        "gb" | "g" => 1_000_000_000,
        "tb" | "t" => 1_000_000_000_000,
        "pb" | "p" => 1_000_000_000_000_000,
        "eb" => 1_000_000_000_000_000_000,
        _ => return None,
    };
    Some(m)
}

/// A KV budget as a scenario states it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum KvBudget {
    /// A fixed number of bytes per device.
    Bytes(u64),
    /// A share (0, 1] of the device memory left after the model weights.
    ShareOfFree(f64),
}

impl KvBudget {
    /// Parses "8 GiB", "1000000" or "90%".
    pub fn parse(text: &str) -> Result<KvBudget, UnitsError> {
        let t = text.trim();
        if let Some(pct) = t.strip_suffix('%') {
            let p: f64 = pct
                .trim()
                .parse()
                .map_err(|_| UnitsError::BadShare(text.to_string()))?;
            if !(p > 0.0 && p <= 100.0) {
                return Err(UnitsError::BadShare(text.to_string()));
            }
            return Ok(KvBudget::ShareOfFree(p / 100.0));
        }
        parse_bytes(t).map(KvBudget::Bytes)
    }

    /// Bytes for a device with `device_bytes` of memory of which `weight_bytes` hold weights.
    /// `None` when a share is asked for without a device figure.
    pub fn resolve(self, device_bytes: Option<u64>, weight_bytes: u64) -> Option<u64> {
        match self {
            KvBudget::Bytes(b) => Some(b),
            KvBudget::ShareOfFree(s) => {
                let free = device_bytes?.saturating_sub(weight_bytes);
                Some((free as f64 * s).floor() as u64)
            }
        }
    }
}

impl fmt::Display for KvBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvBudget::Bytes(b) => write!(f, "{}", format_bytes(*b)),
            KvBudget::ShareOfFree(s) => write!(f, "{}% of free device memory", s * 100.0),
        }
    }
}

/// Human form with a binary unit and at most three decimals, trailing zeros trimmed:
/// 131072 → "128 KiB", 1966080 → "1.875 MiB", 1000 → "1000 B".
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut unit = 0;
    let mut scale = 1u64;
    while unit + 1 < UNITS.len() && bytes >= scale * 1024 {
        scale *= 1024;
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes} B");
    }
    let value = bytes as f64 / scale as f64;
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_with_and_without_units() {
        assert_eq!(parse_bytes("8 GiB"), Ok(8 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5 GB"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("1000000"), Ok(1_000_000));
        assert_eq!(parse_bytes("1e9"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("4 kB"), Ok(4000));
        assert_eq!(parse_bytes("1_000 B"), Ok(1000));
    }

    #[test]
    fn refuses_bad_sizes() {
        assert!(matches!(parse_bytes(""), Err(UnitsError::Empty)));
        assert!(matches!(
            parse_bytes("8 GB/s"),
            Err(UnitsError::UnknownUnit { .. })
        ));
        assert!(matches!(parse_bytes("GiB"), Err(UnitsError::Malformed(_))));
        assert!(matches!(
            parse_bytes("99999999999 TiB"),
            Err(UnitsError::Overflow(_))
        ));
    }

    #[test]
    fn budget_share_is_of_memory_after_weights() {
        assert_eq!(KvBudget::parse("90%"), Ok(KvBudget::ShareOfFree(0.9)));
        let b = KvBudget::parse("50%").unwrap_or(KvBudget::Bytes(0));
        assert_eq!(b.resolve(Some(1000), 200), Some(400));
        assert_eq!(b.resolve(None, 200), None);
        assert!(KvBudget::parse("150%").is_err());
        assert!(KvBudget::parse("0%").is_err());
    }

    #[test]
    fn formats_essay_figures() {
        assert_eq!(format_bytes(131_072), "128 KiB");
        assert_eq!(format_bytes(1_966_080), "1.875 MiB");
        assert_eq!(format_bytes(536_870_912), "512 MiB");
        assert_eq!(format_bytes(1000), "1000 B");
        assert_eq!(format_bytes(1 << 60), "1 EiB");
        assert_eq!(format_bytes(u64::MAX), "16 EiB");
    }

    #[test]
    fn parses_exbibytes() {
        assert_eq!(parse_bytes("1 EiB"), Ok(1 << 60));
        assert_eq!(parse_bytes("8 TiB"), Ok(8 << 40));
        assert!(matches!(
            parse_bytes("16 EiB"),
            Err(UnitsError::Overflow(_))
        ));
    }
}
