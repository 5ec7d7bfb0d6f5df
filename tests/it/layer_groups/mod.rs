//! Layer groups (full, sliding, MLA, recurrent): their pricing, and runs of grouped models on
//! `sim` and `cpu` through the grouped managers.

mod budget;
mod cpu;
mod cpu_hybrid;
mod cpu_recurrent_prefix_cache;
mod pricing;
mod run;
mod sim;
mod swap;
