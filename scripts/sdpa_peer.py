#!/usr/bin/env python3
"""The peer for `kvbench kernel-bench --backend cuda`: PyTorch's scaled_dot_product_attention on
one decode step over the same contiguous K/V kvbench's contiguous kernel reads — per layer
[slots, kv_heads, head_dim] (NHD), sequence i at slots i*context.. — timed the same way (CUDA
events per call, median; CUDA-graph replay where capture works; cold L2 by rotating through
copies that together exceed it four times).

Two layouts are timed: the NHD storage itself seen as [batch, kv_heads, context, head_dim]
through a transpose (no copy), and the same values made contiguous in HND, which PyTorch's
kernels prefer. The peer figure is the faster of the two.

Writes CSV: batch,context_tokens,layout,time_events_us,time_graph_us,peer_time_us,torch,gpu
"""
import argparse
import csv
import math
import statistics
import sys

import torch
import torch.nn.functional as F


def ints(s):
    return [int(x) for x in s.split(",") if x]


def sdpa(q, k, v, group):
    try:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    except TypeError:  # torch < 2.5: no enable_gqa
        return F.scaled_dot_product_attention(
            q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        )


def time_point(batch, ctx, qh, kvh, d, dtype, reps, l2):
    dev = torch.device("cuda")
    kv_bytes = batch * ctx * 2 * kvh * d * torch.tensor([], dtype=dtype).element_size()
    copies = max(1, min(64, math.ceil(4 * l2 / kv_bytes)))
    group = qh // kvh
    q = torch.rand(batch, qh, 1, d, device=dev, dtype=dtype) * 2 - 1
    rows = []
    for layout in ("nhd_view", "hnd"):
        kv = []
        for _ in range(copies):
            k = (torch.rand(batch * ctx, kvh, d, device=dev, dtype=dtype) - 0.5)
            v = (torch.rand(batch * ctx, kvh, d, device=dev, dtype=dtype) - 0.5)
            k = k.view(batch, ctx, kvh, d).transpose(1, 2)
            v = v.view(batch, ctx, kvh, d).transpose(1, 2)
            if layout == "hnd":
                k, v = k.contiguous(), v.contiguous()
            kv.append((k, v))
        out = sdpa(q, kv[0][0], kv[0][1], group)  # warm-up, kernel selection
        torch.cuda.synchronize()
        times = []
        for r in range(reps):
            k, v = kv[r % copies]
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            out = sdpa(q, k, v, group)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        ev = statistics.median(times)
        graph_us = None
        try:
            per_graph = max(copies, 4)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for i in range(3):
                    sdpa(q, kv[i % copies][0], kv[i % copies][1], group)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(per_graph):
                    out = sdpa(q, kv[i % copies][0], kv[i % copies][1], group)
            g.replay()
            torch.cuda.synchronize()
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                g.replay()
            b.record()
            b.synchronize()
            graph_us = a.elapsed_time(b) * 1e3 / (reps * per_graph)
        except Exception as e:  # capture unsupported for this kernel: events only
            print(f"graph capture failed ({layout}, b{batch} c{ctx}): {e}", file=sys.stderr)
        rows.append((layout, ev, graph_us))
        del kv
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,16,64")
    ap.add_argument("--context", default="512,2048,8192")
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 64 << 20)
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["batch", "context_tokens", "layout", "time_events_us", "time_graph_us",
                    "peer_time_us", "torch", "gpu"])
        for b in ints(a.batch):
            for c in ints(a.context):
                rows = time_point(b, c, a.q_heads, a.kv_heads, a.head_dim, dtype, a.reps, l2)
                best = min((g if g is not None else e) for _, e, g in rows)
                for layout, ev, g in rows:
                    w.writerow([b, c, layout, f"{ev:.3f}", "" if g is None else f"{g:.3f}",
                                f"{best:.3f}", torch.__version__, props.name])
                print(f"peer sdpa b{b} c{c}: {best:.2f} us", flush=True)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
