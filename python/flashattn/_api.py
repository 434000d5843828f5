"""Array-level API: NumPy, PyTorch and DLPack arrays.

Inputs are passed to the C++ core without copies (nanobind ndarray / DLPack); outputs are
allocated here, in the same library and on the same device as ``q``, and written in place.
``attention`` hands PyTorch tensors to ``flashattn.torch.attention`` (autograd); the argument
checks of both are ``_checks.py``'s.
"""
from __future__ import annotations

import sys
from typing import Any, Optional, Tuple

import numpy as np

from . import _checks
from . import _flashattn as _C

__all__ = ["attention", "attention_backward", "attention_with_kvcache", "merge_partial"]

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


def _scale_window(scale, window) -> Tuple[float, int, int]:
    wl, wr = _checks.window_pair(window)
    return _checks.scale_value(scale), wl, wr


def _options(q, scale, causal, window, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
             max_seqlen_k, algorithm, deterministic=False, seqused_k=None) -> dict:
    opts = _checks.attention_options(q, scale=scale, causal=causal, window=window, softcap=softcap,
                                     cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                     max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                     algorithm=algorithm, deterministic=deterministic)
    opts.update(cu_seqlens_q=_for_c(cu_seqlens_q), cu_seqlens_k=_for_c(cu_seqlens_k),
                seqused_k=_for_c(_int32_index("seqused_k", seqused_k, q)), stream=_stream_of(q))
    return opts


def _device_guard(q):
    torch = _torch_module(q)
    if torch is not None and q.device.type == "cuda":
        return torch.cuda.device(q.device)
    import contextlib

    return contextlib.nullcontext()


