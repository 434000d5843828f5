"""Array-level API: NumPy, PyTorch (no autograd; see flashattn.torch) and DLPack arrays.

Inputs are passed to the C++ core without copies (nanobind ndarray / DLPack); outputs are
allocated here, in the same library and on the same device as ``q``, and written in place.
"""
from __future__ import annotations

import math
import sys
from typing import Any, Optional, Tuple

import numpy as np

from . import _flashattn as _C

__all__ = ["attention", "attention_backward"]

_ALGORITHMS = ("flash", "standard")


# ---- bfloat16 in NumPy (ml_dtypes) -------------------------------------------------------------
def _ml_bfloat16():
    mod = sys.modules.get("ml_dtypes")
    if mod is None:
        try:
            import ml_dtypes as mod  # noqa: F811
        except ImportError:
            return None
    return np.dtype(mod.bfloat16)


def _is_numpy_bf16(a: Any) -> bool:
    if not isinstance(a, np.ndarray) or a.dtype.kind != "V" or a.dtype.itemsize != 2:
        return False
    bf16 = _ml_bfloat16()
    return bf16 is not None and a.dtype == bf16


# NumPy has no bfloat16 of its own and no DLPack code for ml_dtypes' one: such arrays travel as a
# uint16 view (same bytes, same strides) with uint16_is_bf16=True.
def _np_view(a):
    return a.view(np.uint16) if _is_numpy_bf16(a) else a


# ---- frameworks --------------------------------------------------------------------------------
def _torch_module(a: Any):
    t = sys.modules.get("torch")
    if t is not None and isinstance(a, t.Tensor):
        return t
    return None


def _check_kind(name: str, a: Any) -> None:
    if a is None:
        raise TypeError(f"{name}: expected an array, got None")
    if not (isinstance(a, np.ndarray) or hasattr(a, "__dlpack__")):
        raise TypeError(
            f"{name}: expected a NumPy array, a torch.Tensor or a DLPack array, got {type(a).__name__}"
        )


def _empty_like_layout(q: Any, shape: Tuple[int, ...], float32: bool = False):
    """A dense (row-major) empty array in q's library and on q's device."""
    torch = _torch_module(q)
    if torch is not None:
        return torch.empty(shape, dtype=torch.float32 if float32 else q.dtype, device=q.device)
    if isinstance(q, np.ndarray):
        return np.empty(shape, dtype=np.float32 if float32 else q.dtype)
    ns = getattr(q, "__array_namespace__", None)
    if ns is None:
        raise TypeError(
            f"q: cannot allocate outputs for {type(q).__name__} (no __array_namespace__); "
            "pass out= or use NumPy/PyTorch arrays"
        )
    xp = ns()
    dtype = xp.float32 if float32 else q.dtype
    try:
        return xp.empty(shape, dtype=dtype, device=q.device)
    except TypeError:
        return xp.empty(shape, dtype=dtype)


def _stream_of(q: Any) -> int:
    """The CUDA stream the call runs on: PyTorch's / CuPy's current stream, else the default."""
    torch = _torch_module(q)
    if torch is not None:
        if q.device.type == "cuda":
            return int(torch.cuda.current_stream(q.device).cuda_stream)
        return 0
    if type(q).__module__.startswith("cupy"):
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    return 0


def _for_c(a: Any):
    """What nanobind receives: NumPy views for bf16; for PyTorch, a DLPack capsule of the (detached)
    tensor — torch.utils.dlpack.to_dlpack takes ~0.3 µs where nanobind calling the tensor's
    __dlpack__ method takes ~2.2 µs (docs/perf/log.md, P-073)."""
    if a is None:
        return None
    if isinstance(a, np.ndarray):
        return _np_view(a)
    torch = _torch_module(a)
    if torch is not None:
        return torch.utils.dlpack.to_dlpack(a.detach() if a.requires_grad else a)
    return a


def _is_bf16_uint16(names, *arrays) -> bool:
    if not any(_is_numpy_bf16(a) for a in arrays if a is not None):
        return False
    # A genuine uint16 array must not pass for bfloat16 alongside the views.
    for name, a in zip(names, arrays):
        if isinstance(a, np.ndarray) and a.dtype == np.uint16:
            raise TypeError(f"{name}: expected dtype float32, float16 or bfloat16, got uint16")
    return True


def _to_host_int32(a: Any):
    torch = _torch_module(a)
    if torch is not None:
        return a.detach().cpu().numpy()
    if isinstance(a, np.ndarray):
        return a
    return np.from_dlpack(a) if hasattr(a, "__dlpack__") else np.asarray(a)


