#!/usr/bin/env python3
"""Reads the runs scripts/findings.sh wrote into OUT and writes OUT/findings.md and
OUT/findings.json. Every figure is read from a run's own files (plan JSON, summary.json,
sweep.json, requests.csv, memory.csv, isolation.json); none is typed in. Standard library only.

Figures are named `family.label.[mode.]metric`; findings.md lists each in a table row
`| `key` | value | interval |` so that tests/it/scripts/findings.rs can recompute every one of them
from the same files with its own code.

Intervals: where several seeds ran, a run figure is the mean over seeds with the [min, max] over
seeds; a sweep figure carries the sweep's own interval; an AUC its 95% interval (the hull of
Hanley-McNeil's and a Wilson score interval over the smaller class's count).

Rounding: a figure and its interval are printed to the decimal place of the interval's
half-width (its leading digit), so no printed digit is one the interval leaves to chance; a
figure with no interval, or with every seed agreeing, to three significant digits (integers
whole). findings.json keeps every figure at full precision, with the place it was printed at.
"""

import csv
import glob
import json
import math
import os
import sys

MIB = 1024.0 * 1024.0
GIB = 1024.0 * MIB


class Fig(str):
    """A figure as printed, carrying its full-precision value (for the direction words)."""

    def __new__(cls, text, value):
        obj = super().__new__(cls, text)
        obj.value = value
        return obj


class Findings:
    def __init__(self, out):
        self.out = out
        self.figs = []
        self.keys = set()

    def add(self, key, value, lo=None, hi=None):
        """Records the figure at full precision (findings.json) and returns it as printed:
        rounded to the place its interval supports (see `place`)."""
        if key in self.keys:
            raise SystemExit(f"findings_extract: figure {key} twice")
        self.keys.add(key)
        e = place(value, lo, hi)
        fig = {"key": key, "value": value, "lo": lo, "hi": hi}
        if e is not None:
            fig["printed_place"] = e
        self.figs.append(fig)
        return Fig(fmt_at(value, e), value)

    def ci(self, lo, hi, value):
        """An interval as printed beside its figure: both ends at the figure's place."""
        return fmt_ci(lo, hi, place(value, lo, hi))


# The most significant digits a figure is ever printed with; a figure with no interval (or one
# of zero width: every seed agreed) and not an integer is printed with 3.
MAX_DIGITS = 6
BARE_DIGITS = 3


def place(v, lo=None, hi=None):
    """The decimal place (a power of ten) a number is rounded to, or None for words and
    integers with no interval. With an interval of half-width h > 0: the place of h's leading
    digit, so the last printed digit is the first one the interval leaves uncertain. Without
    one: BARE_DIGITS significant digits (never rounding left of the point). Never more than
    MAX_DIGITS significant digits."""
    if isinstance(v, (str, bool)) or v is None or not math.isfinite(v):
        return None
    top = math.floor(math.log10(abs(v))) if v != 0 else 0
    h = (hi - lo) / 2.0 if lo is not None and hi is not None else 0.0
    if h > 0 and math.isfinite(h):
        e = math.floor(math.log10(h))
    elif float(v) == int(v) and abs(v) < 1e15:
        return None
    else:
        e = min(top - (BARE_DIGITS - 1), 0)
    return max(e, top - (MAX_DIGITS - 1))


def fmt_at(v, e):
    """`v` rounded to 10^e (e None: `fmt`)."""
    if e is None:
        return fmt(v)
    if e >= 0:
        return str(int(round(v / 10**e)) * 10**e)
    return f"{v:.{-e}f}"


