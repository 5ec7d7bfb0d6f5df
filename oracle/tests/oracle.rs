//! The oracle's own properties, independent of the kernels it checks: causality, the GQA head
//! mapping, a hand-computable case, and refusals of bad input.

use kvbench_oracle::{Model, OracleConfig, OracleError, OracleLayer, OracleWeights};

/// Deterministic pseudo-random values in ±0.5 (an LCG; no dependency needed).
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn config(layers: usize, q_heads: usize, kv_heads: usize) -> OracleConfig {
    OracleConfig {
        layers,
        q_heads,
        kv_heads,
        head_dim: 8,
        d_model: 16,
        ffn_dim: 24,
        vocab: 20,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        attention: Vec::new(),
    }
}

fn weights(c: &OracleConfig, seed: u64) -> OracleWeights {
    let (d, qd, kvd, f) = (
        c.d_model,
        c.q_heads * c.head_dim,
        c.kv_heads * c.head_dim,
        c.ffn_dim,
    );
    let mut s = seed;
    let mut next = |n: usize| {
        s += 1;
        values(s, n)
    };
    OracleWeights {
        embed: next(c.vocab * d),
        layers: (0..c.layers)
            .map(|_| OracleLayer {
                attn_norm: vec![1.0; d],
                wq: next(d * qd),
                wk: next(d * kvd),
                wv: next(d * kvd),
                wo: next(qd * d),
                mlp_norm: vec![1.0; d],
                w_gate: next(d * f),
                w_up: next(d * f),
                w_down: next(f * d),
                mla: None,
                recurrent: None,
            })
            .collect(),
        final_norm: vec![1.0; d],
        lm_head: next(d * c.vocab),
    }
}

#[test]
fn later_tokens_never_change_earlier_logits() {
    let c = config(2, 4, 2);
    let m = Model::new(c.clone(), &weights(&c, 1)).expect("model");
    let tokens = [3u32, 7, 1, 19, 0, 5, 5, 12];
    let all = m.logits_at(&tokens, &[0, 3, 7]).expect("logits");
    for (i, &p) in [0usize, 3, 7].iter().enumerate() {
        assert_eq!(
            all[i],
            m.logits(&tokens[..=p]).expect("prefix"),
            "position {p}"
        );
    }
    assert_ne!(all[1], all[2]);
}

/// Grouped-query attention: one KV head shared by two query heads must equal two KV heads
/// holding identical weights, one per query head.
#[test]
fn gqa_maps_query_heads_to_their_kv_head() {
    let shared = config(1, 4, 2);
    let w = weights(&shared, 2);
    let hd = shared.head_dim;
    let expanded = config(1, 4, 4);
    let mut we = w.clone();
    let dup = |src: &[f32]| -> Vec<f32> {
        // [d, 2*hd] → [d, 4*hd]: KV head h serves query heads 2h and 2h+1.
        let mut out = Vec::new();
        for row in src.chunks(2 * hd) {
            for h in 0..2 {
                for _ in 0..2 {
                    out.extend_from_slice(&row[h * hd..(h + 1) * hd]);
                }
            }
        }
        out
    };
    we.layers[0].wk = dup(&w.layers[0].wk);
    we.layers[0].wv = dup(&w.layers[0].wv);
    let a = Model::new(shared, &w)
        .expect("shared")
        .logits(&[1, 2, 3, 4, 5])
        .expect("a");
    let b = Model::new(expanded, &we)
        .expect("expanded")
        .logits(&[1, 2, 3, 4, 5])
        .expect("b");
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{x} vs {y}");
    }
}

/// With no layers the model is `rmsnorm(embed[t]) · lm_head`: computable by hand.
#[test]
fn zero_layers_is_norm_then_projection() {
    let c = config(0, 2, 1);
    let w = weights(&c, 3);
    let m = Model::new(c.clone(), &w).expect("model");
    let t = 6usize;
    let e: Vec<f64> = w.embed[t * c.d_model..(t + 1) * c.d_model]
        .iter()
        .map(|&x| x as f64)
        .collect();
    let rms = (e.iter().map(|x| x * x).sum::<f64>() / c.d_model as f64 + c.norm_eps).sqrt();
    let got = m.logits(&[t as u32]).expect("logits");
    assert_eq!(got.len(), c.vocab);
    for (v, g) in got.iter().enumerate() {
        let want: f64 = (0..c.d_model)
            .map(|i| e[i] / rms * w.lm_head[i * c.vocab + v] as f64)
            .sum();
        assert!((g - want).abs() < 1e-12, "vocab {v}: {g} vs {want}");
    }
}

#[test]
fn bad_input_is_refused() {
    let c = config(1, 4, 2);
    let w = weights(&c, 4);
    let m = Model::new(c.clone(), &w).expect("model");
    assert_eq!(
        m.logits(&[1, 20]),
        Err(OracleError::Token {
            token: 20,
            pos: 1,
            vocab: 20
        })
    );
    assert_eq!(
        m.logits_at(&[1, 2], &[2]),
        Err(OracleError::Position { pos: 2, len: 2 })
    );
    assert!(m.logits(&[]).is_err());
    let mut short = w.clone();
    short.layers[0].wq.pop();
    assert!(matches!(
        Model::new(c.clone(), &short),
        Err(OracleError::WeightShape { name: "wq", .. })
    ));
    assert!(matches!(
        Model::new(config(1, 3, 2), &w),
        Err(OracleError::Config(_))
    ));
}
