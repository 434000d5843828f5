#!/usr/bin/env python3
"""One forward + backward call of the library through the PyTorch shim, for profilers (ncu):
a warm-up pair first, then the pair to profile. bf16, the FlashAttention grid's batch and heads
(batch·N = 16384 tokens, heads·d = 2048) unless given.

    ncu --kernel-name regex:bwd --launch-skip 1 --launch-count 1 python3 bench/one_call.py \
        --lib build-gpu/libflashattn_torch_shim.so -d 64 -N 8192 [--causal]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import Lib  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("-d", type=int, default=128)
    ap.add_argument("-N", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=2)
    a = ap.parse_args()
    lib = Lib(a.lib)
    b, h = max(1, 16384 // a.N), 2048 // a.d
    q = torch.randn(b, a.N, h, a.d, device="cuda", dtype=torch.bfloat16)
    k, v, do = torch.randn_like(q), torch.randn_like(q), torch.randn_like(q)
    o, lse = torch.empty_like(q), torch.empty(b, h, a.N, device="cuda")
    dq, dk, dv = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
    for _ in range(a.calls):
        lib.forward(q, k, v, o, lse, causal=a.causal)
        lib.backward(q, k, v, o, do, lse, dq, dk, dv, causal=a.causal)
    torch.cuda.synchronize()
    print(f"ok: d{a.d} N={a.N} b{b} h{h} causal={a.causal}")


if __name__ == "__main__":
    main()