def _options(q, scale, causal, window, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
             max_seqlen_k, algorithm, deterministic=False) -> dict:
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"algorithm: expected 'flash' or 'standard', got {algorithm!r}")
    if scale is None:
        scale = 0.0  # the core's default: 1/sqrt(head_dim)
    else:
        scale = float(scale)
        if scale == 0.0 or not math.isfinite(scale):
            raise ValueError(f"scale: expected a finite nonzero value (None = 1/sqrt(head_dim)), got {scale}")
    try:
        wl, wr = (int(w) for w in window)
    except (TypeError, ValueError):
        raise ValueError(f"window: expected a pair (left, right) of ints, -1 = unbounded, got {window!r}") from None
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        missing = "cu_seqlens_k" if cu_seqlens_k is None else "cu_seqlens_q"
        raise ValueError(f"{missing}: expected an int32 array together with the other cu_seqlens, got None")
    return dict(
        scale=scale,
        causal=bool(causal),
        window_left=wl,
        window_right=wr,
        softcap=float(softcap),
        cu_seqlens_q=_for_c(cu_seqlens_q),
        cu_seqlens_k=_for_c(cu_seqlens_k),
        max_seqlen_q=int(max_seqlen_q or 0),  # 0: computed by the core from cu_seqlens
        max_seqlen_k=int(max_seqlen_k or 0),
        algorithm=algorithm,
        deterministic=bool(deterministic),
        stream=_stream_of(q),
    )


def _device_guard(q):
    torch = _torch_module(q)
    if torch is not None and q.device.type == "cuda":
        return torch.cuda.device(q.device)
    import contextlib

    return contextlib.nullcontext()


def attention(q, k, v, *, causal: bool = False, scale: Optional[float] = None,
              window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
              cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: Optional[int] = None,
              max_seqlen_k: Optional[int] = None, return_lse: bool = False,
              algorithm: str = "flash", out=None):
    """Exact attention ``softmax(scale * q @ k^T + mask) @ v``.

    Arrays are ``(batch, seqlen, heads, head_dim)`` with a contiguous last dimension (any other
    strides): q ``(B, Sq, H, D)``, k and v ``(B, Sk, Hkv, D)`` with ``H % Hkv == 0`` (GQA/MQA).
    dtype float32, float16 or bfloat16 (NumPy: ``ml_dtypes.bfloat16``); NumPy arrays and PyTorch
    tensors on the CPU, PyTorch/CuPy tensors on CUDA (run on the current stream). No copies.

    causal: bottom-right aligned (query i sees keys j <= i + Sk - Sq), as FlashAttention.
    scale: defaults to 1/sqrt(head_dim). window: (left, right) sliding window, same alignment,
    -1 = unbounded. softcap > 0: scores -> softcap * tanh(scores / softcap).
    cu_seqlens_q/k: varlen, int32 prefix sums (batch+1 entries) over packed tokens; q, k, v then
    have batch 1. Host memory for CPU arrays, device memory for CUDA. max_seqlen_*: None = computed.
    algorithm: "flash" (tiled, online softmax) or "standard" (materializes S and P; the baseline).

    Returns out ``(B, Sq, H, D)`` in q's dtype, or ``(out, lse)`` with return_lse, lse float32
    ``(B, H, Sq)`` (-inf for rows that see no key; their output is 0).
    This function does not record autograd; use ``flashattn.torch`` for that.
    """
    for name, a in (("q", q), ("k", k), ("v", v)):
        _check_kind(name, a)
    if getattr(q, "ndim", 4) != 4:
        raise ValueError(f"q: expected 4 dimensions (batch, seqlen, heads, head_dim), got shape {tuple(q.shape)}")
    opts = _options(q, scale, causal, window, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                    max_seqlen_k, algorithm)
    B, Sq, H, _ = q.shape
    if out is None:
        out = _empty_like_layout(q, tuple(q.shape))
    lse = _empty_like_layout(q, (B, H, Sq), float32=True) if return_lse else None
    with _device_guard(q):
        _C.forward(_for_c(q), _for_c(k), _for_c(v), _for_c(out), _for_c(lse),
                   uint16_is_bf16=_is_bf16_uint16("q k v out".split(), q, k, v, out), **opts)
    return (out, lse) if return_lse else out


def attention_backward(dout, q, k, v, out, lse, *, causal: bool = False,
                       scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1),
                       softcap: float = 0.0, cu_seqlens_q=None, cu_seqlens_k=None,
                       max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                       algorithm: str = "flash", deterministic: bool = False,
                       dq=None, dk=None, dv=None):
    """Gradients ``(dq, dk, dv)`` of :func:`attention` for the output gradient ``dout``.

    ``out`` and ``lse`` are what ``attention(..., return_lse=True)`` returned for the same inputs
    and options (S and P are recomputed from them, never stored). dq is shaped like q, dk and dv
    like k and v (summed over the query heads of each KV head under GQA), all in q's dtype.
    deterministic: bitwise-reproducible accumulation.
    """
    for name, a in (("dout", dout), ("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)):
        _check_kind(name, a)
    opts = _options(q, scale, causal, window, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                    max_seqlen_k, algorithm, deterministic)
    if dq is None:
        dq = _empty_like_layout(q, tuple(q.shape))
    if dk is None:
        dk = _empty_like_layout(q, tuple(k.shape))
    if dv is None:
        dv = _empty_like_layout(q, tuple(v.shape))
    with _device_guard(q):
        _C.backward(_for_c(q), _for_c(k), _for_c(v), _for_c(out), _for_c(dout), _for_c(lse),
                    _for_c(dq), _for_c(dk), _for_c(dv),
                    uint16_is_bf16=_is_bf16_uint16(
                        "q k v out dout dq dk dv".split(), q, k, v, out, dout, dq, dk, dv), **opts)
    return dq, dk, dv
