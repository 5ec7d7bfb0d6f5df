//! What a step's attention reads and computes when the model has sliding or recurrent layer
//! groups ([`crate::model::LayerGroup`]): a sliding layer reads only the last `window` tokens
//! of each sequence (and a query attends to at most `window` of them), a recurrent layer reads
//! and writes its fixed state once per scheduled sequence, and full and MLA layers read every
//! token (an MLA layer its latent). A model with neither is priced by the caller's one-group
//! arithmetic, unchanged.

use crate::model::{LayerGroup, ModelShape};

/// The attention terms of a model with sliding or recurrent groups, on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupedAttention {
    /// Full and MLA groups together: bytes read per context token (with per-block FP8 scale
    /// bytes) and FLOPs per (query × key) pair.
    pub all_bytes_per_token: f64,
    pub all_flops_per_pair: f64,
    /// Sliding groups, one entry per group.
    pub sliding: Vec<Sliding>,
    /// Recurrent state read and written per scheduled sequence.
    pub state_bytes_per_seq: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sliding {
    pub window: u64,
    pub bytes_per_token: f64,
    pub flops_per_pair: f64,
}

/// One step's attention totals over its sequences.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AttentionLoad {
    pub read_bytes: f64,
    /// State written back (recurrent groups); K/V writes are per new token, the caller's.
    pub state_write_bytes: f64,
    pub flops: f64,
    /// `flops` with each group's FLOPs × its [`shortfall`] at the attended length: what the
    /// attention's plateau rate takes as long for.
    pub work_flops: f64,
}

/// How much longer than at the plateau a sequence's attention takes when its last query attends
/// to `attended_tokens`, for a kernel at half its plateau at `half_tokens`: the rate is
/// `plateau × L ÷ (L + L½)`, so the time is the plateau's × `(L + L½) ÷ L`. 1 for `L½ = 0`.
pub fn shortfall(attended_tokens: f64, half_tokens: f64) -> f64 {
    if half_tokens <= 0.0 {
        return 1.0;
    }
    (attended_tokens.max(1.0) + half_tokens) / attended_tokens.max(1.0)
}

impl GroupedAttention {
    /// `None` for a model whose groups all read every token (full and MLA): the caller's
    /// per-token arithmetic prices it exactly.
    pub fn of(model: &ModelShape, q_per_device: f64) -> Option<GroupedAttention> {
        let groups = &model.layer_groups;
        if !groups
            .iter()
            .any(|g| matches!(g, LayerGroup::Sliding { .. } | LayerGroup::Recurrent { .. }))
        {
            return None;
        }
        let (tp, dtype) = (model.tp, model.kv_dtype);
        let bytes = |g: &LayerGroup| g.bytes_per_token(tp, dtype).unwrap_or(u64::MAX) as f64;
        let flops =
            |g: &LayerGroup| g.layers() as f64 * g.attn_flops_per_pair_per_layer(q_per_device);
        let mut a = GroupedAttention {
            all_bytes_per_token: model.kv_scale_bytes_per_token().unwrap_or(0) as f64,
            all_flops_per_pair: 0.0,
            sliding: Vec::new(),
            state_bytes_per_seq: 0.0,
        };
        for g in groups {
            match g {
                LayerGroup::Full { .. } | LayerGroup::Mla { .. } => {
                    a.all_bytes_per_token += bytes(g);
                    a.all_flops_per_pair += flops(g);
                }
                LayerGroup::Sliding { window, .. } => a.sliding.push(Sliding {
                    window: *window as u64,
                    bytes_per_token: bytes(g),
                    flops_per_pair: flops(g),
                }),
                LayerGroup::Recurrent { .. } => {
                    a.state_bytes_per_seq +=
                        g.state_bytes_per_sequence(tp).unwrap_or(u64::MAX) as f64
                }
            }
        }
        Some(a)
    }

