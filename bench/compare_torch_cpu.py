#!/usr/bin/env python3
"""CPU comparison: flashattn's CPU flash path vs PyTorch's CPU flash attention, same machine, same run.

Shapes of issue 2's bar: fp32, B=1, H=8, N=4096, head_dim 64 and 128, causal and not, forward and
backward; at each thread count given. FLOPs: forward 4·B·H·N²·d (half for causal), backward 2.5x.
Our numbers come from `flashattn bench --json` run with OMP_NUM_THREADS; PyTorch's from
scaled_dot_product_attention under SDPBackend.FLASH_ATTENTION with torch.set_num_threads.

usage: compare_torch_cpu.py --flashattn build/tools/flashattn --threads 2 16 [--seqlen 4096] [--bind both]

Our program runs unbound (as PyTorch does) and, with --bind close/both, also with
OMP_PROC_BIND=close OMP_PLACES=cores; the places libgomp made are printed (OMP_DISPLAY_ENV), since
on a VM the "cores" it sees decide how many threads share one (16 threads, bound, gave only ~2x
the 2-thread rate on the H200 machine: docs/perf/log.md, P-022).
"""
import argparse
import json
import os
import statistics
import subprocess
import time


def torch_rates(threads, n, d, causal, heads, reps):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    q, k, v = (torch.randn(1, heads, n, d, generator=g, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, heads, n, d, generator=g)
    flops = 4 * heads * n * n * d / (2 if causal else 1)

    def fwd():
        with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        o.backward(dout)

    def median_s(fn):
        fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    tf = median_s(fwd)
    tfb = median_s(fwd_bwd)
    return flops / tf / 1e9, 2.5 * flops / max(tfb - tf, 1e-9) / 1e9


def ours(binary, threads, n, heads, reps, bind):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_DISPLAY_ENV="verbose")
    env.pop("OMP_PROC_BIND", None)
    env.pop("OMP_PLACES", None)
    if bind:
        env.update(OMP_PROC_BIND="close", OMP_PLACES="cores")
    r = subprocess.run([binary, "bench", "--device", "cpu", "--dtype", "f32", "-N", str(n), "-d", "64", "128",
                        "--heads", str(heads), "--causal", "both", "--backward", "--check-rows", "2",
                        "--reps", str(reps), "--json"], env=env, check=True, capture_output=True, text=True)
    info = [ln.strip() for ln in r.stderr.splitlines() if ln.startswith("flashattn: cpu backend")]
    if info:
        print(f"# {info[0][:400]}", flush=True)
    places = [ln.strip() for ln in r.stderr.splitlines() if "OMP_PLACES" in ln or "OMP_PROC_BIND" in ln]
    print(f"# ours, {threads} threads, {'bound' if bind else 'unbound'}: {'; '.join(places)[:300]}", flush=True)
    rows = json.loads(r.stdout)
    return {(r_["head_dim"], r_["causal"]): (r_["fwd_flops_per_s"] / 1e9, r_["bwd_flops_per_s"] / 1e9, r_.get("ok", True))
            for r_ in rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashattn", required=True)
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 16])
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bind", choices=["none", "close", "both"], default="both")
    a = ap.parse_args()
    print(f"# cpus: {os.cpu_count()}, sched affinity: {len(os.sched_getaffinity(0))}", flush=True)
    binds = {"none": [False], "close": [True], "both": [False, True]}[a.bind]
    print("threads bind  d causal | ours fwd GFLOP/s torch fwd ratio | ours bwd torch bwd ratio | check")
    for t in a.threads:
        mine = {b: ours(a.flashattn, t, a.seqlen, a.heads, a.reps, b) for b in binds}
        for d in (64, 128):
            for causal in (False, True):
                tf, tb = torch_rates(t, a.seqlen, d, causal, a.heads, a.reps)
                for b in binds:
                    of, ob, ok = mine[b][(d, causal)]
                    print(f"{t:7d} {'close' if b else 'none':5s} {d:3d} {'yes' if causal else 'no':>6} | {of:8.1f} "
                          f"{tf:8.1f} {of / tf:5.2f}x | {ob:8.1f} {tb:8.1f} {ob / tb:5.2f}x | {'ok' if ok else 'FAIL'}",
                          flush=True)


if __name__ == "__main__":
    main()
