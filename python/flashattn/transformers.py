"""Hugging Face transformers models on this library, without glue:

    import flashattn.transformers
    model = AutoModel.from_pretrained(path, attn_implementation=flashattn.transformers.IMPLEMENTATION)

Importing the module registers an attention function with transformers' ``AttentionInterface`` and
a mask function with its ``AttentionMaskInterface``, both under the name ``IMPLEMENTATION``. The
name has no "flash" in it: transformers 5 sends every implementation name containing "flash" to
its own FlashAttention loader.

How a call is computed (docs/python.md lists the model features):

- The mask function does not build the (batch, 1, q_len, kv_len) mask that sdpa takes. It returns a
  ``PaddedMask``: the mask pattern (causal, sliding window, bidirectional) read off the mask
  function transformers passes, and, when there is padding, each batch row's span of valid query
  and key positions. It is made once per forward pass and shared by all layers.
- The attention function runs ``flashattn.torch.attention`` (autograd) on (batch, seqlen, heads,
  head_dim) views of transformers' tensors, without copies when no row is padded or, on the CPU,
  when only keys are (every query valid, each row's keys a prefix: ``seqused_k``, as for an
  encoder's right-padded batch or a static cache's empty tail; on CUDA such calls are packed as
  below, because the Hopper kernels take cu_seqlens and a call with seqused_k runs the portable ones). Otherwise — left padding (``generate()`` on a padded
  batch), right-padded causal batches (training), whose padded queries must not shift the causal
  diagonal — it runs on the valid tokens only, packed by cu_seqlens (varlen), and scatters the
  result back (padded query rows output 0).
- What it cannot express goes to transformers' sdpa with a one-time ``SdpaFallbackWarning`` naming
  the reason, never to something else: a 4-D mask given by the caller, a mask pattern other than
  causal / sliding window / bidirectional (packed sequences, chunked attention, custom mask
  functions), padding that is not one contiguous span per row, attention dropout > 0 (training
  with dropout), a position bias, float32 on CUDA (the CUDA kernels are 16-bit), key or value head
  dims other than the query's, head dims above 256 (on CUDA: not a multiple of 8), a combination this
  build has no kernel for (flashattn.UnsupportedError). With softcap, which sdpa lacks, such a call
  raises NotImplementedError instead.
"""
from __future__ import annotations

import warnings
from typing import List, Optional, Tuple

try:
    import transformers as _transformers
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers import masking_utils as _masking
    from transformers.integrations.sdpa_attention import sdpa_attention_forward as _sdpa_attention_forward
except ImportError as e:  # transformers missing, or one without the attention/mask interfaces
    raise ImportError(
        "flashattn.transformers needs the 'transformers' package (version 5 or newer): "
        "pip install 'transformers>=5'") from e

import torch
from torch import Tensor

from . import torch as _ft
from ._flashattn import UnsupportedError

__all__ = ["IMPLEMENTATION", "PaddedMask", "SdpaFallbackWarning", "attention_forward", "build_mask"]

IMPLEMENTATION = "tiled_attention"

if int(_transformers.__version__.split(".")[0]) < 5:
    raise ImportError(f"flashattn.transformers needs transformers 5 or newer, got {_transformers.__version__}")


class SdpaFallbackWarning(UserWarning):
    """A call this library cannot express ran on transformers' sdpa instead (once per reason)."""


_warned = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"flashattn.transformers: {reason}; this call and others like it run on transformers' sdpa",
                      SdpaFallbackWarning, stacklevel=3)


# ---- mask patterns ---------------------------------------------------------------------------------
# transformers builds each mask from an index function (batch, head, q_idx, kv_idx) -> bool in
# absolute positions. The patterns below are recognized by identity (the functions themselves, or
# the code objects of the closures transformers' factories return, with their closed-over window);
# any other function — packed sequences, chunks, and/or combinations with custom functions — is not
# recognized and its mask goes to sdpa.
_AND_CODE = _masking.and_masks(_masking.causal_mask_function).__code__
_SLIDING_CODE = _masking.sliding_window_overlay(1).__code__
_BIDIRECTIONAL_SLIDING_CODE = _masking.sliding_window_bidirectional_overlay(1).__code__


def _closure(fn, code) -> Optional[dict]:
    if getattr(fn, "__code__", None) is not code or fn.__closure__ is None:
        return None
    return dict(zip(code.co_freevars, (cell.cell_contents for cell in fn.__closure__)))


def _window_of(fn, code) -> Optional[int]:
    cells = _closure(fn, code)
    w = None if cells is None else cells.get("sliding_window")
    return w if isinstance(w, int) and not isinstance(w, bool) and w >= 1 else None


