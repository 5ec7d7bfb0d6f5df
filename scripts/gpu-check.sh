#!/usr/bin/env bash
# The GPU check: everything a first session on a GPU box should run, from the carried kvbench
# binary alone (no Rust, no network; a CUDA 12.4+ driver and PyTorch present). It fits twice in
# one 15-minute device window, start-up included: every step has a cap (CAP below), and the
# caps sum to 350 s (CAPS_SUM_S), at most 360 s (the script refuses to run otherwise).
#
# Usage: scripts/gpu-check.sh [--emulated] OUTPUT_FOLDER [path/to/kvbench]
#   (binary default: $KVBENCH_BIN, else target/dist/kvbench, else target/release/kvbench;
#    scripts/build-gpu-binary.sh builds target/dist/kvbench)
#
# Steps, in this order, each under `timeout -k` and its cap, all within one budget
# (KVBENCH_GPU_BUDGET_S, default 360 s); a step that fails or is skipped never stops the later ones:
#   doctor (compiles every program, loads them on the GPU, NVRTC vs driver) -> cuda-check
#   -> kernel-bench --backend cuda, its sliding-window case (Llama-3-8B heads, window 1024)
#      + the PyTorch SDPA peer
#   -> quick scenarios on cuda under --clock model, every sequence checked by the oracle, one
#      of them on tiny-sliding (sliding-window layers beside full ones)
#   -> the five planted faults under --clock model: each passes only when the run names it as
#      the cause ("planted fault `F` fired N times, caught: ..."), "did not fire" otherwise
#   -> compute-sanitizer memcheck and racecheck (where installed)
#   -> the Llama-3-8B chat scenario, last, sized to finish in 60 s.
# Results: OUTPUT_FOLDER/gpu-check.tar.gz (every log, CSV and result folder) and
# OUTPUT_FOLDER/summary.md (the step table and the figures). Both are rewritten after every step
# (each written aside and renamed into place), so a kill at any point, SIGKILL included, leaves a
# valid archive and summary of the steps done. Unpack here with
#   mkdir -p results/gpu && tar -xzf OUTPUT_FOLDER/gpu-check.tar.gz -C results/gpu
# NVRTC compiles each program once for the whole check: the compiled kernels are kept in
# OUTPUT_FOLDER/kernel-cache while it runs, removed at the end.
#
# --emulated runs the same steps on `--backend cuda-emu` (the emulated device, no GPU needed),
# scaled down (fewer requests, a small kernel-bench grid, no module compile in doctor) and with
# every cap and the budget 4 times the GPU's (a debug build on a small shared CPU); the SDPA peer, compute-sanitizer and the 8B run are skipped with the
# reason in the summary. Each scenario and fault step also runs with the emulated driver's noise
# (--emu-driver-noise), so reclamation is shown to hold while cuMemGetInfo moves.
#
# Exit: 0 every step passed; 1 a step failed; 2 bad usage, no binary, or caps over 360 s.
set -uo pipefail

