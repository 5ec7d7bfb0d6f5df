#!/usr/bin/env bash
# The GPU check: everything a first session on a GPU box should run, from the carried kvbench
# binary alone (no Rust, no network; CUDA 13 driver and PyTorch present), within 8 minutes.
#
# Usage: scripts/gpu-check.sh [--emulated] OUTPUT_FOLDER [path/to/kvbench]
#   (binary default: $KVBENCH_BIN, else target/release/kvbench)
#
# Steps, in this order, each under `timeout -k` and a share of one budget (KVBENCH_GPU_BUDGET_S,
# default 470 s); a step that fails or is skipped never stops the later ones:
#   doctor -> cuda-check -> kernel-bench --backend cuda + the PyTorch SDPA peer
#   -> quick scenarios on cuda, every sequence checked by the oracle
#   -> the four planted faults (each must be caught: exit 1)
#   -> compute-sanitizer memcheck and racecheck (where installed)
#   -> the Llama-3-8B chat scenario, last.
# Results: OUTPUT_FOLDER/gpu-check.tar.gz (every log, CSV and result folder) and
# OUTPUT_FOLDER/summary.md (the step table and the figures), nothing else. Unpack here with
#   mkdir -p results/gpu && tar -xzf OUTPUT_FOLDER/gpu-check.tar.gz -C results/gpu
# NVRTC compiles each program once for the whole check: the compiled kernels are kept in
# OUTPUT_FOLDER/kernel-cache while it runs, removed at the end.
#
# --emulated runs the same steps on `--backend cuda-emu` (the emulated device, no GPU needed),
# scaled down: the quick scenarios and faults as on the GPU, a small kernel-bench grid; the SDPA
# peer, compute-sanitizer and the 8B run are skipped with the reason in the summary.
#
# Exit: 0 every step passed; 1 a step failed; 2 bad usage or no binary.
set -uo pipefail

