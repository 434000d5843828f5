#!/usr/bin/env python3
"""Check and benchmark of the Hopper forward kernel (src/cuda/sm90) on an H100/H200.

Correctness: fresh random inputs every run, poisoned outputs (NaN), compared against a float64
reference on upcast inputs with FlashAttention's rule: max|ours - ref| <= 2 * max|plain - ref| + noise,
where `plain` is the same attention computed naively in the input precision (bf16/fp16 GEMMs,
fp32 softmax). Causal masks are bottom-right aligned (query i sees keys j <= i + Nk - Nq); fully
masked rows must give O = 0 and LSE = -inf.
Speed: ours vs PyTorch SDPA's cuDNN and flash backends in the same process, CUDA events, median,
on the FlashAttention grid (batch*seqlen = 16384, heads*head_dim = 2048).

usage: python3 bench/sm90_check.py [--lib build-sm90/libfa_sm90.so] [--no-bench] [--quick] [--causal-only]
--causal-only times only causal attention.
"""
import argparse
import ctypes
import math
import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_lib(path):
    if not os.path.exists(path):
        print(f"building {path} with bench/sm90_build.sh", flush=True)
        subprocess.check_call([os.path.join(ROOT, "bench", "sm90_build.sh")])
    lib = ctypes.CDLL(path)
    lib.fa_sm90_last_error.restype = ctypes.c_char_p
    ll, vp = ctypes.c_longlong, ctypes.c_void_p
    lib.fa_sm90_forward.argtypes = [ctypes.c_int, vp, vp, vp, vp, vp, ll, ll, ll, ll, ll, ll,
                                    ctypes.POINTER(ll), ctypes.POINTER(ll), ctypes.POINTER(ll),
                                    ctypes.POINTER(ll), ctypes.c_float, ctypes.c_int, vp]
    lib.fa_sm90_forward.restype = ctypes.c_int
    return lib


LIB = None


def ours(q, k, v, causal, out=None, lse=None, scale=None):
    """q (B, Nq, H, D), k/v (B, Nk, Hkv, D); returns (out, lse (B, H, Nq) fp32)."""
    B, Nq, H, D = q.shape
    Nk, Hkv = k.shape[1], k.shape[2]
    if out is None:
        out = torch.full_like(q, float("nan"))
    if lse is None:
        lse = torch.full((B, H, Nq), float("nan"), device=q.device, dtype=torch.float32)
    st = lambda t: (ctypes.c_longlong * 3)(t.stride(0), t.stride(1), t.stride(2))
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    rc = LIB.fa_sm90_forward(1 if q.dtype == torch.float16 else 0, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                             out.data_ptr(), lse.data_ptr(), B, Nq, Nk, H, Hkv, D, st(q), st(k), st(v), st(out),
                             scale, int(causal), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if rc == 1:
        raise RuntimeError("unsupported configuration")
    if rc == 2:
        raise RuntimeError(LIB.fa_sm90_last_error().decode())
    return out, lse


def attention_ref(q, k, v, causal, dtype, upcast=True):
    """Naive attention. upcast: in `dtype` (float64) throughout; else GEMMs in the input precision."""
    B, Nq, H, D = q.shape
    Nk, Hkv = k.shape[1], k.shape[2]
    g = H // Hkv
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, N, D)
    kt = kt.repeat_interleave(g, dim=1)
    vt = vt.repeat_interleave(g, dim=1)
    if upcast:
        qt, kt, vt = qt.to(dtype), kt.to(dtype), vt.to(dtype)
    s = (qt @ kt.transpose(-1, -2)).to(dtype if upcast else torch.float32) / math.sqrt(D)
    if causal:
        i = torch.arange(Nq, device=q.device)[:, None]
        j = torch.arange(Nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + Nk - Nq, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # fully masked rows -> 0
    if not upcast:
        p = p.to(q.dtype)
    o = (p @ vt).transpose(1, 2)
    return o, lse


def check(dtype, D, causal, B, Nq, Nk, H, Hkv, layout="bnhd"):
    tq = torch.randn(B, Nq, H, D, device="cuda", dtype=dtype)
    if layout == "qkv_packed" and Nq == Nk and H == Hkv:
        qkv = torch.randn(B, Nq, 3, H, D, device="cuda", dtype=dtype)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
        q = tq
        k = torch.randn(B, Nk, Hkv, D, device="cuda", dtype=dtype)
        v = torch.randn(B, Nk, Hkv, D, device="cuda", dtype=dtype)
    out, lse = ours(q, k, v, causal)
    out2, lse2 = ours(q, k, v, causal)
    torch.cuda.synchronize()
    o_ref, lse_ref = attention_ref(q, k, v, causal, torch.float64)
    o_pt, _ = attention_ref(q, k, v, causal, torch.float64, upcast=False)
    err = (out.double() - o_ref).abs().max().item()
    err_pt = (o_pt.double() - o_ref).abs().max().item()
    mean_err = (out.double() - o_ref).abs().mean().item()
    noise = 2 * (o_ref + 0.3 - 0.3 - o_ref).abs().max().item()
    fin = torch.isfinite(lse_ref)
    lse_ok = bool(torch.equal(torch.isfinite(lse), fin)) and bool((lse[~fin] == float("-inf")).all())
    lse_err = (lse.double()[fin] - lse_ref[fin]).abs().max().item() if fin.any() else 0.0
    nan = bool(torch.isnan(out).any()) or bool(torch.isnan(lse).any())
    same = torch.equal(out, out2) and torch.equal(lse.nan_to_num(), lse2.nan_to_num())
    ok = (not nan) and err <= 2 * err_pt + noise + 1e-6 and lse_ok and lse_err <= 1e-3 and same
    name = f"{str(dtype)[6:]:8s} d{D:<3d} {'causal' if causal else 'full  '} B{B} Nq{Nq} Nk{Nk} H{H}/{Hkv} {layout}"
    print(f"{name:58s} max_err {err:.2e} (plain {err_pt:.2e}) mean {mean_err:.1e} lse_err {lse_err:.1e}"
          f"{' NaN' if nan else ''}{'' if lse_ok else ' LSE-inf-mismatch'}{'' if same else ' NONDETERMINISTIC'}"
          f" [{'ok' if ok else 'FAIL'}]", flush=True)
    return ok


def time_ms(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def bench(dtype, dims, seqlens, out_rows, causal_modes=(False, True)):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for D in dims:
        for causal in causal_modes:
            for N in seqlens:
                B, H = 16384 // N, 2048 // D
                q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=dtype) for _ in range(3))
                out = torch.empty_like(q)
                lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
                flops = 4 * B * H * N * N * D / (2 if causal else 1)
                res = {}
                res["ours"] = time_ms(lambda: ours(q, k, v, causal, out, lse))
                qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
                for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
                    try:
                        with sdpa_kernel([be]):
                            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                            res[name] = time_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
                        if name == "cudnn":
                            res["diff"] = (ref.transpose(1, 2).float() - out.float()).abs().max().item()
                    except Exception as e:  # backend unavailable for this shape
                        res[name] = float("nan")
                tf = {n: flops / (res[n] * 1e-3) / 1e12 for n in ("ours", "cudnn", "fa2")}
                row = (D, causal, N, tf["ours"], tf["cudnn"], tf["fa2"], tf["ours"] / tf["cudnn"],
                       tf["ours"] / tf["fa2"], res.get("diff", float("nan")))
                out_rows.append(row)
                print(f"bench {str(dtype)[6:]} d{D} {'causal' if causal else 'full'} N={N}: ours {res['ours']:.3f} ms "
                      f"{tf['ours']:.0f} TFLOP/s | cudnn {tf['cudnn']:.0f} | fa2 {tf['fa2']:.0f} | "
                      f"max|ours-cudnn| {row[-1]:.1e}", flush=True)
                del q, k, v, out, lse, qt, kt, vt


