//! Statistics shared by sweeps, comparisons, tuning, kernel benches and the reports: intervals
//! for quantiles, proportions, means and slopes ([`interval`]), intervals over per-seed brackets
//! ([`bracket`]), and a device profile's identity ([`device`]).
//!
//! The bottom layer: nothing here imports from the rest of the crate, so every module above may
//! use it without an import circle.

pub mod bracket;
pub mod device;
pub mod interval;

pub use bracket::{bracket_interval, signed_bracket_interval};
pub use device::device_identity;
pub use interval::*;
