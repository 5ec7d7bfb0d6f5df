#!/usr/bin/env bash
# What CI installs besides Rust: NVRTC (the pip wheel nvidia-cuda-nvrtc-cu12, no GPU needed) and
# Debian's chromium (renders report.html in tests/it/results/report_html.rs). .ci/run starts it in
# the background while cargo builds; it writes the environment the tests need to target/ci-setup.env
# and, last, target/ci-setup.done (which .ci/await-setup.sh waits for).
set -uo pipefail
cd "$(dirname "$0")/.."
env_file=target/ci-setup.env
: >"$env_file"
# Where the system Python refuses installs (PEP 668), the wheel goes under target/ instead.
if ! python3 -m pip install --quiet nvidia-cuda-nvrtc-cu12; then
  python3 -m pip install --quiet --break-system-packages --target target/nvrtc-wheel \
    nvidia-cuda-nvrtc-cu12
  echo "export KVBENCH_CUDA_LIB_DIR=$PWD/target/nvrtc-wheel/nvidia/cuda_nvrtc/lib" >>"$env_file"
fi
# Installed as root (or through sudo); if the machine cannot install it, the test prints its SKIP
# line rather than failing the whole run for a missing browser (.ci/await-setup.sh says so).
if ! command -v chromium >/dev/null 2>&1; then
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo -n)
  "${as_root[@]}" apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends \
    chromium || true
fi
touch target/ci-setup.done