def _pattern(fn) -> Optional[Tuple[bool, int, int]]:
    """(causal, window_left, window_right) in the library's terms for a mask function of
    transformers', or None.

    causal: kv <= q. Sliding window (causal): q - W < kv <= q, i.e. window_left = W - 1.
    Bidirectional sliding window: |q - kv| <= W, i.e. window (W, W)."""
    if fn is _masking.causal_mask_function:
        return True, -1, -1
    if fn is _masking.bidirectional_mask_function:
        return False, -1, -1
    cells = _closure(fn, _AND_CODE)
    parts = None if cells is None else cells.get("mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2:
        return None
    overlay, base = parts
    if base is _masking.causal_mask_function:
        w = _window_of(overlay, _SLIDING_CODE)
        return None if w is None else (True, w - 1, -1)
    if base is _masking.bidirectional_mask_function:
        w = _window_of(overlay, _BIDIRECTIONAL_SLIDING_CODE)
        return None if w is None else (False, w, w)
    return None


# ---- the mask object -----------------------------------------------------------------------------
class PaddedMask:
    """What the attention function needs to know about one of transformers' masks, without the
    (batch, 1, q_len, kv_len) tensor.

    causal, window: the pattern, aligned bottom-right within each row's valid tokens (the alignment
    holds because the last valid query and the last valid key of each row are the same position).
    spans: None (no padding: every query and key of the batch is valid), or per batch row the
    half-open ranges (q_start, q_end, k_start, k_end) of valid query and key indices.
    fallback: for a mask the library cannot express, the reason; ``sdpa_mask()`` then gives the
    boolean mask transformers' sdpa would have been given.
    """

    # transformers' mask preprocessing reads .ndim of a mask it is handed back (generate() with a
    # static cache passes prepared masks in again): not 2, so it is not taken for a padding mask.
    ndim = 4

    def __init__(self, batch: int, q_length: int, kv_length: int, causal: bool = False,
                 window: Tuple[int, int] = (-1, -1), spans: Optional[List[Tuple[int, int, int, int]]] = None,
                 fallback: Optional[str] = None, sdpa_args: Optional[dict] = None):
        self.batch, self.q_length, self.kv_length = batch, q_length, kv_length
        self.causal, self.window = causal, window
        self.spans = spans
        self.fallback = fallback
        self._sdpa_args = sdpa_args
        self._sdpa_mask = None
        self._packing = {}

    def __repr__(self) -> str:
        what = f"fallback={self.fallback!r}" if self.fallback else (
            f"causal={self.causal}, window={self.window}, spans={self.spans}")
        return f"PaddedMask(batch={self.batch}, q_length={self.q_length}, kv_length={self.kv_length}, {what})"

    def sdpa_mask(self) -> Optional[Tensor]:
        """The boolean (batch, 1, q_length, kv_length) mask of transformers' sdpa for this call."""
        if self._sdpa_mask is None and self._sdpa_args is not None:
            self._sdpa_mask = _masking.sdpa_mask(allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
                                                 **self._sdpa_args)
        return self._sdpa_mask

    @property
    def right_padded(self) -> bool:
        """Every query valid and each row's keys a prefix: the call takes seqused_k, no unpadding."""
        return self.spans is not None and all(q0 == 0 and q1 == self.q_length and k0 == 0
                                              for q0, q1, k0, _ in self.spans)

    def seqused_k(self, device: torch.device) -> Tensor:
        """(batch) int32: the valid keys of each row (for right_padded masks)."""
        key = ("seqused_k", str(device))
        if key not in self._packing:
            self._packing[key] = torch.tensor([k1 for _, _, _, k1 in self.spans], dtype=torch.int32, device=device)
        return self._packing[key]

    def packing(self, device: torch.device):
        """Index tensors and cu_seqlens of the valid tokens, built once per device and shared by every
        layer: (q batch index, q position, k batch index, k position, cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q, max_seqlen_k)."""
        key = str(device)
        if key not in self._packing:
            spans = torch.tensor(self.spans, dtype=torch.int64, device=device)  # (batch, 4)
            batch = torch.arange(len(self.spans), device=device)
            packed = []
            for start, end in ((spans[:, 0], spans[:, 1]), (spans[:, 2], spans[:, 3])):
                lengths = end - start
                cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0))
                rows = torch.repeat_interleave(batch, lengths)
                # position within the row: the token's index in the packed tensor, less its sequence's
                # first packed index, plus the sequence's first valid position
                pos = torch.arange(int(cu[-1]), device=device) - cu[rows] + start[rows]
                packed.append((rows, pos, cu.to(torch.int32), int(lengths.max())))
            (qb, qs, cu_q, max_q), (kb, ks, cu_k, max_k) = packed
            self._packing[key] = (qb, qs, kb, ks, cu_q, cu_k, max_q, max_k)
        return self._packing[key]


