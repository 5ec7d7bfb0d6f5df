//! The seeded workload generator: (scenario, seed) → request list.

mod types;

pub use types::*;
