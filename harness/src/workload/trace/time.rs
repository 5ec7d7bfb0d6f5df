//! Exact time parsing: decimal strings and Azure timestamps to integer nanoseconds, so that an
//! arrival written in a trace reads back unchanged from `requests.csv`.

/// A non-negative decimal (`12`, `12.5`, `0.000001`) times `10^scale_digits`, rounded half up at
/// the last digit kept; `None` if it is not one.
pub fn decimal_scaled(s: &str, scale_digits: u32) -> Option<u64> {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, f),
        None => (s, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut v: u64 = 0;
    for b in int.bytes() {
        v = v.checked_mul(10)?.checked_add((b - b'0') as u64)?;
    }
    let fb = frac.as_bytes();
    for i in 0..scale_digits as usize {
        let d = fb.get(i).map_or(0, |b| (b - b'0') as u64);
        v = v.checked_mul(10)?.checked_add(d)?;
    }
    if fb.get(scale_digits as usize).is_some_and(|&b| b >= b'5') {
        v = v.checked_add(1)?;
    }
    Some(v)
}

/// Days from 1970-01-01 to the civil date (proleptic Gregorian; H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: u32, m: u32) -> u32 {
    let leap = (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
    match m {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `2023-11-16 18:15:46.6805900` (a `T` instead of the space, a trailing `Z`, and 0 to 9
/// fractional digits are accepted) → nanoseconds since the Unix epoch. UTC is assumed.
pub fn azure_timestamp_ns(s: &str) -> Result<u64, String> {
    let bad = || format!("`{s}` is not a timestamp like 2023-11-16 18:15:46.6805900");
    let s2 = s.strip_suffix('Z').unwrap_or(s);
    let (date, time) = s2
        .split_once(' ')
        .or_else(|| s2.split_once('T'))
        .ok_or_else(bad)?;
    let mut dp = date.split('-');
    let (Some(y), Some(mo), Some(d), None) = (dp.next(), dp.next(), dp.next(), dp.next()) else {
        return Err(bad());
    };
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut tp = hms.split(':');
    let (Some(h), Some(mi), Some(sec), None) = (tp.next(), tp.next(), tp.next(), tp.next()) else {
        return Err(bad());
    };
    let num = |x: &str, lo: u32, hi: u32| -> Result<u32, String> {
        match x.parse::<u32>() {
            Ok(v) if (lo..=hi).contains(&v) && x.bytes().all(|b| b.is_ascii_digit()) => Ok(v),
            _ => Err(bad()),
        }
    };
    let (y, mo, d) = (num(y, 1970, 9999)?, num(mo, 1, 12)?, num(d, 1, 31)?);
    if d > days_in_month(y, mo) {
        return Err(format!(
            "`{s}`: {y}-{mo:02} has {} days, not {d}",
            days_in_month(y, mo)
        ));
    }
    // A leap second cannot be placed on a clock of ns since the epoch without a table: refused.
    let (h, mi, sec) = (num(h, 0, 23)?, num(mi, 0, 59)?, num(sec, 0, 59)?);
    if frac.len() > 9 {
        return Err(bad());
    }
    let frac_ns = if frac.is_empty() {
        0
    } else {
        // `.frac`, a slice of the row (no allocation per row).
        decimal_scaled(&time[hms.len()..], 9).ok_or_else(bad)?
    };
    let days = days_from_civil(y as i64, mo, d);
    let secs = days * 86_400 + h as i64 * 3600 + mi as i64 * 60 + sec as i64;
    u64::try_from(secs)
        .ok()
        .and_then(|s| s.checked_mul(1_000_000_000))
        .and_then(|ns| ns.checked_add(frac_ns))
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_scale_exactly() {
        assert_eq!(decimal_scaled("12", 6), Some(12_000_000));
        assert_eq!(decimal_scaled("12.5", 6), Some(12_500_000));
        assert_eq!(decimal_scaled("0.0000015", 6), Some(2));
        assert_eq!(decimal_scaled(".25", 3), Some(250));
        assert_eq!(decimal_scaled("-1", 6), None);
        assert_eq!(decimal_scaled("1e3", 6), None);
        assert_eq!(decimal_scaled("", 6), None);
    }

    #[test]
    fn azure_timestamps_are_exact_and_ordered() {
        let a = azure_timestamp_ns("2023-11-16 18:15:46.6805900").unwrap();
        let b = azure_timestamp_ns("2023-11-16 18:15:50.9951690").unwrap();
        assert_eq!(b - a, 4_314_579_000);
        // 2023-11-16 is 19677 days after the epoch.
        assert_eq!(
            azure_timestamp_ns("2023-11-16 00:00:00").unwrap(),
            19_677 * 86_400 * 1_000_000_000
        );
        assert_eq!(
            azure_timestamp_ns("2024-03-01T00:00:00Z").unwrap()
                - azure_timestamp_ns("2024-02-28T00:00:00Z").unwrap(),
            2 * 86_400 * 1_000_000_000
        );
        assert!(azure_timestamp_ns("2023-13-01 00:00:00").is_err());
        // Dates and times that do not exist.
        assert!(azure_timestamp_ns("2023-02-29 00:00:00").is_err());
        assert!(azure_timestamp_ns("2024-02-29 00:00:00").is_ok());
        assert!(azure_timestamp_ns("1900-02-29 00:00:00").is_err());
        assert!(azure_timestamp_ns("2023-04-31 00:00:00").is_err());
        assert!(azure_timestamp_ns("2023-11-16 18:15:60").is_err());
        assert!(azure_timestamp_ns("yesterday").is_err());
    }
}
