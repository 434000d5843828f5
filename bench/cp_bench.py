#!/usr/bin/env python3
"""Context-parallel attention (flashattn.context_parallel): per-rank time, the share of the ring's
communication hidden behind compute, and scaling against one process, for one total length.

For each P in --world, P spawned processes (gloo on CPU processes, or NCCL with --device cuda, one
GPU per rank) run, after --warmup calls, --reps timed calls (each between two barriers; the median):
  total    cp.attention forward (+ backward with --backward) on the rank's shard
  compute  the same ring calls (context_parallel._ring_tasks, torch.ops.flashattn.forward/backward,
           the LSE merge) with this rank's own K/V in place of the travelling blocks: no communication
  comm     the ring's sends and receives alone (the packed K/V shard, P - 1 steps; with --backward
           also the fp32 dK/dV accumulators, P steps)
  hidden   (compute + comm - total) / comm, clipped to [0, 1]: the part of the communication that
           overlapped compute (ring mode; for all2all, whose all-to-alls do not overlap, not printed)
One process (P = 1, no process group) times flashattn.torch.attention on the full sequence; scaling
efficiency = T(1) / (P · max over ranks of T(P)). On the CPU every process runs --threads threads
(default 1), so the comparison needs P · threads free cores.

usage: cp_bench.py [--world 2 4] [--seq 4096] [--heads 8] [--kv-heads 8] [--dim 64] [--dtype bf16]
                   [--mode ring|all2all] [--layout zigzag|contiguous] [--causal] [--backward]
                   [--device cpu|cuda] [--threads 1] [--reps 5] [--warmup 1] [--json out.json]
"""
import argparse
import datetime
import json
import math
import multiprocessing
import socket
import statistics
import sys
import time

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def _sync(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn, reps, warmup, torch, device, barrier=None):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if barrier:
            barrier()
        _sync(torch, device)
        t0 = time.perf_counter()
        fn()
        _sync(torch, device)
        times.append(time.perf_counter() - t0)
    if barrier:
        barrier()
    return statistics.median(times)


def _inputs(torch, args, device, seq):
    dtype = getattr(torch, DTYPES[args.dtype])
    gen = torch.Generator().manual_seed(0)
    shapes = ((1, seq, args.heads, args.dim), (1, seq, args.kv_heads, args.dim), (1, seq, args.kv_heads, args.dim))
    return [torch.randn(s, generator=gen).to(dtype=dtype, device=device) for s in shapes]


def _rank(rank, world, port, args, results):
    import torch
    import torch.distributed as dist
    from flashattn import context_parallel as cp

    torch.set_num_threads(args.threads)
    device = "cpu"
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    q, k, v = (cp.shard(t, None, args.layout) for t in _inputs(torch, args, device, args.seq))
    dout = torch.randn_like(q)
    if args.backward:
        q, k, v = (t.requires_grad_() for t in (q, k, v))

    def total():
        out = cp.attention(q, k, v, mode=args.mode, layout=args.layout, causal=args.causal)
        if args.backward:
            out.backward(dout)

    row = {"rank": rank, "total_s": _timed(total, args.reps, args.warmup, torch, device, dist.barrier)}
    if args.mode == "ring":
        s_local = q.shape[1]
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        scale = 1.0 / math.sqrt(args.dim)
        tasks = [cp._ring_tasks(args.layout, rank, (rank - s) % world, world, s_local, args.causal, -1, -1)
                 for s in range(world)]
        work = cp._work_dtype(qd)

        def compute():
            B, S, H, d = qd.shape
            acc = torch.zeros((B, S, H, d), dtype=torch.float32, device=device)
            lse_acc = torch.full((B, H, S), -math.inf, dtype=torch.float32, device=device)
            qw, kw, vw = qd.to(work), kd.to(work), vd.to(work)
            for step in tasks:
                for q0, q1, k0, k1, wl, wr in step:
                    o, l = torch.ops.flashattn.forward(qw[:, q0:q1], kw[:, k0:k1], vw[:, k0:k1], scale, False, wl,
                                                       wr, 0.0, None, None, 0, 0, "flash", False, None)
                    cp._merge(acc, lse_acc, q0, q1, o, l)
            if args.backward:
                out = acc.to(work)
                for step in tasks:
                    for q0, q1, k0, k1, wl, wr in step:
                        torch.ops.flashattn.backward(dout[:, q0:q1].to(work), qw[:, q0:q1], kw[:, k0:k1],
                                                     vw[:, k0:k1], out[:, q0:q1], lse_acc[:, :, q0:q1], scale,
                                                     False, wl, wr, 0.0, None, None, 0, 0, "flash", False, None)

        nxt, prv = (rank + 1) % world, (rank - 1) % world
        kv = torch.stack((kd, vd))
        buf = torch.empty_like(kv)
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=device)
        dkv_buf = torch.empty_like(dkv)

        def comm():
            for _ in range(2 if args.backward else 1):
                for _ in range(world - 1):
                    cp._wait(cp._exchange(kv, buf, None, nxt, prv, cp._TAG_KV))
            if args.backward:
                for _ in range(world):
                    cp._wait(cp._exchange(dkv, dkv_buf, None, nxt, prv, cp._TAG_DKV))

        row["compute_s"] = _timed(compute, args.reps, args.warmup, torch, device, dist.barrier)
        row["comm_s"] = _timed(comm, args.reps, args.warmup, torch, device, dist.barrier)
        if row["comm_s"] > 0:
            hidden = (row["compute_s"] + row["comm_s"] - row["total_s"]) / row["comm_s"]
            row["hidden"] = min(1.0, max(0.0, hidden))
    dist.destroy_process_group()
    results.put(row)


