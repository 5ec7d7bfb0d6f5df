//! Scenario files: schema, parsing with file:line errors, overrides, feasibility checks.
//!
//! Entry point: [`load`]. A scenario that cannot run is refused here, before any work starts.

mod budget;
mod check;
mod check_groups;
mod device;
mod empirical;
mod error;
mod grouped_budget;
mod host;
mod load;
mod locate;
mod manager;
mod model_spec;
pub mod ranges;
mod tagged;
mod tiers;
mod trace_spec;
mod types;

pub use budget::{length_range, request_need, LengthRange, RequestNeed};
pub use check::check_trace_file;
pub use device::{device_memory_bytes, KNOWN_DEVICES};
pub use empirical::read_lengths;
pub use error::{Diagnostic, KeyProblem, Origin, ScenarioError};
pub use host::{available_bytes as host_available_bytes, HostNeed};
pub use load::{load, locate_in_source, parse_document, parse_str};
pub use locate::SourceMap;
pub use manager::{layers_keep_tokens_differently, CacheManager, HybridSupport, ManagerChoice};
pub use model_spec::*;
pub use tiers::{tier_block_bytes, tier_capacity_blocks};
pub use trace_spec::*;
pub use types::*;
