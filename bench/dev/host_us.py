#!/usr/bin/env python3
"""Host time of one forward call (µs): ours through the ctypes shim (arguments packed once) and
PyTorch's SDPA with the cuDNN and FA2 backends, on the FlashAttention grid's shapes. Calls are
issued without synchronization (the launch queue absorbs them), so the time per call is what the
CPU spends before the call returns: argument checks, descriptors, the launch.

  python3 bench/dev/host_us.py --lib build-gpu/libflashattn_torch_shim.so --configs 128:2048:0,64:512:1
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/: compare_torch
from compare_torch import Lib, grid_configs, grid_problem  # noqa: E402


def host_us(fn, calls):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--configs", default="64:512:1,128:2048:0,128:8192:0")
    ap.add_argument("--calls", type=int, default=20)
    a = ap.parse_args()
    lib = Lib(a.lib)
    for d, n, causal in grid_configs(a.configs):
        _, _, q, k, v, o, l = grid_problem(d, n)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        row = {"ours": host_us(lib.bind_forward(q, k, v, o, l, causal=causal), a.calls),
               "ours_unbound": host_us(lambda: lib.forward(q, k, v, o, l, causal=causal), a.calls)}
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel(be):
                row[name] = host_us(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), a.calls)
        print(f"host µs/call d{d} N={n} causal={causal}: " + "  ".join(f"{k_} {v_:.1f}" for k_, v_ in row.items()), flush=True)


if __name__ == "__main__":
    main()
