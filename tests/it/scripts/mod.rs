//! The shell scripts: `tests/skips.sh`, `scripts/findings.sh` and `scripts/gpu-check.sh
//! --emulated`.

mod findings;
mod gpu_check_emulated;
mod skips;