def _spans(valid: Tensor) -> Optional[List[Tuple[int, int]]]:
    """Per row of a (batch, n) boolean tensor, (start, end) of its True entries if they are one
    contiguous run ((0, 0) for none); None if some row's are not."""
    n = valid.shape[-1]
    counts = valid.sum(-1)
    start = valid.to(torch.uint8).argmax(-1)
    end = n - valid.flip(-1).to(torch.uint8).argmax(-1)
    rows = torch.stack([counts, start, end], -1).tolist()  # a host read (a synchronization on CUDA)
    if any(c and c != e - s for c, s, e in rows):
        return None
    return [(s, e) if c else (0, 0) for c, s, e in rows]


def build_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
               mask_function=_masking.causal_mask_function, attention_mask: Optional[Tensor] = None,
               local_size: Optional[int] = None, use_vmap: bool = False, device="cpu", **kwargs):
    """transformers' mask interface (the arguments of its sdpa_mask): a PaddedMask for the attention
    function. attention_mask is the 2-D (batch, kv positions) boolean padding mask or None."""
    if isinstance(attention_mask, PaddedMask):  # a mask prepared earlier, handed back
        return attention_mask
    q_offset, kv_offset = int(q_offset), int(kv_offset)
    sdpa_args = dict(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                     local_size=local_size, use_vmap=use_vmap, device=device)

    def fallback(reason: str) -> PaddedMask:
        return PaddedMask(batch_size, q_length, kv_length, fallback=reason, sdpa_args=sdpa_args)

    pattern = _pattern(mask_function)
    if pattern is None:
        return fallback("a mask pattern other than causal, sliding window or bidirectional "
                        "(packed sequences, chunked attention or a custom mask function)")
    causal, wl, wr = pattern
    aligned = causal or wl >= 0 or wr >= 0  # the pattern depends on where queries sit among the keys
    # Keys past the last query's position are seen by no query under a causal pattern (a static
    # cache's empty tail): they count as padding.
    k_limit = max(min(kv_length, q_offset + q_length - kv_offset), 0) if causal else kv_length
    padding = _masking.prepare_padding_mask(attention_mask, kv_length, kv_offset)
    if padding is None:
        if aligned and k_limit + kv_offset != q_length + q_offset:
            return fallback("queries that do not end at the last key")
        spans = None if k_limit == kv_length else [(0, q_length, 0, k_limit)] * batch_size
        return PaddedMask(batch_size, q_length, kv_length, causal, (wl, wr), spans=spans, sdpa_args=sdpa_args)
    if aligned and q_offset + q_length > padding.shape[-1]:
        return fallback("a padding mask shorter than the query positions")
    keys = padding[:, kv_offset:kv_offset + kv_length].clone()
    keys[:, k_limit:] = False
    k_spans = _spans(keys)
    # The queries' positions among the keys matter to an aligned pattern: their padding counts too.
    q_spans = _spans(padding[:, q_offset:q_offset + q_length]) if aligned else [(0, q_length)] * batch_size
    if k_spans is None or q_spans is None:
        return fallback("padding that is not one contiguous span of tokens per row")
    spans = []
    for (q0, q1), (k0, k1) in zip(q_spans, k_spans):
        if aligned and q1 > q0 and k1 > k0 and k1 + kv_offset != q1 + q_offset:
            return fallback("padding whose last valid key is not at the last valid query's position")
        spans.append((q0, q1, k0, k1) if q1 > q0 else (q0, q1, 0, 0))  # no valid query: no keys needed
    if all(s == (0, q_length, 0, kv_length) for s in spans):
        spans = None
    return PaddedMask(batch_size, q_length, kv_length, causal, (wl, wr), spans=spans, sdpa_args=sdpa_args)


# ---- the attention function ----------------------------------------------------------------------
def _sdpa(module, query, key, value, mask, dropout, scaling, softcap, reason, kwargs):
    if softcap:
        raise NotImplementedError(f"flashattn.transformers: {reason}, and transformers' sdpa, which such calls "
                                  "fall back to, has no softcap")
    _warn_once(reason)
    return _sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs)


def attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask,
                      dropout: float = 0.0, scaling: Optional[float] = None, sliding_window: Optional[int] = None,
                      softcap: Optional[float] = None, is_causal: Optional[bool] = None, **kwargs):
    """transformers' attention interface: query (B, H, Sq, D), key and value (B, Hkv, Sk, D) after the
    cache update; returns (attn_output (B, Sq, H, D), None).

    attention_mask is what build_mask returned (a PaddedMask), None (the model builds no mask:
    causal from module.is_causal as in sdpa, top-left aligned), or a tensor (sdpa). sliding_window
    is carried by the mask (the model's mask function), as for sdpa; softcap > 0 caps the scores."""
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("flashattn.transformers: attention sinks (s_aux) are not supported")
    if kwargs.get("output_attentions", False) and "output_attentions" not in _warned:
        _warned.add("output_attentions")
        warnings.warn("flashattn.transformers: output_attentions=True is not supported: the attention weights "
                      "are returned as None", UserWarning, stacklevel=2)
    sdpa_kwargs = {k: v for k, v in kwargs.items() if k != "output_attentions"}
    if is_causal is not None:
        sdpa_kwargs["is_causal"] = is_causal
    if isinstance(attention_mask, PaddedMask) and attention_mask.fallback:
        return _sdpa(module, query, key, value, attention_mask.sdpa_mask(), dropout, scaling, softcap,
                     attention_mask.fallback, sdpa_kwargs)
    if isinstance(attention_mask, Tensor):
        return _sdpa(module, query, key, value, attention_mask, dropout, scaling, softcap,
                     "an attention mask tensor (a 4-D mask given to the model)", sdpa_kwargs)
    reason = None
    if dropout:
        reason = "attention dropout > 0 (the library has no dropout)"
    elif kwargs.get("position_bias") is not None:
        reason = "a position bias"
    elif query.device.type == "cuda" and query.dtype == torch.float32:
        reason = "float32 on CUDA (the CUDA kernels take float16 and bfloat16)"
    elif value.shape[-1] != query.shape[-1] or key.shape[-1] != query.shape[-1]:
        reason = "key or value head dims other than the query's"
    elif query.shape[-1] > 256:
        reason = "a head dim above 256"
    elif query.device.type == "cuda" and query.shape[-1] % 8:
        reason = "a head dim that is not a multiple of 8 on CUDA"
    if reason is None:
        try:
            return _attention(module, query, key, value, attention_mask, scaling, softcap, is_causal)
        except UnsupportedError as e:  # raised before anything ran: nothing to undo
            reason = f"no kernel for this call in this build ({e})"
    mask = attention_mask.sdpa_mask() if isinstance(attention_mask, PaddedMask) else None
    return _sdpa(module, query, key, value, mask, dropout, scaling, softcap, reason, sdpa_kwargs)


def _attention(module, query, key, value, attention_mask, scaling, softcap, is_causal):
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # (B, S, H, D) views
    batch, sq = q.shape[0], q.shape[1]
    cap = float(softcap) if softcap else 0.0
    if attention_mask is None:
        # As transformers' sdpa without a mask: causal from the module (or the is_causal argument) for
        # more than one query, top-left aligned, so the keys past the first Sq take no part.
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True)) and sq > 1
        if causal and k.shape[1] > sq:
            k, v = k[:, :sq], v[:, :sq]
        return _ft.attention(q, k, v, causal=causal, scale=scaling, softcap=cap), None

    m = attention_mask
    if (m.batch, m.q_length, m.kv_length) != (batch, sq, k.shape[1]):
        raise ValueError(f"attention_mask: expected a mask for batch {batch}, {sq} queries and {k.shape[1]} keys, "
                         f"got {m!r}")
    if m.spans is None:
        return _ft.attention(q, k, v, causal=m.causal, scale=scaling, window=m.window, softcap=cap), None
    if m.right_padded and q.device.type == "cpu":  # seqused_k (on CUDA packed: the Hopper kernels' form)
        return _ft.attention(q, k, v, causal=m.causal, scale=scaling, window=m.window, softcap=cap,
                             seqused_k=m.seqused_k(q.device)), None
    qb, qs, kb, ks, cu_q, cu_k, max_q, max_k = m.packing(q.device)
    out = _ft.attention(q[qb, qs].unsqueeze(0), k[kb, ks].unsqueeze(0), v[kb, ks].unsqueeze(0), causal=m.causal,
                        scale=scaling, window=m.window, softcap=cap, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                        max_seqlen_q=max_q, max_seqlen_k=max_k)
    full = q.new_zeros((batch, sq) + tuple(q.shape[2:]))
    return full.index_put((qb, qs), out[0]), None


AttentionInterface.register(IMPLEMENTATION, attention_forward)
AttentionMaskInterface.register(IMPLEMENTATION, build_mask)
