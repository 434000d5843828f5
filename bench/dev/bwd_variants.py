#!/usr/bin/env python3
"""Times the Hopper backward kernel's variants (FLASHATTN_SM90_BWD_FLAGS, src/cuda/sm90/args.hpp)
on the FlashAttention grid's shapes, one process per variant, bf16, TFLOP/s (2.5 x forward FLOPs).

    python3 bench/dev/bwd_variants.py --lib build-gpu/libflashattn_torch_shim.so --flags 0,1,2,3 \
        --dims 64,128 --seqlens 512,2048,8192

FLASHATTN_SM90_* variables (the default --var among them) are experiment knobs that the library
reads only when built with -DFLASHATTN_DEV_KNOBS=ON: scripts/dev/gpu-check configures so when its
VARIANTS or CHECK_FLAGS set one (DEV_KNOBS=ON forces it); against a build without it every value
times the same code.

--var NAME varies another environment variable instead (its values in --flags), e.g.
--var FLASHATTN_CUDA_SCRATCH_CACHE --flags 0,1073741824; --fwd times the forward instead (4 x FLOPs),
e.g. --fwd --var FLASHATTN_SM90_FWD_SCHED --flags static,dynamic. --var LIB compares builds: the
values are labels of --libs label=path,… (a trailing x repeats a label: run-order bias), e.g.
--var LIB --flags new,base,newx,basex --libs new=build-gpu/libflashattn_torch_shim.so,base=….

Variants that drop work (flag 4: no dQ atomics) give wrong gradients on purpose: they only show
what the dropped part costs. The comparison with PyTorch lives in compare_torch.py --bench.
"""
import argparse
import os
import subprocess
import sys


def child(lib_path, dims, seqlens, reps, fwd=False):
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/: compare_torch
    from compare_torch import Lib, grid_flops, grid_problem, median_ms

    lib = Lib(lib_path)
    for d in dims:
        for causal in (False, True):
            for n in seqlens:
                b, h, q, k, v, o, l = grid_problem(d, n)
                do = torch.randn_like(q)
                lib.forward(q, k, v, o, l, causal=causal)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
                if fwd:
                    ms = median_ms(lambda: lib.forward(q, k, v, o, l, causal=causal), reps)
                else:
                    ms = median_ms(lambda: lib.backward(q, k, v, o, do, l, dq, dk, dv, causal=causal), reps)
                flops = (1.0 if fwd else 2.5) * grid_flops(b, h, n, d, causal)
                print(f"d{d} {'causal' if causal else 'full'} N={n}: {flops / ms / 1e9:.1f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--flags", default="0,1,2,3", help="values of --var, one process each")
    ap.add_argument("--var", default="FLASHATTN_SM90_BWD_FLAGS")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--seqlens", default="512,2048,8192")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--fwd", action="store_true", help="time the forward, not the backward")
    ap.add_argument("--libs", default="", help="with --var LIB: label=path,… ")
    a = ap.parse_args()
    libs = dict(x.split("=", 1) for x in a.libs.split(",") if x)
    dims = [int(x) for x in a.dims.split(",")]
    seqlens = [int(x) for x in a.seqlens.split(",")]
    if a.child:
        child(a.lib, dims, seqlens, a.reps, a.fwd)
        return
    table = {}
    for f in a.flags.split(","):
        lib = a.lib
        if a.var == "LIB":
            env, lib = dict(os.environ), libs[f.rstrip("x")]
        else:
            env = dict(os.environ, **{a.var: f})
        r = subprocess.run([sys.executable, __file__, "--child", "--lib", lib, "--dims", a.dims, "--seqlens",
                            a.seqlens, "--reps", str(a.reps)] + (["--fwd"] if a.fwd else []), env=env, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{a.var}={f}: FAILED\n{r.stderr[-2000:]}", flush=True)
            continue
        for line in r.stdout.splitlines():
            key, val = line.rsplit(":", 1)
            table.setdefault(key, {})[f] = float(val)
    flags = a.flags.split(",")
    print(f"{'forward' if a.fwd else 'backward'} TFLOP/s by {a.var}")
    print(f"{'config':22s}" + "".join(f"{f:>12s}" for f in flags))
    for key, row in table.items():
        print(f"{key:22s}" + "".join(f"{row.get(f, float('nan')):12.1f}" for f in flags))


if __name__ == "__main__":
    main()
