#!/usr/bin/env bash
# Counts the tests that checked nothing: every "SKIP: ..." line a test printed into LOG (the
# output of `cargo test -- --nocapture`), listed with how often each was printed. `cargo test`
# reports such a test as "ok"; this makes the skip visible in the summary.
# KVBENCH_NO_SKIP=REGEX (CI): a SKIP line matching it fails (exit 1) — a component that must be
# there, skipped.
set -euo pipefail
log="$1"
lines=$(grep -oE 'SKIP: .*' "$log" || true)
if [ -z "$lines" ]; then
  echo "== skipped: 0 tests (every test ran its checks)"
  exit 0
fi
n=$(printf '%s\n' "$lines" | wc -l | tr -d ' ')
echo "== skipped: $n test(s) checked nothing (cargo test counts them as passed):"
printf '%s\n' "$lines" | sort | uniq -c | sed 's/^/  /'
if [ -n "${KVBENCH_NO_SKIP:-}" ]; then
  required=$(printf '%s\n' "$lines" | grep -E "$KVBENCH_NO_SKIP" || true)
  if [ -n "$required" ]; then
    echo "FAILED: a required component was skipped (KVBENCH_NO_SKIP=$KVBENCH_NO_SKIP):"
    printf '%s\n' "$required" | sed 's/^/  /'
    exit 1
  fi
fi
