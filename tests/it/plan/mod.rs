//! `kvbench plan` through the binary.

mod cli;
mod presets;
