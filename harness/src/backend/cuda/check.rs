//! The oracle check of the GPU's logits: each checked sequence's logits at its sampled steps
//! against a reference over the same token history, recomputed from scratch. The reference is
//! the f64 oracle where the model is small (`CheckPolicy::Every`) and the CPU f32 model at the
//! 8B shape (`CheckPolicy::Sample`; both in [`super::setup`]). Histories are checked when a
//! sequence is forgotten, outside any timed work; live ones by `Checker::report`.

use std::sync::Arc;

use kvbench_baselines::attention::ContiguousRegion;
use kvbench_kernels::{KvCache, StepSeq, Transformer};

use crate::backend::logit_check;

pub enum Reference {
    Oracle(kvbench_oracle::Model),
    /// The CPU model over a fresh contiguous cache.
    Cpu(Arc<Transformer>),
}

impl Reference {
    /// Logits after each of `positions` (ascending) of `history`.
    pub fn logits_at(&self, history: &[u32], positions: &[usize]) -> Result<Vec<Vec<f64>>, String> {
        match self {
            Reference::Oracle(o) => o.logits_at(history, positions).map_err(|e| e.to_string()),
            Reference::Cpu(m) => {
                let end = positions.iter().max().map_or(0, |&p| p + 1);
                if end > history.len() {
                    return Err(format!(
                        "position {} past a history of {}",
                        end - 1,
                        history.len()
                    ));
                }
                let mut cache: KvCache<f32> = m.new_cache(end.max(1));
                let region = ContiguousRegion {
                    base_slot: 0,
                    capacity_tokens: end.max(1),
                };
                let mut out = Vec::with_capacity(positions.len());
                let mut cur = 0;
                for &p in positions {
                    if p < cur {
                        return Err("positions must ascend".into());
                    }
                    let step = [StepSeq {
                        addr: &region,
                        start_pos: cur,
                        tokens: &history[cur..=p],
                        want_logits: true,
                    }];
                    let l = m
                        .forward(&mut cache, &step)
                        .map_err(|e| e.to_string())?
                        .pop()
                        .flatten()
                        .ok_or("reference returned no logits")?;
                    out.push(l.iter().map(|&x| x as f64).collect());
                    cur = p + 1;
                }
                Ok(out)
            }
        }
    }
}

impl logit_check::Reference for Reference {
    const NAME: &'static str = "reference";

    fn logits_at(&self, history: &[u32], positions: &[usize]) -> Result<Vec<Vec<f64>>, String> {
        Reference::logits_at(self, history, positions)
    }
}

/// The comparison itself is shared with the `cpu` backend's check.
pub type Checker = logit_check::Checker<Reference>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::{model_config, oracle_for};
    use crate::backend::seq_history::Record;
    use crate::model::ModelShape;
    use kvbench_oracle::rel_err;

    #[test]
    fn the_cpu_reference_agrees_with_the_oracle_and_a_wrong_logit_fails() {
        let cfg = model_config(&ModelShape::tiny()).expect("tiny");
        let m = Arc::new(Transformer::seeded(cfg, 3).expect("seeded"));
        let oracle = Reference::Oracle(oracle_for(&m).expect("oracle"));
        let cpu = Reference::Cpu(m.clone());
        let history: Vec<u32> = (0..12).map(|i| (i * 37 % 512) as u32).collect();
        let pos = [4usize, 5, 11];
        let a = oracle.logits_at(&history, &pos).expect("oracle");
        let b = cpu.logits_at(&history, &pos).expect("cpu");
        for (x, y) in a.iter().zip(&b) {
            let y32: Vec<f32> = y.iter().map(|&v| v as f32).collect();
            assert!(rel_err(&y32, x) < 1e-4, "{}", rel_err(&y32, x));
        }
        let good: Vec<Record> = pos
            .iter()
            .zip(&b)
            .map(|(&p, l)| Record {
                pos: p,
                logits: l.iter().map(|&v| v as f32).collect(),
            })
            .collect();
        let mut c = Checker::new(oracle, 1e-4);
        c.check(1, &history, &good);
        let mut bad = good.clone();
        bad[1].logits[0] += 50.0;
        c.check(2, &history, &bad);
        let rep = c.report(std::iter::empty());
        assert_eq!(rep.checked_steps, 6);
        assert!(!rep.ok);
        let msg = c.first_failure().expect("failure").to_string();
        assert!(
            msg.contains("sequence 2") && msg.contains("position 5"),
            "{msg}"
        );
        assert!(cpu.logits_at(&history, &[12]).is_err(), "past the history");
    }
}
