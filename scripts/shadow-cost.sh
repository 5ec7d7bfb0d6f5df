#!/usr/bin/env bash
# The shadow payload's cost on `sim`, as instruction counts: every scenario run with the shadow and
# with `--no-shadow`, back to back, by each of two builds of kvbench (the previous shadow and this
# one), in one pass. Instruction counts (callgrind) repeat exactly on a loaded machine; wall times
# do not (their CPU-time twin, in alternating pairs, is scripts/shadow-time.sh).
#
#   scripts/shadow-cost.sh [--cache-sim] BEFORE_BIN NOW_BIN [SCENARIO...]
#
# BEFORE_BIN and NOW_BIN are release builds (`cargo build --release`, copied aside); BEFORE_BIN
# `-` measures NOW_BIN alone. With no scenario named, every shipped scenario is measured. Prints a
# Markdown table: scenario, with/without before, with/without now, instructions with and without
# (now).
#
# With `--cache-sim`, callgrind also simulates the caches (`--cache-sim=yes --D1=32768,8,64
# --LL=1048576,8,64`: this machine's 32 KiB L1 data cache and 1 MiB L2 as the last level; the
# counts repeat exactly, like the instructions) and the table gains, per build, the ratio of an
# estimate of cycles: Ir + 10 × (D1mr + D1mw) + 100 × (DLmr + DLmw) — an instruction a cycle, an
# L1 miss served by the last level 10 more, a last-level miss 100 more. Misses cost more than
# instructions on this machine: the shadow's extra time follows the estimate, not the count.
set -euo pipefail

sim=0
if [ "${1:-}" = --cache-sim ]; then
    sim=1
    shift
fi
if [ $# -lt 2 ]; then
    echo "usage: $0 [--cache-sim] BEFORE_BIN NOW_BIN [SCENARIO...]" >&2
    exit 2
fi
before=$1
now=$2
shift 2
for b in "$before" "$now"; do
    if [ "$b" != - ] && [ ! -x "$b" ]; then
        echo "$0: $b: not an executable" >&2
        exit 2
    fi
done
# shellcheck source=scripts/shadow-requests.sh
. "$(dirname "$0")/shadow-requests.sh"
if [ $# -gt 0 ]; then
    scenarios=("$@")
else
    mapfile -t scenarios < <(shadow_scenarios)
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Instructions the kvbench process itself executed (its children, e.g. `git`, are not counted),
# then, with `--cache-sim`, the cycle estimate: "IR ESTIMATE" ("fail" if the run failed).
count() {
    local bin=$1 scenario=$2 n=$3
    shift 3
    local set=()
    if [ -n "$n" ]; then
        set=(--set "traffic.requests=$n")
    fi
    local cache=()
    if [ "$sim" = 1 ]; then
        cache=(--cache-sim=yes --D1=32768,8,64 --LL=1048576,8,64)
    fi
    taskset -c 0 valgrind --tool=callgrind "${cache[@]}" --callgrind-out-file="$tmp/cg.%p" \
        "$bin" run "scenarios/$scenario.toml" --backend sim "${set[@]}" --check-every 0 \
        --trace-level requests "$@" --out "$tmp/out" --force >"$tmp/log" 2>&1 &
    local pid=$!
    if ! wait "$pid"; then
        echo "$0: $scenario ($bin $*) failed:" >&2
        tail -3 "$tmp/log" >&2
        rm -f "$tmp"/cg.*
        echo fail
        return
    fi
    # The summary line's columns are named by the `events:` line (Ir first).
    awk '/^events:/ {for (i = 2; i <= NF; i++) col[$i] = i - 1}
        /^summary:/ {
            ir = $2
            if (!("D1mr" in col)) { print ir; next }
            d1 = $(col["D1mr"] + 1) + $(col["D1mw"] + 1)
            ll = $(col["DLmr"] + 1) + $(col["DLmw"] + 1)
            printf "%d %.0f\n", ir, ir + 10 * d1 + 100 * ll
        }' "$tmp/cg.$pid"
    rm -f "$tmp"/cg.*
}

# Ratio of the first (or, with K=2, the second) field of two counts.
ratio() {
    local k=${3:-1}
    case "$1$2" in
    *fail*) echo "—" ;;
    *) awk -v a="$1" -v b="$2" -v k="$k" 'BEGIN {
        split(a, x, " "); split(b, y, " "); printf "%.3f", x[k] / y[k] }' ;;
    esac
}
mega() {
    case $1 in
    fail) echo "—" ;;
    *) printf "%d M" $(((${1%% *} + 500000) / 1000000)) | sed -E ':a; s/([0-9])([0-9]{3})( |,)/\1,\2\3/; ta' ;;
    esac
}

if [ "$sim" = 1 ]; then
    echo "| scenario | with / without, before | with / without, now | cycle estimate with / without, before | cycle estimate with / without, now | instructions with, without (now) |"
    echo "|---|---|---|---|---|---|"
else
    echo "| scenario | with / without, before | with / without, now | instructions with, without (now) |"
    echo "|---|---|---|---|"
fi
for s in "${scenarios[@]}"; do
    n=$(shadow_requests "$s")
    if [ "$before" = - ]; then
        bw=fail bo=fail
    else
        bw=$(count "$before" "$s" "$n")
        bo=$(count "$before" "$s" "$n" --no-shadow)
    fi
    nw=$(count "$now" "$s" "$n")
    no=$(count "$now" "$s" "$n" --no-shadow)
    label="\`$s\`"
    if [ -n "$n" ]; then
        label="$label ($n requests)"
    fi
    if [ "$sim" = 1 ]; then
        echo "| $label | $(ratio "$bw" "$bo") | **$(ratio "$nw" "$no")** | $(ratio "$bw" "$bo" 2) | **$(ratio "$nw" "$no" 2)** | $(mega "$nw"), $(mega "$no") |"
    else
        echo "| $label | $(ratio "$bw" "$bo") | **$(ratio "$nw" "$no")** | $(mega "$nw"), $(mega "$no") |"
    fi
done
