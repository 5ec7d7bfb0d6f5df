#!/usr/bin/env python3
"""Tile an Azure LLM inference trace into a long plain-CSV trace for scale runs.

    scripts/tile_trace.py SRC.csv ROWS OUT.csv

Reads TIMESTAMP,ContextTokens,GeneratedTokens rows, and writes `arrival_ms,prompt_tokens,
output_tokens` rows: the source replayed back to back (each copy shifted by the source's span plus
its mean gap) until ROWS rows are written. Lengths and the arrival pattern stay the real trace's;
only its length grows, for measuring a day-long replay (README, "Scale").
"""
import csv
import sys
from datetime import datetime


def main() -> None:
    src, rows, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    recs = []
    with open(src, newline="") as f:
        for r in csv.DictReader(f):
            ts = r["TIMESTAMP"]
            head, _, frac = ts.partition(".")
            t = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").timestamp() + float("0." + (frac or "0"))
            recs.append((t, int(r["ContextTokens"]), int(r["GeneratedTokens"])))
    t0 = recs[0][0]
    span = recs[-1][0] - t0
    gap = span / max(1, len(recs) - 1)
    with open(out, "w") as f:
        f.write("arrival_ms,prompt_tokens,output_tokens\n")
        n = 0
        copy = 0
        while n < rows:
            shift = copy * (span + gap)
            for t, p, o in recs:
                if n >= rows:
                    break
                f.write(f"{(t - t0 + shift) * 1000.0:.3f},{p},{o}\n")
                n += 1
            copy += 1


if __name__ == "__main__":
    main()
