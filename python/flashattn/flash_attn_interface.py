"""flash-attn's Python interface on this library: code written for flash-attn 2 runs after one import
changes,

    from flash_attn.flash_attn_interface import flash_attn_func       # before
    from flashattn.flash_attn_interface import flash_attn_func        # after

Every function has flash-attn's name, positional order, defaults and results (its documented
semantics: github.com/Dao-AILab/flash-attention, flash_attn/flash_attn_interface.py), and runs the
library's autograd op (flashattn.torch.attention) or its KV-cache op:

- ``causal=True`` with a ``window_size`` is accepted: causal caps the right side at 0, as flash-attn
  does (the library's own functions reject a right window > 0 with causal). A negative window side
  means unbounded, as in flash-attn.
- ``return_attn_probs=True`` returns ``(out, softmax_lse, S_dmask)``; flash-attn fills S_dmask only
  when dropout_p > 0 and returns an empty tensor otherwise, and so does this module (dropout is not
  supported here).
- ``flash_attn_varlen_func`` with a ``block_table`` (k and v a paged cache (num_blocks, page_size,
  Hkv, D), sequence b's keys the first cu_seqlens_k[b + 1] − cu_seqlens_k[b] tokens of its pages)
  runs the KV-cache op once over every sequence, its queries right-aligned in a (batch,
  max_seqlen_q) block so that each sequence's masks stay bottom-right; no autograd (a tensor that
  requires grad raises NotImplementedError).
- ``dropout_p > 0``, ``alibi_slopes`` and the KV-cache ``cache_leftpad`` raise NotImplementedError
  naming the argument.
- flash-attn reports bad arguments as RuntimeError, the library as ValueError or TypeError: here
  they are ``FlashAttnValueError`` / ``FlashAttnTypeError`` / ``FlashAttnUnsupportedError``, which
  derive from both, so ``except RuntimeError`` and ``except ValueError`` both catch them.
- softmax_scale=0 is a ValueError (None means 1/sqrt(head_dim)); float32 runs on the CPU backend.
"""
from __future__ import annotations

import functools
from typing import Tuple

import torch
from torch import Tensor

from . import _checks
from ._flashattn import UnsupportedError
from . import torch as _ft

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "FlashAttnValueError",
    "FlashAttnTypeError",
    "FlashAttnUnsupportedError",
]


class FlashAttnValueError(ValueError, RuntimeError):
    """A bad argument value: a ValueError (the library's class) and a RuntimeError (flash-attn's)."""


class FlashAttnTypeError(TypeError, RuntimeError):
    """A bad argument type, dtype or device: a TypeError and a RuntimeError."""


class FlashAttnUnsupportedError(UnsupportedError, RuntimeError):
    """A combination this build has no kernel for: flashattn.UnsupportedError and a RuntimeError."""


def _runtime_error(e: Exception) -> Exception:
    if isinstance(e, RuntimeError):  # NotImplementedError, and errors already translated
        return e
    cls = (FlashAttnUnsupportedError if isinstance(e, UnsupportedError) else
           FlashAttnTypeError if isinstance(e, TypeError) else FlashAttnValueError)
    return cls(*e.args)


