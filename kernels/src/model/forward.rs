//! One forward step over a batch of sequence chunks (prefill chunks and decode tokens alike).

use super::mla::{mla_attention, MlaStep};
use super::ops::{apply_rope, rms_norm, rope_inv_freq, rope_tables, silu_mul};
use super::LayerKind;
use super::{ModelConfig, ModelWeights};
use crate::addressing::{LayerAddr, TokenAddressing};
use crate::attention::{attention_windowed, AttnDims, QuerySpan};
use crate::elem::KvElem;
use crate::error::{check_len, KernelError};
use crate::gemm::matmul;
use crate::kv::{write_kv, KvCache};
use crate::kv_quant::KvQuant;

/// New tokens of one sequence in this step: they occupy logical positions
/// `start_pos .. start_pos + tokens.len()`; positions before `start_pos` are already cached.
#[derive(Debug, Clone, Copy)]
pub struct StepSeq<'a, A> {
    pub addr: &'a A,
    pub start_pos: usize,
    pub tokens: &'a [u32],
    /// Return logits for the last of `tokens`.
    pub want_logits: bool,
}

/// The model: config, weights, what each layer attends to and RoPE frequencies.
#[derive(Debug, Clone)]
pub struct Transformer {
    pub cfg: ModelConfig,
    pub weights: ModelWeights,
    /// One per layer, in layer order (all [`LayerKind::Full`] unless
    /// [`Transformer::with_layer_kinds`] said otherwise).
    kinds: Vec<LayerKind>,
    inv_freq: Vec<f64>,
}

