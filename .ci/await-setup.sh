# Sourced by tests/check.sh (KVBENCH_BEFORE_TESTS) after the build: waits for .ci/setup.sh, shows
# its log, and exports what the tests need. NVRTC is required (a missing one fails the run instead
# of printing SKIP); Chromium is required where it could be installed.
echo "== waiting for CI's installs (.ci/setup.sh)"
waited_s=0
while [ ! -e target/ci-setup.done ]; do
  if [ "$waited_s" -ge 1800 ]; then
    echo "FAILED: .ci/setup.sh did not finish in 30 minutes" >&2
    cat target/ci-setup.log >&2 || true
    exit 1
  fi
  sleep 2
  waited_s=$((waited_s + 2))
done
echo "   waited ${waited_s} s after the build"
cat target/ci-setup.log 2>/dev/null || true
# shellcheck disable=SC1091
. target/ci-setup.env
export KVBENCH_REQUIRE_NVRTC=1
# A skip of what CI installed fails the run (tests/skips.sh); "no CUDA device" may skip here.
export KVBENCH_NO_SKIP="NVRTC"
if command -v chromium >/dev/null 2>&1; then
  export KVBENCH_REQUIRE_CHROMIUM=1
  export KVBENCH_NO_SKIP="NVRTC|chromium"
else
  echo "WARNING: chromium could not be installed here; tests/it/results/report_html.rs will print SKIP" >&2
fi
