#!/usr/bin/env bash
# The prepared GPU check (issue 10), for a machine with a GPU, CUDA 13 and PyTorch but no Rust and
# no network. Runs everything from one carried, stripped kvbench binary:
#   1. kvbench doctor            (driver, GPU, NVRTC, cuBLAS; every kernel compiled by NVRTC)
#   2. kvbench cuda-check        (every kernel against the f64 reference, the whole grid)
#   3. kvbench kernel-bench --backend cuda at the Llama-3-8B shape, bf16, block 16,
#      batch 1/16/64 x context 512/2048/8192, plus the PyTorch SDPA peer (scripts/sdpa_peer.py)
#   4. the cuda scenario backend end to end (issue 13): quick-basic and quick-mixed (also with
#      async steps) with the oracle, one Llama-3-8B-shape scenario (chat, 300 requests, paged and contiguous), and the
#      planted faults on cuda (skip-cow, early-reuse with async steps, leak, bad-block-table:
#      each must be caught, exit 1)
#   5. compute-sanitizer memcheck and racecheck over `cuda-check --quick`, where it works
# then prints one compact table (scripts/gpu_summary.py). Results and the environment go to
# results/gpu/ (and to $OUT too when the device tool sets it, so they come back — on every exit,
# through a trap). Every step has its own timeout, capped by what is left of the whole budget
# (KVBENCH_GPU_BUDGET_S, default 470 s); a step that fails or is skipped never stops later ones.
# Usage: scripts/gpu-check.sh [path/to/kvbench]     (default: target/release/kvbench)
# Exit: 0 all checks passed, 1 a check failed, 2 no binary / no GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-${KVBENCH_BIN:-target/release/kvbench}}"
RES="results/gpu"
mkdir -p "$RES"
START=$(date +%s)
BUDGET="${KVBENCH_GPU_BUDGET_S:-470}"
elapsed() { echo $(( $(date +%s) - START )); }
copy_out() { if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then mkdir -p "$OUT/results-gpu" && cp -r "$RES"/. "$OUT/results-gpu/" 2>/dev/null; fi; }
trap copy_out EXIT
if [ ! -x "$BIN" ]; then echo "gpu-check: no kvbench binary at $BIN" >&2; exit 2; fi

# NVRTC and cuBLAS live inside Python packages on the GPU image; kvbench finds them there itself,
# and KVBENCH_CUDA_LIB_DIR / LD_LIBRARY_PATH make sure the same copies are taken everywhere.
LIBDIRS=$(python3 - <<'PY' 2>/dev/null
import glob, os, sys
dirs = []
for p in sys.path + ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]:
    for d in [p] + glob.glob(os.path.join(p, "nvidia", "*", "lib")) + glob.glob(os.path.join(p, "torch", "lib")):
        if os.path.isdir(d) and any(glob.glob(d + "/" + n + ".so*") for n in ("libnvrtc", "libcublas", "libcublasLt", "libcudart")):
            if d not in dirs:
                dirs.append(d)
print(":".join(dirs))
PY
)
export KVBENCH_CUDA_LIB_DIR="$LIBDIRS"
# Every kernel loaded at context creation, not at first launch: lazy loading would take device
# memory in the middle of a run, and the cuda backend's reclamation check compares free memory
# at the start and the end of each run.
export CUDA_MODULE_LOADING=EAGER
export LD_LIBRARY_PATH="${LIBDIRS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "library folders: ${LIBDIRS:-none found}"

FAILED=0
declare -a SUMMARY
run_step() { # name timeout_s command...   (a step passes with exit 0, or EXPECT_RC if set)
  local name=$1 limit=$2; shift 2
  local want=${EXPECT_RC:-0}
  local left=$(( BUDGET - $(elapsed) ))
  if [ "$left" -lt 20 ]; then
    SUMMARY+=("$(printf '%-22s skipped (budget of %ss spent)' "$name" "$BUDGET")")
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$RES/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  local verdict=ok
  if [ "$rc" -ne "$want" ]; then
    FAILED=1; verdict=FAILED
    [ "$name" != doctor ] && { echo "--- $name failed (rc $rc, wanted $want); tail of $RES/$name.log:"; tail -n 25 "$RES/$name.log"; }
  fi
  SUMMARY+=("$(printf '%-22s rc=%-3s %4ss %s' "$name" "$rc" "$dt" "$verdict")")
  return 0
}

run_step doctor 90 "$BIN" doctor --require driver,nvrtc,gpu
cat "$RES/doctor.log"
if ! grep -q "^gpu: .* — sm_" "$RES/doctor.log"; then
  echo "gpu-check: no usable GPU (see above)"; cp "$RES/doctor.log" "${OUT:-/nonexistent}/" 2>/dev/null; exit 2
fi
run_step cuda_check 120 "$BIN" cuda-check --out "$RES"
grep -E "^(kernel|attn|kv_write|copy|swap|cuda-check)" "$RES/cuda_check.log"

# The cuda scenario backend: quick scenarios with the oracle on every sequence, then the 8B shape.
E2E="$RES/e2e"
mkdir -p "$E2E"
run_step e2e_quick_basic 60 "$BIN" run scenarios/quick-basic.toml --backend cuda --out "$E2E/quick-basic" --force
run_step e2e_quick_mixed 60 "$BIN" run scenarios/quick-mixed.toml --backend cuda --out "$E2E/quick-mixed" --force
run_step e2e_quick_mixed_async 60 "$BIN" run scenarios/quick-mixed.toml --backend cuda \
  --set scheduler.async_steps=true --out "$E2E/quick-mixed-async" --force
run_step e2e_chat_8b 240 "$BIN" run scenarios/chat-8b-h200.toml --backend cuda --trace-level requests \
  --set traffic.requests=300 --set traffic.output_tokens.median=64 --set traffic.output_tokens.max=256 \
  --set scheduler.max_tokens_per_step=2048 --out "$E2E/chat-8b-300" --force
for f in early-reuse skip-cow; do
  EXPECT_RC=1 run_step "fault_$f" 45 "$BIN" run scenarios/quick-mixed.toml --backend cuda \
    --inject-fault "$f" --out "$E2E/fault-$f" --force
done
run_step kernel_bench 150 "$BIN" kernel-bench --backend cuda --model llama3-8b --dtype bf16 \
  --batch 1,16,64 --context 512,2048,8192 --block-size 16 --max-gib 8 --out "$RES"
run_step peer_sdpa 120 python3 scripts/sdpa_peer.py --batch 1,16,64 --context 512,2048,8192 \
  --q-heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --out "$RES/peer_sdpa.csv"
for f in leak bad-block-table; do
  EXPECT_RC=1 run_step "fault_$f" 45 "$BIN" run scenarios/quick-mixed.toml --backend cuda \
    --inject-fault "$f" --out "$E2E/fault-$f" --force
done

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -n "$SAN" ] && [ "$(elapsed)" -lt $(( BUDGET - 60 )) ]; then
  run_step memcheck 60 "$SAN" --tool memcheck --error-exitcode 1 "$BIN" cuda-check --quick
  run_step racecheck 60 "$SAN" --tool racecheck --error-exitcode 1 "$BIN" cuda-check --quick
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
for d in "$E2E"/*/; do
  [ -f "$d/summary.json" ] && python3 - "$d" <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
print(sys.argv[1].rstrip("/").split("/")[-1], "ok" if s.get("ok") else "FAILED",
      [f"{r.get('cache')}: {r.get('output_tokens')} tokens, numerics {r.get('numerics')}" for r in s.get("runs", [])],
      s.get("failures"))
PY
done
exit $FAILED