MODE=gpu
if [ "${1:-}" = "--emulated" ]; then MODE=emulated; shift; fi
if [ $# -lt 1 ] || [ -z "$1" ]; then
  echo "usage: scripts/gpu-check.sh [--emulated] OUTPUT_FOLDER [path/to/kvbench]" >&2
  exit 2
fi
mkdir -p "$1" || { echo "gpu-check: cannot create $1" >&2; exit 2; }
OUTDIR=$(cd "$1" && pwd)
BIN_ARG="${2:-${KVBENCH_BIN:-target/release/kvbench}}"
case "$BIN_ARG" in /*) BIN="$BIN_ARG" ;; *) BIN="$PWD/$BIN_ARG" ;; esac
cd "$(dirname "$0")/.." || exit 2
if [ ! -x "$BIN" ]; then echo "gpu-check: no kvbench binary at $BIN" >&2; exit 2; fi

WORK="$OUTDIR/gpu-check"        # everything the steps write; packed into the archive
ARCHIVE="$OUTDIR/gpu-check.tar.gz"
SUMMARY="$OUTDIR/summary.md"
export KVBENCH_KERNEL_CACHE="$OUTDIR/kernel-cache"
rm -rf "$WORK" "$KVBENCH_KERNEL_CACHE" "$ARCHIVE" "$SUMMARY"
mkdir -p "$WORK/e2e"
STEPS="$WORK/steps.tsv"
: > "$STEPS"

START=$(date +%s)
BUDGET="${KVBENCH_GPU_BUDGET_S:-470}"
RESERVE=15                      # kept for the summary and the archive
elapsed() { echo $(( $(date +%s) - START )); }

if [ "$MODE" = emulated ]; then
  BACKEND=cuda-emu
  TITLE="EMULATED device (--backend cuda-emu, no GPU): timings are emulated, never GPU figures"
else
  BACKEND=cuda
  TITLE="GPU"
fi

# NVRTC and cuBLAS live inside Python packages on the GPU image; kvbench finds them there itself,
# and KVBENCH_CUDA_LIB_DIR / LD_LIBRARY_PATH make sure the same copies are taken everywhere.
LIBDIRS=""
if command -v python3 >/dev/null 2>&1; then
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
fi
export KVBENCH_CUDA_LIB_DIR="$LIBDIRS"
# Every kernel loaded at context creation, not at first launch (lazy loading would take device
# memory in the middle of a run, and reclamation compares free memory at start and end).
export CUDA_MODULE_LOADING=EAGER
export LD_LIBRARY_PATH="${LIBDIRS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

FAILED=0
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$STEPS"; }  # name verdict rc want s note
skip() { record "$1" skipped - - 0 "$2"; echo "== $1: skipped ($2)"; }

# KVBENCH_GPU_CHECK_ONLY=name,name,... runs only those steps (the others are listed as not
# selected): for a quick look at one step, and for the test that runs the emulated check in CI.
selected() { [ -z "${KVBENCH_GPU_CHECK_ONLY:-}" ] || [[ ",$KVBENCH_GPU_CHECK_ONLY," == *",$1,"* ]]; }

# step NAME LIMIT_S WANT_RC NOTE -- command...   (passes when the command exits WANT_RC)
step() {
  local name=$1 limit=$2 want=$3 note=$4; shift 5
  if ! selected "$name"; then
    skip "$name" "not selected (KVBENCH_GPU_CHECK_ONLY)"
    return 0
  fi
  local left=$(( BUDGET - RESERVE - $(elapsed) ))
  if [ "$left" -lt 10 ]; then
    skip "$name" "budget of ${BUDGET}s spent"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s)"
  local t0; t0=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  local verdict=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    verdict=FAILED; note="timed out after ${limit}s${note:+; $note}"
  elif [ "$rc" -ne "$want" ]; then
    verdict=FAILED
  fi
  if [ "$verdict" = FAILED ]; then
    FAILED=1
    local last
    last=$(grep -v '^[[:space:]]*$' "$WORK/$name.log" | tail -n 1 | tr '\t|' '  ' | cut -c1-160)
    [ -n "$last" ] && note="${note:+$note; }$last"
    echo "--- $name failed (exit $rc, wanted $want); tail of its log:"
    tail -n 15 "$WORK/$name.log"
  fi
  record "$name" "$verdict" "$rc" "$want" "$dt" "$note"
  return 0
}

# A subcommand that takes `--backend cuda-emu` (older binaries run some steps on a GPU only).
takes_emu() { "$BIN" "$1" --help 2>/dev/null | grep -q -- cuda-emu; }

write_summary() {
  local total; total=$(elapsed)
  local n_ok n_failed n_skipped
  n_ok=$(awk -F'\t' '$2=="ok"' "$STEPS" | wc -l)
  n_failed=$(awk -F'\t' '$2=="FAILED"' "$STEPS" | wc -l)
  n_skipped=$(awk -F'\t' '$2=="skipped"' "$STEPS" | wc -l)
  {
    echo "# kvbench GPU check: $TITLE"
    echo
    echo "- date (UTC): $(date -u +%FT%TZ); total ${total}s of a ${BUDGET}s budget"
    echo "- kvbench: $("$BIN" --version 2>/dev/null || echo unknown)"
    echo "- steps: ${n_ok} ok, ${n_failed} failed, ${n_skipped} skipped"
    echo "- everything else: gpu-check.tar.gz (unpack: \`mkdir -p results/gpu && tar -xzf gpu-check.tar.gz -C results/gpu\`)"
    echo
    echo "| step | verdict | exit | wanted | seconds | note |"
    echo "|---|---|---:|---:|---:|---|"
    awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6 }' "$STEPS"
    echo
    if command -v python3 >/dev/null 2>&1; then
      python3 scripts/gpu_summary.py "$WORK" 2>&1 || echo "(gpu_summary.py failed; the CSVs are in the archive)"
    else
      echo "(no python3: figures not tabulated; the CSVs are in the archive)"
    fi
  } > "$SUMMARY"
}

# Packs the work folder into the one archive and leaves only it and summary.md (also on a
# kill: the EXIT trap runs after TERM/INT too).
PACKED=0
pack() {
  [ "$PACKED" = 1 ] && return
  PACKED=1
  write_summary
  cp "$SUMMARY" "$WORK/summary.md"
  if tar -czf "$ARCHIVE" -C "$WORK" .; then
    rm -rf "$WORK" "$KVBENCH_KERNEL_CACHE"
  else
    echo "gpu-check: packing failed; the results stay in $WORK" >&2
  fi
}
trap pack EXIT
trap 'exit 143' TERM INT

echo "gpu-check ($MODE): binary $BIN, output $OUTDIR, library folders: ${LIBDIRS:-none found}"

# 1. doctor
if [ "$MODE" = emulated ]; then
  # The emulated device runs the kernels' host build, not NVRTC's output; compiling every program
  # (about 30 s of CPU, minutes on a loaded 2-core machine) is the NVRTC compile test's job.
  step doctor 60 0 "" -- "$BIN" doctor --no-compile
else
  step doctor 90 0 "" -- "$BIN" doctor --require driver,nvrtc,gpu
fi

# 2. cuda-check
if [ "$MODE" = emulated ]; then
  if takes_emu cuda-check; then
    step cuda_check 120 0 "quick grid" -- "$BIN" cuda-check --backend cuda-emu --quick --out "$WORK"
  else
    skip cuda_check "this kvbench runs cuda-check on a GPU only (no --backend cuda-emu)"
  fi
else
  step cuda_check 90 0 "" -- "$BIN" cuda-check --out "$WORK"
fi

# 3. kernel-bench and the SDPA peer
if [ "$MODE" = emulated ]; then
  if takes_emu kernel-bench; then
    step kernel_bench 90 0 "emulated timings; small grid" -- "$BIN" kernel-bench --backend cuda-emu \
      --model llama3-8b --dtype bf16 --batch 1,4 --context 128 --block-size 16 --max-gib 1 --out "$WORK"
  else
    skip kernel_bench "this kvbench's kernel-bench has no --backend cuda-emu"
  fi
  skip peer_sdpa "the PyTorch SDPA peer needs a GPU"
else
  step kernel_bench 120 0 "" -- "$BIN" kernel-bench --backend cuda --model llama3-8b --dtype bf16 \
    --batch 1,16,64 --context 512,2048,8192 --block-size 16 --max-gib 8 --out "$WORK"
  step peer_sdpa 60 0 "" -- python3 scripts/sdpa_peer.py --batch 1,16,64 --context 512,2048,8192 \
    --q-heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --out "$WORK/peer_sdpa.csv"
fi

# 4. quick scenarios with the oracle on every sequence
Q=45; [ "$MODE" = emulated ] && Q=300   # emulated: the budget is the real cap
E2E="$WORK/e2e"
step e2e_quick_basic "$Q" 0 "" -- "$BIN" run scenarios/quick-basic.toml --backend "$BACKEND" \
  --out "$E2E/quick-basic" --force
step e2e_quick_mixed "$Q" 0 "" -- "$BIN" run scenarios/quick-mixed.toml --backend "$BACKEND" \
  --out "$E2E/quick-mixed" --force
step e2e_quick_mixed_async "$Q" 0 "async steps" -- "$BIN" run scenarios/quick-mixed.toml \
  --backend "$BACKEND" --set scheduler.async_steps=true --out "$E2E/quick-mixed-async" --force
step e2e_conversation_quick "$Q" 0 "" -- "$BIN" run scenarios/conversation-quick.toml \
  --backend "$BACKEND" --out "$E2E/conversation-quick" --force

# 5. the four planted faults: each must be caught (exit 1)
F=40; [ "$MODE" = emulated ] && F=300
for f in skip-cow early-reuse leak bad-block-table; do
  step "fault_$f" "$F" 1 "must be caught" -- "$BIN" run scenarios/quick-mixed.toml --backend "$BACKEND" \
    --inject-fault "$f" --out "$E2E/fault-$f" --force
done

# 6. sanitizers
if [ "$MODE" = emulated ]; then
  skip compute_sanitizer "for a GPU; the emulated device checks every access and copy in the steps above"
else
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ -n "$SAN" ]; then
    step memcheck 60 0 "" -- "$SAN" --tool memcheck --error-exitcode 1 "$BIN" cuda-check --quick
    step racecheck 60 0 "" -- "$SAN" --tool racecheck --error-exitcode 1 "$BIN" cuda-check --quick
  else
    skip compute_sanitizer "compute-sanitizer not installed"
  fi
fi

# 7. the Llama-3-8B chat scenario, last (it takes what is left of the budget, up to 240 s)
if [ "$MODE" = emulated ]; then
  skip e2e_chat_8b "an 8B model is far too slow on the emulated device"
else
  step e2e_chat_8b 240 0 "300 requests, paged and contiguous" -- "$BIN" run scenarios/chat-8b-h200.toml \
    --backend cuda --trace-level requests --set traffic.requests=300 \
    --set traffic.output_tokens.median=64 --set traffic.output_tokens.max=256 \
    --set scheduler.max_tokens_per_step=2048 --out "$E2E/chat-8b-300" --force
fi

{
  echo "mode: $MODE"
  echo "date_utc: $(date -u +%FT%TZ)"
  echo "kvbench: $("$BIN" --version 2>/dev/null)"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi \
    --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null
  grep -E "^(cpu|memory|driver|nvrtc|cublas|gpu):" "$WORK/doctor.log" 2>/dev/null
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>/dev/null
  echo "library folders: $LIBDIRS"
  echo "kernel cache: $(ls "$KVBENCH_KERNEL_CACHE" 2>/dev/null | grep -c cubin) compiled programs"
  echo "total seconds: $(elapsed)"
} > "$WORK/environment.txt"

pack
echo "== gpu-check ($MODE) done in $(elapsed)s: $SUMMARY and $ARCHIVE"
cat "$SUMMARY"
exit $FAILED