def main():
    global LIB
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "build-sm90", "libfa_sm90.so"))
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--causal-only", action="store_true", help="time only causal attention")
    args = ap.parse_args()
    LIB = load_lib(args.lib)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    dims = [int(d) for d in args.dims.split(",")]
    shapes = [(2, 113, 203, 4, 4), (1, 1, 239, 8, 1), (2, 799, 3, 4, 4), (1, 1023, 1024, 4, 2),
              (3, 257, 511, 6, 2), (1, 2048, 2048, 2, 2), (2, 128, 128, 2, 2),
              (4, 1000, 1000, 16, 4), (64, 1, 300, 8, 8),  # > 132 tiles: several per persistent CTA
              (16, 600, 100, 8, 8),  # causal: persistent CTAs that also meet fully masked tiles
              (4, 1000, 16384, 6, 3)]  # long keys, GQA 2
    if args.quick:
        shapes = shapes[:3]
    n_fail = n = 0
    for dtype in (torch.bfloat16, torch.float16):
        for D in dims:
            for causal in (False, True):
                for sh in shapes:
                    n += 1
                    n_fail += not check(dtype, D, causal, *sh)
                n += 1
                n_fail += not check(dtype, D, causal, 2, 300, 300, 4, 4, layout="qkv_packed")
    print(f"correctness: {n - n_fail}/{n} passed", flush=True)
    if args.no_bench or n_fail:
        return 1 if n_fail else 0
    rows = []
    bench(torch.bfloat16, dims, [512, 1024, 2048, 4096, 8192, 16384], rows,
          (True,) if args.causal_only else (False, True))
    print("\n  d  causal     N   ours  cudnn    fa2  ours/cudnn  ours/fa2   (bf16 TFLOP/s)")
    for D, c, N, a, b, f, r1, r2, _ in rows:
        print(f"{D:3d}  {'yes' if c else 'no ':6s} {N:5d}  {a:5.0f}  {b:5.0f}  {f:5.0f}      {r1:5.2f}    {r2:5.2f}")
    print(f"correctness: {n - n_fail}/{n} passed")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