def fmt(v):
    """Integers as integers; text as is; other numbers to MAX_DIGITS significant digits."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "none"
    if float(v) == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.{MAX_DIGITS}g}"


def fmt_ci(lo, hi, e=None):
    if lo is None or hi is None:
        return "—"
    if e is None:
        e = place(lo, lo, hi)
    return f"[{fmt_at(lo, e)}, {fmt_at(hi, e)}]"


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def mode_run(summary, mode):
    for r in summary["runs"]:
        if r["cache"] == mode:
            return r
    raise SystemExit(f"findings_extract: no {mode} run in a summary")


# A run figure's metric: where it is read from.
SUMMARY_METRICS = {
    "ttft_p50_ms": ("ttft_ms", "p50"),
    "ttft_p99_ms": ("ttft_ms", "p99"),
    "itl_p99_ms": ("itl_ms", "p99"),
    "throughput_tok_s": ("throughput_tokens_per_s",),
    "peak_running": ("peak_running_sequences",),
    "hit_rate": ("prefix_cache", "hit_rate"),
    "preemptions": ("preemptions",),
    "cancelled": ("requests", "cancelled"),
    "max_rel_err": ("numerics", "max_rel_err"),
}


def seed_dirs(out, family, label):
    dirs = sorted(glob.glob(os.path.join(out, "runs", f"{family}-{label}-s*")))
    if not dirs:
        raise SystemExit(f"findings_extract: no runs/{family}-{label}-s* folder")
    return dirs


def requests_ttft_ms(run_dir, mode):
    """Mean TTFT of the mode's completed requests, from requests.csv."""
    vals = []
    with open(os.path.join(run_dir, "requests.csv"), newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["cache"] == mode and row["status"] == "completed":
                vals.append(float(row["first_token_ms"]) - float(row["arrival_ms"]))
    if not vals:
        raise SystemExit(f"findings_extract: {run_dir}: no completed {mode} request")
    return sum(vals) / len(vals)


def memory_peak_mib(run_dir, mode, column):
    peak = None
    with open(os.path.join(run_dir, "memory.csv"), newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["cache"] == mode:
                v = float(row[column])
                peak = v if peak is None else max(peak, v)
    if peak is None:
        raise SystemExit(f"findings_extract: {run_dir}: no {mode} rows in memory.csv")
    return peak / MIB


# Lower-tier figures from requests.csv. A prompt's hits are counted at its first admission: the
# rows without a parent; a share is of those rows' prompt tokens.
HIT_COLUMNS = {
    "hit_pct": "cached_prompt_tokens",
    "hit_device_pct": "hit_device_tokens",
    "hit_host_pct": "hit_host_tokens",
    "hit_disk_pct": "hit_disk_tokens",
}
# The three parts of TTFT (they add up to it), averaged over the mode's completed requests.
TTFT_PART_COLUMNS = {
    "ttft_queue_mean_ms": "ttft_queue_ms",
    "ttft_onload_mean_ms": "ttft_onload_ms",
    "ttft_prefill_mean_ms": "ttft_prefill_ms",
}
BOUND_METRICS = ("optimum_hit_rate", "ceiling_hit_rate", "replayed_lru_hit_rate")


def requests_rows(run_dir, mode):
    with open(os.path.join(run_dir, "requests.csv"), newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["cache"] == mode]
    if not rows:
        raise SystemExit(f"findings_extract: {run_dir}: no {mode} rows in requests.csv")
    return rows


def tier_value(run_dir, mode, metric):
    """A lower-tier figure, or None where `metric` is not one."""
    if metric in HIT_COLUMNS or metric == "computed_tokens":
        first = [r for r in requests_rows(run_dir, mode) if r["parent_id"] == ""]
        if metric == "computed_tokens":
            return float(sum(int(r["prefill_computed_tokens"]) for r in first))
        prompt = sum(int(r["prompt_tokens"]) for r in first)
        return 100.0 * sum(int(r[HIT_COLUMNS[metric]]) for r in first) / prompt
    if metric == "onload_gib":
        return sum(int(r["onload_bytes"]) for r in requests_rows(run_dir, mode)) / GIB
    if metric in TTFT_PART_COLUMNS:
        done = [r for r in requests_rows(run_dir, mode) if r["status"] == "completed"]
        return sum(float(r[TTFT_PART_COLUMNS[metric]]) for r in done) / len(done)
    if metric == "offload_gib":
        r = mode_run(read_json(os.path.join(run_dir, "summary.json")), mode)
        return sum(t["offload_bytes"] for t in r.get("tiers", [])) / GIB
    if metric == "achieved_hit_rate" or metric in BOUND_METRICS:
        pc = mode_run(read_json(os.path.join(run_dir, "summary.json")), mode)["prefix_cache"]
        return float(pc[metric] if metric == "achieved_hit_rate" else pc["bounds"][metric])
    return None


def run_value(run_dir, mode, metric):
    if metric == "req_ttft_ms":
        return requests_ttft_ms(run_dir, mode)
    tier = tier_value(run_dir, mode, metric)
    if tier is not None:
        return tier
    if metric.endswith("_peak_mib"):
        return memory_peak_mib(run_dir, mode, metric[: -len("_peak_mib")])
    v = mode_run(read_json(os.path.join(run_dir, "summary.json")), mode)
    for part in SUMMARY_METRICS[metric]:
        v = v[part]
    return float(v)


def run_fig(fd, family, label, mode, metric):
    """Mean over seeds, [min, max] over seeds where more than one ran."""
    vals = [run_value(d, mode, metric) for d in seed_dirs(fd.out, family, label)]
    mean = sum(vals) / len(vals)
    lo, hi = (min(vals), max(vals)) if len(vals) > 1 else (None, None)
    return fd.add(f"{family}.{label}.{mode}.{metric}", mean, lo, hi)


def sweep_figs(fd, label):
    s = read_json(os.path.join(fd.out, "sweep", label, "sweep.json"))
    out = {}
    for r in s["runs"]:
        ci = r["rate_at_target_rps_ci"]
        out[r["cache"]] = fd.add(
            f"sweep.{label}.{r['cache']}.rate_rps", r["rate_at_target_rps"], ci[0], ci[1]
        )
    ci = s["ratio_paged_over_contiguous_ci"]
    out["ratio"] = fd.add(f"sweep.{label}.ratio", s["ratio_paged_over_contiguous"], ci[0], ci[1])
    out["ci"] = fd.ci(ci[0], ci[1], s["ratio_paged_over_contiguous"])
    if ci[0] > 1.0:
        verdict = "paged wins"
    elif ci[1] < 1.0:
        verdict = "contiguous wins"
    else:
        verdict = "tie"
    out["verdict"] = fd.add(f"sweep.{label}.verdict", verdict)
    return out


def level(x):
    return str(int(x)) if float(x) == int(x) else str(x).replace(".", "p")


def commands(out, prefixes):
    lines = []
    with open(os.path.join(out, "commands.tsv"), encoding="utf-8") as f:
        for row in f:
            label, cmd = row.rstrip("\n").split("\t", 1)
            if any(label.startswith(p) for p in prefixes):
                lines.append(cmd)
    return lines


def tune_choice(out):
    """The block size of tune's best paged configuration, where a `kvbench tune` ran: tune.json's
    `modes[]` entry for `paged` names its best by index into `configurations[]`, whose `values`
    hold every knob as the `--set` text."""
    path = os.path.join(out, "tune", "tune.json")
    if not os.path.isfile(path):
        return None
    j = read_json(path)
    for mode in j.get("modes", []):
        if mode.get("cache") != "paged" or mode.get("best") is None:
            continue
        values = j["configurations"][mode["best"]].get("values", {})
        if "cache.block_size" in values:
            return int(values["cache.block_size"])
    return None


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: findings_extract.py OUT")
    out = sys.argv[1]
    fd = Findings(out)
    params = read_json(os.path.join(out, "params.json"))
    sections = []

    def section(title, reading, prefixes, start):
        sections.append((title, reading, prefixes, start))

    # 1. Bytes per token.
    start = len(fd.figs)
    shapes = {}
    for preset in ("llama3-8b", "llama3-70b", "llama3-405b"):
        seq = read_json(os.path.join(out, "plan", f"shape-{preset}.json"))["sequence"]
        shapes[preset] = (
            fd.add(f"plan.{preset}.bytes_per_token", seq["bytes_per_token"]),
            fd.add(f"plan.{preset}.seq_mib", seq["sequence_bytes"] / MIB),
            fd.add(f"plan.{preset}.fits", seq["fits_paged"]),
        )
    section(
        "Bytes per token before the batch",
        "One token of KV costs {} B on llama3-8b, {} B on llama3-70b and {} B on llama3-405b "
        "(one device, tp 1), so a 4096-token sequence holds {} / {} / {} MiB and 80 GiB of KV "
        "fits {} / {} / {} such sequences: the shape, not the scheduler, sets that ceiling.".format(
            *(shapes[p][0] for p in shapes),
            *(shapes[p][1] for p in shapes),
            *(shapes[p][2] for p in shapes),
        ),
        ["plan-"],
        start,
    )

    # 2. Block size against the traces' lengths.
    start = len(fd.figs)
    blocks = (8, 16, 32, 64)
    waste = {}
    for trace in ("azure", "burstgpt", "csv", "mooncake"):
        for b in blocks:
            d = read_json(os.path.join(out, "plan", f"trace-{trace}-b{b}.json"))["distribution"]
            waste[(trace, b)] = fd.add(f"waste.{trace}.b{b}.paged_pct", d["paged_waste_share"] * 100.0)
            if b == 16:
                waste[(trace, "c")] = fd.add(
                    f"waste.{trace}.contiguous_pct", d["contiguous_waste_share"] * 100.0
                )
    rates = {}
    cis = {}
    for b in blocks:
        s = read_json(os.path.join(out, "sweep", f"block-b{b}", "sweep.json"))
        r = mode_run(s, "paged")
        cis[b] = r["rate_at_target_rps_ci"]
        rates[b] = fd.add(
            f"sweep.block-b{b}.paged.rate_rps", r["rate_at_target_rps"], cis[b][0], cis[b][1]
        )
    best = max(blocks, key=lambda b: (rates[b].value, -b))
    fd.add("sweep.block.best", best)
    overlap = max(c[0] for c in cis.values()) <= min(c[1] for c in cis.values())
    worst = max(("azure", "burstgpt", "csv", "mooncake"), key=lambda t: waste[(t, 64)].value)
    tune = tune_choice(out)
    if tune is not None:
        tune_text = "tune's choice: block size {}.".format(fd.add("tune.block_size", tune))
    elif os.path.isdir(os.path.join(out, "tune")):
        tune_text = "tune's choice: `kvbench tune` ran (tune/) but its tune.json names no block size this script reads."
    else:
        tune_text = "tune's choice: not measured (this build has no `kvbench tune`)."
    section(
        "Block size against the shipped traces' lengths",
        "Tail waste grows with the block: on the worst trace ({}) paged waste is {}% at 8-token "
        "blocks and {}% at 64, against {}% for max_seq_len reservations; on sim the rate at target "
        "of chat traffic {} with block size ({} req/s at 8, {} at 64; first best {}){}. {}".format(
            worst,
            waste[(worst, 8)],
            waste[(worst, 64)],
            waste[(worst, "c")],
            "does not move measurably" if overlap else "moves",
            rates[8],
            rates[64],
            best,
            ": sim prices a block's size through memory only (tail waste, the pool's block count), "
            "not in the attention kernel, whose paged read runs at one paged_attention_efficiency "
            "whatever the block, so this says the memory larger blocks waste does not bind at this "
            "budget, not that small blocks cost a GPU kernel nothing"
            if overlap
            else "",
            tune_text,
        ),
        ["waste-", "sweep-block-", "tune"],
        start,
    )

    # 3. Shared prefixes and copy-on-write.
    start = len(fd.figs)
    hit = run_fig(fd, "prefix", "on", "paged", "hit_rate")
    on = run_fig(fd, "prefix", "on", "paged", "ttft_p50_ms")
    off = run_fig(fd, "prefix", "off", "paged", "ttft_p50_ms")
    pk_p = run_fig(fd, "sampling", "n4", "paged", "peak_running")
    pk_c = run_fig(fd, "sampling", "n4", "contiguous", "peak_running")
    sw = sweep_figs(fd, "sampling")
    canc = run_fig(fd, "forks", "cpu", "paged", "cancelled")
    err = run_fig(fd, "forks", "cpu", "paged", "max_rel_err")
    pre = run_fig(fd, "forks", "cpu", "paged", "preemptions")
    section(
        "Shared prefixes and copy-on-write",
        "Shared system prompts: the prefix cache serves a share {} of prompt tokens and takes paged "
        "TTFT p50 from {} ms (cache off) to {} ms; parallel sampling (n = 4 on half the requests) "
        "runs {} sequences at once paged against {} contiguous, a rate-at-target ratio of {} {} "
        "({}); on cpu, forks, shared prefixes, {} cancellations and {} preemptions run with a "
        "largest relative error of {} against the f64 oracle.".format(
            hit, off, on, pk_p, pk_c, sw["ratio"], sw["ci"], sw["verdict"], canc, pre, err
        ),
        ["prefix-", "sampling-", "sweep-sampling", "forks-"],
        start,
    )

    # 4. Capacity is a constraint, not the objective.
    start = len(fd.figs)
    ch = {}
    for c in (512, 2048, 8192):
        for m in ("ttft_p99_ms", "itl_p99_ms", "throughput_tok_s"):
            ch[(c, m)] = run_fig(fd, "chunk", f"c{c}", "paged", m)
    rs = {}
    for w in (1, 10, 30):
        for m in ("ttft_p99_ms", "itl_p99_ms", "throughput_tok_s", "preemptions"):
            rs[(w, m)] = run_fig(fd, "reserve", f"w{w}", "paged", m)
    rc = {m: run_fig(fd, "reserve", "w1", "contiguous", m) for m in ("itl_p99_ms", "throughput_tok_s")}
    num = lambda k: k.value  # the direction words compare full precision
    if num(rs[(1, "throughput_tok_s")]) > num(rs[(30, "throughput_tok_s")]) and num(
        rs[(1, "itl_p99_ms")]
    ) > num(rs[(30, "itl_p99_ms")]):
        tradeoff = (
            ": the setting with the higher throughput is the worse one for tokens already "
            "streaming, and TTFT and ITL move in opposite directions."
        )
    else:
        tradeoff = ": at this load the reserve does not trade throughput against ITL."
    section(
        "Capacity is a constraint, not the objective",
        "Chunked prefill: 512 tokens per step keep ITL p99 at {} ms against {} ms at 8192, for "
        "{} vs {} tok/s and TTFT p99 {} vs {} ms; with a 4 GiB budget, raising the admission "
        "reserve from 1% to 30% of the pool takes ITL p99 from {} to {} ms but TTFT p99 from {} "
        "to {} ms and throughput from {} to {} tok/s (contiguous at 1%: {} tok/s at ITL p99 {} ms)"
        "{}".format(
            ch[(512, "itl_p99_ms")], ch[(8192, "itl_p99_ms")],
            ch[(512, "throughput_tok_s")], ch[(8192, "throughput_tok_s")],
            ch[(512, "ttft_p99_ms")], ch[(8192, "ttft_p99_ms")],
            rs[(1, "itl_p99_ms")], rs[(30, "itl_p99_ms")],
            rs[(1, "ttft_p99_ms")], rs[(30, "ttft_p99_ms")],
            rs[(1, "throughput_tok_s")], rs[(30, "throughput_tok_s")],
            rc["throughput_tok_s"], rc["itl_p99_ms"],
            tradeoff,
        ),
        ["chunk-", "reserve-"],
        start,
    )

    # 5. Resident state vs workspace.
    start = len(fd.figs)
    led = {}
    for shape in ("wide", "narrow"):
        for col in ("weights_bytes", "kv_live_bytes", "workspace_bytes"):
            led[(shape, col)] = run_fig(fd, "ledger", shape, "paged", f"{col}_peak_mib")
    section(
        "Resident state vs workspace",
        "The weights ({} MiB) are resident whatever the batch; the step workspace peaks at {} MiB "
        "for a 256-sequence, 8192-token step and {} MiB for 16 sequences and 512 tokens, and the "
        "live KV at {} vs {} MiB: the batch shape moves workspace and KV, so a budget split "
        "fixed for one shape is wrong for the other.".format(
            led[("wide", "weights_bytes")],
            led[("wide", "workspace_bytes")], led[("narrow", "workspace_bytes")],
            led[("wide", "kv_live_bytes")], led[("narrow", "kv_live_bytes")],
        ),
        ["ledger-"],
        start,
    )

    # 6. Eviction and reuse move costs elsewhere.
    start = len(fd.figs)
    conv = {}
    for label in ("none", "h4g", "h16g"):
        for m in (
            "hit_device_pct", "hit_host_pct", "computed_tokens", "onload_gib", "offload_gib",
            "ttft_p50_ms", "ttft_p99_ms",
            "ttft_queue_mean_ms", "ttft_onload_mean_ms", "ttft_prefill_mean_ms",
        ):
            conv[(label, m)] = run_fig(fd, "conv", label, "paged", m)
    moon = {}
    for ev in ("lru", "lfu", "priority"):
        moon[(ev, "achieved_hit_rate")] = run_fig(fd, "moon", ev, "paged", "achieved_hit_rate")
    for m in BOUND_METRICS:
        moon[m] = run_fig(fd, "moon", "lru", "paged", m)
    for label in ("h16m", "h256m"):
        for m in ("hit_device_pct", "hit_host_pct", "hit_disk_pct", "ttft_p99_ms"):
            moon[(label, m)] = run_fig(fd, "moon", label, "paged", m)
    moon[("lru", "ttft_p99_ms")] = run_fig(fd, "moon", "lru", "paged", "ttft_p99_ms")
    nopay = {}
    for label in ("none", "h4g"):
        for m in ("hit_pct", "ttft_p50_ms", "ttft_p99_ms", "offload_gib", "onload_gib"):
            nopay[(label, m)] = run_fig(fd, "nopay", label, "paged", m)
    num = lambda k: k.value  # the direction words compare full precision
    worse = num(nopay[("h4g", "ttft_p50_ms")]) > num(nopay[("none", "ttft_p50_ms")])
    section(
        "Eviction and reuse move costs elsewhere",
        "Chat sessions overflowing a 2 GiB device cache: without a tier {}% of prompt tokens hit "
        "on the device and {} tokens are prefilled; a 4 GiB host tier adds {}% host hits and a "
        "16 GiB one {}%, taking prefilled tokens to {} / {}, but the cost moves to the link "
        "({} / {} GiB onloaded, {} / {} GiB offloaded) and into TTFT's onload part (mean {} / {} "
        "ms of a TTFT whose queue part is {} / {} ms and prefill part {} / {} ms, against {} and "
        "{} ms without a tier); TTFT p50 goes {} → {} → {} ms and p99 {} → {} → {} ms. On the "
        "Mooncake sample's 32 device blocks LRU reuses a share {} of prompt tokens, LFU {} and "
        "priority {}, where the offline optimum reaches {} and the ceiling (an infinite cache) {}: "
        "the gap is the policy's; lower tiers recover it (device / host / disk {}% / {}% / {}% "
        "with a 16 MiB host tier and a disk, {}% / {}% / {}% at 256 MiB) at TTFT p99 {} and {} ms "
        "against {} ms without them. Where reuse is rare and the link slow (tier-no-pay-8b, 2 GB/s), "
        "a 4 GiB tier moves the hit share from {}% to {}% for {} GiB offloaded, and TTFT p50 goes "
        "from {} to {} ms (p99 {} to {} ms){}".format(
            conv[("none", "hit_device_pct")], conv[("none", "computed_tokens")],
            conv[("h4g", "hit_host_pct")], conv[("h16g", "hit_host_pct")],
            conv[("h4g", "computed_tokens")], conv[("h16g", "computed_tokens")],
            conv[("h4g", "onload_gib")], conv[("h16g", "onload_gib")],
            conv[("h4g", "offload_gib")], conv[("h16g", "offload_gib")],
            conv[("h4g", "ttft_onload_mean_ms")], conv[("h16g", "ttft_onload_mean_ms")],
            conv[("h4g", "ttft_queue_mean_ms")], conv[("h16g", "ttft_queue_mean_ms")],
            conv[("h4g", "ttft_prefill_mean_ms")], conv[("h16g", "ttft_prefill_mean_ms")],
            conv[("none", "ttft_queue_mean_ms")], conv[("none", "ttft_prefill_mean_ms")],
            conv[("none", "ttft_p50_ms")], conv[("h4g", "ttft_p50_ms")], conv[("h16g", "ttft_p50_ms")],
            conv[("none", "ttft_p99_ms")], conv[("h4g", "ttft_p99_ms")], conv[("h16g", "ttft_p99_ms")],
            moon[("lru", "achieved_hit_rate")], moon[("lfu", "achieved_hit_rate")],
            moon[("priority", "achieved_hit_rate")],
            moon["optimum_hit_rate"], moon["ceiling_hit_rate"],
            moon[("h16m", "hit_device_pct")], moon[("h16m", "hit_host_pct")], moon[("h16m", "hit_disk_pct")],
            moon[("h256m", "hit_device_pct")], moon[("h256m", "hit_host_pct")], moon[("h256m", "hit_disk_pct")],
            moon[("h16m", "ttft_p99_ms")], moon[("h256m", "ttft_p99_ms")], moon[("lru", "ttft_p99_ms")],
            nopay[("none", "hit_pct")], nopay[("h4g", "hit_pct")], nopay[("h4g", "offload_gib")],
            nopay[("none", "ttft_p50_ms")], nopay[("h4g", "ttft_p50_ms")],
            nopay[("none", "ttft_p99_ms")], nopay[("h4g", "ttft_p99_ms")],
            ": the tier's offloads hold the slow link in every blocking step and the few hits do "
            "not pay for them." if worse else ": at this load the tier costs nothing measurable.",
        ),
        ["conv-", "moon-", "nopay-"],
        start,
    )

    # 7. Isolation.
    start = len(fd.figs)
    iso = read_json(os.path.join(out, "isolation", "isolation.json"))
    auc = {}
    for c in iso["grid"]:
        key = f"iso.{c['scope']}.l{level(c['load_rps'])}.n{level(c['noise_ms'])}.auc"
        auc[(c["scope"], c["load_rps"], c["noise_ms"])] = (
            fd.add(key, c["auc"], c["auc_ci"][0], c["auc_ci"][1]),
            fd.ci(c["auc_ci"][0], c["auc_ci"][1], c["auc"]),
        )
    loads, noises = iso["loads_rps"], iso["noises_ms"]
    ci_lo = {(c["scope"], c["load_rps"], c["noise_ms"]): c["auc_ci"][0] for c in iso["grid"]}
    iso_lo = ci_lo.__getitem__
    g0, t0 = auc[("global", loads[0], noises[0])], auc[("tenant", loads[0], noises[0])]
    gl, gn = auc[("global", loads[-1], noises[0])], auc[("global", loads[0], noises[-1])]
    # With a host tier: the second, slower hit class (figures of isolation-tier/isolation.json).
    isot = read_json(os.path.join(out, "isolation-tier", "isolation.json"))
    tl, tn = isot["loads_rps"], isot["noises_ms"]
    tcell = {(c["scope"], c["load_rps"], c["noise_ms"]): c for c in isot["grid"]}

    def tier_auc(scope, load, noise, pair, by_intent=False):
        cls = tcell[(scope, load, noise)]["classes"]
        p = cls["by_intent"][pair] if by_intent else cls[pair]
        name = f"intent_{pair}" if by_intent else pair
        key = f"isot.{scope}.l{level(load)}.n{level(noise)}.{name}.auc"
        if p["auc"] is None:
            return ("—", "(no probes in a class)")
        return (
            fd.add(key, p["auc"], p["auc_ci"][0], p["auc_ci"][1]),
            fd.ci(p["auc_ci"][0], p["auc_ci"][1], p["auc"]),
        )

    th = tier_auc("global", tl[0], tn[0], "host_hit")
    tdh = tier_auc("global", tl[0], tn[0], "device_vs_host")
    tdhn = tier_auc("global", tl[0], tn[-1], "device_vs_host")
    thl = tier_auc("global", tl[-1], tn[0], "host_hit")
    tt = tier_auc("tenant", tl[0], tn[0], "host_hit", by_intent=True)
    tier_reading = (
        " With a host tier (conversation-tiered-8b-h200, the prober's filler traffic pushing the "
        "victim's prefix from the device to host memory between its early and late probes), a "
        "host hit is a second, slower hit class: told from a miss at AUC {} {} on an idle device, "
        "and from a device hit at {} {} ({} {} at {} ms of noise), so the prober also learns how "
        "long ago the prefix was sent; at {} req/s of background load the host class reads {} {}; "
        "under tenant scope the late repeats read as fresh prompts ({} {}).".format(
            th[0], th[1], tdh[0], tdh[1], tdhn[0], tdhn[1], level(tn[-1]), level(tl[-1]),
            thl[0], thl[1], tt[0], tt[1],
        )
    )
    section(
        "The isolation boundary",
        "With prefixes shared globally and no background load, a tenant tells another's prefix "
        "hits from misses by its own TTFT at AUC {} {}; per-tenant scope gives {} {} (0.5 is "
        "chance); {} req/s of background load leaves global sharing at {} and {} ms of measurement "
        "noise at {} {}: {}".format(
            g0[0], g0[1], t0[0], t0[1], level(loads[-1]), gl[0], level(noises[-1]), gn[0], gn[1],
            "load and noise blur the channel without closing it; the scope closes it, which is why "
            "reuse is scoped per tenant by default."
            if iso_lo(("global", loads[-1], noises[-1])) > 0.5
            else "enough noise hides a hit as well as the scope does, but a prober can average its "
            "noise away over repeated probes; the scope closes the channel, which is why reuse is "
            "scoped per tenant by default.",
        )
        + tier_reading,
        ["isolation"],
        start,
    )

    # 8. When the machinery is not worth it.
    start = len(fd.figs)
    idle = {}
    for where in ("sim", "cpu"):
        per_seed = [
            (requests_ttft_ms(d, "paged"), requests_ttft_ms(d, "contiguous"))
            for d in seed_dirs(out, "idle", where)
        ]
        if all(p == c for p, c in per_seed):
            v = "tie"
        elif all(p < c for p, c in per_seed):
            v = "paged wins"
        elif all(p > c for p, c in per_seed):
            v = "contiguous wins"
        else:
            v = "mixed"
        mean_p = sum(p for p, _ in per_seed) / len(per_seed)
        mean_c = sum(c for _, c in per_seed) / len(per_seed)
        idle[where] = (
            run_fig(fd, "idle", where, "paged", "req_ttft_ms"),
            run_fig(fd, "idle", where, "contiguous", "req_ttft_ms"),
            fd.add(f"idle.{where}.verdict", v),
            fd.add(f"idle.{where}.paged_over_contiguous", mean_p / mean_c),
        )
    uni, exact, maxlen = sweep_figs(fd, "uniform"), sweep_figs(fd, "exact"), sweep_figs(fd, "maxlen")
    cu = {
        (m, mode): run_fig(fd, "cpuuniform", "basic", mode, m)
        for m in ("throughput_tok_s", "ttft_p99_ms")
        for mode in ("paged", "contiguous")
    }
    section(
        "When the extra machinery is not worth it",
        "One short request on an idle device: TTFT {} ms paged vs {} ms contiguous on sim ({}, "
        "ratio {}) and {} vs {} ms on cpu ({}, ratio {}); uniform short lengths with max_seq_len 128: paged/contiguous "
        "rate at target {} {} ({}); contiguous reservations sized by prompt + output: {} {} ({}); "
        "against max_seq_len reservations as chat ships: {} {} ({}). On cpu with uniform short "
        "lengths: {} vs {} tok/s, TTFT p99 {} vs {} ms.{}".format(
            *idle["sim"], *idle["cpu"],
            uni["ratio"], uni["ci"], uni["verdict"],
            exact["ratio"], exact["ci"], exact["verdict"],
            maxlen["ratio"], maxlen["ci"], maxlen["verdict"],
            cu[("throughput_tok_s", "paged")], cu[("throughput_tok_s", "contiguous")],
            cu[("ttft_p99_ms", "paged")], cu[("ttft_p99_ms", "contiguous")],
            " Paging pays where reservations would be sized for a worst case the traffic rarely "
            "reaches; with short, even lengths it does not win, and a reservation sized by prompt + "
            "output keeps only the ratio above."
            if maxlen["verdict"] == "paged wins" and uni["verdict"] != "paged wins"
            else "",
        ),
        ["idle-", "sweep-uniform", "sweep-exact", "sweep-maxlen", "cpuuniform-"],
        start,
    )

    write(out, fd, params, sections)


def write(out, fd, params, sections):
    mode = "quick" if params["quick"] else "full"
    lines = [
        "# Findings",
        "",
        f"Produced by `scripts/findings.sh OUT{' --quick' if params['quick'] else ''}` ({mode} run: "
        f"{params['run_requests']} requests a run over seeds {', '.join(map(str, params['run_seeds']))}; "
        f"sweeps from {params['sweep_requests']} requests over {params['sweep_seeds']} seeds, "
        f"{params['block_seeds']} for the block sweeps; {params['probes']} isolation probes; "
        f"{params['conv_requests']} conversations and {params['nopay_requests']} requests in the "
        "lower-tier runs) on `sim`, "
        "and on `cpu` with the model clock where the tiny model fits. Every figure is read from the "
        "runs' files in OUT. Intervals: a run figure is the mean over seeds with [min, max] over "
        "seeds; a sweep figure carries the sweep's interval (its bracket for one seed, over seeds "
        "for several); an AUC its 95% interval (the hull of Hanley-McNeil's and a Wilson score "
        "interval over the smaller class's count); — where there is none. Each figure "
        "and its interval are rounded to the decimal place of the interval's half-width; one "
        "without an interval (or whose seeds agree) to three significant digits, integers whole; "
        "OUT/findings.json keeps full precision.",
        "",
    ]
    for n, (title, reading, prefixes, start) in enumerate(sections, 1):
        lines += [f"## {n}. {title}", "", reading, "", "| figure | value | interval |", "|---|---|---|"]
        for f in fd.figs[start : (sections[n][3] if n < len(sections) else len(fd.figs))]:
            e = place(f["value"], f["lo"], f["hi"])
            lines.append(
                f"| `{f['key']}` | {fmt_at(f['value'], e)} | {fmt_ci(f['lo'], f['hi'], e)} |"
            )
        lines += ["", "```"] + commands(out, prefixes) + ["```", ""]
    with open(os.path.join(out, "findings.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    with open(os.path.join(out, "findings.json"), "w", encoding="utf-8") as f:
        json.dump({"params": params, "figures": fd.figs}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
