//! The backends end to end: `cpu` against the oracle, `cuda` without a GPU and on the
//! emulated device, the `sim` cost model against hand computations and published figures, and the
//! device profiles.

mod config_located;
mod cpu_kernel_bench;
mod cpu_oracle;
mod cuda_cli;
mod cuda_emu_driver;
mod cuda_emu_kernel_bench;
mod cuda_emu_scenarios;
mod devices_profiles;
mod host_memory;
mod interrupt_compile;
mod kernel_bench_bounds;
mod moe_tp;
mod sim_published;
mod sim_workspace_moe;
mod workspace_prefill_first;
