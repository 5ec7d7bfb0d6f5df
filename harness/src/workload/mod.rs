//! The seeded workload generator: (scenario, seed) → request list, its hash and its summary.
//!
//! Both cache modes are driven with the list this module returns; nothing downstream draws
//! random numbers about requests.

mod generate;
mod hash;
mod sample;
mod summary;
mod types;

use std::path::PathBuf;

pub use generate::{generate, prefix_tokens, MAX_REQUESTS};
pub use hash::workload_hash;
pub use sample::{DelaySampler, GapSampler, LengthSampler};
pub use summary::{Percentiles, Summary};
pub use types::*;

use crate::scenario::ScenarioError;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error(transparent)]
    Scenario(ScenarioError),
    #[error("{}: trace replay arrives with the trace issue; this build cannot read traces yet", path.display())]
    TraceNotYet { path: PathBuf },
    #[error("{key}: {message}")]
    Distribution { key: String, message: String },
    #[error("traffic.duration_s: more than {limit} requests; lower the rate or the duration")]
    TooMany { limit: usize },
}
