#!/usr/bin/env bash
# The shadow payload's cost on `sim`, as instruction counts: every scenario run with the shadow and
# with `--no-shadow`, back to back, by each of two builds of kvbench (the previous shadow and this
# one), in one pass. Instruction counts (callgrind) repeat exactly on a loaded machine; wall times
# do not (their CPU-time twin, in alternating pairs, is scripts/shadow-time.sh).
#
#   scripts/shadow-cost.sh BEFORE_BIN NOW_BIN [SCENARIO...]
#
# BEFORE_BIN and NOW_BIN are release builds (`cargo build --release`, copied aside); BEFORE_BIN
# `-` measures NOW_BIN alone. With no scenario named, every shipped scenario is measured. Prints a
# Markdown table: scenario, with/without before, with/without now, instructions with and without
# (now).
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: $0 BEFORE_BIN NOW_BIN [SCENARIO...]" >&2
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

# Instructions the kvbench process itself executed (its children, e.g. `git`, are not counted).
count() {
    local bin=$1 scenario=$2 n=$3
    shift 3
    local set=()
    if [ -n "$n" ]; then
        set=(--set "traffic.requests=$n")
    fi
    taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.%p" \
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
    awk '/^summary:/ {print $2}' "$tmp/cg.$pid"
    rm -f "$tmp"/cg.*
}

ratio() {
    case "$1$2" in
    *fail*) echo "—" ;;
    *) awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}' ;;
    esac
}
mega() {
    case $1 in
    fail) echo "—" ;;
    *) printf "%d M" $((($1 + 500000) / 1000000)) | sed -E ':a; s/([0-9])([0-9]{3})( |,)/\1,\2\3/; ta' ;;
    esac
}

echo "| scenario | with / without, before | with / without, now | instructions with, without (now) |"
echo "|---|---|---|---|"
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
    echo "| $label | $(ratio "$bw" "$bo") | **$(ratio "$nw" "$no")** | $(mega "$nw"), $(mega "$no") |"
done
