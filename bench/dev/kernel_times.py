#!/usr/bin/env python3
"""Where one attention call's GPU time goes, kernel by kernel: ours (the library through the PyTorch
shim) next to PyTorch SDPA's flash (FA2) and cuDNN backends, forward and backward, timed by the
PyTorch profiler (CUPTI kernel records) in one process. bf16, FlashAttention grid shapes
(batch·N = 16384 tokens, heads·d = 2048). For short sequences, where a call's fixed parts (the
backward's preprocessing and dQ conversion kernels, launch gaps) weigh most.

    python3 bench/dev/kernel_times.py --lib build-gpu/libflashattn_torch_shim.so --configs 64:512:0,128:512:1

Per call: every kernel's mean GPU time (µs) and the sum; "span" is the first kernel's start to the
last one's end (sum + gaps between the call's kernels). Half of each implementation's calls run in
the listed order and half in reverse, so none always runs right after the same other one.
"""
import argparse
import os
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/: compare_torch
from compare_torch import Lib, grid_configs, grid_problem  # noqa: E402


def short(name, width=60):
    name = name.replace("flashattn::cuda::", "").replace("(anonymous namespace)::", "")
    return name if len(name) <= width else name[: width - 3] + "..."


def kernel_table(fn, calls):
    """Mean per-call kernel times of fn (µs) and the mean span of one call's kernels."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
    per_kernel = defaultdict(float)
    events = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0:
            if "memcpy" in e.name.lower() and "memset" not in e.name.lower():
                continue
            per_kernel[e.name] += e.time_range.elapsed_us() / calls
            events.append((e.time_range.start, e.time_range.end))
    events.sort()
    # one call = the kernels between two synchronizations: group by gaps longer than 50 µs
    spans, start, end = [], None, None
    for s, t in events:
        if start is None or s - end > 50:
            if start is not None:
                spans.append(end - start)
            start = s
        end = t if end is None else max(end, t)
    if start is not None:
        spans.append(end - start)
    span = sum(spans) / max(1, len(spans))
    return per_kernel, span


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--configs", default="64:512:0,64:512:1,128:512:1", help="d:N:causal,…")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--fwd-only", action="store_true", help="only the forwards of ours and cuDNN")
    a = ap.parse_args()
    lib = Lib(a.lib)
    for d, n, causal in grid_configs(a.configs):
        b, h, q, k, v, o, l = grid_problem(d, n)
        do = torch.randn_like(q)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
        dot = do.transpose(1, 2)
        runs = [("ours fwd", lambda: lib.forward(q, k, v, o, l, causal=causal)),
                ("ours bwd", lambda: lib.backward(q, k, v, o, do, l, dq, dk, dv, causal=causal))]
        for name, be in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(be):
                ot = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            runs.append((f"{name} fwd", lambda be=be: _sdpa(be, qt, kt, vt, causal)))
            runs.append((f"{name} bwd", lambda be=be, ot=ot: _grad(be, ot, qt, kt, vt, dot)))
        if a.fwd_only:
            runs = [r_ for r_ in runs if r_[0] in ("ours fwd", "cudnn fwd")]
        print(f"== d{d} N={n} b{b} h{h} causal={causal}")
        # Half the calls in the listed order, half in reverse (ABBA), averaged: the clock depends on
        # what ran just before (compare_torch.interleaved_ms), and ours always ran first.
        halves = {name: [] for name, _ in runs}
        for order in (runs, runs[::-1]):
            for name, fn in order:
                try:
                    halves[name].append(kernel_table(fn, max(1, a.calls // 2)))
                except Exception as ex:  # noqa: BLE001
                    halves[name].append(ex)
        for name, _ in runs:
            got = [h_ for h_ in halves[name] if not isinstance(h_, Exception)]
            if len(got) < 2:
                print(f"  {name}: {next(h_ for h_ in halves[name] if isinstance(h_, Exception))}")
                continue
            table = defaultdict(float)
            for t_, _ in got:
                for kname, us in t_.items():
                    table[kname] += us / len(got)
            span = sum(sp for _, sp in got) / len(got)
            total = sum(table.values())
            print(f"  {name:10s} sum {total:8.1f} µs  span {span:8.1f} µs")
            for kname, us in sorted(table.items(), key=lambda kv: -kv[1]):
                print(f"      {us:8.1f}  {short(kname)}")


def _sdpa(be, qt, kt, vt, causal):
    with sdpa_kernel(be):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)


def _grad(be, ot, qt, kt, vt, dot):
    with sdpa_kernel(be):
        return torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True)


if __name__ == "__main__":
    main()