impl Transformer {
    pub fn new(cfg: ModelConfig, weights: ModelWeights) -> Result<Transformer, KernelError> {
        cfg.validate()?;
        let (d, v) = (cfg.d_model, cfg.vocab);
        check_len("embed", v * d, weights.embed.len())?;
        check_len("lm_head", d * v, weights.lm_head.len())?;
        check_len("final_norm", d, weights.final_norm.len())?;
        check_len("layers", cfg.layers, weights.layers.len())?;
        for l in &weights.layers {
            check_len("attn_norm", d, l.attn_norm.len())?;
            if let Some(r) = &l.recurrent {
                if r.state_dim == 0 {
                    return Err(KernelError::Config("state_dim must be positive".into()));
                }
                check_len("recurrent w_a", d * r.state_dim, r.w_a.len())?;
                check_len("recurrent w_u", d * r.state_dim, r.w_u.len())?;
                check_len("recurrent w_g", d * r.state_dim, r.w_g.len())?;
                check_len("recurrent w_out", r.state_dim * d, r.w_out.len())?;
            } else if let Some(m) = &l.mla {
                let (qh, hd, r) = (cfg.q_heads, cfg.head_dim, m.rope_dim);
                if m.latent_dim == 0 || r == 0 || !r.is_multiple_of(2) {
                    return Err(KernelError::Config(format!(
                        "MLA latent_dim {} must be positive and rope_dim {r} even and positive",
                        m.latent_dim
                    )));
                }
                check_len("mla wq", d * qh * (hd + r), m.wq.len())?;
                check_len("mla w_dkv", d * (m.latent_dim + r), m.w_dkv.len())?;
                check_len("mla w_uk", m.latent_dim * qh * hd, m.w_uk.len())?;
                check_len("mla w_uv", m.latent_dim * qh * hd, m.w_uv.len())?;
            } else {
                check_len("wq", d * cfg.q_dim(), l.wq.len())?;
                check_len("wk", d * cfg.kv_dim(), l.wk.len())?;
                check_len("wv", d * cfg.kv_dim(), l.wv.len())?;
            }
            if l.recurrent.is_none() {
                check_len("wo", cfg.q_dim() * d, l.wo.len())?;
            }
            check_len("mlp_norm", d, l.mlp_norm.len())?;
            check_len("w_gate", d * cfg.ffn_dim, l.w_gate.len())?;
            check_len("w_up", d * cfg.ffn_dim, l.w_up.len())?;
            check_len("w_down", cfg.ffn_dim * d, l.w_down.len())?;
        }
        let inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta);
        let kinds = weights
            .layers
            .iter()
            .map(|l| match (&l.mla, &l.recurrent) {
                (_, Some(r)) => LayerKind::Recurrent {
                    state_dim: r.state_dim,
                },
                (Some(m), None) => LayerKind::Mla {
                    latent_dim: m.latent_dim,
                    rope_dim: m.rope_dim,
                },
                (None, None) => LayerKind::Full,
            })
            .collect();
        Ok(Transformer {
            kinds,
            cfg,
            weights,
            inv_freq,
        })
    }

    /// A seeded model whose layers are `kinds` ([`ModelWeights::random_with_kinds`]).
    pub fn seeded_with_kinds(
        cfg: ModelConfig,
        kinds: Vec<LayerKind>,
        seed: u64,
    ) -> Result<Transformer, KernelError> {
        let w = ModelWeights::random_with_kinds(&cfg, &kinds, seed)?;
        Transformer::new(cfg, w)?.with_layer_kinds(kinds)
    }

    /// The same model with each layer's attention kind given (one per layer, in order). The
    /// weights do not change: a sliding layer has a full layer's projections.
    pub fn with_layer_kinds(mut self, kinds: Vec<LayerKind>) -> Result<Transformer, KernelError> {
        check_len("layer kinds", self.cfg.layers, kinds.len())?;
        if kinds.iter().any(|k| k.window() == Some(0)) {
            return Err(KernelError::Config(
                "a sliding window holds at least one token".into(),
            ));
        }
        // MLA and recurrent layers have their own weights: a kind may change only among full
        // and sliding.
        for (i, (new, old)) in kinds.iter().zip(&self.kinds).enumerate() {
            let mla =
                |k: &LayerKind| matches!(k, LayerKind::Mla { .. } | LayerKind::Recurrent { .. });
            if (mla(new) || mla(old)) && new != old {
                return Err(KernelError::Config(format!(
                    "layer {i}: weights for {old:?}, not {new:?}"
                )));
            }
        }
        self.kinds = kinds;
        Ok(self)
    }

    /// What each layer attends to, in layer order.
    pub fn layer_kinds(&self) -> &[LayerKind] {
        &self.kinds
    }

    /// Values of one sequence's recurrent state, all recurrent layers (0 without any): what
    /// [`forward_with_states`](Self::forward_with_states) carries per sequence, zero at
    /// position 0.
    pub fn state_len(&self) -> usize {
        self.kinds
            .iter()
            .map(|k| match k {
                LayerKind::Recurrent { state_dim } => *state_dim,
                _ => 0,
            })
            .sum()
    }

    /// A seeded model (see [`ModelWeights::random`]).
    pub fn seeded(cfg: ModelConfig, seed: u64) -> Result<Transformer, KernelError> {
        let w = ModelWeights::random(&cfg, seed)?;
        Transformer::new(cfg, w)
    }

    /// A cache shaped for this model.
    pub fn new_cache<E: KvElem>(&self, num_slots: usize) -> KvCache<E> {
        let rows: Vec<(usize, usize)> = self
            .kinds
            .iter()
            .map(|k| k.kv_rows(self.cfg.kv_dim()))
            .collect();
        KvCache::with_rows(&rows, num_slots, self.cfg.kv_heads, self.cfg.head_dim)
    }

    /// The amax of K and of V per layer per KV head over `tokens` run as one unquantised
    /// sequence, flattened `[layer][k=0, v=1][kv_head]`: the calibration of static FP8 scales
    /// ([`crate::kv_quant`]).
    pub fn kv_amax(&self, tokens: &[u32]) -> Result<Vec<f32>, KernelError> {
        let mut kv: KvCache<f32> = self.new_cache(tokens.len().max(1));
        let blocks = [0u32];
        let addr = crate::addressing::PagedTable {
            block_size: tokens.len().max(1),
            blocks: &blocks,
        };
        let seq = StepSeq {
            addr: &addr,
            start_pos: 0,
            tokens,
            want_logits: false,
        };
        let mut states = [vec![0f32; self.state_len()]];
        self.forward_with_states(&mut kv, &[seq], &mut states)?;
        let (kh, hd) = (self.cfg.kv_heads, self.cfg.head_dim);
        let amax_of = |buf: &[f32], h: usize| {
            buf.chunks_exact(kh * hd)
                .flat_map(|row| &row[h * hd..(h + 1) * hd])
                .fold(0f32, |m, x| m.max(x.abs()))
        };
        let mut out = Vec::with_capacity(self.cfg.layers * 2 * kh);
        for (l, kind) in kv.layers.iter().zip(&self.kinds) {
            for buf in [&l.k, &l.v] {
                // An MLA layer takes no static scales (its latent's are per token): zeros keep
                // the layout one entry per layer per KV head.
                if matches!(kind, LayerKind::Mla { .. } | LayerKind::Recurrent { .. }) {
                    out.extend(std::iter::repeat_n(0.0, kh));
                } else {
                    out.extend((0..kh).map(|h| amax_of(buf, h)));
                }
            }
        }
        Ok(out)
    }

    /// The MLP half of a layer: `x += down(silu(gate(norm x)) ⊙ up(norm x))`.
    #[allow(clippy::too_many_arguments)]
    fn mlp(
        &self,
        lw: &super::LayerWeights,
        x: &mut [f32],
        h: &mut [f32],
        gate: &mut [f32],
        up: &mut [f32],
        proj: &mut [f32],
        n: usize,
    ) -> Result<(), KernelError> {
        let c = &self.cfg;
        let (d, f) = (c.d_model, c.ffn_dim);
        rms_norm(x, &lw.mlp_norm, c.norm_eps, h);
        matmul(h, &lw.w_gate, gate, n, d, f)?;
        matmul(h, &lw.w_up, up, n, d, f)?;
        silu_mul(gate, up);
        matmul(gate, &lw.w_down, proj, n, f, d)?;
        x.iter_mut().zip(proj.iter()).for_each(|(a, b)| *a += b);
        Ok(())
    }

    /// Runs one step: writes every new token's K/V into its slot and returns, per sequence, the
    /// logits of its last token where asked. A token's result does not depend on the rest of the
    /// batch (see `gemm`), nor on how its sequence was chunked.
    pub fn forward<E: KvElem, A: TokenAddressing>(
        &self,
        kv: &mut KvCache<E>,
        seqs: &[StepSeq<'_, A>],
    ) -> Result<Vec<Option<Vec<f32>>>, KernelError> {
        self.forward_with_states(kv, seqs, &mut [])
    }

    /// [`forward`](Self::forward) for a model with recurrent layers: `states[i]` is sequence
    /// `i`'s state ([`state_len`](Self::state_len) values) after its positions before
    /// `start_pos`, advanced here through its new tokens. The caller owns where states live and
    /// that each is at its sequence's `start_pos` (zeros at 0). Without recurrent layers
    /// `states` may be empty.
    pub fn forward_with_states<E: KvElem, A: TokenAddressing>(
        &self,
        kv: &mut KvCache<E>,
        seqs: &[StepSeq<'_, A>],
        states: &mut [Vec<f32>],
    ) -> Result<Vec<Option<Vec<f32>>>, KernelError> {
        let c = &self.cfg;
        let state_len = self.state_len();
        if state_len > 0 {
            check_len("recurrent states", seqs.len(), states.len())?;
            for st in states.iter() {
                check_len("recurrent state", state_len, st.len())?;
            }
        }
        let mut state_at = 0;
        let (d, qd, kvd, f) = (c.d_model, c.q_dim(), c.kv_dim(), c.ffn_dim);
        if kv.layers.len() != c.layers
            || kv.kv_heads != c.kv_heads
            || kv.head_dim != c.head_dim
            || (0..c.layers).any(|i| kv.rows_of(i) != self.kinds[i].kv_rows(kvd))
        {
            return Err(KernelError::Config(
                "KV cache shape does not match the model".into(),
            ));
        }
        let mut positions = Vec::new();
        let mut x = Vec::new();
        for s in seqs {
            for (i, &tok) in s.tokens.iter().enumerate() {
                let t = tok as usize;
                if t >= c.vocab {
                    return Err(KernelError::Shape {
                        what: "token id < vocab",
                        expected: c.vocab,
                        got: t,
                    });
                }
                positions.push(s.start_pos + i);
                x.extend_from_slice(&self.weights.embed[t * d..(t + 1) * d]);
            }
        }
        let n = positions.len();
        let quant = kv.quant.as_ref();
        let slot_sets = LayerSlots::translate(seqs, &self.kinds, quant)?;
        let (cos, sin) = rope_tables(&positions, &self.inv_freq);
        let dims = AttnDims {
            q_heads: c.q_heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
        };
        let scale = 1.0 / (c.head_dim as f32).sqrt();

        let mut h = vec![0f32; n * d];
        let mut q = vec![0f32; n * qd];
        let mut k = vec![0f32; n * kvd];
        let mut v = vec![0f32; n * kvd];
        let mut att = vec![0f32; n * qd];
        let mut proj = vec![0f32; n * d];
        let mut gate = vec![0f32; n * f];
        let mut up = vec![0f32; n * f];
        let scales = &mut kv.scales;
        for (li, ((lw, lkv), kind)) in self
            .weights
            .layers
            .iter()
            .zip(kv.layers.iter_mut())
            .zip(&self.kinds)
            .enumerate()
        {
            rms_norm(&x, &lw.attn_norm, c.norm_eps, &mut h);
            if let Some(r) = &lw.recurrent {
                let lens: Vec<usize> = seqs.iter().map(|s| s.tokens.len()).collect();
                recurrent_layer(r, d, &h, &lens, states, state_at, &mut x)?;
                state_at += r.state_dim;
                self.mlp(lw, &mut x, &mut h, &mut gate, &mut up, &mut proj, n)?;
                continue;
            }
            let (slots, first_slots) = slot_sets.of(li);
            let views: Vec<LayerAddr<'_, A>> = seqs
                .iter()
                .map(|s| LayerAddr {
                    addr: s.addr,
                    layer: li,
                })
                .collect();
            let spans: Vec<QuerySpan<'_, LayerAddr<'_, A>>> = seqs
                .iter()
                .zip(&views)
                .map(|(s, addr)| QuerySpan {
                    addr,
                    context_len: s.start_pos + s.tokens.len(),
                    q_len: s.tokens.len(),
                })
                .collect();
            if let Some(m) = &lw.mla {
                let mla_step = MlaStep {
                    cfg: c,
                    positions: &positions,
                    slots,
                    spans: &spans,
                    quant,
                    num_slots: kv.num_slots,
                };
                mla_attention(&mla_step, m, &h, lkv, &mut att)?;
                matmul(&att, &lw.wo, &mut proj, n, qd, d)?;
                x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
                self.mlp(lw, &mut x, &mut h, &mut gate, &mut up, &mut proj, n)?;
                continue;
            }
            matmul(&h, &lw.wq, &mut q, n, d, qd)?;
            matmul(&h, &lw.wk, &mut k, n, d, kvd)?;
            matmul(&h, &lw.wv, &mut v, n, d, kvd)?;
            apply_rope(&mut q, c.q_heads, c.head_dim, &cos, &sin);
            apply_rope(&mut k, c.kv_heads, c.head_dim, &cos, &sin);
            write_kv(lkv, kv.num_slots, kvd, &k, &v, slots)?;
            if let (Some(q), Some([ks, vs])) = (quant, scales.get_mut(li)) {
                let (kh, hd) = (c.kv_heads, c.head_dim);
                q.apply(li, 0, &mut lkv.k, ks, kh, hd, slots, first_slots)?;
                q.apply(li, 1, &mut lkv.v, vs, kh, hd, slots, first_slots)?;
            }
            attention_windowed(
                lkv,
                kv.num_slots,
                dims,
                &spans,
                &q,
                &mut att,
                scale,
                kind.window(),
            )?;
            matmul(&att, &lw.wo, &mut proj, n, qd, d)?;
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
            self.mlp(lw, &mut x, &mut h, &mut gate, &mut up, &mut proj, n)?;
        }

        // Final norm and vocabulary projection, only for the rows whose logits are wanted.
        let mut rows = Vec::new();
        let mut end = 0;
        for s in seqs {
            end += s.tokens.len();
            if s.want_logits && !s.tokens.is_empty() {
                rows.push(end - 1);
            }
        }
        let mut last = vec![0f32; rows.len() * d];
        for (i, &r) in rows.iter().enumerate() {
            rms_norm(
                &x[r * d..(r + 1) * d],
                &self.weights.final_norm,
                c.norm_eps,
                &mut last[i * d..(i + 1) * d],
            );
        }
        let mut logits = vec![0f32; rows.len() * c.vocab];
        matmul(
            &last,
            &self.weights.lm_head,
            &mut logits,
            rows.len(),
            d,
            c.vocab,
        )?;
        let mut out = Vec::with_capacity(seqs.len());
        let mut li = logits.chunks_exact(c.vocab);
        for s in seqs {
            out.push(if s.want_logits && !s.tokens.is_empty() {
                li.next().map(|l| l.to_vec())
            } else {
                None
            });
        }
        Ok(out)
    }
}

/// One recurrent layer over the step's rows (sequences' new tokens in order, `lens` each):
/// every sequence's state at `states[i][at..at + state_dim]` advanced token by token, and
/// `x += (s ⊙ silu(h·W_g))·W_out` for each row.
fn recurrent_layer(
    r: &super::RecurrentWeights,
    d: usize,
    h: &[f32],
    lens: &[usize],
    states: &mut [Vec<f32>],
    at: usize,
    x: &mut [f32],
) -> Result<(), KernelError> {
    let (n, sd) = (lens.iter().sum::<usize>(), r.state_dim);
    let mut a = vec![0f32; n * sd];
    let mut u = vec![0f32; n * sd];
    let mut g = vec![0f32; n * sd];
    matmul(h, &r.w_a, &mut a, n, d, sd)?;
    matmul(h, &r.w_u, &mut u, n, d, sd)?;
    matmul(h, &r.w_g, &mut g, n, d, sd)?;
    let mut y = vec![0f32; n * sd];
    let mut row = 0;
    for (&len, st) in lens.iter().zip(states.iter_mut()) {
        let s = st.get_mut(at..at + sd).ok_or(KernelError::Shape {
            what: "recurrent state",
            expected: at + sd,
            got: 0,
        })?;
        for t in row..row + len {
            for j in 0..sd {
                let gate = 1.0 / (1.0 + (-a[t * sd + j]).exp());
                s[j] = gate * s[j] + (1.0 - gate) * u[t * sd + j];
                let gv = g[t * sd + j];
                y[t * sd + j] = s[j] * gv / (1.0 + (-gv).exp());
            }
        }
        row += len;
    }
    let mut out = vec![0f32; n * d];
    matmul(&y, &r.w_out, &mut out, n, sd, d)?;
    x.iter_mut().zip(&out).for_each(|(xv, o)| *xv += o);
    Ok(())
}

/// The slots a step's new tokens are written to, per layer: one translation per run of
/// consecutive layers that read through the same table ([`TokenAddressing::table_of_layer`]),
/// so a layout with one table translates once per step, and every slot of every layer is
/// translated (and an unmapped position refused) before anything is written.
struct LayerSlots {
    /// `(slots, first_slots)` per translation: each new token's slot, and (per-block FP8
    /// scales) the slot of its block's first position.
    sets: Vec<(Vec<i64>, Vec<i64>)>,
    /// Per layer, its translation in `sets` (a recurrent layer keeps its neighbour's: it
    /// addresses nothing).
    of_layer: Vec<usize>,
}

impl LayerSlots {
    fn translate<A: TokenAddressing>(
        seqs: &[StepSeq<'_, A>],
        kinds: &[LayerKind],
        quant: Option<&KvQuant>,
    ) -> Result<LayerSlots, KernelError> {
        let mut sets = Vec::new();
        let mut of_layer = Vec::with_capacity(kinds.len());
        let mut tables: Option<Vec<usize>> = None;
        for (li, kind) in kinds.iter().enumerate() {
            if matches!(kind, LayerKind::Recurrent { .. }) {
                of_layer.push(sets.len().saturating_sub(1));
                continue;
            }
            let now: Vec<usize> = seqs.iter().map(|s| s.addr.table_of_layer(li)).collect();
            if tables.as_ref() != Some(&now) {
                let mut slots = Vec::new();
                let mut first_slots = Vec::new();
                for s in seqs {
                    for pos in s.start_pos..s.start_pos + s.tokens.len() {
                        slots.push(s.addr.slot_of_layer(li, pos)? as i64);
                        if let Some(first) = quant.and_then(|q| q.block_first(pos)) {
                            first_slots.push(s.addr.slot_of_layer(li, first)? as i64);
                        }
                    }
                }
                sets.push((slots, first_slots));
                tables = Some(now);
            }
            of_layer.push(sets.len() - 1);
        }
        Ok(LayerSlots { sets, of_layer })
    }

    /// Layer `li`'s slots and first slots (empty for a model of recurrent layers only).
    fn of(&self, li: usize) -> (&[i64], &[i64]) {
        match self.of_layer.get(li).and_then(|&i| self.sets.get(i)) {
            Some((s, f)) => (s, f),
            None => (&[], &[]),
        }
    }
}
