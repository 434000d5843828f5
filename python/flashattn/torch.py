"""PyTorch integration: custom ops with autograd, fake (meta) kernels and torch.compile support.

    from flashattn.torch import flash_attn_func, sdpa
    out = flash_attn_func(q, k, v, causal=True)      # (B, S, H, D), FlashAttention's layout
    out = sdpa(q, k, v, is_causal=True)              # (B, H, S, D), PyTorch's layout

Ops (``torch.ops.flashattn.*``): ``forward`` -> (out, lse), ``backward`` -> (dq, dk, dv) and
``forward_kvcache`` -> (out, lse), which updates k_cache and v_cache in place (declared as mutated
arguments); all are opaque to torch.compile (no graph breaks with fullgraph=True) and run on the CPU
and on CUDA (on PyTorch's current stream, so they can be captured in a CUDA graph). dtypes float16
and bfloat16 everywhere, float32 on the CPU (and with algorithm="standard" on CUDA: the CUDA flash
kernels are 16-bit only); accumulation is fp32.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack as _dl

from . import _checks
from . import _flashattn as _C

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "sdpa", "attention"]

def _launch_options(q: Tensor, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                    cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic, seqused_k):
    stream = 0
    if q.device.type == "cuda":
        stream = int(torch.cuda.current_stream(q.device).cuda_stream)
    return dict(scale=float(scale), causal=bool(causal), window_left=int(window_left),
                window_right=int(window_right), softcap=float(softcap),
                cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k), seqused_k=seqused_k,
                algorithm=algorithm, deterministic=bool(deterministic), stream=stream)


def _capsules(opts: dict) -> dict:
    # cu_seqlens and seqused_k tensors as DLPack capsules too (see _forward_impl).
    for key in ("cu_seqlens_q", "cu_seqlens_k", "seqused_k"):
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
                  cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic, seqused_k=None):
    """The forward op's body (also called directly by attention()'s eager fast path)."""
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    B, Sq, H, D = q.shape
    out = torch.empty((B, Sq, H, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    opts = _launch_options(q, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                           cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic, seqused_k)
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
             algorithm: str, deterministic: bool, seqused_k: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """out (B, Sq, H, D) in q's dtype and lse (B, H, Sq) float32. scale 0 = 1/sqrt(D).
    deterministic is used by the backward only (kept here so autograd can pass it on).
    seqused_k: None, or (batch) int32 on q's device: sequence b attends to its first seqused_k[b]
    keys (causal and window align to them); the rows past them are padding, never read."""
    return _forward_impl(q, k, v, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                         cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic, seqused_k)


@_forward.register_fake
def _forward_fake(q, k, v, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                  cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic, seqused_k=None):
    B, Sq, H, D = q.shape
    out = q.new_empty((B, Sq, H, D))
    lse = q.new_empty((B, H, Sq), dtype=torch.float32)
    return out, lse


def _backward_impl(dout, q, k, v, out, lse, scale, causal, window_left, window_right, softcap,
                   cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic,
                   seqused_k=None):
    """The backward op's body (also called by the eager autograd path, _EagerAttention)."""
    dout = _last_dim_contiguous(dout)
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    out = _last_dim_contiguous(out)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    opts = _launch_options(q, scale, causal, window_left, window_right, softcap, cu_seqlens_q,
                           cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic, seqused_k)
    with _device_ctx(q):
        _C.backward(_dl(q), _dl(k), _dl(v), _dl(out), _dl(dout.to(q.dtype)), _dl(lse), _dl(dq), _dl(dk),
                    _dl(dv), **_capsules(opts))
    return dq, dk, dv


@torch.library.custom_op("flashattn::backward", mutates_args=())
def _backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
              scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
              cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
              max_seqlen_k: int, algorithm: str, deterministic: bool, seqused_k: Optional[Tensor] = None
              ) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv), dense, in q's dtype (dk, dv rows past seqused_k[b] are zeros)."""
    return _backward_impl(dout, q, k, v, out, lse, scale, causal, window_left, window_right, softcap,
                          cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic,
                          seqused_k)


@_backward.register_fake
def _backward_fake(dout, q, k, v, out, lse, scale, causal, window_left, window_right, softcap,
                   cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm,
                   deterministic, seqused_k=None):
    return (q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape))


