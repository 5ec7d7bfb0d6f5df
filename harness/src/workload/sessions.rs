//! Multi-turn sessions (`[traffic.sessions]`): each request the arrival process draws starts a
//! session; its later turns are planned here and issued by the engine.
//!
//! A later turn's `prompt` holds only its new user tokens. The engine builds the turn's real
//! prompt when the previous turn resolves — the previous prompt, then the previous turn's output
//! token ids as the run produced them (real greedy ids on `cpu`, the backend's stand-in ids on
//! `sim`), then the new tokens — and issues it a think time after that turn's last token.
//! Building at run time keeps the conversation exact on every backend: the ids a turn prepends
//! are the ones its cache actually holds.

use rand::Rng;

use super::sample::{DelaySampler, LengthSampler};
use super::seeded::rng;
use super::types::{Request, SessionTurn};
use super::Prompt;
use super::WorkloadError;
use crate::scenario::{Scenario, SessionOverflow, SessionsSpec};

mod stream {
    pub const TURNS: u64 = 32;
    pub const THINK: u64 = 33;
    pub const NEW_TOKENS_LEN: u64 = 34;
    pub const NEW_TOKENS: u64 = 35;
    pub const OUTPUT_LENGTHS: u64 = 36;
}

/// Expand first turns (in arrival order) into sessions, ids session-major: a session's turns
/// are consecutive ids, so turn k + 1 is request id + 1.
pub fn expand(
    scenario: &Scenario,
    spec: &SessionsSpec,
    seed: u64,
    vocab: u32,
    first_turns: Vec<Request>,
) -> Result<Vec<Request>, WorkloadError> {
    let key = "traffic.sessions";
    let turns = LengthSampler::new(scenario, &spec.turns, &format!("{key}.turns"))?;
    let new_len = LengthSampler::new(scenario, &spec.new_tokens, &format!("{key}.new_tokens"))?;
    let think = DelaySampler::new(&spec.think, &format!("{key}.think"))?;
    let output = match &scenario.traffic.output_tokens {
        Some(d) => LengthSampler::new(scenario, d, "traffic.output_tokens")?,
        None => {
            return Err(WorkloadError::Distribution {
                key: "traffic.output_tokens".into(),
                message: "required with sessions".into(),
            })
        }
    };
    let truncate_front = spec.overflow == SessionOverflow::Truncate;
    let (mut r_turns, mut r_think) = (rng(seed, stream::TURNS), rng(seed, stream::THINK));
    let (mut r_len, mut r_tok) = (
        rng(seed, stream::NEW_TOKENS_LEN),
        rng(seed, stream::NEW_TOKENS),
    );
    let mut r_out = rng(seed, stream::OUTPUT_LENGTHS);
    let mut out = Vec::with_capacity(first_turns.len());
    for (session, first) in first_turns.into_iter().enumerate() {
        let n = turns.draw(&mut r_turns).max(1);
        let base = out.len() as u64;
        let next = |k: u32| (k + 1 < n).then_some(base + k as u64 + 1);
        let (arrival_ms, tenant) = (first.arrival_ms, first.tenant);
        out.push(Request {
            id: base,
            session: Some(SessionTurn {
                session: session as u32,
                turn: 0,
                next: next(0),
                think_ms: 0.0,
                truncate_front,
            }),
            ..first
        });
        for k in 1..n {
            let len = new_len.draw(&mut r_len);
            out.push(Request {
                id: base + k as u64,
                tenant,
                // Never used for issuing (the engine issues it after the previous turn); kept
                // equal to the session's start so the list stays in arrival order.
                arrival_ms,
                prompt: Prompt::Explicit((0..len).map(|_| r_tok.gen_range(0..vocab)).collect()),
                prefix_group: None,
                // Below max_seq_len, so a front-truncated conversation keeps a prompt token.
                output_tokens: output
                    .draw(&mut r_out)
                    .clamp(1, scenario.cache.max_seq_len - 1),
                samples: 1,
                cancel: None,
                session: Some(SessionTurn {
                    session: session as u32,
                    turn: k,
                    next: next(k),
                    think_ms: think.draw(&mut r_think),
                    truncate_front,
                }),
            });
        }
    }
    Ok(out)
}
