#!/usr/bin/env python3
"""Packed variable-length sequences (varlen) against the same tokens run padded, and against
PyTorch's FlashAttention-2 varlen forward, in one process, interleaved (compare_torch.interleaved_ms).

Per configuration d:N:causal: 16384 tokens in sequences of random lengths in [N/2, 3N/2] (fixed seed),
heads·d = 2048, bf16. TFLOP/s count the visible (query, key) pairs of the real sequences (4·d FLOPs
each), so padding shows up as lost speed, not as extra work.

    python3 bench/varlen_bench.py --lib build-gpu/libflashattn_torch_shim.so --configs 128:2048:1,64:512:0
"""
import argparse
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import Lib, grid_configs, interleaved_ms  # noqa: E402


def lengths(n, total, seed):
    rng = random.Random(seed)
    out = []
    while sum(out) < total:
        out.append(min(rng.randint(n // 2, 3 * n // 2), total - sum(out)))
    return out


def visible_pairs(lens, causal):
    return sum(l * (l + 1) // 2 if causal else l * l for l in lens)


def fa2_varlen(q, k, v, cu, max_len, causal, scale):
    """PyTorch's FlashAttention-2 varlen forward (an internal op; None if this build lacks it)."""
    op = getattr(torch.ops.aten, "_flash_attention_forward", None)
    if op is None:
        return None
    fn = lambda: op(q, k, v, cu, cu, max_len, max_len, 0.0, causal, False, scale=scale)  # noqa: E731
    try:
        fn()
    except Exception as e:  # noqa: BLE001 — report, do not fail the run
        print(f"  FA2 varlen unavailable: {type(e).__name__}: {str(e)[:120]}")
        return None
    return fn


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", required=True)
    ap.add_argument("--configs", default="64:512:1,128:2048:1,128:2048:0,256:8192:1")
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    lib = Lib(args.lib)
    dev, dt = "cuda", torch.bfloat16
    print("config        seqs  ours varlen  ours padded  FA2 varlen   TFLOP/s (visible pairs)")
    for d, n, causal in grid_configs(args.configs):
        h = 2048 // d
        lens = lengths(n, 16384, seed=n + d)
        total, mx = sum(lens), max(lens)
        scale = d ** -0.5
        cu = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))], dtype=torch.int32, device=dev)
        q = torch.randn(1, total, h, d, device=dev, dtype=dt)
        k, v = torch.randn_like(q), torch.randn_like(q)
        out, lse = torch.empty_like(q), torch.empty(1, h, total, device=dev)
        impls = {"varlen": (lib.bind_forward(q, k, v, out, lse, causal=causal, cu_q=cu, cu_k=cu, max_q=mx, max_k=mx),
                            torch.no_grad)}
        # padded: every sequence in a batch row of the longest length (rows past a sequence unused)
        qp = torch.randn(len(lens), mx, h, d, device=dev, dtype=dt)
        kp, vp = torch.randn_like(qp), torch.randn_like(qp)
        op_, lp = torch.empty_like(qp), torch.empty(len(lens), h, mx, device=dev)
        impls["padded"] = (lib.bind_forward(qp, kp, vp, op_, lp, causal=causal), torch.no_grad)
        fa2 = fa2_varlen(q[0], k[0], v[0], cu, mx, causal, scale)
        if fa2 is not None:
            impls["fa2"] = (fa2, torch.no_grad)
        ms = interleaved_ms(impls, args.reps, batch=5)
        flops = 4 * h * d * visible_pairs(lens, causal)
        tf = {name: flops / (t * 1e-3) / 1e12 for name, t in ms.items()}
        print(f"d{d:3d} N={n:5d} {'causal' if causal else 'full  '} {len(lens):4d}  {tf['varlen']:9.1f}  "
              f"{tf['padded']:11.1f}  {tf.get('fa2', float('nan')):10.1f}")


if __name__ == "__main__":
    main()
