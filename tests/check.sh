#!/usr/bin/env bash
# The test command (README): format, lints, the whole test suite, and the loom model of the fence
# protocol. Seeded randomized tests print their seed; raise case counts with PROPTEST_CASES=N.
set -euo pipefail
cd "$(dirname "$0")/.."

rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== cargo fmt --check"
cargo fmt --all -- --check

# Clippy's lints run inside the test build itself: clippy-driver is the compiler for the
# workspace's crates (what `cargo clippy` does, but with code generation), so every crate is
# compiled once instead of once to check and once to test. `--all-targets` covers the benches and
# examples `cargo clippy --all-targets` covers. Same lints, same `-D warnings`; dependencies are
# built by plain rustc. Every cargo call below inherits the wrapper, so none recompiles.
echo "== build every target with clippy's lints (-D warnings)"
if ! RUSTC_WORKSPACE_WRAPPER="$(command -v clippy-driver)"; then
  echo "FAILED: clippy-driver not found (rustup component add clippy)" >&2
  exit 1
fi
export RUSTC_WORKSPACE_WRAPPER
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
cargo test --workspace --all-targets --locked --no-run

# CI installs NVRTC and Chromium in the background while the build runs; it names here what
# waits for them (and exports where they are) before the tests start.
if [ -n "${KVBENCH_BEFORE_TESTS:-}" ]; then
  # shellcheck disable=SC1090
  . "$KVBENCH_BEFORE_TESTS"
fi

echo "== cargo test"
# Includes kernels/cuda/tests/nvrtc_compile.rs: every CUDA kernel program compiled by NVRTC for
# sm_80 and sm_90, failing on any error or warning (SKIP where NVRTC is absent, unless
# KVBENCH_REQUIRE_NVRTC=1, which .ci/run sets after installing the nvidia-cuda-nvrtc-cu12 wheel).
# Tests that need a GPU print "SKIP: no CUDA device" and pass nothing.
# A skipped test passes in cargo's count: its SKIP lines are counted and listed after the run
# (tests/skips.sh); with KVBENCH_NO_SKIP=REGEX (CI) a matching skip fails the run.
echo "   NVRTC required: ${KVBENCH_REQUIRE_NVRTC:-0}; skips refused: ${KVBENCH_NO_SKIP:-none}"
mkdir -p "${CARGO_TARGET_DIR:-target}"
test_log="${CARGO_TARGET_DIR:-target}/check-test-output.log"
cargo test --workspace --locked -- --nocapture 2>&1 | tee "$test_log"
bash tests/skips.sh "$test_log"

# The merge gate (docs/sweep-and-gate.md): a fresh sweep on the
# deterministic sim backend against the committed baseline; exit 1 on a significant regression
# beyond 5%, 2 when the workload or scenario definition no longer matches. It uses the binary
# `cargo test` just built (its integration tests run it), so nothing is compiled again.
echo "== gate: sim sweep against results/baseline/sim"
kvbench="${CARGO_TARGET_DIR:-target}/debug/kvbench"
"$kvbench" sweep scenarios/chat-8b-h200.toml --backend sim --seeds 2 --set traffic.requests=800 \
  --out "${CARGO_TARGET_DIR:-target}/gate/chat-8b-h200" --force
"$kvbench" gate --baseline results/baseline/sim/chat-8b-h200 \
  --current "${CARGO_TARGET_DIR:-target}/gate/chat-8b-h200" --max-regression 5

# The attention kernels pick AVX2+FMA micro-kernels where the CPU has them; rerun the kernel tests
# with the slower paths forced, so the portable and AVX2-only code is checked here too. The path
# is read once per process, so each value is its own run: the kernels' tests against their
# reference, and the integration binary's `kernels::` module (attention and the whole model
# against the f64 oracle, bit for bit across paged and contiguous). The scenario-level oracle
# runs exercise no other kernel code: they run once, on the best path, above.
for path in portable avx2; do
  echo "== kernel tests on the $path code path"
  # `--workspace`, not `-p kvbench-kernels`: one package alone unifies other features and
  # would compile the crate again.
  KVBENCH_KERNEL_PATH=$path cargo test --locked --workspace --test attention
  KVBENCH_KERNEL_PATH=$path cargo test --locked --test it -- kernels::
done

echo "== loom: fence/release protocol"
env -u RUSTC_WORKSPACE_WRAPPER LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" \
  CARGO_TARGET_DIR=target/loom cargo test -p kvbench-cache-api --release --locked loom