    /// What one sequence's chunk of `new` tokens after `ctx` context tokens reads and computes;
    /// `half_tokens` is the attention kernel's half-saturation length ([`shortfall`]).
    pub fn seq(&self, ctx: u64, new: u64, half_tokens: f64) -> AttentionLoad {
        let all_tokens = ctx + new;
        let all_pairs = (new * ctx) as f64 + (new * (new + 1) / 2) as f64;
        let all_flops = all_pairs * self.all_flops_per_pair;
        let mut load = AttentionLoad {
            read_bytes: all_tokens as f64 * self.all_bytes_per_token,
            state_write_bytes: 0.0,
            flops: all_flops,
            work_flops: all_flops * shortfall(all_tokens as f64, half_tokens),
        };
        for s in &self.sliding {
            // The chunk needs the window before its first token and its own tokens.
            let tokens = all_tokens.min(s.window.saturating_sub(1) + new);
            load.read_bytes += tokens as f64 * s.bytes_per_token;
            let flops = sliding_pairs(ctx, new, s.window) as f64 * s.flops_per_pair;
            load.flops += flops;
            // Its last query attends to at most the window.
            let attended = all_tokens.min(s.window) as f64;
            load.work_flops += flops * shortfall(attended, half_tokens);
        }
        if new > 0 {
            load.read_bytes += self.state_bytes_per_seq;
            load.state_write_bytes += self.state_bytes_per_seq;
        }
        load
    }
}

/// Query-key pairs of `new` queries at positions `ctx..ctx + new`, each attending to itself and
/// the tokens before it, at most `window`: Σ min(p, window) for p in `ctx + 1 ..= ctx + new`.
pub fn sliding_pairs(ctx: u64, new: u64, window: u64) -> u128 {
    if new == 0 {
        return 0;
    }
    let (a, b, w) = (ctx as u128 + 1, (ctx + new) as u128, window as u128);
    let arith = |lo: u128, hi: u128| (lo + hi) * (hi - lo + 1) / 2;
    if b <= w {
        arith(a, b)
    } else if a > w {
        (b - a + 1) * w
    } else {
        arith(a, w) + (b - w) * w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The curve by hand: a full group's FLOPs at the length its last query attends to (context
    /// plus chunk), a sliding group's at its window once the sequence is longer; none without a
    /// half-saturation length.
    #[test]
    fn work_scales_each_group_by_its_attended_length() {
        let a = GroupedAttention {
            all_bytes_per_token: 0.0,
            all_flops_per_pair: 3.0,
            sliding: vec![Sliding {
                window: 1024,
                bytes_per_token: 0.0,
                flops_per_pair: 5.0,
            }],
            state_bytes_per_seq: 0.0,
        };
        let (ctx, new, half) = (5000u64, 8u64, 209.0);
        let load = a.seq(ctx, new, half);
        let full = ((new * ctx) as f64 + (new * (new + 1) / 2) as f64) * 3.0;
        let sliding = sliding_pairs(ctx, new, 1024) as f64 * 5.0;
        assert_eq!(load.flops, full + sliding);
        let want = full * (5008.0 + half) / 5008.0 + sliding * (1024.0 + half) / 1024.0;
        assert!((load.work_flops - want).abs() <= 1e-12 * want, "{load:?}");
        // A short sequence inside the window: both groups at its own length.
        let short = a.seq(0, 100, half);
        let factor = (100.0 + half) / 100.0;
        assert!((short.work_flops - short.flops * factor).abs() <= 1e-12 * short.work_flops);
        assert_eq!(a.seq(ctx, new, 0.0).work_flops, load.flops);
        assert_eq!(shortfall(4096.0, 0.0), 1.0);
    }

    #[test]
    fn sliding_pairs_are_the_brute_force_sum() {
        for window in [1u64, 3, 8, 100] {
            for ctx in 0..20u64 {
                for new in 0..20u64 {
                    let brute: u128 = (ctx + 1..=ctx + new).map(|p| p.min(window) as u128).sum();
                    assert_eq!(
                        sliding_pairs(ctx, new, window),
                        brute,
                        "{ctx} {new} {window}"
                    );
                }
            }
        }
    }
}
