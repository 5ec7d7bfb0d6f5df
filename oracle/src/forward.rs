//! The full-history forward pass.

use rayon::prelude::*;

use crate::math::{matmul, rms_norm, rope, silu, softmax};
use crate::{OracleAttention, OracleConfig, OracleError, OracleWeights};

/// An MLA layer's weights in f64.
struct Mla {
    latent_dim: usize,
    rope_dim: usize,
    wq: Vec<f64>,
    w_dkv: Vec<f64>,
    w_uk: Vec<f64>,
    w_uv: Vec<f64>,
}

/// A recurrent layer's weights in f64.
struct Recurrent {
    state_dim: usize,
    w_a: Vec<f64>,
    w_u: Vec<f64>,
    w_g: Vec<f64>,
    w_out: Vec<f64>,
}

struct Layer {
    attention: OracleAttention,
    mla: Option<Mla>,
    recurrent: Option<Recurrent>,
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
            let attention = c.attention.get(i).copied().unwrap_or_default();
            let mla = match (attention, &l.mla) {
                (
                    OracleAttention::Mla {
                        latent_dim,
                        rope_dim,
                    },
                    Some(m),
                ) => {
                    if latent_dim == 0 || rope_dim == 0 || !rope_dim.is_multiple_of(2) {
                        return Err(OracleError::Config(format!(
                            "layer {i}: MLA needs a positive latent_dim ({latent_dim}) and an even positive rope_dim ({rope_dim})"
                        )));
                    }
                    let qh = c.q_heads;
                    Some(Mla {
                        latent_dim,
                        rope_dim,
                        wq: widen("mla wq", &m.wq, d * qh * (c.head_dim + rope_dim))?,
                        w_dkv: widen("mla w_dkv", &m.w_dkv, d * (latent_dim + rope_dim))?,
                        w_uk: widen("mla w_uk", &m.w_uk, latent_dim * qd)?,
                        w_uv: widen("mla w_uv", &m.w_uv, latent_dim * qd)?,
                    })
                }
                (OracleAttention::Mla { .. }, None) | (_, Some(_)) => {
                    return Err(OracleError::Config(format!(
                        "layer {i}: MLA weights go with an MLA layer and only with one"
                    )))
                }
                _ => None,
            };
            let recurrent = match (attention, &l.recurrent) {
                (OracleAttention::Recurrent { state_dim }, Some(r)) if state_dim > 0 => {
                    Some(Recurrent {
                        state_dim,
                        w_a: widen("recurrent w_a", &r.w_a, d * state_dim)?,
                        w_u: widen("recurrent w_u", &r.w_u, d * state_dim)?,
                        w_g: widen("recurrent w_g", &r.w_g, d * state_dim)?,
                        w_out: widen("recurrent w_out", &r.w_out, state_dim * d)?,
                    })
                }
                (OracleAttention::Recurrent { .. }, _) | (_, Some(_)) => {
                    return Err(OracleError::Config(format!(
                        "layer {i}: recurrent weights (and a positive state_dim) go with a recurrent layer and only with one"
                    )))
                }
                _ => None,
            };
            let attn_w = |name, v: &[f32], n| {
                if mla.is_some() || recurrent.is_some() {
                    Ok(Vec::new())
                } else {
                    widen(name, v, n)
                }
            };
            layers.push(Layer {
                attention,
                attn_norm: widen("attn_norm", &l.attn_norm, d)?,
                wq: attn_w("wq", &l.wq, d * qd)?,
                wk: attn_w("wk", &l.wk, d * kvd)?,
                wv: attn_w("wv", &l.wv, d * kvd)?,
                wo: if recurrent.is_some() {
                    Vec::new()
                } else {
                    widen("wo", &l.wo, qd * d)?
                },
                mlp_norm: widen("mlp_norm", &l.mlp_norm, d)?,
                w_gate: widen("w_gate", &l.w_gate, d * f)?,
                w_up: widen("w_up", &l.w_up, d * f)?,
                w_down: widen("w_down", &l.w_down, f * d)?,
                mla,
                recurrent,
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
        if let Some(r) = &l.recurrent {
            // The recurrence, position by position from a zero state.
            let sd = r.state_dim;
            let a = matmul(&h, &r.w_a, n, d, sd);
            let u = matmul(&h, &r.w_u, n, d, sd);
            let g = matmul(&h, &r.w_g, n, d, sd);
            let mut s = vec![0f64; sd];
            let mut y = vec![0f64; n * sd];
            for t in 0..n {
                for j in 0..sd {
                    let gate = 1.0 / (1.0 + (-a[t * sd + j]).exp());
                    s[j] = gate * s[j] + (1.0 - gate) * u[t * sd + j];
                    y[t * sd + j] = s[j] * silu(g[t * sd + j]);
                }
            }
            let o = matmul(&y, &r.w_out, n, sd, d);
            for (xv, ov) in x.iter_mut().zip(&o) {
                *xv += ov;
            }
            self.mlp(l, x, n);
            return;
        }
        if let Some(m) = &l.mla {
            let att = self.mla_attention(m, &h, n);
            self.finish_layer(l, x, &att, n);
            return;
        }
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
                OracleAttention::Sliding { window } => (p + 1).saturating_sub(window),
                _ => 0,
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
        self.finish_layer(l, x, &att, n);
    }

    /// Output projection and residual, then the MLP and its residual.
    fn finish_layer(&self, l: &Layer, x: &mut [f64], att: &[f64], n: usize) {
        let c = &self.cfg;
        let (d, qd) = (c.d_model, c.q_heads * c.head_dim);
        let o = matmul(att, &l.wo, n, qd, d);
        for (xv, ov) in x.iter_mut().zip(&o) {
            *xv += ov;
        }
        self.mlp(l, x, n);
    }

    /// The MLP and its residual.
    fn mlp(&self, l: &Layer, x: &mut [f64], n: usize) {
        let c = &self.cfg;
        let d = c.d_model;

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

    /// MLA the long way: every head's key `[c · W_uk_h, k_rope]` and value `c · W_uv_h`
    /// expanded for every position, then plain causal attention with scale
    /// `1/sqrt(head_dim + rope_dim)`. Returns `[n, q_heads × head_dim]`.
    fn mla_attention(&self, m: &Mla, h: &[f64], n: usize) -> Vec<f64> {
        let c = &self.cfg;
        let (d, qh, hd) = (c.d_model, c.q_heads, c.head_dim);
        let (lat, rd) = (m.latent_dim, m.rope_dim);
        let qw = hd + rd;
        let q = matmul(h, &m.wq, n, d, qh * qw);
        let ckv = matmul(h, &m.w_dkv, n, d, lat + rd);
        // Split into the no-RoPE and RoPE parts, rotating the latter.
        let mut q_nope = vec![0f64; n * qh * hd];
        let mut q_rope = vec![0f64; n * qh * rd];
        let mut latent = vec![0f64; n * lat];
        let mut k_rope = vec![0f64; n * rd];
        for t in 0..n {
            for hh in 0..qh {
                let src = &q[(t * qh + hh) * qw..(t * qh + hh + 1) * qw];
                q_nope[(t * qh + hh) * hd..(t * qh + hh + 1) * hd].copy_from_slice(&src[..hd]);
                q_rope[(t * qh + hh) * rd..(t * qh + hh + 1) * rd].copy_from_slice(&src[hd..]);
            }
            let r = &ckv[t * (lat + rd)..(t + 1) * (lat + rd)];
            latent[t * lat..(t + 1) * lat].copy_from_slice(&r[..lat]);
            k_rope[t * rd..(t + 1) * rd].copy_from_slice(&r[lat..]);
        }
        rope(&mut q_rope, qh, rd, c.rope_theta);
        rope(&mut k_rope, 1, rd, c.rope_theta);
        let k_nope = matmul(&latent, &m.w_uk, n, lat, qh * hd);
        let v = matmul(&latent, &m.w_uv, n, lat, qh * hd);
        let scale = 1.0 / (qw as f64).sqrt();
        let mut att = vec![0f64; n * qh * hd];
        att.par_chunks_mut(qh * hd)
            .enumerate()
            .for_each(|(p, out)| {
                let mut scores = vec![0f64; p + 1];
                for hh in 0..qh {
                    let qn = &q_nope[(p * qh + hh) * hd..(p * qh + hh + 1) * hd];
                    let qr = &q_rope[(p * qh + hh) * rd..(p * qh + hh + 1) * rd];
                    for (t, s) in scores.iter_mut().enumerate() {
                        let kn = &k_nope[(t * qh + hh) * hd..(t * qh + hh + 1) * hd];
                        let kr = &k_rope[t * rd..(t + 1) * rd];
                        let dot_n: f64 = qn.iter().zip(kn).map(|(a, b)| a * b).sum();
                        let dot_r: f64 = qr.iter().zip(kr).map(|(a, b)| a * b).sum();
                        *s = (dot_n + dot_r) * scale;
                    }
                    softmax(&mut scores);
                    let o = &mut out[hh * hd..(hh + 1) * hd];
                    for (t, &pr) in scores.iter().enumerate() {
                        let vv = &v[(t * qh + hh) * hd..(t * qh + hh + 1) * hd];
                        for (ov, vx) in o.iter_mut().zip(vv) {
                            *ov += pr * vx;
                        }
                    }
                }
            });
        att
    }
}
