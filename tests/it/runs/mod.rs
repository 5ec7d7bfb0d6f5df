//! `kvbench run` and `suite` end to end on `sim`: where they write, properties of random runs,
//! the PagedAttention finding, sharded suites and fuzzing.

mod paged_finding;
mod paths;
mod properties;
mod shard_suite;
mod suite_fuzz;
