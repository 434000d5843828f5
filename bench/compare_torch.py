#!/usr/bin/env python3
"""flashattn CUDA kernels vs PyTorch, in one process (scripts/dev/gpu-check runs it).

  --check : correctness of our flash and standard paths against a float64 reference written here in
            plain torch (its own mask), fresh random inputs; 50x bitwise repeat (forward and
            deterministic backward); fully-masked rows; inputs x10 and x30.
  --bench : the FlashAttention grid (batch*seqlen = 16384, heads*head_dim = 2048, seqlen 512..16384,
            head_dim 64/128/256, causal and not), forward and backward TFLOP/s of ours vs SDPA's flash
            (FlashAttention-2) and cuDNN backends; median of CUDA-event timings after warm-up, the
            implementations interleaved (interleaved_ms), per call and back to back; FlashAttention-4
            (`flash_attn.cute`, the flash-attn-4 wheel) in the same rows where it imports (--fa4 auto);
            --det adds our deterministic backward (Options::deterministic) to the same rounds.
Our library is reached through bench/torch_shim.cpp (ctypes, raw device pointers).
"""
import argparse, contextlib, ctypes, functools, json, math, statistics, sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


class Call(ctypes.Structure):
    _fields_ = [("scale", ctypes.c_float), ("causal", ctypes.c_int), ("window_left", ctypes.c_int),
                ("window_right", ctypes.c_int), ("softcap", ctypes.c_float),
                ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
                ("max_seqlen_q", ctypes.c_int), ("max_seqlen_k", ctypes.c_int), ("varlen_batch", ctypes.c_int),
                ("algorithm", ctypes.c_int), ("deterministic", ctypes.c_int), ("stream", ctypes.c_void_p)]


class Lib:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        for f in (self.lib.fa_forward, self.lib.fa_backward):
            f.restype = ctypes.c_char_p
        self.lib.fa_info.restype = ctypes.c_char_p

    @staticmethod
    def _pack(ts):
        ptrs = (ctypes.c_void_p * len(ts))(*[t.data_ptr() if t is not None else 0 for t in ts])
        shapes, strides = [], []
        for t in ts:
            shapes += list(t.shape) if t is not None else [0] * 4
            strides += list(t.stride()) if t is not None else [0] * 4
        return ptrs, (ctypes.c_int64 * len(shapes))(*shapes), (ctypes.c_int64 * len(strides))(*strides)

    @staticmethod
    def _call(kw, q):
        cq, ck = kw.get("cu_q"), kw.get("cu_k")
        return Call(kw.get("scale", 0.0), int(kw.get("causal", False)), kw.get("wl", -1), kw.get("wr", -1),
                    kw.get("softcap", 0.0), cq.data_ptr() if cq is not None else None,
                    ck.data_ptr() if ck is not None else None, kw.get("max_q", 0), kw.get("max_k", 0),
                    (cq.numel() - 1) if cq is not None else 0,
                    1 if kw.get("algo") == "standard" else 0, int(kw.get("deterministic", False)),
                    torch.cuda.current_stream().cuda_stream)

    def bind_forward(self, q, k, v, out, lse, **kw):
        """A zero-argument call of the forward with its ctypes arguments packed once: what a timing
        loop should repeat (the packing is this harness's Python cost, not the library's)."""
        lse4 = lse.unsqueeze(-1) if lse is not None else None
        args = (*self._pack([q, k, v, out, lse4]), ctypes.byref(self._call(kw, q)))
        return lambda: self._raise(self.lib.fa_forward(args[0], DT[q.dtype], *args[1:]))

    def bind_backward(self, q, k, v, out, dout, lse, dq, dk, dv, **kw):
        args = (*self._pack([q, k, v, out, dout, lse.unsqueeze(-1), dq, dk, dv]), ctypes.byref(self._call(kw, q)))
        return lambda: self._raise(self.lib.fa_backward(args[0], DT[q.dtype], *args[1:]))

    @staticmethod
    def _raise(err):
        if err:
            raise RuntimeError(err.decode())

    def forward(self, q, k, v, out, lse, **kw):
        self.bind_forward(q, k, v, out, lse, **kw)()

    def backward(self, q, k, v, out, dout, lse, dq, dk, dv, **kw):
        self.bind_backward(q, k, v, out, dout, lse, dq, dk, dv, **kw)()


