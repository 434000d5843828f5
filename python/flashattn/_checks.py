"""The argument checks shared by every Python front end (flashattn.attention, flashattn.torch,
flashattn.flash_attn_interface, flashattn.transformers).

Only what the C++ core cannot see is checked here: the core takes scale 0 to mean 1/sqrt(head_dim),
so an explicit 0 must be refused before it gets there, and Python values (a window that is not a
pair, cu_seqlens given alone) must be turned into the core's scalars. Everything else — shapes,
dtypes, devices, window bounds, softcap's range — is the core's check (src/core/check.cpp), raised as
ValueError or TypeError naming the argument.
"""
from __future__ import annotations

import math
from typing import Tuple

ALGORITHMS = ("flash", "standard")


def scale_value(scale, name: str = "scale") -> float:
    """The core's scale: 0.0 for None (the core's default, 1/sqrt(head_dim)); a given value must be
    finite and nonzero."""
    if scale is None:
        return 0.0
    try:
        value = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a float or None (= 1/sqrt(head_dim)), got {type(scale).__name__}") from None
    if value == 0.0 or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite nonzero value (None = 1/sqrt(head_dim)), got {value}")
    return value


def window_pair(window, name: str = "window") -> Tuple[int, int]:
    """(left, right) as two ints; -1 = unbounded (the core checks the range)."""
    try:
        left, right = (int(w) for w in window)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a pair (left, right) of ints, -1 = unbounded, got {window!r}") from None
    return left, right


def algorithm_name(algorithm) -> str:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: expected 'flash' or 'standard', got {algorithm!r}")
    return algorithm


def cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k) -> None:
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        missing = "cu_seqlens_k" if cu_seqlens_k is None else "cu_seqlens_q"
        raise ValueError(f"{missing}: expected an int32 array together with the other cu_seqlens, got None")


def four_dims(name: str, a) -> None:
    ndim = getattr(a, "ndim", 4)
    if ndim != 4:
        raise ValueError(f"{name}: expected 4 dimensions (batch, seqlen, heads, head_dim), got shape {tuple(a.shape)}")


def attention_options(q, *, scale, causal, window, softcap, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                      max_seqlen_k, algorithm, deterministic, window_name: str = "window",
                      scale_name: str = "scale") -> dict:
    """Every scalar option of forward/backward, checked and converted once, as the binding's keywords
    (cu_seqlens and the stream are the front end's: they depend on the array library)."""
    four_dims("q", q)
    cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k)
    wl, wr = window_pair(window, window_name)
    return dict(scale=scale_value(scale, scale_name), causal=bool(causal), window_left=wl, window_right=wr,
                softcap=float(softcap), max_seqlen_q=int(max_seqlen_q or 0),  # 0: computed by the core
                max_seqlen_k=int(max_seqlen_k or 0), algorithm=algorithm_name(algorithm),
                deterministic=bool(deterministic))
