//! Scenario files: schema, parsing with file:line errors, overrides, feasibility checks.

mod types;

pub use types::*;