# ---------------------------------------------------------------------------------------------
# Reference (float64, materialized), independent of the kernels' mask code.
def ref_attention(q, k, v, scale, causal, wl, wr, softcap, dtype=torch.float64):
    """q (Nq, H, d), k/v (Nk, Hkv, d) of one sequence -> out (Nq, H, d), lse (H, Nq)."""
    nq, h, d = q.shape
    nk, hkv = k.shape[0], k.shape[1]
    g = h // hkv
    qq, kk, vv = (x.to(dtype).transpose(0, 1) for x in (q, k, v))
    kk = kk.repeat_interleave(g, 0)
    vv = vv.repeat_interleave(g, 0)
    s = torch.matmul(qq, kk.transpose(1, 2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(nq, device=q.device)[:, None]
    j = torch.arange(nk, device=q.device)[None, :]
    diag = i + nk - nq
    right = 0 if causal else wr
    vis = torch.ones(nq, nk, dtype=torch.bool, device=q.device)
    if wl >= 0:
        vis &= j >= diag - wl
    if right >= 0:
        vis &= j <= diag + right
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    p = torch.nan_to_num(p, nan=0.0)
    out = torch.matmul(p.to(dtype), vv)
    return out.transpose(0, 1), lse


def ref_call(q, k, v, dout, cu_q, cu_k, scale, causal, wl, wr, softcap, dtype=torch.float64):
    """Batched/varlen reference with autograd: returns out, lse (B,H,Nq), dq, dk, dv."""
    qr, kr, vr = (x.detach().to(dtype).requires_grad_(True) for x in (q, k, v))
    outs, lses = [], []
    if cu_q is None:
        for b in range(q.shape[0]):
            o, l = ref_attention(qr[b], kr[b], vr[b], scale, causal, wl, wr, softcap, dtype)
            outs.append(o), lses.append(l)
        out, lse = torch.stack(outs), torch.stack(lses)
    else:
        cq, ck = cu_q.tolist(), cu_k.tolist()
        for b in range(len(cq) - 1):
            o, l = ref_attention(qr[0, cq[b]:cq[b + 1]], kr[0, ck[b]:ck[b + 1]], vr[0, ck[b]:ck[b + 1]],
                                 scale, causal, wl, wr, softcap, dtype)
            outs.append(o), lses.append(l)
        out, lse = torch.cat(outs)[None], torch.cat(lses, 1)[None]
    out.backward(dout.to(dtype))
    return out.detach(), lse.detach(), qr.grad, kr.grad, vr.grad


def err(x, ref):
    x, ref = x.double(), ref.double()
    fin = torch.isfinite(ref)
    d = (x - ref).abs()
    d = torch.where(fin, d, torch.where(x == ref, torch.zeros_like(d), torch.full_like(d, float("inf"))))
    return d.max().item() if d.numel() else 0.0


def case_inputs(dtype, b, nq, nk, h, hkv, d, causal=False, wl=-1, wr=-1, softcap=0.0, varlen=None,
                mult=1.0, gen=None, kramp=0.0):
    """A check case's fresh random q, k, v, dout (varlen: packed, batch 1) and the library call's
    keyword arguments (algo and deterministic are the caller's). kramp > 0 scales key j by
    1 + kramp·(1 − j/nk): the kernels visit key tiles last to first, so a row's maximum score grows
    tile after tile (by more than the lazy rescale's 2^8 at kramp 20, by more than 2^128, fp32's
    range, at kramp 600)."""
    dev = "cuda"
    cu_q = cu_k = None
    max_q = max_k = 0
    if varlen is not None:
        lq, lk = varlen
        cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device=dev)
        cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32, device=dev)
        b, nq, nk, max_q, max_k = 1, sum(lq), sum(lk), max(lq), max(lk)
    q = (torch.randn(b, nq, h, d, device=dev, generator=gen) * mult).to(dtype)
    k = torch.randn(b, nk, hkv, d, device=dev, generator=gen) * mult
    if kramp:
        k = k * (1 + kramp * (1 - torch.arange(nk, device=dev) / nk)).view(1, nk, 1, 1)
    k = k.to(dtype)
    v = torch.randn(b, nk, hkv, d, device=dev, generator=gen).to(dtype)
    dout = torch.randn(b, nq, h, d, device=dev, generator=gen).to(dtype)
    kw = dict(causal=causal, wl=wl, wr=wr, softcap=softcap, cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k)
    return q, k, v, dout, kw


