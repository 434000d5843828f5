"""PyTorch integration: custom ops with autograd, fake (meta) kernels and torch.compile support.

    from flashattn.torch import flash_attn_func, sdpa
    out = flash_attn_func(q, k, v, causal=True)      # (B, S, H, D), FlashAttention's layout
    out = sdpa(q, k, v, is_causal=True)              # (B, H, S, D), PyTorch's layout

Ops (``torch.ops.flashattn.*``): ``forward`` -> (out, lse) and ``backward`` -> (dq, dk, dv); both
are opaque to torch.compile (no graph breaks with fullgraph=True) and run on the CPU and on CUDA
(on PyTorch's current stream). dtypes float16 and bfloat16 everywhere, float32 on the CPU (and with
algorithm="standard" on CUDA: the CUDA flash kernels are 16-bit only); accumulation is fp32.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack as _dl

from . import _flashattn as _C

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "sdpa", "attention"]

_ALGORITHMS = ("flash", "standard")


def _launch_options(q: Tensor, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                    cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic):
    stream = 0
    if q.device.type == "cuda":
        stream = int(torch.cuda.current_stream(q.device).cuda_stream)
    return dict(scale=float(scale), causal=bool(causal), window_left=int(window_left),
                window_right=int(window_right), softcap=float(softcap),
                cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k),
                algorithm=algorithm, deterministic=bool(deterministic), stream=stream)


def _capsules(opts: dict) -> dict:
    # cu_seqlens tensors as DLPack capsules too (see _forward_impl).
    for key in ("cu_seqlens_q", "cu_seqlens_k"):
        if opts[key] is not None:
            opts[key] = _dl(opts[key])
    return opts


def _last_dim_contiguous(t: Tensor) -> Tensor:
    # The core takes any strides but a contiguous last dimension; autograd hands us expanded
    # (stride-0) gradients at times.
    if t.stride(-1) != 1 or 0 in t.stride():
        return t.contiguous()
    return t


def _device_ctx(q: Tensor):
    if q.device.type == "cuda":
        return torch.cuda.device(q.device)
    import contextlib

    return contextlib.nullcontext()


# ---- custom ops --------------------------------------------------------------------------------
def _forward_impl(q, k, v, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                  cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic):
    """The forward op's body (also called directly by attention()'s eager fast path)."""
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    B, Sq, H, D = q.shape
    out = torch.empty((B, Sq, H, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    opts = _launch_options(q, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                           cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic)
    # Tensors go to the binding as DLPack capsules (to_dlpack: ~0.3 µs each) rather than as
    # tensors, whose __dlpack__ method nanobind would call (~2.2 µs each, Python code in torch):
    # 19 -> 8 µs per call on a tiny CPU problem (docs/perf/log.md, P-073).
    with _device_ctx(q):
        _C.forward(_dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), **_capsules(opts))
    return out, lse


@torch.library.custom_op("flashattn::forward", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, window_left: int,
             window_right: int, softcap: float, cu_seqlens_q: Optional[Tensor],
             cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
             algorithm: str, deterministic: bool) -> Tuple[Tensor, Tensor]:
    """out (B, Sq, H, D) in q's dtype and lse (B, H, Sq) float32. scale 0 = 1/sqrt(D).
    deterministic is used by the backward only (kept here so autograd can pass it on)."""
    return _forward_impl(q, k, v, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                         cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic)


@_forward.register_fake
def _forward_fake(q, k, v, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                  cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic):
    B, Sq, H, D = q.shape
    out = q.new_empty((B, Sq, H, D))
    lse = q.new_empty((B, H, Sq), dtype=torch.float32)
    return out, lse


def _backward_impl(dout, q, k, v, out, lse, scale, causal, window_left, window_right, softcap,
                   cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic):
    """The backward op's body (also called by the eager autograd path, _EagerAttention)."""
    dout = _last_dim_contiguous(dout)
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    out = _last_dim_contiguous(out)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    opts = _launch_options(q, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                           cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic)
    with _device_ctx(q):
        _C.backward(_dl(q), _dl(k), _dl(v), _dl(out), _dl(dout.to(q.dtype)), _dl(lse), _dl(dq), _dl(dk),
                    _dl(dv), **_capsules(opts))
    return dq, dk, dv