def _setup_context(ctx, inputs, output):
    # inputs: the forward op's arguments; seqused_k (the last) may be left out on the eager path.
    (q, k, v, scale, causal, window_left, window_right, softcap, cu_seqlens_q, cu_seqlens_k,
     max_seqlen_q, max_seqlen_k, algorithm, deterministic) = inputs[:14]
    seqused_k = inputs[14] if len(inputs) > 14 else None
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k)
    ctx.args = (scale, causal, window_left, window_right, softcap, max_seqlen_q, max_seqlen_k,
                algorithm, deterministic)
    ctx.num_inputs = len(inputs)
    ctx.mark_non_differentiable(lse)


def _input_grads(ctx, dout, backward):
    """The forward inputs' gradients from what _setup_context saved, through `backward` (the
    backward op, or its body on the eager path)."""
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k = ctx.saved_tensors
    (scale, causal, window_left, window_right, softcap, max_seqlen_q, max_seqlen_k, algorithm,
     deterministic) = ctx.args
    dq, dk, dv = backward(dout, q, k, v, out, lse, scale, causal, window_left, window_right, softcap,
                          cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, algorithm, deterministic,
                          seqused_k)
    return (dq, dk, dv) + (None,) * (ctx.num_inputs - 3)


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
# bodies (the op's own autograd formula, once differentiable like the op). flash_attn_with_kvcache
# calls the KV-cache op's body the same way (it records no gradient) and bumps the caches' version
# counters as the op does. Results equal the ops' bit for bit (test_eager_paths_match_ops,
# test_kvcache_eager_path_matches_op). Any API this check relies on being absent (another PyTorch
# version) sends every call through the ops.
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


# ---- KV-cache op ---------------------------------------------------------------------------------
def _kvcache_impl(q, k_cache, v_cache, cache_seqlens, k, v, rotary_cos, rotary_sin, cache_batch_idx,
                  block_table, scale, causal, window_left, window_right, softcap, rotary_interleaved,
                  num_splits, return_lse):
    """The KV-cache op's body (also called directly by flash_attn_with_kvcache's eager fast path).
    Every tensor reaches the binding as it is: the core checks all of them before it writes."""
    B, Sq, H, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq) if return_lse else (0,), dtype=torch.float32, device=q.device)
    stream = int(torch.cuda.current_stream(q.device).cuda_stream) if q.device.type == "cuda" else 0
    opt = lambda t: None if t is None else _dl(t)  # noqa: E731
    with _device_ctx(q):
        _C.forward_kvcache(_dl(q), _dl(k_cache), _dl(v_cache), _dl(out), _dl(lse) if return_lse else None,
                           cache_seqlens=_dl(cache_seqlens), k=opt(k), v=opt(v), rotary_cos=opt(rotary_cos),
                           rotary_sin=opt(rotary_sin), cache_batch_idx=opt(cache_batch_idx),
                           block_table=opt(block_table), scale=scale, causal=causal, window_left=window_left,
                           window_right=window_right, softcap=softcap, rotary_interleaved=rotary_interleaved,
                           num_splits=num_splits, stream=stream, check_on_device=q.device.type == "cuda")
    return out, lse


@torch.library.custom_op("flashattn::forward_kvcache", mutates_args=("k_cache", "v_cache"))
def _forward_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor, k: Optional[Tensor],
                     v: Optional[Tensor], rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor],
                     cache_batch_idx: Optional[Tensor], block_table: Optional[Tensor], scale: float,
                     causal: bool, window_left: int, window_right: int, softcap: float,
                     rotary_interleaved: bool, num_splits: int, return_lse: bool) -> Tuple[Tensor, Tensor]:
    """Writes k, v (B, S_new, Hkv, D) into k_cache, v_cache in place at cache_seqlens[b] ... (cache_seqlens
    a (B) int32 tensor on q's device), then returns out (B, Sq, H, D) in q's dtype and lse (B, H, Sq)
    float32 (an empty tensor without return_lse). scale 0 = 1/sqrt(D). No autograd formula."""
    return _kvcache_impl(q, k_cache, v_cache, cache_seqlens, k, v, rotary_cos, rotary_sin, cache_batch_idx,
                         block_table, scale, causal, window_left, window_right, softcap, rotary_interleaved,
                         num_splits, return_lse)