def run_case(lib, dtype, b, nq, nk, h, hkv, d, causal=False, wl=-1, wr=-1, softcap=0.0, varlen=None,
             mult=1.0, algo="flash", seed=0, deterministic=True, kramp=0.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    q, k, v, dout, kw = case_inputs(dtype, b, nq, nk, h, hkv, d, causal, wl, wr, softcap, varlen, mult, gen, kramp)
    b, nq = q.shape[0], q.shape[1]
    cu_q, cu_k = kw["cu_q"], kw["cu_k"]
    scale = 1.0 / math.sqrt(d)
    kw.update(algo=algo, deterministic=deterministic)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((b, h, nq), float("nan"), device=dev)
    lib.forward(q, k, v, out, lse, **kw)
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    lib.backward(q, k, v, out, dout, lse, dq, dk, dv, **kw)
    torch.cuda.synchronize()
    ro, rl, rdq, rdk, rdv = ref_call(q, k, v, dout, cu_q, cu_k, scale, causal, wl, wr, softcap)
    # The bar: FA3's test — error at most 2x that of the same plain math in the low precision (+ noise).
    lo, ll, ldq, ldk, ldv = ref_call(q, k, v, dout, cu_q, cu_k, scale, causal, wl, wr, softcap, dtype)
    lo, ldq, ldk, ldv = (x.to(dtype) for x in (lo, ldq, ldk, ldv))
    res = {}
    ok = True
    for name, mine, ref, base in (("out", out, ro, lo), ("lse", lse, rl, ll.float()), ("dq", dq, rdq, ldq),
                                  ("dk", dk, rdk, ldk), ("dv", dv, rdv, ldv)):
        e, eb = err(mine, ref), err(base, ref)
        tol = 2 * eb + 1e-3 * max(1.0, ref[torch.isfinite(ref)].abs().max().item() if ref.numel() else 1.0)
        good = math.isfinite(e) and e <= tol and not torch.isnan(mine).any().item()
        ok &= good
        res[name] = (e, tol)
    if kramp and algo != "standard":
        # Growing maxima make the plain low-precision baseline poor (large logits rounded to the
        # input type), so its 2x is a loose bound. The forward must also be within 2x of the
        # standard algorithm's error (fp32 math on the same inputs) plus the same noise term.
        so, sl = torch.full_like(q, float("nan")), torch.full((b, h, nq), float("nan"), device=dev)
        lib.forward(q, k, v, so, sl, **dict(kw, algo="standard"))
        torch.cuda.synchronize()
        for name, mine, ref, std in (("out~std", out, ro, so), ("lse~std", lse, rl, sl)):
            e = err(mine, ref)
            tol = 2 * err(std, ref) + 1e-3 * max(1.0, ref[torch.isfinite(ref)].abs().max().item() if ref.numel() else 1.0)
            ok &= math.isfinite(e) and e <= tol
            res[name] = (e, tol)
    return ok, res


CASES = [  # (dtype, b, nq, nk, h, hkv, d, kwargs)
    (torch.float16, 2, 128, 128, 4, 4, 64, {}),
    (torch.bfloat16, 2, 128, 128, 4, 4, 128, {"causal": True}),
    (torch.float16, 1, 113, 203, 4, 2, 32, {}),
    (torch.bfloat16, 1, 113, 203, 4, 2, 96, {"causal": True}),
    (torch.float16, 1, 1023, 1024, 2, 2, 128, {"causal": True}),
    (torch.float16, 1, 1, 239, 8, 1, 64, {}),
    (torch.bfloat16, 1, 3, 799, 4, 4, 256, {"causal": True}),
    (torch.float16, 2, 300, 200, 4, 1, 192, {"causal": True}),  # Nq > Nk: fully masked rows
    (torch.bfloat16, 1, 257, 257, 8, 2, 256, {}),
    (torch.float16, 1, 200, 300, 4, 4, 40, {}),                 # head dim 40 -> kernel 64
    (torch.bfloat16, 1, 200, 300, 4, 4, 136, {"causal": True}),  # 136 -> 192
    (torch.float16, 1, 333, 333, 4, 4, 72, {"wl": 32, "wr": 8}),
    (torch.bfloat16, 1, 256, 512, 4, 2, 128, {"wl": 64, "wr": -1}),
    (torch.float16, 1, 256, 256, 4, 4, 64, {"softcap": 30.0, "causal": True}),
    (torch.bfloat16, 1, 190, 190, 4, 4, 256, {"softcap": 5.0}),
    # softcap on the Hopper backward (d128 kernel): causal Nq != Nk (masked rows), GQA, a small cap
    (torch.float16, 2, 300, 420, 8, 2, 128, {"softcap": 20.0, "causal": True}),
    (torch.bfloat16, 1, 513, 513, 4, 4, 128, {"softcap": 3.0, "mult": 4.0}),
    (torch.float16, 1, 0, 0, 4, 4, 64, {"varlen": ([17, 0, 130, 64], [40, 7, 0, 200]), "causal": True}),
    (torch.bfloat16, 1, 0, 0, 8, 2, 128, {"varlen": ([100, 1, 257], [100, 300, 64])}),
    # varlen on the Hopper forward and backward (the backward: d64/d96/d128): sequences of several
    # query blocks ending inside a warpgroup's rows (plain-store epilogue) and on block edges, empty
    # entries, Nq != Nk per sequence, windows, softcap
    (torch.bfloat16, 1, 0, 0, 8, 2, 64, {"varlen": ([700, 0, 128, 1000, 65], [700, 50, 0, 1333, 64]), "causal": True}),
    (torch.float16, 1, 0, 0, 4, 4, 256, {"varlen": ([513, 64, 300], [200, 64, 901]), "causal": True}),
    (torch.bfloat16, 1, 0, 0, 4, 4, 192, {"varlen": ([129, 777, 1], [640, 777, 300])}),
    (torch.float16, 1, 0, 0, 8, 4, 96, {"varlen": ([1000, 300], [1000, 450]), "causal": True, "wl": 100}),
    (torch.bfloat16, 1, 0, 0, 4, 4, 128, {"varlen": ([2048, 190, 33], [2048, 190, 2000]), "softcap": 20.0}),
    (torch.bfloat16, 1, 0, 0, 4, 2, 128, {"varlen": ([513, 64, 300], [200, 64, 901]), "softcap": 20.0}),
    (torch.float16, 1, 500, 500, 4, 4, 128, {"mult": 10.0}),
    (torch.bfloat16, 1, 500, 500, 4, 4, 64, {"mult": 30.0, "causal": True}),
    (torch.float16, 1, 128, 64, 4, 4, 64, {"causal": True, "wl": 0}),
    (torch.float16, 1, 700, 300, 4, 2, 256, {"causal": True}),  # d256 Hopper bwd: masked rows, GQA
    (torch.bfloat16, 2, 1100, 1100, 4, 4, 256, {"mult": 10.0}),
    # more Hopper forward tiles than SMs: the causal dynamic schedule (CTAs run several tiles)
    (torch.bfloat16, 4, 1000, 1000, 16, 4, 128, {"causal": True}),
    (torch.bfloat16, 2, 2048, 2048, 8, 8, 64, {"causal": True}),  # d64 192-row tiles
    (torch.float16, 2, 1500, 700, 16, 16, 256, {"causal": True}),  # fully masked tiles too
    # head dim 192 (the Hopper forward's 128×112 tile): partial key tiles, GQA, many tiles
    (torch.bfloat16, 2, 1000, 1000, 8, 2, 192, {}),
    (torch.float16, 1, 2048, 2048, 8, 8, 192, {"causal": True}),
    # head dim 96 (the Hopper forward's d128 kernels, Q/K/V zero-padded by TMA, O stored to 96)
    (torch.bfloat16, 2, 1000, 1000, 8, 2, 96, {}),
    (torch.float16, 1, 777, 1500, 4, 4, 96, {"causal": True}),
    (torch.bfloat16, 1, 600, 600, 4, 4, 96, {"causal": True, "wl": 100, "softcap": 30.0}),
    # sliding-window causal (the Hopper forward's left window): windows across key-tile edges,
    # Nk > Nq, Nq > Nk (masked rows), 192-row d64 tiles
    (torch.bfloat16, 2, 1000, 1000, 8, 2, 128, {"causal": True, "wl": 200}),
    (torch.float16, 1, 777, 1500, 4, 4, 64, {"causal": True, "wl": 333}),
    (torch.bfloat16, 1, 1200, 600, 4, 4, 256, {"causal": True, "wl": 100}),
    (torch.float16, 2, 2048, 2048, 8, 8, 64, {"causal": True, "wl": 511}),
    # a window ending at the diagonal without causal=True: the same keys, the causal kernels
    (torch.bfloat16, 1, 700, 900, 8, 2, 128, {"wl": 100, "wr": 0}),
    (torch.float16, 2, 300, 300, 4, 4, 256, {"wl": 0, "wr": 0}),
    # any window on the causal kernels: both sides, right only, left only (right clamped to Nq)
    (torch.bfloat16, 2, 600, 800, 8, 2, 128, {"wl": 64, "wr": 16}),
    (torch.float16, 1, 777, 500, 4, 4, 64, {"wr": 40}),
    (torch.bfloat16, 1, 1024, 1024, 4, 4, 256, {"wl": 128}),
    (torch.float16, 1, 513, 513, 4, 4, 192, {"wl": 100, "wr": 100, "softcap": 20.0}),
    # d64 192-row causal tiles whose warpgroups skip key blocks right of their own rows: Nq > Nk
    # (warpgroups with every row masked), a right window with GQA, varlen with a short sequence
    (torch.bfloat16, 1, 3000, 2100, 4, 4, 64, {"causal": True}),
    (torch.float16, 1, 2100, 3001, 8, 2, 64, {"wl": 300, "wr": 37}),
    (torch.bfloat16, 1, 0, 0, 4, 4, 64, {"varlen": ([2100, 5, 2500], [2100, 300, 2048]), "causal": True}),
    # softcap on the d64 non-causal Hopper forward (its own kernel instance): GQA, varlen with an
    # empty entry
    (torch.bfloat16, 1, 700, 900, 8, 2, 64, {"softcap": 15.0}),
    (torch.float16, 1, 0, 0, 4, 4, 64, {"varlen": ([300, 0, 513], [200, 64, 700]), "softcap": 10.0}),
    # the non-causal Hopper forward's stream-K tail (scheduler.cuh, StreamKTail): more tiles than the
    # 132 SMs and not a multiple, at least 16 key blocks each (kStreamKMinBlocks), so tiles are cut
    # between CTAs and merged — 128- and 112-key tiles, 192-row d64 tiles, d96, GQA
    (torch.bfloat16, 4, 1000, 2100, 16, 4, 128, {}),
    (torch.float16, 2, 2000, 2100, 16, 16, 64, {}),
    (torch.bfloat16, 1, 1100, 8300, 16, 8, 128, {}),
    (torch.float16, 2, 1200, 1900, 8, 8, 192, {}),
    (torch.bfloat16, 4, 700, 2100, 12, 4, 96, {}),
    # rows whose maximum keeps growing (kramp): the forward's rescaling on most key tiles, and jumps
    # past fp32's range in one tile (the speculative softmax's exponentials overflow and are redone)
    (torch.bfloat16, 1, 300, 1100, 4, 4, 128, {"kramp": 20.0}),
    (torch.float16, 1, 256, 1100, 4, 2, 128, {"kramp": 20.0, "causal": True}),
    (torch.bfloat16, 1, 200, 2100, 4, 2, 128, {"kramp": 600.0}),
    (torch.bfloat16, 1, 0, 0, 4, 4, 128, {"varlen": ([300, 0, 257], [1100, 64, 900]), "kramp": 600.0}),
    (torch.float16, 1, 900, 1000, 4, 2, 64, {"kramp": 20.0, "causal": True}),  # d64 128-row tiles
    (torch.bfloat16, 2, 700, 700, 4, 4, 64, {"kramp": 600.0, "causal": True}),
]


def check(lib):
    rows, fails = [], 0
    # flash twice: deterministic (portable kernels) and not (the Hopper backward where it applies)
    for algo, det in (("flash", True), ("flash", False), ("standard", True)):
        for i, (dt, b, nq, nk, h, hkv, d, kw) in enumerate(CASES):
            try:
                ok, res = run_case(lib, dt, b, nq, nk, h, hkv, d, algo=algo, seed=i, deterministic=det, **kw)
                msg = " ".join(f"{k}={e:.1e}/{t:.1e}" for k, (e, t) in res.items())
            except Exception as ex:  # noqa: BLE001
                ok, msg = False, f"EXCEPTION {ex}"
            fails += not ok
            line = f"{algo + ('' if det else '/nd'):8s} {str(dt)[6:]:8s} b{b} nq{nq} nk{nk} h{h}/{hkv} d{d} {kw}: {msg} [{'ok' if ok else 'FAIL'}]"
            print(line, flush=True)
            rows.append(line)
    # 50x bitwise repeat: forward and deterministic backward (catches races)
    for d, causal in ((64, False), (128, True), (256, False)):
        dt = torch.bfloat16
        q = torch.randn(2, 777, 8, d, device="cuda", dtype=dt)
        k = torch.randn(2, 777, 4, d, device="cuda", dtype=dt)
        v = torch.randn(2, 777, 4, d, device="cuda", dtype=dt)
        do = torch.randn_like(q)
        outs = []
        for _ in range(50):
            o = torch.empty_like(q); l = torch.empty(2, 8, 777, device="cuda")
            lib.forward(q, k, v, o, l, causal=causal)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            lib.backward(q, k, v, o, do, l, dq, dk, dv, causal=causal, deterministic=True)
            outs.append((o, l, dq, dk, dv))
        same = all(all(torch.equal(a, b_) for a, b_ in zip(outs[0], x)) for x in outs[1:])
        fails += not same
        print(f"repeat50 d{d} causal={causal}: {'bitwise equal [ok]' if same else 'DIFFER [FAIL]'}", flush=True)
    print(f"check: {fails} failures", flush=True)
    return fails


def grid_configs(spec):
    """"d:N:causal,…" -> (d, N, causal) per configuration."""
    for cfg in spec.split(","):
        d, n, causal = (int(x) for x in cfg.split(":"))
        yield d, n, bool(causal)


def grid_problem(d, n, dtype=torch.bfloat16):
    """The FlashAttention grid's problem at head dim d and length n (batch·n = 16384, heads·d = 2048):
    (b, h, q, k, v, out, lse), q, k, v random (B, N, H, d) on the GPU, out and lse empty."""
    b, h = max(1, 16384 // n), 2048 // d
    q = torch.randn(b, n, h, d, device="cuda", dtype=dtype)
    k, v = torch.randn_like(q), torch.randn_like(q)
    return b, h, q, k, v, torch.empty_like(q), torch.empty(b, h, n, device="cuda")


def grid_flops(b, h, n, d, causal):
    """Forward FLOPs (4·B·H·N²·d, half of it causal); the backward counts 2.5× this."""
    return 4 * b * h * n * n * d * (0.5 if causal else 1.0)


def call_times(fn, reps, batch, warmup):
    """Per-call ms of `reps` samples, each `batch` calls issued between two CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(batch):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / batch)
    return ts


def median_ms(fn, reps, warmup=3):
    """Median time of one call started on an idle GPU: its host work is part of every sample."""
    return statistics.median(call_times(fn, reps, 1, warmup))


def stream_ms(fn, reps, batch=10, warmup=3):
    """Mean time per call of `batch` calls issued back to back (no host synchronization between
    them), the median over `reps` such batches. This is what a training or serving loop sees: a
    call's host work (argument packing, checks, launch) overlaps the previous call's kernels
    whenever it is shorter, as in FlashAttention's own benchmarks (torch.utils.benchmark). median_ms
    instead starts every call on an idle GPU, so its host work is part of each sample."""
    return statistics.median(call_times(fn, reps, batch, warmup))


# How interleaved_ms orders the implementations: "balanced" (default) or "rotation" (one rotation
# of every implementation per round, forward and backward together, 4 rounds: the order to compare
# the balanced one against, since in it each implementation mostly follows the same other one).
ORDER = "balanced"


def interleaved_ms(impls, reps, batch, rounds=None):
    """Median ms per call of every implementation, timed in rounds, each round taking
    ceil(reps / rounds) samples of `batch` calls per implementation. The GPU runs at its power
    limit under this load (bench/dev/sustained.py: ~690 W, the SM clock 1.55-1.85 GHz instead of
    1.98), and its clock depends on what ran just before; timing each implementation in one block
    gives the block after a heavier one a lower clock (docs/perf/log.md, P-066, P-065).
    impls: name -> (fn, ctx), ctx a context manager factory entered around the implementation's
    samples (SDPA's backend choice).

    Balanced order: the rounds go through every rotation of the names forward and backward, so each
    implementation runs after each other one equally often. A rotation alone keeps the cyclic order
    (with ours_fwd, ours_bwd, fa2_fwd, …, cudnn_bwd, ours_fwd runs after cuDNN's backward in three
    rounds of four, cuDNN's forward after FA2's: docs/perf/log.md, P-097); bench() also
    times the forward and backward implementations as separate groups."""
    names = list(impls)
    if ORDER == "rotation":
        rounds = rounds or 4
        orders = [names[r % len(names):] + names[: r % len(names)] for r in range(rounds)]
    else:
        rots = [names[r:] + names[:r] for r in range(len(names))]
        orders = [o for rot in rots for o in (rot, rot[::-1])]
        if rounds:  # whole passes over the balanced orders
            orders = orders * max(1, math.ceil(rounds / len(orders)))
    per_round = max(1, math.ceil(reps / len(orders)))
    samples = {name: [] for name in impls}
    for order in orders:
        for name in order:
            fn, ctx = impls[name]
            with ctx():
                samples[name] += call_times(fn, per_round, batch, warmup=1)
    return {name: statistics.median(v) for name, v in samples.items()}


def interleaved_groups(impls, reps, batch):
    """interleaved_ms per pass: the forward implementations together, then the backward ones
    (balanced order; the rotation order times all of them as one group)."""
    if ORDER == "rotation":
        return interleaved_ms(impls, reps, batch)
    out = {}
    for suffix in ("_fwd", "_bwd"):
        out.update(interleaved_ms({k: v for k, v in impls.items() if k.endswith(suffix)}, reps, batch))
    return out


def fa4_module(mode):
    """FlashAttention-4's flash_attn_func (flash_attn.cute) or None: mode "auto" where it imports,
    "off" never, "on" or the import error."""
    if mode == "off":
        return None
    try:
        from flash_attn.cute import flash_attn_func
        return flash_attn_func
    except Exception as ex:  # noqa: BLE001
        if mode == "on":
            raise
        print(f"  fa4: not in this run ({type(ex).__name__}: {ex})", file=sys.stderr)
        return None


def bench(lib, dims, seqlens, dtype, reps, out_json, fa4=None, det=False):
    results = []
    for d in dims:
        for causal in (False, True):
            for n in seqlens:
                b, h, q, k, v, o, l = grid_problem(d, n, dtype)
                do = torch.randn_like(q)
                flops = grid_flops(b, h, n, d, causal)
                r = reps if n <= 4096 else max(5, reps // 2)
                row = {"d": d, "causal": causal, "n": n, "b": b, "h": h}
                dq, dk, dv = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
                none = contextlib.nullcontext
                impls = {"ours_fwd": (lib.bind_forward(q, k, v, o, l, causal=causal), none),
                         "ours_bwd": (lib.bind_backward(q, k, v, o, do, l, dq, dk, dv, causal=causal), none)}
                impls["ours_fwd"][0]()  # o, l for the backward
                if det:  # Options::deterministic, in the same rounds as the default
                    impls["det_bwd"] = (lib.bind_backward(q, k, v, o, do, l, dq, dk, dv, causal=causal, deterministic=True), none)
                qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
                dot = do.transpose(1, 2)
                for name, be in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        ctx = functools.partial(sdpa_kernel, be)
                        with ctx():
                            f_ = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)  # noqa: E731
                            ot = f_()
                            b_ = lambda ot=ot: torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True)  # noqa: E731
                            b_()
                        impls[f"{name}_fwd"], impls[f"{name}_bwd"] = (f_, ctx), (b_, ctx)
                    except Exception as ex:  # noqa: BLE001
                        row[f"{name}_fwd"] = row[f"{name}_bwd"] = float("nan")
                        row[f"{name}_fwd_s"] = row[f"{name}_bwd_s"] = float("nan")
                        print(f"  {name} d{d} n{n}: {ex}", file=sys.stderr)
                if fa4:  # (B, N, H, d) as ours; its backward through autograd, as SDPA's
                    try:
                        q4, k4, v4 = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
                        f_ = lambda: fa4(q4, k4, v4, causal=causal)[0]  # noqa: E731
                        o4 = f_()
                        b_ = lambda o4=o4: torch.autograd.grad(o4, (q4, k4, v4), do, retain_graph=True)  # noqa: E731
                        b_()
                        impls["fa4_fwd"], impls["fa4_bwd"] = (f_, none), (b_, none)
                    except Exception as ex:  # noqa: BLE001
                        row["fa4_fwd"] = row["fa4_bwd"] = row["fa4_fwd_s"] = row["fa4_bwd_s"] = float("nan")
                        print(f"  fa4 d{d} n{n}: {type(ex).__name__}: {ex}", file=sys.stderr)
                # Each call twice: started on an idle GPU (host time included in every sample) and
                # back to back (*_s keys: 10 calls between two events, host time hidden where shorter
                # than the kernels, as in FlashAttention's own benchmarks).
                row.update(interleaved_groups(impls, r, 1))
                row.update({k_ + "_s": v_ for k_, v_ in interleaved_groups(impls, max(6, r // 4), 10).items()})
                for key in list(row):
                    if key.endswith("_fwd") or key.endswith("_fwd_s"):
                        row[key.replace("_fwd", "_fwd_tf")] = flops / row[key] / 1e9
                    elif key.endswith("_bwd") or key.endswith("_bwd_s"):
                        row[key.replace("_bwd", "_bwd_tf")] = 2.5 * flops / row[key] / 1e9
                results.append(row)
                tf = lambda k_: row.get(k_, float("nan"))  # noqa: E731
                print(f"d{d:3d} {'causal' if causal else 'full  '} N={n:5d}: fwd ours {tf('ours_fwd_tf'):6.1f} fa2 {tf('fa2_fwd_tf'):6.1f} "
                      f"cudnn {tf('cudnn_fwd_tf'):6.1f} | bwd ours {tf('ours_bwd_tf'):6.1f} fa2 {tf('fa2_bwd_tf'):6.1f} "
                      f"cudnn {tf('cudnn_bwd_tf'):6.1f} TFLOP/s | ratio fwd {tf('ours_fwd_tf')/tf('fa2_fwd_tf'):.2f}x fa2 "
                      f"{tf('ours_fwd_tf')/tf('cudnn_fwd_tf'):.2f}x cudnn, bwd {tf('ours_bwd_tf')/tf('fa2_bwd_tf'):.2f}x fa2 "
                      f"{tf('ours_bwd_tf')/tf('cudnn_bwd_tf'):.2f}x cudnn | back to back: fwd "
                      f"{tf('ours_fwd_tf_s')/tf('cudnn_fwd_tf_s'):.2f}x cudnn, bwd "
                      f"{tf('ours_bwd_tf_s')/tf('cudnn_bwd_tf_s'):.2f}x cudnn"
                      + (f" | fa4 fwd {tf('fa4_fwd_tf'):6.1f} bwd {tf('fa4_bwd_tf'):6.1f} TFLOP/s, bwd ours/fa4 "
                         f"{tf('ours_bwd_tf')/tf('fa4_bwd_tf'):.2f}x" if fa4 else "")
                      + (f" | deterministic bwd {tf('det_bwd_tf'):6.1f} TFLOP/s, {tf('det_bwd_tf')/tf('ours_bwd_tf'):.2f}x default"
                         if det else ""), flush=True)
                del q, k, v, do, o, l, dq, dk, dv, qt, kt, vt, impls
    if out_json:
        # Strict JSON: a rate that could not be measured (NaN: a backend unavailable) is null.
        strict = [{k_: (None if isinstance(v_, float) and not math.isfinite(v_) else v_) for k_, v_ in r_.items()}
                  for r_ in results]
        with open(out_json, "w") as f:
            json.dump(strict, f, indent=1, allow_nan=False)
    return results


def overhead(lib, reps):
    """Per-call fixed cost: the median time of a call too small to keep the GPU busy (B1 H1 N128),
    host work included (each timed call starts on an idle GPU, as in the grid). Prints µs."""
    rows = []
    for d in (64, 128):
        q = torch.randn(1, 128, 1, d, device="cuda", dtype=torch.bfloat16)
        k, v, do = torch.randn_like(q), torch.randn_like(q), torch.randn_like(q)
        o, l = torch.empty_like(q), torch.empty(1, 1, 128, device="cuda")
        dq, dk, dv = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
        t = {"ours_fwd": median_ms(lambda: lib.forward(q, k, v, o, l, causal=False), reps),
             "ours_bwd": median_ms(lambda: lib.backward(q, k, v, o, do, l, dq, dk, dv, causal=False), reps)}
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
        for name, be in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(be):
                t[f"{name}_fwd"] = median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt), reps)
                ot = F.scaled_dot_product_attention(qt, kt, vt)
                t[f"{name}_bwd"] = median_ms(lambda: torch.autograd.grad(ot, (qt, kt, vt), do.transpose(1, 2),
                                                                         retain_graph=True), reps)
        print(f"overhead d{d} B1 H1 N128 (µs): " + "  ".join(f"{k_} {1000 * v_:.1f}" for k_, v_ in t.items()), flush=True)
        rows.append(t)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--overhead", action="store_true", help="per-call fixed cost at B1 H1 N128")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--order", choices=("balanced", "rotation"), default="balanced",
                    help="implementation order of the interleaved timing (interleaved_ms)")
    ap.add_argument("--fa4", choices=("auto", "on", "off"), default="auto",
                    help="--bench: FlashAttention-4 (flash_attn.cute) in the rows where it imports")
    ap.add_argument("--det", action="store_true", help="--bench: also our deterministic backward")
    ap.add_argument("--json", default="", help="--bench: write the rows here (strict JSON: a missing rate is null)")
    a = ap.parse_args()
    global ORDER
    ORDER = a.order
    lib = Lib(a.lib)
    print(lib.lib.fa_info().decode(), "| torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), flush=True)
    fails = check(lib) if a.check else 0
    if a.overhead:
        overhead(lib, max(a.reps, 50))
    if a.bench:
        bench(lib, [int(x) for x in a.dims.split(",")], [int(x) for x in a.seqlens.split(",")],
              torch.bfloat16 if a.dtype == "bf16" else torch.float16, a.reps, a.json, fa4_module(a.fa4), a.det)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
