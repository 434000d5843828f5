"""NumPy float64 reference for attention forward and backward (the spec the tests compare to).

Written from docs/semantics.md alone: bottom-right aligned causal/window masks, softcap before masking,
GQA (query head h reads KV head h // (H // Hkv)), varlen by cu_seqlens, fully masked rows give
output 0, LSE -inf and zero gradients.
"""
import numpy as np


def _f64(a):
    a = np.asarray(a)
    return a.astype(np.float64)


def visible(sq, sk, causal, window):
    """Boolean (sq, sk) mask, bottom-right aligned: query i's diagonal key is i + sk - sq."""
    wl, wr = window
    if causal:
        wr = 0 if wr < 0 else min(wr, 0)
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    diag = i + sk - sq
    m = np.ones((sq, sk), dtype=bool)
    if wl >= 0:
        m &= j >= diag - wl
    if wr >= 0:
        m &= j <= diag + wr
    return m


def _spans(q, k, cu_q, cu_k):
    if cu_q is None:
        return [(b, 0, q.shape[1], 0, k.shape[1]) for b in range(q.shape[0])]
    cu_q, cu_k = np.asarray(cu_q), np.asarray(cu_k)
    return [(0, int(cu_q[s]), int(cu_q[s + 1]), int(cu_k[s]), int(cu_k[s + 1]))
            for s in range(len(cu_q) - 1)]


def _head_forward(qh, kh, vh, scale, softcap, mask):
    """One (sequence, head): returns out, lse, and what the backward needs."""
    raw = scale * (qh @ kh.T)
    s = softcap * np.tanh(raw / softcap) if softcap > 0 else raw
    s = np.where(mask, s, -np.inf)
    m = s.max(axis=1, keepdims=True) if s.shape[1] else np.full((s.shape[0], 1), -np.inf)
    dead = ~np.isfinite(m)
    m_safe = np.where(dead, 0.0, m)
    p = np.exp(s - m_safe)
    p = np.where(mask, p, 0.0)
    l = p.sum(axis=1, keepdims=True)
    p = np.where(dead, 0.0, p / np.where(l == 0, 1.0, l))
    lse = np.where(dead, -np.inf, m_safe + np.log(np.where(l == 0, 1.0, l)))[:, 0]
    return p @ vh, lse, p, raw


def forward(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0,
            cu_seqlens_q=None, cu_seqlens_k=None):
    """out (B, Sq, H, D) and lse (B, H, Sq), float64."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    B, Sq, H, D = q.shape
    Hkv = k.shape[2]
    g = H // Hkv
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    out = np.zeros_like(q)
    lse = np.full((B, H, Sq), -np.inf)
    for b, q0, q1, k0, k1 in _spans(q, k, cu_seqlens_q, cu_seqlens_k):
        mask = visible(q1 - q0, k1 - k0, causal, window)
        for h in range(H):
            o, l, _, _ = _head_forward(q[b, q0:q1, h], k[b, k0:k1, h // g], v[b, k0:k1, h // g],
                                       scale, softcap, mask)
            out[b, q0:q1, h] = o
            lse[b, h, q0:q1] = l
    return out, lse


def backward(dout, q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0,
             cu_seqlens_q=None, cu_seqlens_k=None):
    """dq, dk, dv (float64) of sum(out * dout)."""
    dout, q, k, v = _f64(dout), _f64(q), _f64(k), _f64(v)
    B, Sq, H, D = q.shape
    Hkv = k.shape[2]
    g = H // Hkv
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b, q0, q1, k0, k1 in _spans(q, k, cu_seqlens_q, cu_seqlens_k):
        mask = visible(q1 - q0, k1 - k0, causal, window)
        for h in range(H):
            qh, kh, vh = q[b, q0:q1, h], k[b, k0:k1, h // g], v[b, k0:k1, h // g]
            o, _, p, raw = _head_forward(qh, kh, vh, scale, softcap, mask)
            do = dout[b, q0:q1, h]
            dv[b, k0:k1, h // g] += p.T @ do
            dp = do @ vh.T
            ds = p * (dp - (do * o).sum(axis=1, keepdims=True))
            if softcap > 0:
                ds = ds * (1.0 - np.tanh(raw / softcap) ** 2)
            dq[b, q0:q1, h] = scale * ds @ kh
            dk[b, k0:k1, h // g] += scale * ds.T @ qh
    return dq, dk, dv
