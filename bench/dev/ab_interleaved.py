#!/usr/bin/env python3
"""Same-process A/B of forward (or, with --bwd, backward) variants, interleaved: several builds of the library (or one build
under different FLASHATTN_* knobs) timed call batch by call batch in a rotating order, so every
variant sees the same clock and power state (the H200 sits at its power limit under this load and
its clock follows what ran just before; bench/dev/sustained.py). bwd_variants.py instead runs one
process per variant, whose spread (±5–15 % at short N) swamps the effects being measured.

A variant is  name=path  or  name=path:VAR=VALUE[:VAR=VALUE…]. Each variant loads its own copy of
the library (the knobs are read once per library instance, at its first call), with its
environment set while that first call runs. The library reads its FLASHATTN_SM90_* experiment
knobs only when built with -DFLASHATTN_DEV_KNOBS=ON (DEV_KNOBS=ON scripts/dev/gpu-check); a build
without it ignores them, and every knob variant then times the same code.

  python3 bench/dev/ab_interleaved.py --variants "base=build-gpu/libflashattn_torch_shim.so,\\
      m128=build-gpu/libflashattn_torch_shim.so:FLASHATTN_SM90_FWD_BLOCK_M=128" --configs 64:512:1
Prints, per configuration, the median ms per call of each variant (batches of --batch calls back
to back between two CUDA events, --rounds rounds) and its speed relative to the first variant.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/: compare_torch
from compare_torch import Lib, call_times, grid_configs, grid_problem  # noqa: E402


def load_variants(spec, tmp):
    out = []
    for item in spec.split(","):
        name, rest = item.split("=", 1)
        path, *envs = rest.split(":")
        copy = os.path.join(tmp, f"lib_{name}.so")
        shutil.copy(path, copy)
        out.append((name, Lib(copy), dict(e.split("=", 1) for e in envs)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", required=True)
    ap.add_argument("--configs", default="128:2048:0")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--batch", type=int, default=5)
    ap.add_argument("--bwd", action="store_true", help="time the backward (out and LSE from the first variant's forward)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ab_")
    variants = load_variants(a.variants, tmp)
    names = [v[0] for v in variants]
    first = True
    print(f"{'config':16s} " + " ".join(f"{n:>12s}" for n in names) + "   (ms per call; x: speed vs " + names[0] + ")")
    for d, n, causal in grid_configs(a.configs):
        _, _, q, k, v, o, l = grid_problem(d, n)
        if a.bwd:
            do = torch.randn_like(q)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
            variants[0][1].forward(q, k, v, o, l, causal=causal)
        fns = {}
        for name, lib, env in variants:
            fn = (lib.bind_backward(q, k, v, o, do, l, dq, dk, dv, causal=causal) if a.bwd
                  else lib.bind_forward(q, k, v, o, l, causal=causal))
            if first:  # the knobs are read at a library's first call
                saved = {key: os.environ.get(key) for key in env}
                os.environ.update(env)
                fn()
                torch.cuda.synchronize()
                for key, val in saved.items():
                    if val is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = val
            fns[name] = fn
        first = False
        samples = {name: [] for name in names}
        for name in names:
            for _ in range(2):
                fns[name]()
        torch.cuda.synchronize()
        for r in range(a.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                samples[name] += call_times(fns[name], 1, a.batch, warmup=0)
        med = {name: statistics.median(s) for name, s in samples.items()}
        base = med[names[0]]
        print(f"d{d} N={n} {'causal' if causal else 'full  '} " + " ".join(
            f"{med[name]:7.3f} {base / med[name]:4.2f}x" for name in names), flush=True)


if __name__ == "__main__":
    main()