@_forward_kvcache.register_fake
def _forward_kvcache_fake(q, k_cache, v_cache, cache_seqlens, k, v, rotary_cos, rotary_sin, cache_batch_idx,
                          block_table, scale, causal, window_left, window_right, softcap, rotary_interleaved,
                          num_splits, return_lse):
    B, Sq, H, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, H, Sq) if return_lse else (0,), dtype=torch.float32)


def _dense_last_dim(t: Optional[Tensor]) -> Optional[Tensor]:
    """A read-only input as the core takes it: t itself (detached) when its last dimension is
    contiguous, else a dense copy — the only copy flash_attn_with_kvcache makes of an input."""
    if t is None or not isinstance(t, Tensor):
        return t  # the binding names what it expected
    if t.requires_grad:
        t = t.detach()
    if t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        t = t.contiguous()
    return t


# Integer dtypes that cache_seqlens is converted from (exactly; int64 saturated first, so that no
# length wraps into the valid range); int32 is taken as it is.
_NARROW_INTS = (torch.int8, torch.int16, torch.uint8)


def _cache_seqlens(cache_seqlens, q: Tensor, k_cache: Tensor, block_table, k) -> Tensor:
    """cache_seqlens in the form the op takes, a (batch) int32 tensor on q's device, from any form
    flash-attn accepts: that tensor (passed as it is), an int (every sequence that long), or None
    (every sequence fills its cache: S_max, or max_pages * page_size when paged; not with k and v)."""
    batch = q.shape[0]
    if cache_seqlens is None:
        if k is not None:
            raise ValueError("cache_seqlens: expected a (batch) int32 tensor or an int when k and v are "
                             "appended, got None")
        pages = block_table.shape[-1] if isinstance(block_table, Tensor) and block_table.dim() == 2 else 1
        return torch.full((batch,), k_cache.shape[1] * pages, dtype=torch.int32, device=q.device)
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, (int, torch.SymInt, Tensor)):
        raise TypeError(f"cache_seqlens: expected a (batch) int32 tensor or an int, got {type(cache_seqlens).__name__}")
    if not isinstance(cache_seqlens, Tensor):
        if isinstance(cache_seqlens, int) and not -2**31 <= cache_seqlens < 2**31:
            raise ValueError(f"cache_seqlens: expected an int32 value, got {cache_seqlens}")
        return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    if cache_seqlens.dtype != torch.int32:
        if cache_seqlens.dtype == torch.int64:
            cache_seqlens = cache_seqlens.clamp(-1, 2**31 - 1).to(torch.int32)  # explicit copy
        elif cache_seqlens.dtype in _NARROW_INTS:
            cache_seqlens = cache_seqlens.to(torch.int32)  # explicit copy
        else:
            raise TypeError(f"cache_seqlens: expected dtype int32 (or another integer dtype, converted), "
                            f"got {cache_seqlens.dtype}")
    return _dense_last_dim(cache_seqlens)


