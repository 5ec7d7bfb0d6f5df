//! The seeded workload generator: (scenario, seed) → request list, its hash and its summary.
//!
//! Both cache modes are driven with the list this module returns; nothing downstream draws
//! random numbers about requests.

mod generate;
mod hash;
mod prompt;
mod sample;
mod seeded;
mod sessions;
mod summary;
pub mod trace;
mod types;

pub use generate::{generate, prefix_tokens, MAX_REQUESTS};
pub use hash::{workload_hash, workload_hash_with_trace};
pub use prompt::{hash_block_tokens, Continuation, Head, Prompt, Recipe};
pub use sample::{DelaySampler, GapSampler, LengthSampler};
pub use summary::{Percentiles, Summary};
pub use types::*;

use crate::scenario::ScenarioError;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error(transparent)]
    Scenario(ScenarioError),
    #[error(transparent)]
    Trace(#[from] trace::TraceError),
    #[error("{key}: {message}")]
    Distribution { key: String, message: String },
    #[error("traffic.duration_s: more than {limit} requests; lower the rate or the duration")]
    TooMany { limit: usize },
}

/// A trace replay's workload: the rows within the window as requests, the trace's identity and
/// its ideal prefix reuse at the cache's block size.
fn trace_workload(
    scenario: &crate::scenario::Scenario,
    spec: &crate::scenario::TraceSpec,
    seed: u64,
    vocab: u32,
) -> Result<Workload, WorkloadError> {
    let path = scenario.resolve_path(&spec.path);
    let limits = trace::ReplayLimits {
        max_requests: scenario.traffic.requests,
        duration_s: scenario.traffic.duration_s,
    };
    let trace::Replayed {
        requests,
        mut info,
        has_content_ids,
        ..
    } = trace::replay(&path, spec, &limits, seed, vocab)?;
    if has_content_ids {
        let per_tenant = scenario.scheduler.prefix_scope != crate::scenario::PrefixScope::Global;
        let ideal = trace::ideal_prefix_reuse(
            &requests,
            scenario.block_size(),
            scenario.cache.max_seq_len,
            per_tenant,
        );
        info.ideal_prefix_hit_rate = Some(ideal.hit_rate);
    }
    let workload_hash = workload_hash_with_trace(&requests, None, &info);
    Ok(Workload {
        requests,
        closed_loop: None,
        workload_hash,
        trace: Some(info),
    })
}