MODE=gpu
if [ "${1:-}" = "--emulated" ]; then MODE=emulated; shift; fi
if [ $# -lt 1 ] || [ -z "$1" ]; then
  echo "usage: scripts/gpu-check.sh [--emulated] OUTPUT_FOLDER [path/to/kvbench]" >&2
  exit 2
fi
mkdir -p "$1" || { echo "gpu-check: cannot create $1" >&2; exit 2; }
OUTDIR=$(cd "$1" && pwd)
DEFAULT_BIN=target/release/kvbench
[ -x "$(dirname "$0")/../target/dist/kvbench" ] && DEFAULT_BIN=target/dist/kvbench
BIN_ARG="${2:-${KVBENCH_BIN:-$DEFAULT_BIN}}"
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

# Each step's cap, seconds. Their sum is stated (CAPS_SUM_S) and checked here; at most 360 s, so
# that two checks and two machine start-ups fit one 15-minute device window.
declare -A CAP=(
  [doctor]=35 [cuda_check]=30 [kernel_bench]=35 [kernel_bench_window]=15 [peer_sdpa]=25
  [e2e_quick_basic]=12 [e2e_quick_mixed]=12 [e2e_quick_mixed_async]=12 [e2e_conversation_quick]=12
  [e2e_tiny_sliding]=12
  [fault_skip-cow]=10 [fault_early-reuse]=10 [fault_leak]=10 [fault_bad-block-table]=10
  [fault_device-leak]=10 [memcheck]=20 [racecheck]=20 [e2e_chat_8b]=60
)
CAPS_SUM_S=350
sum=0; for k in "${!CAP[@]}"; do sum=$(( sum + CAP[$k] )); done
if [ "$sum" -ne "$CAPS_SUM_S" ] || [ "$sum" -gt 360 ]; then
  echo "gpu-check: step caps sum to ${sum}s (stated ${CAPS_SUM_S}s; at most 360s)" >&2
  exit 2
fi

# Emulated, every cap and the budget are scaled by EMU_SCALE: the same steps run a debug build on
# the host CPU (measured on 2 shared cores: docs/gpu.md).
EMU_SCALE=1
[ "$MODE" = emulated ] && EMU_SCALE=4
for k in "${!CAP[@]}"; do CAP[$k]=$(( CAP[$k] * EMU_SCALE )); done

START=$(date +%s)
BUDGET="${KVBENCH_GPU_BUDGET_S:-$(( 360 * EMU_SCALE ))}"
RESERVE=5                       # kept for the last summary and archive
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
# kvbench's own steps load every kernel at context creation, not at first launch (lazy loading
# would take device memory in the middle of a run); the PyTorch peer keeps its own default.
KV=(env CUDA_MODULE_LOADING=EAGER "$BIN")
export LD_LIBRARY_PATH="${LIBDIRS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

FAILED=0
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$STEPS"; }  # name verdict rc want s note
skip() { record "$1" skipped - - 0 "$2"; echo "== $1: skipped ($2)"; }

# KVBENCH_GPU_CHECK_ONLY=name,name,... runs only those steps (the others are listed as not
# selected): for a quick look at one step, and for the test that runs the emulated check in CI.
selected() { [ -z "${KVBENCH_GPU_CHECK_ONLY:-}" ] || [[ ",$KVBENCH_GPU_CHECK_ONLY," == *",$1,"* ]]; }

# step NAME WANT_RC NOTE -- command...   (passes when the command exits WANT_RC; a fault step
# also needs the run's own line naming its planted fault as the cause). Its cap is CAP[NAME].
step() {
  local name=$1 want=$2 note=$3; shift 4
  local limit=${CAP[$name]:?no cap for step $name}
  if ! selected "$name"; then
    skip "$name" "not selected (KVBENCH_GPU_CHECK_ONLY)"
    return 0
  fi
  local left=$(( BUDGET - RESERVE - $(elapsed) ))
  if [ "$left" -lt 5 ]; then
    skip "$name" "budget of ${BUDGET}s spent"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s)"
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  local verdict=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    verdict=FAILED; note="timed out after ${limit}s${note:+; $note}"
  elif [[ "$name" == fault_* ]]; then
    local f=${name#fault_} line
    line=$(grep -m1 -F -e "planted fault \`$f\` fired" -e "planted fault \`$f\` did not fire" \
      "$WORK/$name.log" | tr '\t|' '  ' | cut -c1-200)
    if [ "$rc" -eq "$want" ] && [[ "$line" == *"fired"*"caught: "* ]]; then
      note="caught: ${line#*caught: }"
    elif [[ "$line" == *"did not fire"* ]]; then
      verdict=FAILED; note="did not fire"
    else
      verdict=FAILED
      note="exit $rc without the planted fault named as the cause${line:+: $line}"
    fi
  elif [ "$rc" -ne "$want" ]; then
    verdict=FAILED
  fi
  if [ "$verdict" = FAILED ]; then
    FAILED=1
    if [[ "$name" != fault_* ]]; then
      local last
      last=$(grep -v '^[[:space:]]*$' "$WORK/$name.log" | tail -n 1 | tr '\t|' '  ' | cut -c1-160)
      [ -n "$last" ] && note="${note:+$note; }$last"
    fi
    echo "--- $name failed (exit $rc, wanted $want); tail of its log:"
    tail -n 15 "$WORK/$name.log"
  fi
  record "$name" "$verdict" "$rc" "$want" "$dt" "$note"
  save
  return 0
}

# A subcommand that takes `--backend cuda-emu` (older binaries run some steps on a GPU only).
takes_emu() { "$BIN" "$1" --help 2>/dev/null | grep -q -- cuda-emu; }

write_summary_to() {
  local total; total=$(elapsed)
  local n_ok n_failed n_skipped
  n_ok=$(awk -F'\t' '$2=="ok"' "$STEPS" | wc -l)
  n_failed=$(awk -F'\t' '$2=="FAILED"' "$STEPS" | wc -l)
  n_skipped=$(awk -F'\t' '$2=="skipped"' "$STEPS" | wc -l)
  {
    echo "# kvbench GPU check: $TITLE"
    echo
    echo "- date (UTC): $(date -u +%FT%TZ); total ${total}s of a ${BUDGET}s budget (step caps sum to ${CAPS_SUM_S}s)"
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
  } > "$1"
}

# The archive and the summary as of now, each written aside and renamed into place: a kill at any
# moment leaves the previous complete pair.
save() {
  write_summary_to "$OUTDIR/.summary.md.tmp" && cp "$OUTDIR/.summary.md.tmp" "$WORK/summary.md" \
    && mv -f "$OUTDIR/.summary.md.tmp" "$SUMMARY"
  tar -czf "$OUTDIR/.gpu-check.tar.gz.tmp" -C "$WORK" . 2>/dev/null \
    && mv -f "$OUTDIR/.gpu-check.tar.gz.tmp" "$ARCHIVE"
}

# At the end (also on TERM/INT): the last save, then only the archive and summary.md stay.
PACKED=0
pack() {
  [ "$PACKED" = 1 ] && return
  PACKED=1
  save
  if [ -s "$ARCHIVE" ]; then
    rm -rf "$WORK" "$KVBENCH_KERNEL_CACHE"
  else
    echo "gpu-check: packing failed; the results stay in $WORK" >&2
  fi
}
trap pack EXIT
trap 'exit 143' TERM INT
save

echo "gpu-check ($MODE): binary $BIN, output $OUTDIR, library folders: ${LIBDIRS:-none found}"

# Scenario and fault steps: --clock model, so the schedule (and so the preemptions a fault needs)
# is the emulator's on any device. Emulated: fewer requests (REQ N sets them; nothing on a GPU)
# and the emulated driver's noise.
if [ "$MODE" = emulated ]; then
  NOISE=(--emu-driver-noise 1)
  REQ() { echo "--set traffic.requests=$1"; }
else
  NOISE=()
  REQ() { :; }
fi
E2E="$WORK/e2e"
scenario() {  # scenario STEP FILE OUT NOTE [extra flags...]
  local name=$1 file=$2 out=$3 note=$4; shift 4
  step "$name" 0 "$note" -- "${KV[@]}" run "$file" --backend "$BACKEND" --clock model \
    "${NOISE[@]}" "$@" --out "$E2E/$out" --force
}

# 1. doctor
if [ "$MODE" = emulated ]; then
  # The emulated device runs the kernels' host build, not NVRTC's output; compiling every program
  # (about 30 s of CPU, minutes on a loaded 2-core machine) is the NVRTC compile test's job.
  step doctor 0 "" -- "${KV[@]}" doctor --no-compile
else
  step doctor 0 "compiles and loads every program; NVRTC vs driver" -- "${KV[@]}" doctor \
    --require driver,nvrtc,gpu
fi

# 2. cuda-check
if [ "$MODE" = emulated ]; then
  if takes_emu cuda-check; then
    step cuda_check 0 "quick grid" -- "${KV[@]}" cuda-check --backend cuda-emu --quick --out "$WORK"
  else
    skip cuda_check "this kvbench runs cuda-check on a GPU only (no --backend cuda-emu)"
  fi
else
  step cuda_check 0 "" -- "${KV[@]}" cuda-check --out "$WORK"
fi

# 3. kernel-bench and the SDPA peer
if [ "$MODE" = emulated ]; then
  if takes_emu kernel-bench; then
    step kernel_bench 0 "K/V bytes read beside the ideal (the emulator times nothing); small grid" -- "${KV[@]}" kernel-bench --backend cuda-emu \
      --model llama3-8b --dtype bf16 --batch 1 --context 128 --block-size 16 --max-gib 1 --out "$WORK"
  else
    skip kernel_bench "this kvbench's kernel-bench has no --backend cuda-emu"
  fi
  if "$BIN" kernel-bench --help 2>/dev/null | grep -q -- --window && takes_emu kernel-bench; then
    step kernel_bench_window 0 "sliding window 64: K/V bytes read beside the window's" -- \
      "${KV[@]}" kernel-bench --backend cuda-emu --model llama3-8b --dtype bf16 --batch 1 \
      --context 256 --block-size 16 --window 64 --max-gib 1 --out "$WORK/window"
  else
    skip kernel_bench_window "this kvbench's kernel-bench has no --window on cuda-emu"
  fi
  skip peer_sdpa "the PyTorch SDPA peer needs a GPU"
else
  step kernel_bench 0 "" -- "${KV[@]}" kernel-bench --backend cuda --model llama3-8b --dtype bf16 \
    --batch 1,16,64 --context 512,2048,8192 --block-size 16 --max-gib 8 --out "$WORK"
  # A sliding layer of Llama-3-8B's heads (Gemma 3's 1024-token window): decode reads the
  # window only, so its GB/s are over the window's bytes (kernel_bench.csv, window_tokens).
  step kernel_bench_window 0 "window 1024 over 8192-token contexts" -- "${KV[@]}" kernel-bench \
    --backend cuda --model llama3-8b --dtype bf16 --batch 1,16,64 --context 8192 \
    --block-size 16 --window 1024 --max-gib 8 --out "$WORK/window"
  step peer_sdpa 0 "" -- python3 scripts/sdpa_peer.py --batch 1,16,64 --context 512,2048,8192 \
    --q-heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --out "$WORK/peer_sdpa.csv"
fi

# 4. quick scenarios with the oracle on every sequence
# shellcheck disable=SC2046  # REQ's words are flags
scenario e2e_quick_basic scenarios/quick-basic.toml quick-basic "" $(REQ 8)
# shellcheck disable=SC2046
scenario e2e_quick_mixed scenarios/quick-mixed.toml quick-mixed "" $(REQ 8)
# shellcheck disable=SC2046
scenario e2e_quick_mixed_async scenarios/quick-mixed.toml quick-mixed-async "async steps" \
  --set scheduler.async_steps=true $(REQ 8)
# shellcheck disable=SC2046
scenario e2e_conversation_quick scenarios/conversation-quick.toml conversation-quick "" $(REQ 4)
# shellcheck disable=SC2046
scenario e2e_tiny_sliding scenarios/quick-basic.toml quick-basic-tiny-sliding \
  "two sliding layers of window 12 beside two full ones" --set model.preset=tiny-sliding $(REQ 6)

# 5. the planted faults: each must be caught, and named as the cause by the run itself. Each gets
# what it needs to fire: forks sharing partly filled blocks (skip-cow), releases while a step is
# in flight (early-reuse: asynchronous steps).
for f in skip-cow early-reuse leak bad-block-table device-leak; do
  case $f in
    skip-cow) extra=($(REQ 14)) ;;
    early-reuse) extra=(--set scheduler.async_steps=true $(REQ 20)) ;;
    *) extra=($(REQ 8)) ;;
  esac
  step "fault_$f" 1 "" -- "${KV[@]}" run scenarios/quick-mixed.toml --backend "$BACKEND" \
    --clock model "${NOISE[@]}" "${extra[@]}" --inject-fault "$f" --out "$E2E/fault-$f" --force