def attention(q, k, v, *, causal: bool = False, scale: Optional[float] = None,
              window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
              cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: Optional[int] = None,
              max_seqlen_k: Optional[int] = None, seqused_k=None, return_lse: bool = False,
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
    seqused_k: None, or one int32 entry per sequence (batch, or the cu_seqlens' batch): sequence b
    attends to its first seqused_k[b] keys only, causal and window aligned bottom-right to them; the
    key rows past them are padding, never read (a right-padded batch needs no unpadding).
    algorithm: "flash" (tiled, online softmax) or "standard" (materializes S and P; the baseline).

    Returns out ``(B, Sq, H, D)`` in q's dtype, or ``(out, lse)`` with return_lse, lse float32
    ``(B, H, Sq)`` (-inf for rows that see no key; their output is 0).
    PyTorch tensors go through ``flashattn.torch.attention`` (autograd, torch.compile), the same
    call with the same checks: the result is differentiable when the inputs require grad. With
    ``out=`` the result is written into ``out`` in place, which records no gradient: given tensors
    that require grad while gradients are enabled, that is a ValueError.
    """
    for name, a in (("q", q), ("k", k), ("v", v)):
        _check_kind(name, a)
    torch = _torch_module(q)
    if torch is not None:
        if out is None:
            from . import torch as flashattn_torch

            return flashattn_torch.attention(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap,
                                             cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                             max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                             seqused_k=seqused_k, return_lse=return_lse, algorithm=algorithm)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in (q, k, v)):
            raise ValueError("out: expected None when q, k or v require grad (a result written in place records "
                             "no gradient), got a tensor")
    opts = _options(q, scale, causal, window, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                    max_seqlen_k, algorithm, seqused_k=seqused_k)
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
                       seqused_k=None, algorithm: str = "flash", deterministic: bool = False,
                       dq=None, dk=None, dv=None):
    """Gradients ``(dq, dk, dv)`` of :func:`attention` for the output gradient ``dout``.

    ``out`` and ``lse`` are what ``attention(..., return_lse=True)`` returned for the same inputs
    and options (S and P are recomputed from them, never stored). dq is shaped like q, dk and dv
    like k and v (summed over the query heads of each KV head under GQA), all in q's dtype.
    deterministic: bitwise-reproducible accumulation. seqused_k: the forward's (dk and dv rows past
    seqused_k[b] are written as zeros).
    """
    for name, a in (("dout", dout), ("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)):
        _check_kind(name, a)
    opts = _options(q, scale, causal, window, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                    max_seqlen_k, algorithm, deterministic, seqused_k)
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


def merge_partial(out_acc, lse_acc, part, lse_part):
    """Merges one partial attention result into a float32 accumulator, in place, and returns it.

    Both partials cover the same queries over disjoint keys (ring attention, keys split across
    calls): ``out_acc`` (B, S, H, D) float32 and ``lse_acc`` (B, H, S) float32 hold one, ``part``
    (float32, float16 or bfloat16) and ``lse_part`` (B, H, S) float32 the other, each normalized
    as ``attention(..., return_lse=True)`` returns it. Afterwards ``lse_acc = logaddexp(lse_acc,
    lse_part)`` and ``out_acc = exp(lse_acc_before - lse_acc) * out_acc + exp(lse_part - lse_acc) *
    part``, in fp32; a side whose LSE is -inf is not read, so an accumulator may start as LSE -inf
    over any values. No autograd. Returns ``(out_acc, lse_acc)``.
    """
    for name, a in (("out_acc", out_acc), ("lse_acc", lse_acc), ("part", part), ("lse_part", lse_part)):
        _check_kind(name, a)
    for name, a in (("out_acc", out_acc), ("lse_acc", lse_acc)):
        _writable(name, a)
    with _device_guard(out_acc):
        _C.merge_partial(_for_c(out_acc), _for_c(lse_acc), _for_c(part), _for_c(lse_part),
                         uint16_is_bf16=_is_bf16_uint16(["part"], part), stream=_stream_of(out_acc))
    return out_acc, lse_acc


# ---- attention over a KV cache -----------------------------------------------------------------
_INT32 = np.iinfo(np.int32)


def _int32_index(name: str, a: Any, q: Any, batch: Optional[int] = None):
    """An index array (cache_seqlens, cache_batch_idx, block_table) as the int32 array the core
    reads, in q's memory: int32 arrays pass as they are; other integer arrays and sequences of ints
    are converted (a copy; values outside int32 raise ValueError); with batch given, an int fills a
    (batch) array."""
    torch = _torch_module(q)
    if batch is not None and isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)):
        if not _INT32.min <= int(a) <= _INT32.max:
            raise ValueError(f"{name}: expected an int32 value, got {int(a)}")
        if torch is not None:
            return torch.full((batch,), int(a), dtype=torch.int32, device=q.device)
        if isinstance(q, np.ndarray):
            return np.full((batch,), int(a), dtype=np.int32)
        xp = q.__array_namespace__()
        return xp.full((batch,), int(a), dtype=xp.int32, device=q.device)
    t = _torch_module(a)
    if t is not None:
        if a.dtype == t.int32:
            return a
        if a.dtype.is_floating_point or a.dtype.is_complex or a.dtype == t.bool:
            raise TypeError(f"{name}: expected an integer dtype (int32, or converted), got {a.dtype}")
        if a.numel() and not (_INT32.min <= int(a.min()) and int(a.max()) <= _INT32.max):
            raise ValueError(f"{name}: expected values that fit int32, got {int(a.min())} .. {int(a.max())}")
        return a.to(t.int32)
    if isinstance(a, (np.ndarray, list, tuple)):
        arr = np.asarray(a)
        if arr.dtype == np.int32 and isinstance(a, np.ndarray):
            return arr
        if arr.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected an integer dtype (int32, or converted), got {arr.dtype}")
        if arr.size and not (_INT32.min <= int(arr.min()) and int(arr.max()) <= _INT32.max):
            raise ValueError(f"{name}: expected values that fit int32, got {int(arr.min())} .. {int(arr.max())}")
        arr = arr.astype(np.int32)
        return arr if torch is None or isinstance(a, np.ndarray) else torch.from_numpy(arr).to(q.device)
    if a is None or hasattr(a, "__dlpack__"):
        return a  # another library's array: the binding checks its dtype
    raise TypeError(f"{name}: expected an int32 array, got {type(a).__name__}")


def _writable(name: str, a: Any) -> None:
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        raise ValueError(f"{name}: expected a writable array (it is written in place), got a read-only one")


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None, rotary_cos=None,
                           rotary_sin=None, rotary_interleaved: bool = True, cache_batch_idx=None,
                           block_table=None, causal: bool = False, scale: Optional[float] = None,
                           window: Tuple[int, int] = (-1, -1), softcap: float = 0.0, num_splits: int = 0,
                           return_lse: bool = False, out=None):
    """Attention over a KV cache (decoding, appending): the array-level ``flash_attn_with_kvcache``.

    q ``(B, Sq, H, D)``. The cache, updated in place: k_cache and v_cache ``(B_cache, S_max, Hkv, D)``
    with sequence b in row ``cache_batch_idx[b]`` (default b), or paged ``(num_pages, page_size, Hkv,
    D)`` with block_table ``(B, max_pages)``: token t of sequence b at page ``block_table[b, t //
    page_size]``, row ``t % page_size``, for any page_size >= 1. ``H % Hkv == 0`` (GQA/MQA).

    cache_seqlens ``(B,)``: the tokens already in each sequence's cache, or an int for all of them.
    k, v ``(B, S_new, Hkv, D)``, if given, are written into the cache at positions
    ``cache_seqlens[b] … cache_seqlens[b] + S_new - 1``, the keys rotated first when rotary_cos and
    rotary_sin ``(seqlen_rotary, rotary_dim / 2)`` are given (rotary_dim <= D, the first rotary_dim
    features; pairs (2i, 2i + 1) when rotary_interleaved, else (i, i + rotary_dim / 2)); new key j
    is rotated at position ``cache_seqlens[b] + j``, query i at ``cache_seqlens[b] + i`` with causal or
    a window, else every query at ``cache_seqlens[b]``. Then q attends to the first
    ``cache_seqlens[b] + S_new`` cached tokens (the new keys as the cache stores them): causal and
    window ``(left, right)`` aligned bottom-right to that total, softcap > 0 and scale (None =
    1/sqrt(D)) as in :func:`attention`. cache_seqlens is not advanced: the caller does that.
    num_splits: key ranges each sequence is split into, merged at the end (0: chosen by the library).

    dtypes: q, out, the cache and k, v all alike: float32, float16 or bfloat16 (NumPy:
    ``ml_dtypes.bfloat16``); rotary tables float32 or float16 (bfloat16 tables are widened to
    float32, exactly). Index arrays are int32 (other integer arrays and lists are converted). NumPy
    arrays and PyTorch tensors on the CPU; PyTorch/CuPy tensors on CUDA (current stream). No copies
    of the float arrays; every last dimension must be contiguous.

    Returns out ``(B, Sq, H, D)`` (written into ``out`` when given), or ``(out, lse)`` with
    return_lse, lse float32 ``(B, H, Sq)``: -inf for a row that sees no key, whose output is 0.
    Every argument is checked before anything is written: bad input raises ValueError or TypeError
    naming the argument and leaves out and the cache as they were. No autograd (see
    ``flashattn.torch.flash_attn_with_kvcache``).
    """
    for name, a in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_kind(name, a)
    if getattr(q, "ndim", 4) != 4:
        raise ValueError(f"q: expected 4 dimensions (batch, seqlen, heads, head_dim), got shape {tuple(q.shape)}")
    scale, wl, wr = _scale_window(scale, window)
    batch = q.shape[0]
    seqlens = _int32_index("cache_seqlens", cache_seqlens, q, batch)
    batch_idx = _int32_index("cache_batch_idx", cache_batch_idx, q)
    table = _int32_index("block_table", block_table, q)
    cos, sin = (t.astype(np.float32) if _is_numpy_bf16(t) else t for t in (rotary_cos, rotary_sin))
    for name, a in (("k_cache", k_cache), ("v_cache", v_cache), ("out", out)):
        _writable(name, a)
    if out is None:
        out = _empty_like_layout(q, tuple(q.shape))
    lse = _empty_like_layout(q, (batch, q.shape[2], q.shape[1]), float32=True) if return_lse else None
    bf16 = _is_bf16_uint16("q k_cache v_cache out k v".split(), q, k_cache, v_cache, out, k, v)
    with _device_guard(q):
        _C.forward_kvcache(_for_c(q), _for_c(k_cache), _for_c(v_cache), _for_c(out), _for_c(lse),
                           cache_seqlens=_for_c(seqlens), k=_for_c(k), v=_for_c(v), rotary_cos=_for_c(cos),
                           rotary_sin=_for_c(sin), cache_batch_idx=_for_c(batch_idx), block_table=_for_c(table),
                           scale=scale, causal=bool(causal), window_left=wl, window_right=wr,
                           softcap=float(softcap), rotary_interleaved=bool(rotary_interleaved),
                           num_splits=int(num_splits), stream=_stream_of(q), uint16_is_bf16=bf16)
    return (out, lse) if return_lse else out