def _flash_attn_errors(fn):
    """Re-raises the library's ValueError / TypeError as the classes above, message unchanged."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError) as e:
            translated = _runtime_error(e)
            if translated is e:
                raise
            raise translated.with_traceback(e.__traceback__) from None

    return wrapper


def _unsupported(fn_name: str, dropout_p, alibi_slopes) -> None:
    if dropout_p != 0.0:
        raise NotImplementedError(f"{fn_name}: dropout_p > 0 is not supported (got {dropout_p})")
    if alibi_slopes is not None:
        raise NotImplementedError(f"{fn_name}: alibi_slopes is not supported")


def _window(window_size, causal: bool) -> Tuple[int, int]:
    """flash-attn's reading of window_size: a negative side is unbounded (-1); causal sets the right
    side to 0 whatever was given."""
    left, right = _checks.window_pair(window_size, "window_size")
    left, right = max(left, -1), max(right, -1)
    return left, (0 if causal else right)


def _probs_placeholder(q: Tensor) -> Tensor:
    # flash-attn's S_dmask without dropout: an empty tensor of q's dtype.
    return torch.empty((0,), dtype=q.dtype, device=q.device)


def _dense(q, k, v, softmax_scale, causal, window_size, softcap, deterministic, return_attn_probs):
    out, lse = _ft.attention(q, k, v, causal=causal, scale=softmax_scale, window=_window(window_size, causal),
                             softcap=softcap, deterministic=deterministic, return_lse=True)
    return (out, lse, _probs_placeholder(q)) if return_attn_probs else out


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
            window_size, softcap, deterministic, return_attn_probs):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 3:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name}: expected 3 dimensions (total_tokens, heads, head_dim), got {shape}")
    out, lse = _ft.attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), causal=causal, scale=softmax_scale,
                             window=_window(window_size, causal), softcap=softcap, cu_seqlens_q=cu_seqlens_q,
                             cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                             deterministic=deterministic, return_lse=True)
    out = out.squeeze(0)
    return (out, lse.squeeze(0), _probs_placeholder(q)) if return_attn_probs else out


def _varlen_paged(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, block_table, softmax_scale, causal,
                  window_size, softcap, return_attn_probs):
    """Packed queries over a paged cache: sequence b's queries go to rows [max_q − len_q, max_q) of
    its row of a (batch, max_q) block, so the KV-cache op's bottom-right alignment (query i of Sq
    sees keys up to i + len_k − Sq) is the sequence's own; the other rows are dropped."""
    if not isinstance(q, Tensor) or q.dim() != 3:
        shape = tuple(q.shape) if isinstance(q, Tensor) else type(q).__name__
        raise ValueError(f"q: expected 3 dimensions (total_tokens, heads, head_dim), got {shape}")
    if any(isinstance(t, Tensor) and t.requires_grad for t in (q, k_cache, v_cache)):
        raise NotImplementedError("flash_attn_varlen_func: block_table (a paged cache) runs without autograd; "
                                  "got a tensor that requires grad")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, Tensor) or t.dim() != 1 or t.dtype != torch.int32:
            raise ValueError(f"{name}: expected a 1-D int32 tensor")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel() or cu_seqlens_q.numel() < 1:
        raise ValueError(f"cu_seqlens_q, cu_seqlens_k: expected the same batch + 1 >= 1 entries, got "
                         f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    batch = cu_seqlens_q.numel() - 1
    cu_q = cu_seqlens_q.to(device=q.device, dtype=torch.int64)
    lens_q = cu_q[1:] - cu_q[:-1]
    lens_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    total_q = q.shape[0]
    longest = int(lens_q.max()) if batch > 0 else 0
    if batch > 0 and (int(lens_q.min()) < 0 or int(cu_q[-1]) != total_q or int(cu_q[0]) != 0):
        raise ValueError(f"cu_seqlens_q: expected non-decreasing prefix sums from 0 to q's {total_q} tokens")
    if longest > max_seqlen_q:
        raise ValueError(f"max_seqlen_q: {max_seqlen_q} is less than the longest query sequence ({longest})")
    rows = max(int(max_seqlen_q), 1)
    # token j of sequence b: row b, position rows − len_q[b] + (j − cu_q[b]) of the block
    seq = torch.repeat_interleave(torch.arange(batch, device=q.device), lens_q, output_size=total_q)
    pos = torch.arange(total_q, device=q.device) + (rows - lens_q - cu_q[:-1])[seq]
    block = q.new_zeros((batch, rows) + tuple(q.shape[1:]))
    block[seq, pos] = q
    out, lse = _ft.flash_attn_with_kvcache(block, k_cache, v_cache, cache_seqlens=lens_k, block_table=block_table,
                                           softmax_scale=softmax_scale, causal=causal,
                                           window_size=_window(window_size, causal), softcap=softcap,
                                           return_softmax_lse=True)
    out = out[seq, pos]
    if not return_attn_probs:
        return out
    return out, lse[seq, :, pos].transpose(0, 1).contiguous(), _probs_placeholder(q)


def _packed(name: str, t, ndim: int, count: int, axis: int, layout: str):
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim or t.shape[axis] != count:
        raise ValueError(f"{name}: expected shape {layout}, got {tuple(t.shape)}")
    return t.unbind(axis)


@_flash_attn_errors
def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (B, Sq, H, D), k and v (B, Sk, Hkv, D) with H % Hkv == 0. causal and window_size aligned
    bottom-right (query i sees keys [i + Sk - Sq - window_size[0], i + Sk - Sq + window_size[1]]).
    Returns out (B, Sq, H, D), or (out, softmax_lse (B, H, Sq) float32, empty S_dmask) with
    return_attn_probs."""
    _unsupported("flash_attn_func", dropout_p, alibi_slopes)
    return _dense(q, k, v, softmax_scale, causal, window_size, softcap, deterministic, return_attn_probs)


@_flash_attn_errors
def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv (B, S, 3, H, D); otherwise as flash_attn_func. The gradient is qkv's, (B, S, 3, H, D)."""
    _unsupported("flash_attn_qkvpacked_func", dropout_p, alibi_slopes)
    q, k, v = _packed("qkv", qkv, 5, 3, 2, "(batch, seqlen, 3, heads, head_dim)")
    return _dense(q, k, v, softmax_scale, causal, window_size, softcap, deterministic, return_attn_probs)


@_flash_attn_errors
def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (B, Sq, H, D), kv (B, Sk, 2, Hkv, D); otherwise as flash_attn_func."""
    _unsupported("flash_attn_kvpacked_func", dropout_p, alibi_slopes)
    k, v = _packed("kv", kv, 5, 2, 2, "(batch, seqlen, 2, heads_k, head_dim)")
    return _dense(q, k, v, softmax_scale, causal, window_size, softcap, deterministic, return_attn_probs)


@_flash_attn_errors
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """Packed sequences: q (total_q, H, D), k and v (total_k, Hkv, D), cu_seqlens_q/k (batch + 1,)
    int32 on q's device; masks align bottom-right within each sequence. With block_table (batch,
    max_pages) int32, k and v are a paged cache (num_blocks, page_size, Hkv, D) and sequence b's
    keys its first cu_seqlens_k[b + 1] − cu_seqlens_k[b] tokens (forward only). Returns out
    (total_q, H, D), or (out, softmax_lse (H, total_q) float32, empty S_dmask) with
    return_attn_probs."""
    _unsupported("flash_attn_varlen_func", dropout_p, alibi_slopes)
    if block_table is not None:
        return _varlen_paged(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, block_table, softmax_scale, causal,
                             window_size, softcap, return_attn_probs)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                   window_size, softcap, deterministic, return_attn_probs)


@_flash_attn_errors
def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv (total, 3, H, D) with one cu_seqlens and max_seqlen for q and k; otherwise as
    flash_attn_varlen_func."""
    _unsupported("flash_attn_varlen_qkvpacked_func", dropout_p, alibi_slopes)
    q, k, v = _packed("qkv", qkv, 4, 3, 1, "(total_tokens, 3, heads, head_dim)")
    return _varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, softmax_scale, causal, window_size,
                   softcap, deterministic, return_attn_probs)


@_flash_attn_errors
def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (total_q, H, D), kv (total_k, 2, Hkv, D); otherwise as flash_attn_varlen_func."""
    _unsupported("flash_attn_varlen_kvpacked_func", dropout_p, alibi_slopes)
    k, v = _packed("kv", kv, 4, 2, 1, "(total_tokens, 2, heads_k, head_dim)")
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                   window_size, softcap, deterministic, return_attn_probs)


@_flash_attn_errors
def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """flashattn.torch.flash_attn_with_kvcache (appends k, v to the cache in place, then q attends to
    the first cache_seqlens[b] + S_new cached tokens; contiguous or paged cache, any page size) with
    flash-attn's window rule (causal caps the right side at 0) and error classes. No autograd."""
    return _ft.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos=rotary_cos, rotary_sin=rotary_sin, cache_seqlens=cache_seqlens,
        cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, block_table=block_table,
        softmax_scale=softmax_scale, causal=causal, window_size=_window(window_size, causal), softcap=softcap,
        rotary_interleaved=rotary_interleaved, alibi_slopes=alibi_slopes, num_splits=num_splits,
        return_softmax_lse=return_softmax_lse)
