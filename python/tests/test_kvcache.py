"""flashattn.torch.flash_attn_with_kvcache against a float64 PyTorch reference written here:
the in-place append (rotated keys), the attention over the cache, paged caches, the LSE and the
arguments it does not implement."""
import math

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn.torch import flash_attn_with_kvcache  # noqa: E402

TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def rotate(x, cos, sin, pos, interleaved):
    """x (..., D) at positions pos (...,) rotated in float64, flash-attn's rule."""
    r = cos.shape[1] * 2
    c, s = cos[pos].double(), sin[pos].double()
    x = x.double().clone()
    if interleaved:
        x0, x1 = x[..., 0:r:2].clone(), x[..., 1:r:2].clone()
        x[..., 0:r:2], x[..., 1:r:2] = x0 * c - x1 * s, x0 * s + x1 * c
    else:
        x0, x1 = x[..., : r // 2].clone(), x[..., r // 2: r].clone()
        x[..., : r // 2], x[..., r // 2: r] = x0 * c - x1 * s, x0 * s + x1 * c
    return x


def reference(q, keys, values, lens_total, causal, window, softcap, scale):
    """q (B, Sq, H, D); keys/values: per sequence (total, Hkv, D) float64 lists."""
    B, Sq, H, D = q.shape
    out = torch.zeros(B, Sq, H, D, dtype=torch.float64)
    lse = torch.full((B, H, Sq), -math.inf, dtype=torch.float64)
    for b in range(B):
        k, v, total = keys[b], values[b], lens_total[b]
        g = H // k.shape[1]
        for h in range(H):
            s = (q[b, :, h].double() @ k[:, h // g].T) * scale  # (Sq, total)
            if softcap > 0:
                s = softcap * torch.tanh(s / softcap)
            i = torch.arange(Sq)[:, None]
            j = torch.arange(total)[None, :]
            diag = i + total - Sq
            ok = torch.ones_like(s, dtype=torch.bool)
            if causal:
                ok &= j <= diag
            if window[0] >= 0:
                ok &= j >= diag - window[0]
            if window[1] >= 0:
                ok &= j <= diag + window[1]
            s = s.masked_fill(~ok, -math.inf)
            m = s.max(dim=1, keepdim=True).values
            has = torch.isfinite(m)
            p = torch.where(has, torch.exp(s - torch.where(has, m, 0)), 0)
            l = p.sum(dim=1, keepdim=True)
            out[b, :, h] = torch.where(has, (p @ v[:, h // g]) / torch.where(has, l, 1), 0)
            lse[b, h] = torch.where(has[:, 0], (m + torch.log(l))[:, 0], -math.inf)
    return out, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("page", [0, 7, 16])
@pytest.mark.parametrize("rotary", ["none", "interleaved", "halves"])
def test_matches_reference_and_appends_in_place(dtype, page, rotary):
    gen = torch.Generator().manual_seed(1)
    B, Sq, H, Hkv, D, S_new, cap = 2, 3, 8, 2, 32, 3, 64
    causal = rotary != "none" or page == 7
    lens = torch.tensor([20, 5], dtype=torch.int32)
    r = lambda *s: (torch.rand(*s, generator=gen) * 2 - 1).to(dtype)  # noqa: E731
    q, k, v = r(B, Sq, H, D), r(B, S_new, Hkv, D), r(B, S_new, Hkv, D)
    if page:
        pages = B * (cap // page + 1) + 2
        kc, vc = r(pages, page, Hkv, D), r(pages, page, Hkv, D)
        table = torch.randperm(pages, generator=gen)[: B * (cap // page + 1)].view(B, -1).to(torch.int32)
        where = lambda b, t: (int(table[b, t // page]), t % page)  # noqa: E731
    else:
        kc, vc = r(B, cap, Hkv, D), r(B, cap, Hkv, D)
        table = None
        where = lambda b, t: (b, t)  # noqa: E731
    cos = sin = None
    if rotary != "none":
        ang = torch.arange(cap + Sq)[:, None] * torch.pow(10000, -torch.arange(8) / 8)[None, :]
        cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
    kc0, vc0 = kc.clone(), vc.clone()
    interleaved = rotary == "interleaved"
    out, lse = flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                       block_table=table, causal=causal, rotary_interleaved=interleaved,
                                       return_softmax_lse=True)
    assert flashattn.last_kernel_path() == "cpu.kvcache"
    # The oracle's keys: the old cache, then the new keys (rotated, stored in the dtype).
    keys, values, totals = [], [], []
    for b in range(B):
        old = int(lens[b])
        ks, vs = [], []
        for t in range(old + S_new):
            if t < old:
                pb, row = where(b, t)
                ks.append(kc0[pb, row].double())
                vs.append(vc0[pb, row].double())
            else:
                kt = k[b, t - old]
                if cos is not None:
                    kt = rotate(kt, cos, sin, torch.full((Hkv,), t), interleaved)
                ks.append(kt.to(dtype).double())
                vs.append(v[b, t - old].double())
        keys.append(torch.stack(ks))
        values.append(torch.stack(vs))
        totals.append(old + S_new)
    qr = q.double()
    if cos is not None:
        pos = lens[:, None].long() + (torch.arange(Sq)[None, :] if causal else 0)
        qr = rotate(q, cos, sin, pos[:, :, None].expand(B, Sq, H), interleaved)
    want, want_lse = reference(qr, keys, values, totals, causal, (-1, -1), 0.0, 1 / math.sqrt(D))
    assert (out.double() - want).abs().max() < TOL[dtype]
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse.float()))
    fin = torch.isfinite(want_lse)
    assert (lse.double()[fin] - want_lse[fin]).abs().max() < 1e-3
    # The cache: the new slots hold the new tokens, the rest is as it was.
    touched = torch.zeros(kc.shape[:2], dtype=torch.bool)
    for b in range(B):
        for j in range(S_new):
            pb, row = where(b, int(lens[b]) + j)
            touched[pb, row] = True
            assert torch.equal(vc[pb, row], v[b, j])
            assert (kc[pb, row].double() - keys[b][int(lens[b]) + j]).abs().max() <= 2 * TOL[dtype]
    assert torch.equal(kc[~touched], kc0[~touched]) and torch.equal(vc[~touched], vc0[~touched])


def test_int_seqlens_gqa_decode_and_unsupported_arguments():
    gen = torch.Generator().manual_seed(2)
    q = torch.rand(1, 1, 4, 16, generator=gen)
    kc, vc = torch.rand(1, 10, 1, 16, generator=gen), torch.rand(1, 10, 1, 16, generator=gen)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=10)
    want, _ = reference(q, [kc[0].double()], [vc[0].double()], [10], False, (-1, -1), 0.0, 0.25)
    assert (out.double() - want).abs().max() < 2e-5
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=10, alibi_slopes=torch.zeros(4))
    with pytest.raises(NotImplementedError, match="cache_leftpad"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=10, cache_leftpad=torch.zeros(1, dtype=torch.int32))
    kc0 = kc.clone()
    with pytest.raises(ValueError, match="cache_seqlens"):  # past the capacity: nothing written
        flash_attn_with_kvcache(q, kc, vc, torch.ones(1, 1, 1, 16), torch.ones(1, 1, 1, 16), cache_seqlens=10)
    assert torch.equal(kc, kc0)
