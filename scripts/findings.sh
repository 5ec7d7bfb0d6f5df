#!/usr/bin/env bash
# The essay's claims as a scenario library with findings: runs every experiment on `sim` (and
# `cpu` with the model clock where the tiny model fits), writes each run into OUT, and derives
# OUT/findings.md (and findings.json) from the runs' files with scripts/findings_extract.py —
# every figure is read from summary.json, sweep.json, requests.csv, memory.csv, plan JSON or
# isolation.json, never typed in.
#
#   scripts/findings.sh OUT [--quick]
#
# OUT must not exist (or be empty). --quick uses reduced request counts and seeds (for CI).
# The binary is $KVBENCH (default target/debug/kvbench, relative to the repository root).
# docs/findings.md is a copy of a full run's OUT/findings.md: regenerate it with this script.
set -euo pipefail

usage() { echo "usage: scripts/findings.sh OUT [--quick]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
OUT_ARG=$1
QUICK=0
if [ $# -eq 2 ]; then
  [ "$2" = "--quick" ] || usage
  QUICK=1
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
KVBENCH=${KVBENCH:-target/debug/kvbench}
[ -x "$KVBENCH" ] || { echo "findings.sh: no kvbench binary at $KVBENCH (set KVBENCH)" >&2; exit 2; }
if [ -e "$OUT_ARG" ] && [ -n "$(ls -A "$OUT_ARG" 2>/dev/null)" ]; then
  echo "findings.sh: $OUT_ARG exists and is not empty" >&2; exit 2
fi
mkdir -p "$OUT_ARG"
OUT=$(cd "$OUT_ARG" && pwd)
mkdir -p "$OUT/plan" "$OUT/runs" "$OUT/sweep" "$OUT/logs"

if [ "$QUICK" = 1 ]; then
  RUN_REQUESTS=100; SWEEP_REQUESTS=150; RUN_SEEDS="1 2"; SWEEP_SEEDS=2; BLOCK_SEEDS=1
  PROBES=40; CPU_REQUESTS=24; FORK_REQUESTS=40; CONV_REQUESTS=16; NOPAY_REQUESTS=100
else
  RUN_REQUESTS=1000; SWEEP_REQUESTS=400; RUN_SEEDS="1 2 3"; SWEEP_SEEDS=3; BLOCK_SEEDS=2
  PROBES=100; CPU_REQUESTS=48; FORK_REQUESTS=80; CONV_REQUESTS=60; NOPAY_REQUESTS=400
fi
printf '{"quick": %s, "run_requests": %s, "sweep_requests": %s, "run_seeds": [%s], "sweep_seeds": %s, "block_seeds": %s, "probes": %s, "cpu_requests": %s, "fork_requests": %s, "conv_requests": %s, "nopay_requests": %s}\n' \
  "$([ "$QUICK" = 1 ] && echo true || echo false)" "$RUN_REQUESTS" "$SWEEP_REQUESTS" \
  "$(echo $RUN_SEEDS | sed 's/ /, /g')" "$SWEEP_SEEDS" "$BLOCK_SEEDS" "$PROBES" "$CPU_REQUESTS" \
  "$FORK_REQUESTS" "$CONV_REQUESTS" "$NOPAY_REQUESTS" > "$OUT/params.json"

# Every command goes into commands.tsv (LABEL <tab> the command as anyone would type it: `kvbench`
# for the binary, OUT for the output folder), then runs with its output in logs/LABEL.log.
: > "$OUT/commands.tsv"
kv() {
  local label=$1; shift
  local shown="kvbench"
  for a in "$@"; do
    a=${a//$OUT/OUT}
    case $a in
      *[\ \"\'{}]*) shown+=" '$a'" ;;
      *) shown+=" $a" ;;
    esac
  done
  printf '%s\t%s\n' "$label" "$shown" >> "$OUT/commands.tsv"
  if ! "$KVBENCH" "$@" > "$OUT/logs/$label.log" 2>&1; then
    echo "findings.sh: $label failed: $shown (see $OUT/logs/$label.log)" >&2
    tail -20 "$OUT/logs/$label.log" >&2
    exit 1
  fi
}
step() { echo "[findings] $*" >&2; }

CHAT=scenarios/chat-8b-h200.toml
RUN_COMMON=(--backend sim --trace-level requests --check-every 64)

# 1. Bytes per token before the batch: three model shapes, a 4096-token sequence, 80 GiB of KV.
step "plan: three shapes"
for preset in llama3-8b llama3-70b llama3-405b; do
  "$KVBENCH" plan --preset "$preset" --tokens 4096 --budget "80 GiB" --json > "$OUT/plan/shape-$preset.json"
  printf '%s\t%s\n' "plan-$preset" "kvbench plan --preset $preset --tokens 4096 --budget '80 GiB' --json" >> "$OUT/commands.tsv"
done

# 2. Block size against the shipped traces' length distributions (tail waste), and the rate at
#    target per block size on the chat scenario (lognormal lengths).
step "block size: trace tail waste and rate at target"
for trace in azure burstgpt csv mooncake; do
  for b in 8 16 32 64; do
    "$KVBENCH" plan --scenario "scenarios/trace-$trace.toml" --block-size "$b" --json > "$OUT/plan/trace-$trace-b$b.json"
    printf '%s\t%s\n' "waste-$trace-b$b" "kvbench plan --scenario scenarios/trace-$trace.toml --block-size $b --json" >> "$OUT/commands.tsv"
  done
done
for b in 8 16 32 64; do
  kv "sweep-block-b$b" sweep "$CHAT" --backend sim --seeds "$BLOCK_SEEDS" --set "traffic.requests=$SWEEP_REQUESTS" \
    --set "cache.block_size=$b" --out "$OUT/sweep/block-b$b"
done
# tune's choice: only where this build has `kvbench tune`.
if "$KVBENCH" tune --help > /dev/null 2>&1; then
  step "tune (present in this build)"
  TUNE_ARGS=(tune "$CHAT" --backend sim --out "$OUT/tune")
  [ "$QUICK" = 1 ] && TUNE_ARGS+=(--budget-s 30 --set "traffic.requests=$SWEEP_REQUESTS")
  printf '%s\t%s\n' tune "kvbench ${TUNE_ARGS[*]//$OUT/OUT}" >> "$OUT/commands.tsv"
  if ! "$KVBENCH" "${TUNE_ARGS[@]}" > "$OUT/logs/tune.log" 2>&1; then
    echo "findings.sh: tune failed (logs/tune.log); its choice is left out" >&2
  fi
fi

# 3. Shared prefixes and copy-on-write: shared system prompts with the prefix cache on and off,
#    parallel sampling (run and sweep), forks after cancellation on cpu with the oracle check.
step "shared prefixes and copy-on-write"
for seed in $RUN_SEEDS; do
  kv "prefix-on-s$seed" run scenarios/shared-prompts-8b-h200.toml "${RUN_COMMON[@]}" --seed "$seed" \
    --set "traffic.requests=$RUN_REQUESTS" --out "$OUT/runs/prefix-on-s$seed"
  kv "prefix-off-s$seed" run scenarios/shared-prompts-8b-h200.toml "${RUN_COMMON[@]}" --seed "$seed" \
    --set "traffic.requests=$RUN_REQUESTS" --set scheduler.prefix_cache=false --out "$OUT/runs/prefix-off-s$seed"
  kv "sampling-n4-s$seed" run scenarios/parallel-sampling-8b-h200.toml "${RUN_COMMON[@]}" --seed "$seed" \
    --set "traffic.requests=$RUN_REQUESTS" --out "$OUT/runs/sampling-n4-s$seed"
done
kv sweep-sampling sweep scenarios/parallel-sampling-8b-h200.toml --backend sim --seeds "$SWEEP_SEEDS" \
  --set "traffic.requests=$SWEEP_REQUESTS" --out "$OUT/sweep/sampling"
kv forks-cpu-s1 run scenarios/quick-mixed.toml --backend cpu --clock model --trace-level requests \
  --set "traffic.requests=$FORK_REQUESTS" --out "$OUT/runs/forks-cpu-s1"

# 4. Capacity is a constraint, not the objective: chunked prefill (tokens per step) and the
#    admission reserve (watermark) against TTFT and ITL separately. The reserve is measured with a
#    4 GiB KV budget, where memory (not compute) binds.
step "chunked prefill and reserve"
for seed in $RUN_SEEDS; do
  for c in 512 2048 8192; do
    kv "chunk-c$c-s$seed" run "$CHAT" "${RUN_COMMON[@]}" --seed "$seed" --set "traffic.requests=$RUN_REQUESTS" \
      --set "scheduler.max_tokens_per_step=$c" --out "$OUT/runs/chunk-c$c-s$seed"
  done
  for w in 1 10 30; do
    kv "reserve-w$w-s$seed" run "$CHAT" "${RUN_COMMON[@]}" --seed "$seed" --set "traffic.requests=$RUN_REQUESTS" \
      --set 'memory.kv_budget=4 GiB' --set "scheduler.watermark=0.$(printf '%02d' "$w")" --out "$OUT/runs/reserve-w$w-s$seed"
  done
done

# 5. Resident state vs workspace: the ledger by category under a wide and a narrow batch shape.
step "ledger under two batch shapes"
kv ledger-wide-s1 run "$CHAT" "${RUN_COMMON[@]}" --set "traffic.requests=$RUN_REQUESTS" \
  --set scheduler.max_seqs_per_step=256 --set scheduler.max_tokens_per_step=8192 --out "$OUT/runs/ledger-wide-s1"
kv ledger-narrow-s1 run "$CHAT" "${RUN_COMMON[@]}" --set "traffic.requests=$RUN_REQUESTS" \
  --set scheduler.max_seqs_per_step=16 --set scheduler.max_tokens_per_step=512 --out "$OUT/runs/ledger-narrow-s1"

# 6. Eviction and reuse move costs elsewhere. "No tier" is the scenario file with its
#    [cache.host_tier] and [cache.disk_tier] tables removed (written into OUT/scenarios; a
#    trace's relative path made absolute so the copy still finds it). Chat sessions that overflow
#    a 2 GiB device cache, without a tier and with a host tier at two capacities; the Mooncake
#    sample's device cache under three eviction policies (its bounds: the offline optimum and
#    the ceiling at the same blocks) and with its lower tiers; the tier that does not pay.
step "lower tiers: eviction and reuse"
mkdir -p "$OUT/scenarios"
no_tier() {
  awk -v root="$ROOT/scenarios/" 'BEGIN { skip = 0 }
    /^\[/ { skip = ($0 ~ /^\[cache\.(host|disk)_tier\]/) }
    !skip { if ($0 ~ /^path = "/ && $0 !~ /^path = "\//) sub(/^path = "/, "path = \"" root); print }' "$1" > "$2"
}
CONV=scenarios/conversation-tiered-8b-h200.toml
MOON=scenarios/trace-mooncake-tiered.toml
NOPAY=scenarios/tier-no-pay-8b.toml
no_tier "$CONV" "$OUT/scenarios/conversation-no-tier.toml"
no_tier "$MOON" "$OUT/scenarios/mooncake-no-tier.toml"
no_tier "$NOPAY" "$OUT/scenarios/no-pay-no-tier.toml"
for seed in $RUN_SEEDS; do
  kv "conv-none-s$seed" run "$OUT/scenarios/conversation-no-tier.toml" "${RUN_COMMON[@]}" --seed "$seed" \
    --set "traffic.requests=$CONV_REQUESTS" --out "$OUT/runs/conv-none-s$seed"
  for cap in 4 16; do
    kv "conv-h${cap}g-s$seed" run "$CONV" "${RUN_COMMON[@]}" --seed "$seed" --set "traffic.requests=$CONV_REQUESTS" \
      --set "cache.host_tier.capacity=$cap GiB" --out "$OUT/runs/conv-h${cap}g-s$seed"
  done
  kv "nopay-none-s$seed" run "$OUT/scenarios/no-pay-no-tier.toml" "${RUN_COMMON[@]}" --seed "$seed" \
    --set "traffic.requests=$NOPAY_REQUESTS" --out "$OUT/runs/nopay-none-s$seed"
  kv "nopay-h4g-s$seed" run "$NOPAY" "${RUN_COMMON[@]}" --seed "$seed" --set "traffic.requests=$NOPAY_REQUESTS" \
    --set 'cache.host_tier.capacity=4 GiB' --out "$OUT/runs/nopay-h4g-s$seed"
done
# The trace replays the same ten rows whatever the seed: one run each.
for ev in lru lfu priority; do
  kv "moon-$ev-s1" run "$OUT/scenarios/mooncake-no-tier.toml" "${RUN_COMMON[@]}" --set "cache.eviction=$ev" \
    --out "$OUT/runs/moon-$ev-s1"
done
for cap in 16 256; do
  kv "moon-h${cap}m-s1" run "$MOON" "${RUN_COMMON[@]}" --set "cache.host_tier.capacity=$cap MiB" \
    --out "$OUT/runs/moon-h${cap}m-s1"
done

# 7. The isolation boundary: AUC per scope x background load x measurement noise.
step "isolation"
kv isolation isolation "$CHAT" --backend sim --probes "$PROBES" --load 0,16 --noise-ms 0,20,200 --out "$OUT/isolation"
#    With a host tier a hit comes in two classes (on the device, or pushed to host memory and
#    onloaded): the prober's filler traffic pushes the victim's prefix to the host between its
#    early and late probe slots.
kv isolation-tier isolation scenarios/conversation-tiered-8b-h200.toml --backend sim --probes "$PROBES" \
  --load 0,4 --noise-ms 0,5 --out "$OUT/isolation-tier"

# 8. When the machinery is not worth it: one short request on an idle device; uniform short
#    lengths; a contiguous reservation sized by prompt + output; and chat as it ships, for contrast.
step "when paging is not worth it"
for seed in $RUN_SEEDS; do
  kv "idle-sim-s$seed" run "$CHAT" "${RUN_COMMON[@]}" --seed "$seed" --set traffic.requests=1 \
    --set 'traffic.prompt_tokens={dist="uniform",min=32,max=128}' --out "$OUT/runs/idle-sim-s$seed"
  kv "idle-cpu-s$seed" run scenarios/quick-basic.toml --backend cpu --clock model --trace-level requests \
    --seed "$seed" --set traffic.requests=1 --out "$OUT/runs/idle-cpu-s$seed"
done
UNIFORM=(--set 'traffic.prompt_tokens={dist="uniform",min=32,max=64}'
         --set 'traffic.output_tokens={dist="uniform",min=16,max=32}' --set cache.max_seq_len=128)
kv sweep-uniform sweep "$CHAT" --backend sim --seeds "$SWEEP_SEEDS" --set "traffic.requests=$SWEEP_REQUESTS" \
  "${UNIFORM[@]}" --out "$OUT/sweep/uniform"
kv sweep-exact sweep "$CHAT" --backend sim --seeds "$SWEEP_SEEDS" --set "traffic.requests=$SWEEP_REQUESTS" \
  --set cache.contiguous_reservation=prompt_plus_output --out "$OUT/sweep/exact"
kv sweep-maxlen sweep "$CHAT" --backend sim --seeds "$SWEEP_SEEDS" --set "traffic.requests=$SWEEP_REQUESTS" \
  --out "$OUT/sweep/maxlen"
kv cpuuniform-basic-s1 run scenarios/quick-basic.toml --backend cpu --clock model --trace-level requests \
  --set "traffic.requests=$CPU_REQUESTS" --out "$OUT/runs/cpuuniform-basic-s1"

step "extracting findings"
python3 scripts/findings_extract.py "$OUT"
echo "wrote $OUT/findings.md"
