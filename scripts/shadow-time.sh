#!/usr/bin/env bash
# The shadow payload's cost on `sim` in CPU time (user + system), the twin of
# scripts/shadow-cost.sh's instruction counts: each scenario run with the shadow and with
# `--no-shadow` in alternating pairs — the order swapped every pair, and with two builds the two
# builds' pairs interleaved and swapped too — so that load from other work on the machine falls
# on both sides alike. A pair's ratio is with / without; the table gives each build's median
# ratio over the pairs and their spread.
#
#   scripts/shadow-time.sh [-n PAIRS] [--whole] BEFORE_BIN NOW_BIN [SCENARIO...]
#
# BEFORE_BIN and NOW_BIN are release builds (`cargo build --release`, copied aside); BEFORE_BIN
# `-` measures NOW_BIN alone. PAIRS defaults to 21. Without `--whole` a scenario runs with the
# `traffic.requests` of scripts/shadow-requests.sh (the callgrind table's runs); with it, whole.
# With no scenario named, every shipped scenario is measured. Each run is
#
#   nice BIN run scenarios/SCENARIO.toml --backend sim [--set traffic.requests=N] \
#       --check-every 0 --trace-level requests [--no-shadow] --out DIR --force
#
# timed by the kernel's resource usage of the finished process (`wait4`, through python3: user +
# system time in microseconds, where /usr/bin/time counts in 10 ms and left the cut runs of a few
# tens of milliseconds in coarse steps). Prints a Markdown table and the load average before and
# after.
set -euo pipefail

pairs=21
whole=0
while [ $# -gt 0 ]; do
    case $1 in
    -n)
        pairs=${2:-}
        shift 2
        ;;
    --whole)
        whole=1
        shift
        ;;
    *) break ;;
    esac
done
if [ $# -lt 2 ] || ! [[ $pairs =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [-n PAIRS] [--whole] BEFORE_BIN NOW_BIN [SCENARIO...]" >&2
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
if ! command -v python3 >/dev/null; then
    echo "$0: python3: not found (it reads each run's CPU time from wait4)" >&2
    exit 2
fi
# shellcheck source=scripts/shadow-requests.sh
. "$(dirname "$0")/shadow-requests.sh"
if [ $# -gt 0 ]; then
    scenarios=("$@")
else
    mapfile -t scenarios < <(shadow_scenarios)
fi
builds=("$now")
if [ "$before" != - ]; then
    builds=("$before" "$now")
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Runs the command after FILE and writes "CPU_S WALL_S" into FILE: user + system time of the
# process (and the children it waited for, as GNU time counts), from wait4, in microseconds.
# Exits with the command's status.
rusage() {
    python3 -c '
import os, sys, time
out, cmd = sys.argv[1], sys.argv[2:]
t0 = time.monotonic()
pid = os.posix_spawnp(cmd[0], cmd, os.environ)
_, status, ru = os.wait4(pid, 0)
wall = time.monotonic() - t0
with open(out, "w") as f:
    f.write(f"{ru.ru_utime + ru.ru_stime:.6f} {wall:.6f}\n")
sys.exit(os.waitstatus_to_exitcode(status))
' "$@"
}

# One run; appends "CPU_S WALL_S" to FILE. Exits the script if the run fails: a failed run has no
# time worth comparing.
timed() {
    local file=$1 bin=$2 scenario=$3 n=$4
    shift 4
    local set=()
    if [ -n "$n" ]; then
        set=(--set "traffic.requests=$n")
    fi
    if ! rusage "$tmp/time" nice "$bin" run "scenarios/$scenario.toml" \
        --backend sim "${set[@]}" --check-every 0 --trace-level requests "$@" \
        --out "$tmp/out" --force >"$tmp/log" 2>&1; then
        echo "$0: $scenario ($bin $*) failed:" >&2
        tail -3 "$tmp/log" >&2
        exit 1
    fi
    cat "$tmp/time" >>"$file"
}

# Median, lowest and highest of the numbers on stdin, one a line: "MEDIAN LOW HIGH".
stats() {
    sort -g | awk '{v[NR] = $1} END {
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.3f %.3f %.3f\n", m, v[1], v[NR]
    }'
}

load() {
    cut -d' ' -f1-3 /proc/loadavg
}

echo "load average before: $(load)"
echo
echo "| scenario | build | pairs | CPU with / without, median (lowest–highest) | wall, median | CPU s with, without (medians) |"
echo "|---|---|---|---|---|---|"
for s in "${scenarios[@]}"; do
    n=""
    if [ "$whole" = 0 ]; then
        n=$(shadow_requests "$s")
    fi
    for ((b = 0; b < ${#builds[@]}; b++)); do
        : >"$tmp/with.$b"
        : >"$tmp/without.$b"
    done
    for ((i = 0; i < pairs; i++)); do
        for ((k = 0; k < ${#builds[@]}; k++)); do
            # Builds alternate which goes first, and each build's pair alternates its order.
            b=$(((k + i) % ${#builds[@]}))
            if [ $((i % 2)) = 0 ]; then
                timed "$tmp/with.$b" "${builds[$b]}" "$s" "$n"
                timed "$tmp/without.$b" "${builds[$b]}" "$s" "$n" --no-shadow
            else
                timed "$tmp/without.$b" "${builds[$b]}" "$s" "$n" --no-shadow
                timed "$tmp/with.$b" "${builds[$b]}" "$s" "$n"
            fi
        done
    done
    label="\`$s\`"
    if [ -n "$n" ]; then
        label="$label ($n requests)"
    fi
    for ((b = 0; b < ${#builds[@]}; b++)); do
        name=now
        if [ ${#builds[@]} = 2 ] && [ $b = 0 ]; then
            name=before
        fi
        read -r cpu lo hi < <(paste -d' ' "$tmp/with.$b" "$tmp/without.$b" |
            awk '{printf "%.6f\n", $1 / $3}' | stats)
        read -r wall _ _ < <(paste -d' ' "$tmp/with.$b" "$tmp/without.$b" |
            awk '{printf "%.6f\n", $2 / $4}' | stats)
        read -r cw _ _ < <(cut -d' ' -f1 "$tmp/with.$b" | stats)
        read -r co _ _ < <(cut -d' ' -f1 "$tmp/without.$b" | stats)
        echo "| $label | $name | $pairs | **$cpu** ($lo–$hi) | $wall | $cw, $co |"
    done
done
echo
echo "load average after: $(load)"
