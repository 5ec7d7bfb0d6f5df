#!/usr/bin/env bash
# The test command (README): format, lints, the whole test suite, and the loom model of the fence
# protocol. Seeded randomized tests print their seed; raise case counts with PROPTEST_CASES=N.
set -euo pipefail
cd "$(dirname "$0")/.."

rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test"
cargo test --workspace --locked

echo "== loom: fence/release protocol"
LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p kvbench-cache-api --release --locked loom
