#!/usr/bin/env python3
"""The figures of a gpu-check work folder as Markdown on stdout (scripts/gpu-check.sh puts them
into summary.md under its step table). Every figure is recomputed from the files:

- kvbench's paged and contiguous decode attention (kernel_bench.csv), the read ceiling, and the
  PyTorch SDPA peer (peer_sdpa.csv) as a ratio kvbench contiguous / peer (< 1: kvbench faster),
  with PASS/MISS against the targets (information, not an exit code);
- the same decode attention as a sliding layer (window/kernel_bench.csv, --window): times and
  GB/s over the window's bytes on a GPU, K/V bytes read against the window's on the emulator;
- cuda-check (cuda_check.csv): checks passed and the largest attention error;
- each scenario run under e2e/ (summary.json): backend, checks, tokens per cache, numerics,
  reclamation, and the device memory reconciliation (kvbench's bytes, the driver's measured
  warm-up, the residue against its tolerance, the driver version and event-timing call).

Usage: gpu_summary.py WORK_FOLDER"""
import csv
import json
import os
import sys


def load(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def kernel_section(d, lines):
    kb = load(os.path.join(d, "kernel_bench.csv"))
    if not kb:
        return
    peer = {}
    for r in load(os.path.join(d, "peer_sdpa.csv")):
        peer[(int(r["batch"]), int(r["context_tokens"]))] = float(r["peer_time_us"])
    pts = {}
    for r in kb:
        key = (int(r["batch"]), int(r["context_tokens"]), int(r["block_size"]))
        pts.setdefault(key, {})[r["cache"]] = r
    backend = kb[0].get("backend", "")
    lines.append(f"## Decode attention ({backend or 'kernel-bench'})")
    lines.append("")
    try:
        ceiling = float(kb[0]["ceiling_gbytes_per_s"])
        lines.append(f"read ceiling {ceiling:.0f} GB/s")
        lines.append("")
    except (KeyError, ValueError):
        pass
    lines.append("| batch | context | block | paged us | contig us | paged/contig | paged % ceil | contig % ceil | peer us | contig/peer |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    targets = []
    for (b, c, bs), m in sorted(pts.items()):
        p, q = m.get("paged"), m.get("contiguous")
        if not p or not q:
            continue
        tp, tc = float(p["time_us"]), float(q["time_us"])
        fp, fc = float(p.get("ceiling_fraction") or "nan"), float(q.get("ceiling_fraction") or "nan")
        pe = peer.get((b, c))
        ratio = f"{tc / pe:.3f}" if pe else "-"
        lines.append(f"| {b} | {c} | {bs} | {tp:.2f} | {tc:.2f} | {tp / tc:.3f} | {fp * 100:.1f}% | {fc * 100:.1f}% | {pe if pe else '-'} | {ratio} |")
        if b == 64 and c == 2048:
            targets.append(("paged >= 80% of ceiling at 64x2048", fp >= 0.8))
            targets.append(("contiguous >= 80% of ceiling at 64x2048", fc >= 0.8))
        if bs == 16:
            targets.append((f"paged/contig <= 1.05 at b{b} c{c} block 16", tp / tc <= 1.05))
        if pe:
            targets.append((f"contig no slower than SDPA at b{b} c{c}", tc <= pe))
    lines.append("")
    for name, ok in targets:
        lines.append(f"- {'PASS' if ok else 'MISS'} {name}")
    lines.append("")


def window_section(d, lines):
    kb = load(os.path.join(d, "window", "kernel_bench.csv"))
    if not kb:
        return
    lines.append(f"## Sliding-window attention (window {kb[0].get('window_tokens', '?')} tokens)")
    lines.append("")
    lines.append("| cache | phase | batch | context | block | time us | GB/s (window) | K/V bytes read | K/V bytes ideal (window) |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in kb:
        lines.append(
            f"| {r['cache']} | {r.get('phase', '')} | {r['batch']} | {r['context_tokens']} | {r['block_size']} "
            f"| {r['time_us'] or '-'} | {r['gbytes_per_s'] or '-'} | {r.get('kv_bytes_read') or '-'} | {r.get('kv_bytes_ideal') or '-'} |"
        )
    lines.append("")


def check_section(d, lines):
    check = load(os.path.join(d, "cuda_check.csv"))
    if not check:
        return
    bad = [r for r in check if r["ok"] != "true"]
    attn = [float(r["max_abs_err"]) for r in check if r["kernel"].startswith("attn")]
    worst = f", largest attention error {max(attn):.2e}" if attn else ""
    lines.append(f"## cuda-check\n\n{len(check) - len(bad)}/{len(check)} checks passed{worst}")
    for r in bad[:10]:
        lines.append(f"- FAIL {r['kernel']} {r.get('case', '')}: {r['max_abs_err']}")
    lines.append("")


def scenario_section(d, lines):
    e2e = os.path.join(d, "e2e")
    if not os.path.isdir(e2e):
        return
    rows = []
    for name in sorted(os.listdir(e2e)):
        path = os.path.join(e2e, name, "summary.json")
        if not os.path.exists(path):
            rows.append(f"| {name} | - | no summary.json | | | | |")
            continue
        try:
            with open(path) as f:
                s = json.load(f)
        except (OSError, ValueError) as e:
            rows.append(f"| {name} | - | unreadable summary.json: {e} | | | | |")
            continue
        checks = s.get("checks") or {}
        ok = "ok" if checks.get("ok") else "FAILED: " + "; ".join(str(x) for x in checks.get("failures", []))[:200]
        fault = s.get("fault")
        if fault:
            ok += f" (fault {fault}, fired {s.get('fault_fired')})"
        tokens, numerics, reclaim, device = [], [], [], []
        for r in s.get("runs", []):
            cache = r.get("cache")
            tokens.append(f"{cache} {r.get('output_tokens')}")
            n = r.get("numerics")
            if isinstance(n, dict):
                numerics.append(f"{cache} " + ", ".join(f"{k} {v}" for k, v in list(n.items())[:3]))
            rec = r.get("reclamation") or {}
            reclaim.append(f"{cache} {'ok' if rec.get('ok') else rec.get('detail', '-')}")
            dev = (r.get("memory") or {}).get("device")
            if isinstance(dev, dict):
                mib = 1 << 20
                device.append(
                    f"{cache} kvbench {dev.get('kvbench_bytes', 0) / mib:.1f} MiB, warm-up "
                    f"{dev.get('driver_warmup_bytes', 0) / mib:.1f} MiB, residue "
                    f"{dev.get('residue_bytes', 0) / mib:.1f} of {dev.get('tolerance_bytes', 0) / mib:.0f} MiB"
                    f" ({'ok' if dev.get('residue_ok') else 'BEYOND'}); driver {dev.get('driver_version')}, "
                    f"{dev.get('event_timing_call')}"
                )
        rows.append(f"| {name} | {s.get('backend')} | {ok} | {'; '.join(tokens)} | {'; '.join(numerics) or '-'} | {'; '.join(reclaim)} | {'; '.join(device) or '-'} |")
    if rows:
        lines.append("## Scenarios")
        lines.append("")
        lines.append("| run | backend | checks | output tokens | numerics | reclamation | device memory |")
        lines.append("|---|---|---|---|---|---|---|")
        lines.extend(rows)
        lines.append("")


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    d = sys.argv[1]
    lines = []
    check_section(d, lines)
    kernel_section(d, lines)
    window_section(d, lines)
    scenario_section(d, lines)
    if not lines:
        lines.append("(no figures: no step wrote a CSV or a scenario result)")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
