#!/usr/bin/env python3
"""Sustained-load timing of the forward: ours vs PyTorch's cuDNN backend, with the GPU's SM clock
and power sampled by nvidia-smi while each runs.

kernel_times.py (CUPTI) synchronizes after every call, so each call starts on an idle GPU at boost
clock; compare_torch.py's back-to-back timing keeps the GPU busy for only ~10 calls. This keeps one
implementation busy for --seconds (calls issued back to back, one CUDA-event pair per --batch
calls), alternating implementations --rounds times, and prints per window the median time per call
and the mean SM clock, power draw and temperature that nvidia-smi reported during it — to tell a
kernel that is slower from one that runs at a lower clock (power limit).

  python3 bench/dev/sustained.py --lib build-gpu/libflashattn_torch_shim.so --configs 64:8192:1,128:2048:0
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/: compare_torch
from compare_torch import Lib, call_times, grid_configs, grid_flops, grid_problem  # noqa: E402


def start_sampler(path):
    f = open(path, "w")
    p = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                          "--format=csv,noheader,nounits", "-lms", "20"], stdout=f, stderr=subprocess.DEVNULL)
    return p, f


def read_samples(path):
    rows = []
    for line in open(path):
        parts = [x.strip() for x in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((ts, float(parts[1]), float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    return rows


def window(fn, seconds, batch):
    """Calls fn back to back for `seconds`; returns (median ms per call over the second half,
    wall start, wall end of that half)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples, t0 = [], time.time()
    while time.time() - t0 < seconds:
        samples.append((time.time(), call_times(fn, 1, batch, warmup=0)[0]))
    half = samples[len(samples) // 2:]
    return statistics.median(ms for _, ms in half), half[0][0], half[-1][0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--configs", default="64:8192:1,128:2048:0", help="d:N:causal,…")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--log", default="/tmp/sustained-smi.csv")
    a = ap.parse_args()
    lib = Lib(a.lib)
    proc, f = start_sampler(a.log)
    time.sleep(0.3)
    results = []
    try:
        for d, n, causal in grid_configs(a.configs):
            cfg = f"{d}:{n}:{int(causal)}"
            b, h, q, k, v, o, l = grid_problem(d, n)
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            flops = grid_flops(b, h, n, d, causal)
            ours = lambda: lib.forward(q, k, v, o, l, causal=causal)  # noqa: E731

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            for r in range(a.rounds):
                for name, fn in (("ours", ours), ("cudnn", cudnn)) if r % 2 == 0 else (("cudnn", cudnn), ("ours", ours)):
                    ms, t0, t1 = window(fn, a.seconds, a.batch)
                    results.append((cfg, name, r, ms, flops / ms / 1e9, t0, t1))
    finally:
        time.sleep(0.2)
        proc.terminate()
        proc.wait()
        f.close()
    smi = read_samples(a.log)
    print(f"{'config':14s} {'impl':6s} rnd {'ms/call':>8s} {'TFLOP/s':>8s} {'MHz':>6s} {'W':>6s} {'C':>4s}")
    for cfg, name, r, ms, tf, t0, t1 in results:
        s = [x for x in smi if t0 <= x[0] <= t1]
        mhz = statistics.mean(x[1] for x in s) if s else float("nan")
        w = statistics.mean(x[2] for x in s) if s else float("nan")
        c = statistics.mean(x[3] for x in s) if s else float("nan")
        print(f"{cfg:14s} {name:6s} {r:3d} {ms:8.3f} {tf:8.1f} {mhz:6.0f} {w:6.0f} {c:4.0f}")


if __name__ == "__main__":
    main()