def _single(args):
    import torch
    import flashattn.torch as fat

    torch.set_num_threads(args.threads)
    device = "cuda" if args.device == "cuda" else "cpu"
    q, k, v = _inputs(torch, args, device, args.seq)
    dout = torch.randn_like(q)
    if args.backward:
        q, k, v = (t.requires_grad_() for t in (q, k, v))

    def call():
        out = fat.attention(q, k, v, causal=args.causal)
        if args.backward:
            out.backward(dout)

    return _timed(call, args.reps, args.warmup, torch, device)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, nargs="+", default=[2])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--mode", choices=["ring", "all2all"], default="ring")
    ap.add_argument("--layout", choices=["zigzag", "contiguous"], default="zigzag")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.dtype == "f32" and args.device == "cuda":
        sys.exit("f32 runs on the CPU only (the CUDA flash kernels are 16-bit)")

    t1 = _single(args)
    what = "fwd+bwd" if args.backward else "fwd"
    print(f"{args.mode} {args.layout} {'causal ' if args.causal else ''}{what} S={args.seq} H={args.heads} "
          f"Hkv={args.kv_heads} d={args.dim} {args.dtype} {args.device} threads/process={args.threads}")
    print(f"P=1 (one process, flashattn.torch.attention): {t1 * 1e3:.2f} ms")
    report = {"args": vars(args), "single_s": t1, "runs": []}
    ctx = multiprocessing.get_context("spawn")
    for world in args.world:
        results = ctx.Queue()
        port = _free_port()
        procs = [ctx.Process(target=_rank, args=(r, world, port, args, results)) for r in range(world)]
        for p in procs:
            p.start()
        rows = sorted((results.get() for _ in range(world)), key=lambda r: r["rank"])
        for p in procs:
            p.join()
        slowest = max(r["total_s"] for r in rows)
        eff = t1 / (world * slowest)
        print(f"P={world}: scaling efficiency {eff * 100:.0f}% (T1 / (P x slowest rank))")
        for r in rows:
            line = f"  rank {r['rank']}: total {r['total_s'] * 1e3:8.2f} ms"
            if "compute_s" in r:
                line += f"  compute {r['compute_s'] * 1e3:8.2f} ms  comm {r['comm_s'] * 1e3:8.2f} ms"
            if "hidden" in r:
                line += f"  hidden {r['hidden'] * 100:3.0f}%"
            print(line)
        report["runs"].append({"world": world, "efficiency": eff, "ranks": rows})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
