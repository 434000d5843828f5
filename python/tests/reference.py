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


def rotary(x, cos, sin, pos, interleaved):
    """x (..., D) in float64 rotated at the integer positions pos (shape x.shape[:-1]) by the tables
    cos, sin (seqlen_rotary, rotary_dim / 2): the first rotary_dim features turn, in pairs (2i, 2i + 1)
    when interleaved (GPT-J), else (i, i + rotary_dim / 2) (GPT-NeoX); the rest pass through."""
    x = _f64(x).copy()
    c, s = _f64(cos)[pos], _f64(sin)[pos]
    r = 2 * c.shape[-1]
    if interleaved:
        x0, x1 = x[..., 0:r:2].copy(), x[..., 1:r:2].copy()
        x[..., 0:r:2], x[..., 1:r:2] = x0 * c - x1 * s, x0 * s + x1 * c
    else:
        x0, x1 = x[..., : r // 2].copy(), x[..., r // 2: r].copy()
        x[..., : r // 2], x[..., r // 2: r] = x0 * c - x1 * s, x0 * s + x1 * c
    return x


def kvcache_forward(q, k_cache, v_cache, cache_seqlens, k_new=None, v_new=None, rotary_cos=None,
                    rotary_sin=None, rotary_interleaved=True, cache_batch_idx=None, block_table=None,
                    causal=False, scale=None, window=(-1, -1), softcap=0.0, store=None):
    """Attention over a KV cache in float64, as docs/semantics.md defines it.

    Per sequence b, the new tokens (rotated keys) are written at positions cache_seqlens[b] ...
    (contiguous cache: row cache_batch_idx[b] or b; paged: page block_table[b][t // page_size], row
    t % page_size), then q (rotated at cache_seqlens[b] + i with causal or a window, else at
    cache_seqlens[b]) attends to the first cache_seqlens[b] + S_new cached tokens as forward() with
    Nk = that total. store rounds what is written to the cache's dtype (float64 in, float64 out;
    default: kept exact), so the attention reads the new keys as the cache holds them.

    Returns out (B, Sq, H, D), lse (B, H, Sq), the caches after the call (float64 copies) and the
    boolean (cache_batch, cache_rows) mask of the rows written.
    """
    q = _f64(q)
    kc, vc = _f64(k_cache).copy(), _f64(v_cache).copy()
    store = store if store is not None else (lambda a: a)
    B, Sq, H, D = q.shape
    lens = np.broadcast_to(np.asarray(cache_seqlens, dtype=np.int64), (B,))
    s_new = 0 if k_new is None else np.shape(k_new)[1]
    rotated = rotary_cos is not None
    q_moves = causal or window[0] >= 0 or window[1] >= 0
    written = np.zeros(kc.shape[:2], dtype=bool)
    out = np.zeros_like(q)
    lse = np.full((B, H, Sq), -np.inf)
    for b in range(B):
        old = int(lens[b])

        def where(t):
            if block_table is not None:
                return int(np.asarray(block_table)[b, t // kc.shape[1]]), t % kc.shape[1]
            return (b if cache_batch_idx is None else int(np.asarray(cache_batch_idx)[b])), t

        for j in range(s_new):
            kt = _f64(k_new[b, j])  # (Hkv, D)
            if rotated:
                kt = rotary(kt, rotary_cos, rotary_sin, np.full(kt.shape[:-1], old + j), rotary_interleaved)
            at = where(old + j)
            kc[at], vc[at] = store(kt), store(_f64(v_new[b, j]))
            written[at] = True
        total = old + s_new
        keys = np.stack([kc[where(t)] for t in range(total)]) if total else np.zeros((0,) + kc.shape[2:])
        values = np.stack([vc[where(t)] for t in range(total)]) if total else np.zeros((0,) + vc.shape[2:])
        qb = q[b]
        if rotated:
            pos = old + (np.arange(Sq) if q_moves else np.zeros(Sq, dtype=np.int64))
            qb = rotary(qb, rotary_cos, rotary_sin, np.broadcast_to(pos[:, None], (Sq, H)), rotary_interleaved)
        o, l = forward(qb[None], keys[None], values[None], causal=causal, scale=scale, window=window,
                       softcap=softcap)
        out[b], lse[b] = o[0], l[0]
    return out, lse, kc, vc, written