# ---- public functions --------------------------------------------------------------------------
def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
              scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1),
              softcap: float = 0.0, cu_seqlens_q: Optional[Tensor] = None,
              cu_seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
              max_seqlen_k: Optional[int] = None, seqused_k: Optional[Tensor] = None,
              return_lse: bool = False, algorithm: str = "flash", deterministic: bool = False):
    """Differentiable :func:`flashattn.attention` for PyTorch tensors: (B, S, H, D) layout,
    bottom-right causal/window alignment; returns out, or (out, lse) with return_lse (lse is
    (B, H, Sq) float32 and not differentiable). The arguments are checked as flashattn.attention
    checks them (flashattn/_checks.py); cu_seqlens and seqused_k that are not tensors are converted
    to int32 tensors on q's device.

    seqused_k: None, or (batch) int32 (one entry per sequence, also with cu_seqlens): sequence b
    attends to its first seqused_k[b] keys only, causal and window aligned bottom-right to them; the
    key rows past them are padding (never read; their gradients are zeros). A right-padded batch
    needs no unpadding."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    o = _checks.attention_options(q, scale=scale, causal=causal, window=window, softcap=softcap,
                                  cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                  max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                  algorithm=algorithm, deterministic=deterministic)
    cu_seqlens_q, cu_seqlens_k, seqused_k = (c if c is None or isinstance(c, Tensor) else
                                             torch.as_tensor(c, dtype=torch.int32, device=q.device)
                                             for c in (cu_seqlens_q, cu_seqlens_k, seqused_k))
    args = (q, k, v, o["scale"], o["causal"], o["window_left"], o["window_right"], o["softcap"], cu_seqlens_q,
            cu_seqlens_k, o["max_seqlen_q"], o["max_seqlen_k"], o["algorithm"], o["deterministic"], seqused_k)
    if not _plain_eager(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k):
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
    Hkv, D) with block_table (B, max_pages) int32 (any page_size >= 1); H % Hkv == 0.
    cache_seqlens: the tokens already in each cache, as flash-attn takes it: a (B) int32 tensor on
    q's device (passed as it is), an int (every sequence that long), or None (every sequence fills
    its cache; not with k and v). Other integer tensors are converted to int32 (a copy).
    k, v (B, S_new, Hkv, D), if given, are written into the cache in place at cache_seqlens[b] …
    (rotated first with rotary_cos/rotary_sin, (seqlen_rotary, rotary_dim / 2), interleaved or not);
    then q (rotated at cache_seqlens[b] + i with causal or a window, else at cache_seqlens[b]) attends
    to the first cache_seqlens[b] + S_new tokens, causal and window aligned bottom-right to that
    total. cache_batch_idx (B) int32 picks each sequence's row of a contiguous cache. cache_seqlens
    is not advanced. Returns out (B, Sq, H, D), and softmax_lse (B, H, Sq) float32 with
    return_softmax_lse (-inf for a row that sees no key, whose output is 0).

    Runs ``torch.ops.flashattn.forward_kvcache`` (under torch.compile, export and other tracing; in
    plain eager mode its body is called directly), on PyTorch's current CUDA stream for CUDA
    tensors, so a decode step can be captured in a CUDA graph and replayed with new cache_seqlens
    values. Inputs are not copied when their last dimension is contiguous; others are copied
    densely first, except k_cache and v_cache, which are written in place and so must have a
    contiguous last dimension. No gradient is recorded, as in flash-attn: out and softmax_lse never
    require grad, whatever the inputs.
    cache_leftpad and alibi_slopes are not supported and raise NotImplementedError; bad input
    raises ValueError or TypeError naming the argument, and then neither the cache nor anything
    else has been written. On CUDA the values of cache_seqlens, block_table and cache_batch_idx
    are checked on the device, without synchronizing (as a decode loop needs): an out-of-range
    value makes the call write nothing (out keeps what torch.empty gave it) and raises nothing.
    """
    if cache_leftpad is not None:
        raise NotImplementedError("flash_attn_with_kvcache: cache_leftpad is not supported")
    if alibi_slopes is not None:
        raise NotImplementedError("flash_attn_with_kvcache: alibi_slopes is not supported")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q: expected 4 dimensions (batch, seqlen, heads, head_dim), got shape {tuple(q.shape)}")
    seqlens = _cache_seqlens(cache_seqlens, q, k_cache, block_table, k)
    wl, wr = _checks.window_pair(window_size, "window_size")
    # The caches are written through these detached aliases (same memory, same version counter).
    kc = k_cache.detach() if k_cache.requires_grad else k_cache
    vc = v_cache.detach() if v_cache.requires_grad else v_cache
    args = (_dense_last_dim(q), kc, vc, seqlens, _dense_last_dim(k), _dense_last_dim(v),
            _dense_last_dim(rotary_cos), _dense_last_dim(rotary_sin), _dense_last_dim(cache_batch_idx),
            _dense_last_dim(block_table), _checks.scale_value(softmax_scale), bool(causal), wl, wr, float(softcap),
            bool(rotary_interleaved), int(num_splits), bool(return_softmax_lse))
    if _plain_eager(*args[:10]):
        out, lse = _kvcache_impl(*args)
        torch.autograd.graph.increment_version((kc, vc))  # as the op's in-place bookkeeping does
    else:
        out, lse = torch.ops.flashattn.forward_kvcache(*args)
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


def __getattr__(name):
    # flashattn.torch.context_parallel (the module flashattn.context_parallel), imported on first use
    # so that importing flashattn.torch does not import torch.distributed.
    if name == "context_parallel":
        import importlib

        return importlib.import_module("..context_parallel", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