@torch.library.custom_op("flashattn::backward", mutates_args=())
def _backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
              scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
              cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
              max_seqlen_k: int, algorithm: str, deterministic: bool
              ) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv), dense, in q's dtype."""
    return _backward_impl(dout, q, k, v, out, lse, scale, causal, window_left, window_right, softcap,
                          cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic)


@_backward.register_fake
def _backward_fake(dout, q, k, v, out, lse, scale, causal, window_left, window_right, softcap,
                   cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm,
                   deterministic):
    return (q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape))


def _setup_context(ctx, inputs, output):
    (q, k, v, scale, causal, window_left, window_right, softcap, cu_seqlens_q, cu_seqlens_k,
     max_seqlen_q, max_seqlen_k, algorithm, deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.args = (scale, causal, window_left, window_right, softcap, max_seqlen_q, max_seqlen_k,
                algorithm, deterministic)
    ctx.mark_non_differentiable(lse)


def _input_grads(ctx, dout, backward):
    """The forward inputs' gradients from what _setup_context saved, through `backward` (the
    backward op, or its body on the eager path)."""
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    (scale, causal, window_left, window_right, softcap, max_seqlen_q, max_seqlen_k, algorithm,
     deterministic) = ctx.args
    dq, dk, dv = backward(dout, q, k, v, out, lse, scale, causal, window_left, window_right, softcap,
                          cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None


def _autograd_backward(ctx, dout, dlse):
    # lse is returned for inspection and marked non-differentiable: its gradient is ignored.
    return _input_grads(ctx, dout, torch.ops.flashattn.backward)


torch.library.register_autograd("flashattn::forward", _autograd_backward,
                                setup_context=_setup_context)


# ---- eager paths ---------------------------------------------------------------------------------
# The custom ops' dispatch costs more than their bodies on short calls (CPU, B1 N16 H1 d64;
# docs/perf/log.md, P-073): ~17 µs per forward without gradients, ~70 µs with
# (torch.library's autograd wrapper), against a ~8 µs body. In plain eager mode — plain tensors, no
# torch.compile / export tracing, no dispatch or torch-function mode, no functorch transform —
# attention() therefore calls the bodies directly: without a gradient to record the forward body
# alone, with one through _EagerAttention, an autograd.Function over the same forward and backward
# bodies (the op's own autograd formula, once differentiable like the op). Results equal the ops'
# bit for bit (test_eager_paths_match_ops). Any API this check relies on being absent (another
# PyTorch version) sends every call through the ops.
_dispatch_stack_len = getattr(torch._C, "_len_torch_dispatch_stack", None)
_function_stack_len = getattr(torch._C, "_len_torch_function_stack", None)
_functorch_level = getattr(getattr(torch._C, "_functorch", None), "maybe_current_level", None)
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
_EAGER_OK = None not in (_dispatch_stack_len, _function_stack_len, _functorch_level, _is_compiling)


def _plain_eager(*tensors) -> bool:
    """Whether the ops' bodies may run directly: plain tensors, nothing tracing or intercepting."""
    if not _EAGER_OK:
        return False
    for t in tensors:
        if t is not None and type(t) is not Tensor:
            return False
    return (not _is_compiling() and _dispatch_stack_len() == 0 and _function_stack_len() == 0
            and _functorch_level() is None)


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class _EagerAttention(torch.autograd.Function):
    """forward/backward of the ops without their dispatch (see above); args as flashattn::forward."""

    @staticmethod
    def forward(ctx, *args):
        out, lse = _forward_impl(*args)
        _setup_context(ctx, args, (out, lse))
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        return _input_grads(ctx, dout, _backward_impl)  # lse's gradient ignored, as on the op


# ---- public functions --------------------------------------------------------------------------
def _check_scale(scale) -> float:
    if scale is None:
        return 0.0
    scale = float(scale)
    if scale == 0.0:
        raise ValueError("scale: expected a nonzero value (None = 1/sqrt(head_dim)), got 0.0")
    return scale


def _check_algorithm(algorithm: str) -> str:
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"algorithm: expected 'flash' or 'standard', got {algorithm!r}")
    return algorithm


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
              scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1),
              softcap: float = 0.0, cu_seqlens_q: Optional[Tensor] = None,
              cu_seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
              max_seqlen_k: Optional[int] = None, return_lse: bool = False,
              algorithm: str = "flash", deterministic: bool = False):
    """Differentiable :func:`flashattn.attention` for PyTorch tensors: (B, S, H, D) layout,
    bottom-right causal/window alignment; returns out, or (out, lse) with return_lse (lse is
    (B, H, Sq) float32 and not differentiable)."""
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        missing = "cu_seqlens_k" if cu_seqlens_k is None else "cu_seqlens_q"
        raise ValueError(f"{missing}: expected an int32 tensor together with the other cu_seqlens, got None")
    wl, wr = (int(w) for w in window)
    args = (q, k, v, _check_scale(scale), bool(causal), wl, wr, float(softcap), cu_seqlens_q,
            cu_seqlens_k, int(max_seqlen_q or 0), int(max_seqlen_k or 0), _check_algorithm(algorithm),
            bool(deterministic))
    if not _plain_eager(q, k, v, cu_seqlens_q, cu_seqlens_k):
        out, lse = torch.ops.flashattn.forward(*args)
    elif _needs_grad(q, k, v):
        out, lse = _EagerAttention.apply(*args)
    else:
        out, lse = _forward_impl(*args)
    return (out, lse) if return_lse else out


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0,
                    softmax_scale: Optional[float] = None, causal: bool = False,
                    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False):
    """FlashAttention's ``flash_attn_func``: q (B, Sq, H, D), k and v (B, Sk, Hkv, D), H % Hkv == 0.

    causal and window_size are aligned bottom-right (query i sees keys j <= i + Sk - Sq), as in
    FlashAttention >= 2.1. dropout_p > 0 and alibi_slopes are not supported and raise
    NotImplementedError. With return_attn_probs, returns (out, softmax_lse, None): lse is
    (B, H, Sq) float32; the attention probabilities are never materialized.
    """
    if dropout_p != 0.0:
        raise NotImplementedError(f"flash_attn_func: dropout_p > 0 is not supported (got {dropout_p})")
    if alibi_slopes is not None:
        raise NotImplementedError("flash_attn_func: alibi_slopes is not supported")
    out, lse = attention(q, k, v, causal=causal, scale=softmax_scale, window=window_size,
                         softcap=softcap, deterministic=deterministic, return_lse=True)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor] = None,
                            v: Optional[Tensor] = None, rotary_cos: Optional[Tensor] = None,
                            rotary_sin: Optional[Tensor] = None, cache_seqlens=None,
                            cache_batch_idx: Optional[Tensor] = None,
                            cache_leftpad: Optional[Tensor] = None, block_table: Optional[Tensor] = None,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: Optional[Tensor] = None,
                            num_splits: int = 0, return_softmax_lse: bool = False):
    """FlashAttention's ``flash_attn_with_kvcache``: decoding and appending over a KV cache.

    q (B, Sq, H, D); k_cache, v_cache (B_cache, S_max, Hkv, D), or paged (num_pages, page_size,
    Hkv, D) with block_table (B, max_pages) int32 (any page_size >= 1). cache_seqlens: (B) int32 or
    an int, the tokens already in each cache. k, v (B, S_new, Hkv, D), if given, are written into
    the cache in place at cache_seqlens[b] … (rotated first with rotary_cos/rotary_sin,
    (seqlen_rotary, rotary_dim / 2), interleaved or not); then q (rotated at cache_seqlens[b] + i
    with causal or a window, else at cache_seqlens[b]) attends to the first cache_seqlens[b] + S_new
    tokens, causal and window aligned bottom-right to that total. cache_seqlens is not advanced.
    Returns out (B, Sq, H, D), and softmax_lse (B, H, Sq) float32 with return_softmax_lse.
    cache_leftpad and alibi_slopes are not supported and raise NotImplementedError.
    """
    if cache_leftpad is not None:
        raise NotImplementedError("flash_attn_with_kvcache: cache_leftpad is not supported")
    if alibi_slopes is not None:
        raise NotImplementedError("flash_attn_with_kvcache: alibi_slopes is not supported")
    if cache_seqlens is None:
        raise ValueError("cache_seqlens: expected a (batch) int32 tensor or an int, got None")
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    scale = _check_scale(softmax_scale)
    wl, wr = (int(w) for w in window_size)
    q = _last_dim_contiguous(q)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device) \
        if return_softmax_lse else None
    stream = int(torch.cuda.current_stream(q.device).cuda_stream) if q.device.type == "cuda" else 0
    opt = lambda t: None if t is None else _dl(_last_dim_contiguous(t))
    with _device_ctx(q):
        _C.forward_kvcache(_dl(q), _dl(k_cache), _dl(v_cache), _dl(out), None if lse is None else _dl(lse),
                           cache_seqlens=_dl(cache_seqlens), k=opt(k), v=opt(v), rotary_cos=opt(rotary_cos),
                           rotary_sin=opt(rotary_sin), cache_batch_idx=opt(cache_batch_idx),
                           block_table=opt(block_table), scale=scale, causal=bool(causal), window_left=wl,
                           window_right=wr, softcap=float(softcap), rotary_interleaved=bool(rotary_interleaved),
                           num_splits=int(num_splits), stream=stream)
    return (out, lse) if return_softmax_lse else out


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                           cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                           dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                           causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                           softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                           deterministic: bool = False, return_attn_probs: bool = False):
    """FlashAttention's ``flash_attn_varlen_func``: packed q (total_q, H, D), k and v
    (total_k, Hkv, D), cu_seqlens_q/k int32 (batch + 1,) on q's device. Returns out
    (total_q, H, D) [, lse (H, total_q), None]."""
    if dropout_p != 0.0:
        raise NotImplementedError(f"flash_attn_varlen_func: dropout_p > 0 is not supported (got {dropout_p})")
    if alibi_slopes is not None:
        raise NotImplementedError("flash_attn_varlen_func: alibi_slopes is not supported")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name}: expected 3 dimensions (total_tokens, heads, head_dim), got shape {tuple(t.shape)}")
    out, lse = attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), causal=causal,
                         scale=softmax_scale, window=window_size, softcap=softcap,
                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                         deterministic=deterministic, return_lse=True)
    out = out.squeeze(0)
    return (out, lse.squeeze(0), None) if return_attn_probs else out


def sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
         dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
         enable_gqa: bool = False) -> Tensor:
    """Drop-in for ``torch.nn.functional.scaled_dot_product_attention`` (its layout and mask
    alignment): query (B, H, Sq, D), key and value (B, Hkv, Sk, D), output (B, H, Sq, D).

    is_causal is aligned TOP-LEFT, as in PyTorch: query i sees keys j <= i, whatever Sq and Sk
    (unlike flash_attn_func, which aligns bottom-right; the two agree when Sq == Sk). Query heads
    H != Hkv need enable_gqa=True, as in PyTorch. attn_mask and dropout_p > 0 are not supported
    and raise NotImplementedError. The output is a (B, H, Sq, D) view of a (B, Sq, H, D) tensor.
    """
    if attn_mask is not None:
        raise NotImplementedError("sdpa: attn_mask is not supported (use is_causal or flash_attn_func's window_size)")
    if dropout_p != 0.0:
        raise NotImplementedError(f"sdpa: dropout_p > 0 is not supported (got {dropout_p})")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != 4:
            raise ValueError(f"{name}: expected 4 dimensions (batch, heads, seqlen, head_dim), got shape {tuple(t.shape)}")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(f"key: expected {query.shape[1]} heads as query (or enable_gqa=True), got {key.shape[1]}")
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    window = (-1, -1)
    causal = False
    if is_causal:
        sq, sk = q.shape[1], k.shape[1]
        if sq <= sk:
            # Keys j >= Sq are seen by no query: top-left causal on (Sq, Sk) is the (square,
            # bottom-right == top-left) causal attention on the first Sq keys.
            k, v = k[:, :sq], v[:, :sq]
            causal = True
        else:
            # Bottom-right diagonal i + Sk - Sq moved right by Sq - Sk keys: j <= i.
            window = (-1, sq - sk)
    out = attention(q, k, v, causal=causal, scale=scale, window=window)
    return out.transpose(1, 2)
