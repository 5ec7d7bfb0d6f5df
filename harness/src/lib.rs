//! kvbench: benchmarks and verifies KV-cache management for LLM serving.
//!
//! Start at `ARCHITECTURE.md`. Data flows one way: scenario → workload (request list) → engine
//! (admission, policy, cache manager, backend) → events → metrics → reports.

pub mod backend;
pub mod cache;
pub mod calibrate;
pub mod cli;
pub mod compare;
pub mod endpoint;
pub mod engine;
pub mod experiment;
pub mod isolation;
pub mod metrics;
pub mod model;
pub mod plan;
pub mod results;
pub mod scenario;
pub mod seam;
pub mod serve;
pub mod shadow;
pub mod stats;
pub mod sweep;
pub mod tune;
pub mod units;
pub mod workload;