done

# 6. sanitizers
if [ "$MODE" = emulated ]; then
  skip compute_sanitizer "for a GPU; the emulated device checks every access and copy in the steps above"
else
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ -n "$SAN" ]; then
    step memcheck 0 "" -- env CUDA_MODULE_LOADING=EAGER "$SAN" --tool memcheck --error-exitcode 1 \
      "$BIN" cuda-check --quick
    step racecheck 0 "" -- env CUDA_MODULE_LOADING=EAGER "$SAN" --tool racecheck --error-exitcode 1 \
      "$BIN" cuda-check --quick
  else
    skip compute_sanitizer "compute-sanitizer not installed"
  fi
fi

# 7. the Llama-3-8B chat scenario, last, on the measured clock (its figures are the GPU's): 48
# requests with outputs cut to a median of 32 tokens, sized to finish within its 60 s cap.
if [ "$MODE" = emulated ]; then
  skip e2e_chat_8b "an 8B model is far too slow on the emulated device"
else
  step e2e_chat_8b 0 "48 requests, paged and contiguous" -- "${KV[@]}" run \
    scenarios/chat-8b-h200.toml --backend cuda --trace-level requests --set traffic.requests=48 \
    --set traffic.output_tokens.median=32 --set traffic.output_tokens.max=64 \
    --set scheduler.max_tokens_per_step=2048 --out "$E2E/chat-8b-48" --force
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
