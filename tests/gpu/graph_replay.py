#!/usr/bin/env python3
"""One library build's forward captured in a CUDA graph and replayed on fresh inputs, checked
against PyTorch's attention in float32, under a watchdog (a replay that does not finish within
--seconds is reported as a hang and the process exits 2). What python/tests/test_torch.py's
test_cuda_graph_replay checks for the installed package, for any build of the torch shim (e.g. a
tree under .ab/):

  python3 tests/gpu/graph_replay.py --lib build-gpu/libflashattn_torch_shim.so --configs 128:2048:0:20
Configs d:N:causal:heads (batch 1, bf16).
"""
import argparse
import os
import sys
import threading

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))  # compare_torch
from compare_torch import Lib  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--configs", default="128:2048:0:20,64:2048:0:30,128:2048:1:20")
    ap.add_argument("--replays", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20)
    args = ap.parse_args()
    lib = Lib(args.lib)
    gen = torch.Generator(device="cuda").manual_seed(11)
    failed = False
    for cfg in args.configs.split(","):
        d, n, causal, heads = (int(x) for x in cfg.split(":"))
        q, k, v = (torch.empty((1, n, heads, d), device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        lse = torch.empty((1, heads, n), device="cuda", dtype=torch.float32)
        for t in (q, k, v):
            t.normal_(generator=gen)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture
            lib.bind_forward(q, k, v, out, lse, causal=bool(causal))()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            lib.bind_forward(q, k, v, out, lse, causal=bool(causal))()
        for r in range(args.replays):
            for t in (q, k, v):
                t.normal_(generator=gen)
            out.fill_(float("nan"))
            done = threading.Event()

            def watchdog(r=r):
                if not done.wait(args.seconds):
                    print(f"d{d} N={n} causal={causal} heads={heads}: HANG in replay {r}", flush=True)
                    os._exit(2)

            threading.Thread(target=watchdog, daemon=True).start()
            graph.replay()
            torch.cuda.synchronize()
            done.set()
            want = F.scaled_dot_product_attention(*(t.float().transpose(1, 2) for t in (q, k, v)),
                                                  is_causal=bool(causal)).transpose(1, 2)
            err = (out.float() - want).abs().max().item()
            ok = err == err and err < 3e-2
            failed |= not ok
            print(f"d{d} N={n} causal={causal} heads={heads} replay {r}: max error {err:.2e} {'ok' if ok else 'FAIL'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
