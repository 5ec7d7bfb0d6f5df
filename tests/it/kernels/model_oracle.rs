//! The seeded transformer over a paged KV cache against the independent f64 oracle, which
//! recomputes the whole history with no cache. f32 tolerance: ‖out − ref‖/‖ref‖ ≤ 1e-4.

use crate::support::kernels_common as common;

use common::rng;
use kvbench::backend::cpu::{model_config, BF16_TOLERANCE as BF16_TOL, F32_TOLERANCE as F32_TOL};
use kvbench::model::ModelShape;
use kvbench_kernels::{bf16, rank_token, KvCache, KvElem, PagedTable, StepSeq, Transformer};
use rand::seq::SliceRandom;
use rand::Rng;

fn tiny_config() -> kvbench_kernels::ModelConfig {
    model_config(&ModelShape::tiny()).expect("the tiny preset is a valid cpu model")
}

fn oracle_for(model: &Transformer) -> kvbench_oracle::Model {
    kvbench::backend::cpu::oracle_for(model).expect("oracle accepts the model")
}

/// Generates `decode` tokens greedily after prefilling `prompt` in `chunks`, checking every
/// sampled step against the oracle. Returns (stream, logits per step, worst rel err).
fn generate<E: KvElem>(
    model: &Transformer,
    oracle: &kvbench_oracle::Model,
    table: &[u32],
    block_size: usize,
    prompt: &[u32],
    chunks: &[usize],
    decode: usize,
) -> (Vec<u32>, Vec<Vec<f32>>, f64) {
    let mut kv: KvCache<E> = model.new_cache(table.len() * block_size * 2);
    let addr = PagedTable {
        block_size,
        blocks: table,
    };
    let mut history = prompt.to_vec();
    let mut start = 0;
    let mut all_logits = Vec::new();
    let mut worst = 0f64;
    let mut last = None;
    for &c in chunks {
        let seq = StepSeq {
            addr: &addr,
            start_pos: start,
            tokens: &prompt[start..start + c],
            want_logits: start + c == prompt.len(),
        };
        last = model.forward(&mut kv, &[seq]).expect("forward")[0].clone();
        start += c;
    }
    assert_eq!(start, prompt.len(), "chunks must cover the prompt");
    for step in 0..=decode {
        let logits = last.take().expect("logits for the last token");
        let reference = oracle.logits(&history).expect("oracle");
        let err = kvbench_oracle::rel_err(&logits, &reference);
        assert!(
            err <= if E::NAME == "f32" { F32_TOL } else { BF16_TOL },
            "{} step {step}: rel err {err:.3e}",
            E::NAME
        );
        worst = worst.max(err);
        let tok = rank_token(&logits, 0).expect("non-empty vocab");
        all_logits.push(logits);
        if step == decode {
            break;
        }
        history.push(tok);
        let pos = history.len() - 1;
        let seq = StepSeq {
            addr: &addr,
            start_pos: pos,
            tokens: &history[pos..],
            want_logits: true,
        };
        last = model.forward(&mut kv, &[seq]).expect("forward")[0].clone();
    }
    (history[prompt.len()..].to_vec(), all_logits, worst)
}

fn shuffled_table(r: &mut rand_chacha::ChaCha8Rng, blocks: usize) -> Vec<u32> {
    let mut t: Vec<u32> = (0..blocks as u32 * 2).collect();
    t.shuffle(r);
    t.truncate(blocks);
    t
}

#[test]
fn paged_model_matches_oracle_and_chunking_does_not_change_a_bit() {
    let seed = common::seed("model_oracle");
    let mut r = rng(seed, 1);
    let model = Transformer::seeded(tiny_config(), seed).expect("model");
    let oracle = oracle_for(&model);
    let prompt: Vec<u32> = (0..37).map(|_| r.gen_range(0..512)).collect();
    let bs = 16;
    let table = shuffled_table(&mut r, 5);
    let (s1, l1, worst) = generate::<f32>(&model, &oracle, &table, bs, &prompt, &[37], 30);
    let table2 = shuffled_table(&mut r, 9);
    let (s2, l2, _) = generate::<f32>(&model, &oracle, &table2, 8, &prompt, &[16, 16, 5], 30);
    eprintln!("f32 worst rel err vs oracle: {worst:.3e}");
    assert_eq!(
        s1, s2,
        "greedy streams differ between block sizes / chunkings"
    );
    assert_eq!(
        l1, l2,
        "logits are not bit-identical across block tables and chunkings"
    );
}

