//! Who waited for a step's onloads: the sequences whose lower-tier hits the step brought back,
//! each charged a share of the step's onload wait (`StepOutput::onload_wait_s`) by the tokens
//! it had onloaded — so per-request waits add up to what the steps waited, to the nanosecond.
//!
//! **Rounding rule:** with wait `W` ns and onload tokens `t_i` (sum `T`), sequence `i` gets
//! `⌊W · t_i / T⌋` ns and the remainder `W − Σ⌊…⌋` (less than the number of sequences) goes to
//! the first sequence in the step's op order. A sequence that is done by the time the step
//! completes (cancelled while it was in flight) is charged nothing: its record already went out.

use kvbench_cache_api::TierOp;

/// The step's onloads per stream, in op order (a stream's several ops summed into its first
/// entry's place), `(stream, tokens)`.
pub(super) fn onloads_by_stream(ops: &[TierOp]) -> Vec<(u32, u64)> {
    let mut out: Vec<(u32, u64)> = Vec::new();
    for op in ops.iter().filter(|op| op.is_onload()) {
        let Some(seq) = op.seq else { continue };
        let Ok(stream) = u32::try_from(seq) else {
            continue;
        };
        match out.iter_mut().find(|(s, _)| *s == stream) {
            Some((_, t)) => *t += u64::from(op.tokens),
            None => out.push((stream, u64::from(op.tokens))),
        }
    }
    out
}

/// `wait_ns` shared by `tokens`, in order, by the rounding rule above. All zero when no tokens.
pub fn split_wait_ns(wait_ns: u64, tokens: &[u64]) -> Vec<u64> {
    let total: u128 = tokens.iter().map(|&t| u128::from(t)).sum();
    if total == 0 {
        return vec![0; tokens.len()];
    }
    // Each floor is at most `wait_ns`, so it fits in u64.
    let mut out: Vec<u64> = tokens
        .iter()
        .map(|&t| (u128::from(wait_ns) * u128::from(t) / total) as u64)
        .collect();
    let given: u64 = out.iter().sum();
    if let Some(first) = out.first_mut() {
        *first += wait_ns - given;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvbench_cache_api::{BlockLoc, Tier};

    fn op(from: Tier, to: Tier, seq: Option<u64>, tokens: u32) -> TierOp {
        TierOp {
            from: BlockLoc {
                tier: from,
                slot: 0,
            },
            to: BlockLoc { tier: to, slot: 1 },
            tokens,
            seq,
        }
    }

    #[test]
    fn shares_are_floors_with_the_remainder_to_the_first() {
        // 100 ns over 1:1:1 → 33 each, 1 left for the first.
        assert_eq!(split_wait_ns(100, &[16, 16, 16]), [34, 33, 33]);
        // 10 ns over 16:32 → 3 and 6, 1 left.
        assert_eq!(split_wait_ns(10, &[16, 32]), [4, 6]);
        assert_eq!(split_wait_ns(0, &[16, 32]), [0, 0]);
        assert_eq!(split_wait_ns(7, &[]), Vec::<u64>::new());
        assert_eq!(split_wait_ns(7, &[0, 0]), [0, 0]);
        // No overflow at the extremes.
        assert_eq!(split_wait_ns(u64::MAX, &[u64::MAX]), [u64::MAX]);
    }

    #[test]
    fn shares_always_sum_to_the_wait_and_follow_the_tokens() {
        let seed: u64 = std::env::var("KVBENCH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x000e_10ad_5eed);
        println!("seed {seed} (KVBENCH_SEED replays)");
        let mut x = seed;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x >> 33
        };
        for _ in 0..2000 {
            let n = (next() % 6 + 1) as usize;
            let tokens: Vec<u64> = (0..n).map(|_| next() % 5 * 16).collect();
            let wait = next() % 10_000_000;
            let shares = split_wait_ns(wait, &tokens);
            let total: u64 = tokens.iter().sum();
            if total == 0 {
                assert!(shares.iter().all(|&s| s == 0), "seed {seed}");
                continue;
            }
            assert_eq!(shares.iter().sum::<u64>(), wait, "seed {seed}");
            for (i, (&s, &t)) in shares.iter().zip(&tokens).enumerate() {
                let exact = wait as f64 * t as f64 / total as f64;
                let extra = if i == 0 { n as f64 } else { 1.0 };
                assert!(
                    s as f64 <= exact + extra && s as f64 + 1.0 > exact,
                    "seed {seed}: share {s} of {wait} for {t}/{total}"
                );
            }
        }
    }

    #[test]
    fn onloads_are_summed_per_stream_in_op_order_and_offloads_ignored() {
        let ops = [
            op(Tier::Device, Tier::Host, None, 16),
            op(Tier::Host, Tier::Device, Some(7), 16),
            op(Tier::Disk, Tier::Device, Some(3), 16),
            op(Tier::Host, Tier::Disk, None, 16),
            op(Tier::Host, Tier::Device, Some(7), 16),
        ];
        assert_eq!(onloads_by_stream(&ops), [(7, 32), (3, 16)]);
    }
}
