//! The full-history forward pass.

use rayon::prelude::*;

use crate::math::{matmul, rms_norm, rope, silu, softmax};
use crate::{OracleAttention, OracleConfig, OracleError, OracleWeights};

struct Layer {
    attention: OracleAttention,
    attn_norm: Vec<f64>,
    wq: Vec<f64>,
    wk: Vec<f64>,
    wv: Vec<f64>,
    wo: Vec<f64>,
    mlp_norm: Vec<f64>,
    w_gate: Vec<f64>,
    w_up: Vec<f64>,
    w_down: Vec<f64>,
}

/// The reference model. Stateless between calls: every call recomputes the whole history.
pub struct Model {
    cfg: OracleConfig,
    embed: Vec<f64>,
    layers: Vec<Layer>,
    final_norm: Vec<f64>,
    lm_head: Vec<f64>,
}

fn widen(name: &'static str, v: &[f32], expected: usize) -> Result<Vec<f64>, OracleError> {
    if v.len() != expected {
        return Err(OracleError::WeightShape {
            name,
            expected,
            got: v.len(),
        });
    }
    Ok(v.iter().map(|&x| x as f64).collect())
}

impl Model {
    pub fn new(cfg: OracleConfig, w: &OracleWeights) -> Result<Model, OracleError> {
        let c = &cfg;
        if c.kv_heads == 0
            || !c.q_heads.is_multiple_of(c.kv_heads)
            || !c.head_dim.is_multiple_of(2)
            || c.head_dim == 0
        {
            return Err(OracleError::Config(format!(
                "need q_heads ({}) a multiple of kv_heads ({}) and an even head_dim ({})",
                c.q_heads, c.kv_heads, c.head_dim
            )));
        }
        if w.layers.len() != c.layers {
            return Err(OracleError::WeightShape {
                name: "layers",
                expected: c.layers,
                got: w.layers.len(),
            });
        }
        let (d, qd, kvd, f) = (
            c.d_model,
            c.q_heads * c.head_dim,
            c.kv_heads * c.head_dim,
            c.ffn_dim,
        );
        if !c.attention.is_empty() && c.attention.len() != c.layers {
            return Err(OracleError::Config(format!(
                "{} attention kinds for {} layers",
                c.attention.len(),
                c.layers
            )));
        }
        if c.attention
            .contains(&OracleAttention::Sliding { window: 0 })
        {
            return Err(OracleError::Config(
                "a sliding window holds at least one token".into(),
            ));
        }
        let mut layers = Vec::with_capacity(c.layers);
        for (i, l) in w.layers.iter().enumerate() {
            layers.push(Layer {
                attention: c.attention.get(i).copied().unwrap_or_default(),
                attn_norm: widen("attn_norm", &l.attn_norm, d)?,
                wq: widen("wq", &l.wq, d * qd)?,
                wk: widen("wk", &l.wk, d * kvd)?,
                wv: widen("wv", &l.wv, d * kvd)?,
                wo: widen("wo", &l.wo, qd * d)?,
                mlp_norm: widen("mlp_norm", &l.mlp_norm, d)?,
                w_gate: widen("w_gate", &l.w_gate, d * f)?,
                w_up: widen("w_up", &l.w_up, d * f)?,
                w_down: widen("w_down", &l.w_down, f * d)?,
            });
        }
        Ok(Model {
            embed: widen("embed", &w.embed, c.vocab * d)?,
            final_norm: widen("final_norm", &w.final_norm, d)?,
            lm_head: widen("lm_head", &w.lm_head, d * c.vocab)?,
            layers,
            cfg,
        })
    }

    pub fn config(&self) -> &OracleConfig {
        &self.cfg
    }

    /// Logits after the last token of `tokens`.
    pub fn logits(&self, tokens: &[u32]) -> Result<Vec<f64>, OracleError> {
        let last = tokens
            .len()
            .checked_sub(1)
            .ok_or(OracleError::Position { pos: 0, len: 0 })?;
        Ok(self.logits_at(tokens, &[last])?.remove(0))
    }

