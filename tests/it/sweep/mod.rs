//! `kvbench sweep`, `compare` and `gate`: refusals, statistics, recomputed figures and the gate's
//! rules.

mod cli;
mod compare;
mod gate_cli;
mod gate_rules;
mod stats;
