#!/usr/bin/env python3
"""One compact table from a gpu-check run folder: kvbench's paged and contiguous decode attention
(kernel_bench.csv), the read ceiling, and the PyTorch SDPA peer (peer_sdpa.csv) as a ratio
kvbench contiguous / peer (< 1: kvbench faster). Every figure is recomputed from those files.
Also checks the issue's targets and prints PASS/MISS per target (information, not an exit code).
Writes summary.md next to the CSVs."""
import csv
import os
import sys


def load(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main():
    d = sys.argv[1]
    kb = load(os.path.join(d, "kernel_bench.csv"))
    peer = {}
    for r in load(os.path.join(d, "peer_sdpa.csv")):
        peer[(int(r["batch"]), int(r["context_tokens"]))] = float(r["peer_time_us"])
    pts = {}
    for r in kb:
        key = (int(r["batch"]), int(r["context_tokens"]), int(r["block_size"]))
        pts.setdefault(key, {})[r["cache"]] = r
    lines = []
    ceiling = float(kb[0]["ceiling_gbytes_per_s"]) if kb else float("nan")
    lines.append(f"read ceiling {ceiling:.0f} GB/s")
    lines.append("| batch | context | block | paged us | contig us | paged/contig | paged % ceil | contig % ceil | peer us | contig/peer |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    targets = []
    for (b, c, bs), m in sorted(pts.items()):
        p, q = m.get("paged"), m.get("contiguous")
        if not p or not q:
            continue
        tp, tc = float(p["time_us"]), float(q["time_us"])
        fp, fc = float(p["ceiling_fraction"]), float(q["ceiling_fraction"])
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
    check = load(os.path.join(d, "cuda_check.csv"))
    if check:
        bad = [r for r in check if r["ok"] != "true"]
        lines.append(f"cuda-check: {len(check) - len(bad)}/{len(check)} passed, max attention error "
                     f"{max(float(r['max_abs_err']) for r in check if r['kernel'].startswith('attn')):.2e}")
    for name, ok in targets:
        lines.append(f"{'PASS' if ok else 'MISS'} {name}")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(d, "summary.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