    /// Logits after each listed position (the model's prediction for position + 1), computed
    /// from `tokens` in one causal pass with no cache.
    pub fn logits_at(
        &self,
        tokens: &[u32],
        positions: &[usize],
    ) -> Result<Vec<Vec<f64>>, OracleError> {
        let c = &self.cfg;
        let n = tokens.len();
        if let Some(&pos) = positions.iter().find(|&&p| p >= n) {
            return Err(OracleError::Position { pos, len: n });
        }
        // Only the history up to the last wanted position matters (causality).
        let n = positions.iter().max().map_or(0, |&p| p + 1);
        let d = c.d_model;
        let mut x = Vec::with_capacity(n * d);
        for (pos, &t) in tokens[..n].iter().enumerate() {
            if t as usize >= c.vocab {
                return Err(OracleError::Token {
                    token: t,
                    pos,
                    vocab: c.vocab,
                });
            }
            x.extend_from_slice(&self.embed[t as usize * d..(t as usize + 1) * d]);
        }
        for layer in &self.layers {
            self.layer_forward(layer, &mut x, n);
        }
        let mut out = Vec::with_capacity(positions.len());
        for &p in positions {
            let h = rms_norm(&x[p * d..(p + 1) * d], &self.final_norm, c.norm_eps);
            out.push(matmul(&h, &self.lm_head, 1, d, c.vocab));
        }
        Ok(out)
    }

    fn layer_forward(&self, l: &Layer, x: &mut [f64], n: usize) {
        let c = &self.cfg;
        let (d, hd) = (c.d_model, c.head_dim);
        let (qd, kvd) = (c.q_heads * hd, c.kv_heads * hd);
        let h = rms_norm(x, &l.attn_norm, c.norm_eps);
        let mut q = matmul(&h, &l.wq, n, d, qd);
        let mut k = matmul(&h, &l.wk, n, d, kvd);
        let v = matmul(&h, &l.wv, n, d, kvd);
        rope(&mut q, c.q_heads, hd, c.rope_theta);
        rope(&mut k, c.kv_heads, hd, c.rope_theta);

        // Causal attention: position p, query head qh reads KV head qh / group over first..=p,
        // where first is 0, or for a sliding layer the oldest position inside its window.
        let group = c.q_heads / c.kv_heads;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut att = vec![0f64; n * qd];
        att.par_chunks_mut(qd).enumerate().for_each(|(p, out)| {
            let first = match l.attention {
                OracleAttention::Full => 0,
                OracleAttention::Sliding { window } => (p + 1).saturating_sub(window),
            };
            let mut scores = vec![0f64; p + 1 - first];
            for qh in 0..c.q_heads {
                let kh = qh / group;
                let qv = &q[p * qd + qh * hd..p * qd + (qh + 1) * hd];
                for (i, s) in scores.iter_mut().enumerate() {
                    let t = first + i;
                    let kv = &k[t * kvd + kh * hd..t * kvd + (kh + 1) * hd];
                    *s = qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>() * scale;
                }
                softmax(&mut scores);
                let o = &mut out[qh * hd..(qh + 1) * hd];
                for (i, &pr) in scores.iter().enumerate() {
                    let t = first + i;
                    let vv = &v[t * kvd + kh * hd..t * kvd + (kh + 1) * hd];
                    for (ov, vx) in o.iter_mut().zip(vv) {
                        *ov += pr * vx;
                    }
                }
            }
        });
        let o = matmul(&att, &l.wo, n, qd, d);
        for (xv, ov) in x.iter_mut().zip(&o) {
            *xv += ov;
        }

        let h = rms_norm(x, &l.mlp_norm, c.norm_eps);
        let mut gate = matmul(&h, &l.w_gate, n, d, c.ffn_dim);
        let up = matmul(&h, &l.w_up, n, d, c.ffn_dim);
        for (g, u) in gate.iter_mut().zip(&up) {
            *g = silu(*g) * u;
        }
        let down = matmul(&gate, &l.w_down, n, c.ffn_dim, d);
        for (xv, dv) in x.iter_mut().zip(&down) {
            *xv += dv;
        }
    }
}
