#!/usr/bin/env python3
"""One forward + backward call of the library through the PyTorch shim, for profilers (ncu):
a warm-up pair first, then the pair to profile (inside the NVTX range "prof"). --impl cudnn/fa2
runs PyTorch's SDPA with that backend instead (forward only unless --bwd), for comparing
counters of the peers' kernels (ncu --nvtx --nvtx-include "prof/"). bf16, the FlashAttention grid's batch and heads
(batch·N = 16384 tokens, heads·d = 2048) unless given.

    ncu --kernel-name regex:bwd --launch-skip 1 --launch-count 1 python3 bench/dev/one_call.py \
        --lib build-gpu/libflashattn_torch_shim.so -d 64 -N 8192 [--causal]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/: compare_torch
from compare_torch import Lib  # noqa: E402


_lib = None


def one_ours(a, q, k, v, do):
    global _lib
    if _lib is None:
        _lib = Lib(a.lib)
    o, lse = torch.empty_like(q), torch.empty(q.shape[0], q.shape[2], a.N, device="cuda")
    dq, dk, dv = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
    _lib.forward(q, k, v, o, lse, causal=a.causal)
    _lib.backward(q, k, v, o, do, lse, dq, dk, dv, causal=a.causal)


def one_peer(a, q, k, v, do):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = SDPBackend.CUDNN_ATTENTION if a.impl == "cudnn" else SDPBackend.FLASH_ATTENTION
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(a.bwd) for x in (q, k, v))
    with sdpa_kernel(be):
        o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=a.causal)
        if a.bwd:
            o.backward(do.transpose(1, 2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("-d", type=int, default=128)
    ap.add_argument("-N", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--impl", choices=["ours", "cudnn", "fa2"], default="ours")
    ap.add_argument("--bwd", action="store_true", help="peers: also the backward")
    ap.add_argument("--batch", type=int, default=0, help="instead of the grid's 16384 // N")
    ap.add_argument("--heads", type=int, default=0, help="instead of the grid's 2048 // d")
    ap.add_argument("--f16", action="store_true", help="float16 instead of bfloat16")
    a = ap.parse_args()
    b, h = a.batch or max(1, 16384 // a.N), a.heads or 2048 // a.d
    q = torch.randn(b, a.N, h, a.d, device="cuda", dtype=torch.float16 if a.f16 else torch.bfloat16)
    k, v, do = torch.randn_like(q), torch.randn_like(q), torch.randn_like(q)
    for i in range(a.calls):
        last = i == a.calls - 1
        torch.cuda.synchronize()
        if last:
            torch.cuda.nvtx.range_push("prof")
        if a.impl == "ours":
            one_ours(a, q, k, v, do)
        else:
            one_peer(a, q, k, v, do)
        torch.cuda.synchronize()
        if last:
            torch.cuda.nvtx.range_pop()
    print(f"ok: d{a.d} N={a.N} b{b} h{h} causal={a.causal} {q.dtype}")


if __name__ == "__main__":
    main()