#[test]
fn bf16_kv_stays_within_stated_tolerance() {
    let seed = common::seed("model_oracle_bf16");
    let mut r = rng(seed, 2);
    let model = Transformer::seeded(tiny_config(), seed).expect("model");
    let oracle = oracle_for(&model);
    let prompt: Vec<u32> = (0..29).map(|_| r.gen_range(0..512)).collect();
    let table = shuffled_table(&mut r, 4);
    let (_, _, worst) = generate::<bf16>(&model, &oracle, &table, 16, &prompt, &[20, 9], 20);
    eprintln!("bf16 worst rel err vs oracle: {worst:.3e}");
}

#[test]
fn a_token_does_not_depend_on_its_batch_neighbours() {
    let seed = common::seed("batch_invariance");
    let mut r = rng(seed, 3);
    let model = Transformer::seeded(tiny_config(), seed).expect("model");
    let a: Vec<u32> = (0..23).map(|_| r.gen_range(0..512)).collect();
    let b: Vec<u32> = (0..41).map(|_| r.gen_range(0..512)).collect();
    let (ta, tb) = ([0u32, 1], [2u32, 3, 4]);
    let (pa, pb) = (
        PagedTable {
            block_size: 16,
            blocks: &ta,
        },
        PagedTable {
            block_size: 16,
            blocks: &tb,
        },
    );
    let mut kv1: KvCache<f32> = model.new_cache(80);
    let alone = model
        .forward(
            &mut kv1,
            &[StepSeq {
                addr: &pa,
                start_pos: 0,
                tokens: &a,
                want_logits: true,
            }],
        )
        .expect("fwd");
    let mut kv2: KvCache<f32> = model.new_cache(80);
    let both = model
        .forward(
            &mut kv2,
            &[
                StepSeq {
                    addr: &pb,
                    start_pos: 0,
                    tokens: &b,
                    want_logits: true,
                },
                StepSeq {
                    addr: &pa,
                    start_pos: 0,
                    tokens: &a,
                    want_logits: true,
                },
            ],
        )
        .expect("fwd");
    assert_eq!(alone[0], both[1]);
}

/// Random weights must not make greedy decoding a coin toss: the top-1 logit should usually
/// win by a visible margin, or tiny rounding differences would flip streams.
#[test]
fn logits_are_not_degenerate() {
    let seed = common::seed("margins");
    let mut r = rng(seed, 4);
    let model = Transformer::seeded(tiny_config(), seed).expect("model");
    let mut gaps = Vec::new();
    let mut distinct = std::collections::BTreeSet::new();
    for s in 0..40u32 {
        let prompt: Vec<u32> = (0..8 + s as usize).map(|_| r.gen_range(0..512)).collect();
        let t: Vec<u32> = (0..4).collect();
        let addr = PagedTable {
            block_size: 16,
            blocks: &t,
        };
        let mut kv: KvCache<f32> = model.new_cache(64);
        let l = model
            .forward(
                &mut kv,
                &[StepSeq {
                    addr: &addr,
                    start_pos: 0,
                    tokens: &prompt,
                    want_logits: true,
                }],
            )
            .expect("fwd")[0]
            .clone()
            .expect("logits");
        let mean = l.iter().sum::<f32>() / l.len() as f32;
        let std = (l.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / l.len() as f32).sqrt();
        let mut sorted = l.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        gaps.push((sorted[0] - sorted[1]) / std);
        distinct.insert(rank_token(&l, 0).expect("token"));
        assert!(
            std > 0.5 && std < 20.0,
            "logit std {std} out of the intended range"
        );
    }
    gaps.sort_by(|a, b| a.total_cmp(b));
    eprintln!(
        "top1-top2 gap / std: min {:.3e} median {:.3}",
        gaps[0],
        gaps[gaps.len() / 2]
    );
    assert!(gaps[gaps.len() / 2] > 0.05, "median top-1 margin too small");
    assert!(
        distinct.len() > 10,
        "greedy picks collapse to {} tokens",
        distinct.len()
    );
}
