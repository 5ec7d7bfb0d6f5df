//! The attention kernels and the seeded transformer against their references. `tests/check.sh`
//! reruns this module and `backends::cpu_oracle` with each `KVBENCH_KERNEL_PATH`.

mod attention;
mod model_oracle;
