#!/usr/bin/env python3
"""Decoding over a KV cache: flashattn's forward_kvcache against PyTorch's SDPA, same machine, same run.

One query token per sequence attends to the whole cache (H 32 over Hkv 8, d 128). Shapes:
  cpu : B 1, cache 32K and 128K tokens, f32 and bf16, the cache contiguous and paged (16 tokens a page)
  cuda: bf16, B 1, 8, 64, 128 over cache 4K, 32K, 128K, contiguous and paged (16)
Ours: `flashattn decode --json` (its time is the median of --reps calls, each after the caches are
flushed; its read bandwidth is the machine's, measured by the program). PyTorch: scaled_dot_product_attention
with enable_gqa=True over the dense cache (B, Hkv, cache, d), timed the same way (a read of twice the
last-level cache / L2 of another buffer before each call, or with --flush write a write of it, whose
dirty lines' write-backs then overlap the call; CPU: wall time, torch.set_num_threads as
OMP_NUM_THREADS for ours; CUDA: events, the flash and cuDNN backends separately through sdpa_kernel,
each call after a GPU wait of --queue-ahead µs queued behind the flush, so that the host's work
for the call, PyTorch's dispatch or ours, overlaps it and the events time the GPU alone).
Rates count the KV bytes only, 2·B·cache·Hkv·d·element size, for both.

usage: decode_vs_torch.py --flashattn build/tools/flashattn [--device cpu|cuda] [--threads N]
                          [--reps 10] [--flush read|write] [--queue-ahead 200] [--json rows.json]
Without PyTorch, prints ours only and says so.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

H, HKV, D = 32, 8, 128
ELEM = {"f32": 4, "f16": 2, "bf16": 2}


def shapes(device):
    """(dtype, page_size, batch, cache) of the comparison; page_size 0 = contiguous."""
    if device == "cuda":
        return [("bf16", p, b, n) for p in (0, 16) for b in (1, 8, 64, 128) for n in (4096, 32768, 131072)]
    return [(dt, p, 1, n) for dt in ("f32", "bf16") for p in (0, 16) for n in (32768, 131072)]


def ours(binary, device, dtype, page, batches, caches, threads, reps, flush, queue_us):
    """Rows of one `flashattn decode --json` run, keyed by (batch, cache); the build line it printed."""
    env = dict(os.environ)
    if device == "cpu":
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [binary, "decode", "--device", device, "--dtype", dtype, "--batch", *map(str, batches),
           "--cache", *map(str, caches), "--heads", str(H), "--heads-kv", str(HKV), "--head-dim", str(D),
           "--paged", str(page), "--reps", str(reps), "--flush", flush, "--queue-ahead", str(queue_us), "--json"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    info = next((ln.strip() for ln in r.stderr.splitlines() if ln.startswith("flashattn: ")), "")
    try:
        rows = json.loads(r.stdout)
    except json.JSONDecodeError:
        msg = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return {}, info, f"exit {r.returncode}: {msg}"
    return {(row["batch"], row["cache_len"]): row for row in rows}, info, ""


class Torch:
    """PyTorch's SDPA for one query token over a dense cache, timed as flashattn decode times itself."""

    def __init__(self, device, threads, flush, queue_us):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.torch, self.F, self.sdpa_kernel, self.device = torch, F, sdpa_kernel, device
        if device == "cuda":
            props = torch.cuda.get_device_properties(0)
            self.machine = props.name
            self.backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
            flush_bytes = 2 * props.L2_cache_size
        else:
            torch.set_num_threads(threads)
            self.machine = cpu_model()
            self.backends = {"flash": SDPBackend.FLASH_ATTENTION}
            flush_bytes = 2 * last_level_cache()
        self.flush = torch.zeros(flush_bytes, dtype=torch.uint8, device=device)
        self.write_flush = flush == "write"
        self.wait_cycles = 0
        if device == "cuda" and queue_us > 0:  # torch.cuda._sleep spins in GPU clock cycles: measure them
            torch.cuda._sleep(1000)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            torch.cuda._sleep(10_000_000)
            end.record()
            end.synchronize()
            self.wait_cycles = int(queue_us * 1e-3 * 10_000_000 / begin.elapsed_time(end))
        self.version = torch.__version__

    def time_ms(self, dtype, batch, cache, backend, reps):
        torch, F = self.torch, self.F
        dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
        g = torch.Generator(device=self.device).manual_seed(int.from_bytes(os.urandom(4), "little"))
        q = torch.randn(batch, H, 1, D, generator=g, device=self.device, dtype=dt)
        k = torch.randn(batch, HKV, cache, D, generator=g, device=self.device, dtype=dt)
        v = torch.randn(batch, HKV, cache, D, generator=g, device=self.device, dtype=dt)

        def call():
            with torch.no_grad(), self.sdpa_kernel(self.backends[backend]):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        call()  # warm-up; raises where the backend does not take the shape
        times = []
        for r in range(reps):
            if self.write_flush:
                self.flush.fill_(r & 0xFF)
            else:
                self.flush.max()  # a read of every byte (a reduction to one element)
            if self.wait_cycles:
                torch.cuda._sleep(self.wait_cycles)
            if self.device == "cuda":
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                call()
                end.record()
                end.synchronize()
                times.append(begin.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                call()
                times.append(1e3 * (time.perf_counter() - t0))
        del q, k, v
        return statistics.median(times)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def last_level_cache():
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            n = os.sysconf(name)
            if n > 0:
                return n
        except (ValueError, OSError):
            pass
    return 32 << 20


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashattn", required=True, help="the flashattn program (build/tools/flashattn)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="CPU threads, both sides")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--flush", choices=["read", "write"], default="read",
                    help="before each call, both sides: read (or write) twice the last-level cache / L2")
    ap.add_argument("--queue-ahead", type=float, default=200.0,
                    help="CUDA: µs of GPU wait queued after the flush before each call, both sides, so that the "
                         "host's launch work overlaps it and the events time the GPU (0 = none)")
    ap.add_argument("--json", help="write every row (ours and PyTorch's) here")
    a = ap.parse_args()

    todo = shapes(a.device)
    mine, errors = {}, {}
    for dtype, page in sorted({(s[0], s[1]) for s in todo}):
        sel = [s for s in todo if s[:2] == (dtype, page)]
        rows, info, err = ours(a.flashattn, a.device, dtype, page, sorted({s[2] for s in sel}),
                               sorted({s[3] for s in sel}), a.threads, a.reps, a.flush, a.queue_ahead)
        if info and not mine and not errors:
            print(f"# {info[:400]}", flush=True)
        for key, row in rows.items():
            mine[(dtype, page) + key] = row
        if err:
            errors[(dtype, page)] = err

    try:
        torch_side = Torch(a.device, a.threads, a.flush, a.queue_ahead)
        backends = list(torch_side.backends)
        print(f"# PyTorch {torch_side.version}, SDPA backends: {', '.join(backends)}", flush=True)
    except Exception as e:  # absent, or no device for it
        torch_side, backends = None, []
        print(f"# PyTorch not available ({type(e).__name__}: {e}): ours only", flush=True)

    measured = [r for r in mine.values() if r.get("read_bw_bytes_per_s") is not None]
    machine = measured[0]["machine"] if measured else (torch_side.machine if torch_side else "?")
    where = f"{machine}, {a.threads} threads" if a.device == "cpu" else machine
    if measured:
        bws = sorted({r["read_bw_bytes_per_s"] for r in measured})
        bw = f"{bws[0] / 1e9:.1f} GB/s" if len(bws) == 1 else \
            f"{bws[0] / 1e9:.1f} to {bws[-1] / 1e9:.1f} GB/s over its {len(bws)} runs (each row against its own run's)"
        print(f"# {where}; read bandwidth measured by flashattn decode: {bw}; {measured[0]['read_bw_method']}", flush=True)
    else:
        print(f"# {where}", flush=True)
    head = f"{'dtype':5s} {'B':>4s} {'cache':>7s} {'layout':>10s} | {'ours GB/s':>9s} {'% read BW':>9s}"
    for b in backends:
        head += f" | {'torch ' + b + ' GB/s':>16s} {'ratio':>6s}"
    print(head, flush=True)

    torch_ms = {}  # (dtype, batch, cache, backend) -> ms or an error: one measurement serves both layouts
    out_rows = []
    for dtype, page, batch, cache in todo:
        kv_bytes = 2 * batch * cache * HKV * D * ELEM[dtype]
        row = mine.get((dtype, page, batch, cache))
        rec = {"device": a.device, "machine": machine, "dtype": dtype, "batch": batch, "cache_len": cache,
               "heads": H, "heads_kv": HKV, "head_dim": D, "page_size": page, "kv_bytes": kv_bytes, "flush": a.flush,
               "queue_ahead_us": a.queue_ahead if a.device == "cuda" else 0,
               "ours": row if row is not None else {"error": errors.get((dtype, page), "no row")}}
        if a.device == "cpu":
            rec["threads"] = a.threads
        layout = f"paged {page}" if page else "contiguous"
        line = f"{dtype:5s} {batch:4d} {cache // 1024:6d}K {layout:>10s} | "
        ours_rate = None
        if row is not None and row.get("kv_bytes_per_s") is not None:
            ours_rate = row["kv_bytes_per_s"]
            check = "" if row.get("ok", True) else " FAIL"
            line += f"{ours_rate / 1e9:9.1f} {100 * row['read_bw_fraction']:8.0f}%{check}"
        else:
            why = (row or {}).get("skipped") or (row or {}).get("error") or errors.get((dtype, page), "not run")
            line += f"{'—':>9s} {'—':>9s}"
            rec["ours_note"] = why
        for b in backends:
            key = (dtype, batch, cache, b)
            if key not in torch_ms:
                try:
                    torch_ms[key] = torch_side.time_ms(dtype, batch, cache, b, a.reps)
                except Exception as e:  # the backend refuses the shape, or memory runs out
                    torch_ms[key] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
                    if a.device == "cuda":
                        torch_side.torch.cuda.empty_cache()
            ms = torch_ms[key]
            if isinstance(ms, float):
                rate = kv_bytes / (ms * 1e-3)
                rec[f"torch_{b}"] = {"time_ms": ms, "kv_bytes_per_s": rate}
                ratio = f"{ours_rate / rate:5.2f}x" if ours_rate else "—"
                line += f" | {rate / 1e9:16.1f} {ratio:>6s}"
            else:
                rec[f"torch_{b}"] = {"error": ms}
                line += f" | {'not run':>16s} {'—':>6s}"
        print(line, flush=True)
        out_rows.append(rec)

    notes = sorted({r["ours_note"] for r in out_rows if "ours_note" in r})
    for n in notes:
        print(f"# ours not run: {n}")
    for key, ms in sorted(torch_ms.items()):
        if not isinstance(ms, float):
            print(f"# torch {key[3]} {key[0]} B={key[1]} cache={key[2]}: {ms}")
    print("# ratio = ours GB/s / torch GB/s (above 1: ours faster); GB/s = KV bytes 2·B·cache·Hkv·d·elem / time")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out_rows, f, indent=1)
        print(f"# wrote {len(out_rows)} rows to {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
