//! The kvbench package's integration tests, one binary: linking the library once instead of once
//! per test file is most of what the suite's build saves. Modules go by subject; the helpers the
//! subjects share are `support`, once each.
//!
//! Tests here run on parallel threads of one process, so a test must not change what the process
//! shares: no `std::env::set_var` or `set_current_dir` (a child's `Command::env` and
//! `current_dir` are fine), no signal handlers, no process-wide setting another test reads. The
//! tests that need one have their own binary beside this folder:
//! - `tests/trace_scale.rs` installs a counting global allocator and measures peak allocation,
//!   which every other thread of its process would add to;
//! - `tests/tier_cuda_emu.rs` sets the emulated device's delay seed, which is process-wide
//!   (`backend::cuda::set_emu_seed`) and would reach the emulated runs of `backends::` here.
//!
//! `KVBENCH_KERNEL_PATH` is read once per process; `tests/check.sh` runs this binary again under
//! each value with a name filter (`kernels::`, `backends::cpu_oracle::`).

mod support;

mod backends;
mod cache;
mod calibrate;
mod checker;
mod endpoint;
mod engine;
mod isolation;
mod kernels;
mod layer_groups;
mod plan;
mod results;
mod runs;
mod scenario;
mod scripts;
mod serve;
mod sweep;
mod tiers;
mod trace;
mod tune;
mod workload;
