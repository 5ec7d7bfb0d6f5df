#!/usr/bin/env bash
# The prepared GPU check (issue 10), for a machine with a GPU, CUDA 13 and PyTorch but no Rust and
# no network. Runs everything from one carried, stripped kvbench binary:
#   1. kvbench doctor            (driver, GPU, NVRTC, cuBLAS; every kernel compiled by NVRTC)
#   2. kvbench cuda-check        (every kernel against the f64 reference, the whole grid)
#   3. kvbench kernel-bench --backend cuda at the Llama-3-8B shape, bf16, block 16,
#      batch 1/16/64 x context 512/2048/8192, plus the PyTorch SDPA peer (scripts/sdpa_peer.py)
#   4. compute-sanitizer memcheck and racecheck over `cuda-check --quick`, where it works
# then prints one compact table (scripts/gpu_summary.py). Results and the environment go to
# results/gpu/ (and to $OUT too when the device tool sets it, so they come back).
# Usage: scripts/gpu-check.sh [path/to/kvbench]     (default: target/release/kvbench)
# Exit: 0 all checks passed, 1 a check failed, 2 no binary / no GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-${KVBENCH_BIN:-target/release/kvbench}}"
RES="results/gpu"
mkdir -p "$RES"
START=$(date +%s)
elapsed() { echo $(( $(date +%s) - START )); }
if [ ! -x "$BIN" ]; then echo "gpu-check: no kvbench binary at $BIN" >&2; exit 2; fi

# NVRTC and cuBLAS live inside Python packages on the GPU image; kvbench finds them there itself,
# and KVBENCH_CUDA_LIB_DIR / LD_LIBRARY_PATH make sure the same copies are taken everywhere.
LIBDIRS=$(python3 - <<'PY' 2>/dev/null
import glob, os, sys
dirs = []
for p in sys.path + ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]:
    for d in [p] + glob.glob(os.path.join(p, "nvidia", "*", "lib")) + glob.glob(os.path.join(p, "torch", "lib")):
        if os.path.isdir(d) and (glob.glob(d + "/libnvrtc.so*") or glob.glob(d + "/libcublas.so*")):
            if d not in dirs:
                dirs.append(d)
print(":".join(dirs))
PY
)
export KVBENCH_CUDA_LIB_DIR="$LIBDIRS"
export LD_LIBRARY_PATH="${LIBDIRS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "library folders: ${LIBDIRS:-none found}"

FAILED=0
declare -a SUMMARY
run_step() { # name timeout_s command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$RES/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  SUMMARY+=("$(printf '%-22s rc=%-3s %4ss' "$name" "$rc" "$dt")")
  if [ "$rc" -ne 0 ]; then
    FAILED=1
    [ "$name" != doctor ] && { echo "--- $name failed (rc $rc); tail of $RES/$name.log:"; tail -n 25 "$RES/$name.log"; }
  fi
  return $rc
}

run_step doctor 90 "$BIN" doctor --require driver,nvrtc,gpu
cat "$RES/doctor.log"
if ! grep -q "^gpu: .* — sm_" "$RES/doctor.log"; then
  echo "gpu-check: no usable GPU (see above)"; cp "$RES/doctor.log" "${OUT:-/nonexistent}/" 2>/dev/null; exit 2
fi
run_step cuda_check 120 "$BIN" cuda-check --out "$RES"
grep -E "^(kernel|attn|kv_write|copy|swap|cuda-check)" "$RES/cuda_check.log"
run_step kernel_bench 150 "$BIN" kernel-bench --backend cuda --model llama3-8b --dtype bf16 \
  --batch 1,16,64 --context 512,2048,8192 --block-size 16 --max-gib 8 --out "$RES"
run_step peer_sdpa 120 python3 scripts/sdpa_peer.py --batch 1,16,64 --context 512,2048,8192 \
  --q-heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --out "$RES/peer_sdpa.csv"

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -n "$SAN" ] && [ "$(elapsed)" -lt 200 ]; then
  run_step memcheck 60 "$SAN" --tool memcheck --error-exitcode 1 "$BIN" cuda-check --quick
  [ "$(elapsed)" -lt 250 ] && run_step racecheck 60 "$SAN" --tool racecheck --error-exitcode 1 "$BIN" cuda-check --quick
else
  SUMMARY+=("compute-sanitizer      skipped (${SAN:-not found}; elapsed $(elapsed)s)")
fi

{
  echo "date_utc: $(date -u +%FT%TZ)"
  echo "kvbench: $("$BIN" --version 2>/dev/null)"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null
  grep -E "^(cpu|memory|driver|nvrtc|cublas|gpu):" "$RES/doctor.log"
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>/dev/null
  echo "library folders: $LIBDIRS"
  echo "total seconds: $(elapsed)"
} > "$RES/environment.txt"

echo "== gpu-check summary ($(elapsed) s)"
printf '%s\n' "${SUMMARY[@]}"
python3 scripts/gpu_summary.py "$RES"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then mkdir -p "$OUT/results-gpu" && cp -r "$RES"/. "$OUT/results-gpu/"; fi
exit $FAILED
