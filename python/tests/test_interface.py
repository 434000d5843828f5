"""flashattn.flash_attn_interface (flash-attn's functions, names, defaults and errors) against the
float64 reference (reference.py), gradients included; and the one argument check behind
flashattn.attention and flashattn.torch.attention.

Fresh random inputs per case (seeded by the case). Tolerances per dtype as in test_torch.py.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
import flashattn.torch as ft  # noqa: E402
import reference as ref  # noqa: E402
from flashattn import flash_attn_interface as fai  # noqa: E402
from tolerances import grad_tol, tol, torch_devices  # noqa: E402

DEVICES = torch_devices()

TOL = {dt: tol(dt) for dt in (torch.float32, torch.float16, torch.bfloat16)}
GRAD_TOL = {dt: grad_tol(dt) for dt in (torch.float32, torch.float16, torch.bfloat16)}


def wdt(device):
    return torch.float32 if device == "cpu" else torch.float16


def rand(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen).to(dtype=dtype, device=device).requires_grad_()


def close(got, want, tol, what):
    got = got.detach().double().cpu()
    want = torch.as_tensor(want, dtype=torch.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    torch.testing.assert_close(got, want, atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}")


def np64(t):
    return t.detach().double().cpu().numpy()


def cu(lengths, device):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=device)


# flash-attn's reading of (causal, window_size) in the reference's terms: causal caps the right side at
# 0, a negative side is unbounded.
def ref_window(causal, window_size):
    wl, wr = (max(w, -1) for w in window_size)
    return (wl, 0) if causal else (wl, wr)


OPTIONS = [
    dict(),
    dict(causal=True),
    dict(causal=True, window_size=(5, 3)),            # flash-attn: causal caps the right side at 0
    dict(window_size=(4, -7)),                        # a negative side is unbounded
    dict(softcap=3.0, softmax_scale=0.3),
]
OPTION_IDS = ["dense", "causal", "causal-window", "window-negative", "softcap-scale"]


def _check(out, lse, inputs, want_out, want_grads, dtype, dout, lse_want=None):
    close(out, want_out, TOL[dtype], "out")
    if lse is not None:
        close(lse, lse_want, TOL[dtype], "lse")
    got = torch.autograd.grad(out, inputs, dout)
    for g, w, name in zip(got, want_grads, ("grad 0", "grad 1", "grad 2")):
        close(g, w, GRAD_TOL[dtype], name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", OPTIONS, ids=OPTION_IDS)
def test_dense_functions(device, opts):
    """flash_attn_func, flash_attn_kvpacked_func and flash_attn_qkvpacked_func, with
    return_attn_probs giving (out, softmax_lse, empty S_dmask) as flash-attn without dropout."""
    dt = wdt(device)
    gen = torch.Generator().manual_seed(len(str(opts)))
    B, Sq, Sk, H, Hkv, D = 2, 19, 27, 4, 2, 32
    causal, window = opts.get("causal", False), ref_window(opts.get("causal", False), opts.get("window_size", (-1, -1)))
    ropts = dict(causal=causal, window=window, softcap=opts.get("softcap", 0.0), scale=opts.get("softmax_scale"))
    q, k, v = rand((B, Sq, H, D), dt, device, gen), rand((B, Sk, Hkv, D), dt, device, gen), rand((B, Sk, Hkv, D), dt, device, gen)
    dout = torch.randn(B, Sq, H, D, generator=gen).to(dt).to(device)
    want, want_lse = ref.forward(np64(q), np64(k), np64(v), **ropts)
    want_grads = ref.backward(np64(dout), np64(q), np64(k), np64(v), **ropts)

    out, lse, probs = fai.flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    assert probs.numel() == 0 and probs.dtype == dt
    _check(out, lse, (q, k, v), want, want_grads, dt, dout, want_lse)

    kv = torch.stack([k.detach(), v.detach()], dim=2).requires_grad_()  # (B, Sk, 2, Hkv, D)
    out = fai.flash_attn_kvpacked_func(q, kv, **opts)
    (dkv,) = torch.autograd.grad(out, (kv,), dout, retain_graph=True)
    _check(out, None, (q,), want, want_grads[:1], dt, dout)
    close(dkv[:, :, 0], want_grads[1], GRAD_TOL[dt], "dk (kvpacked)")
    close(dkv[:, :, 1], want_grads[2], GRAD_TOL[dt], "dv (kvpacked)")

    # qkvpacked: one sequence length and one head count for q, k and v
    qkv = torch.randn(B, Sq, 3, H, D, generator=gen).to(dt).to(device).requires_grad_()
    qs, ks, vs = (np64(qkv[:, :, i]) for i in range(3))
    want, want_lse = ref.forward(qs, ks, vs, **ropts)
    want_grads = ref.backward(np64(dout), qs, ks, vs, **ropts)
    out = fai.flash_attn_qkvpacked_func(qkv, **opts)
    (dqkv,) = torch.autograd.grad(out, (qkv,), dout)
    close(out, want, TOL[dt], "out (qkvpacked)")
    for i, name in enumerate(("dq", "dk", "dv")):
        close(dqkv[:, :, i], want_grads[i], GRAD_TOL[dt], f"{name} (qkvpacked)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", OPTIONS, ids=OPTION_IDS)
def test_varlen_functions(device, opts):
    """flash_attn_varlen_func, flash_attn_varlen_kvpacked_func and flash_attn_varlen_qkvpacked_func
    over packed sequences (one of them empty); softmax_lse is (H, total_q)."""
    dt = wdt(device)
    gen = torch.Generator().manual_seed(100 + len(str(opts)))
    lq, lk, H, Hkv, D = [5, 12, 0, 9], [9, 12, 4, 6], 4, 2, 16
    cu_q, cu_k = cu(lq, device), cu(lk, device)
    causal, window = opts.get("causal", False), ref_window(opts.get("causal", False), opts.get("window_size", (-1, -1)))
    ropts = dict(causal=causal, window=window, softcap=opts.get("softcap", 0.0), scale=opts.get("softmax_scale"),
                 cu_seqlens_q=cu_q.cpu().numpy(), cu_seqlens_k=cu_k.cpu().numpy())
    q = rand((sum(lq), H, D), dt, device, gen)
    k, v = rand((sum(lk), Hkv, D), dt, device, gen), rand((sum(lk), Hkv, D), dt, device, gen)
    dout = torch.randn(sum(lq), H, D, generator=gen).to(dt).to(device)
    want, want_lse = ref.forward(np64(q)[None], np64(k)[None], np64(v)[None], **ropts)
    want_grads = [g[0] for g in ref.backward(np64(dout)[None], np64(q)[None], np64(k)[None], np64(v)[None], **ropts)]

    out, lse, probs = fai.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), return_attn_probs=True, **opts)
    assert probs.numel() == 0
    _check(out, lse, (q, k, v), want[0], want_grads, dt, dout, want_lse[0])

    kv = torch.stack([k.detach(), v.detach()], dim=1).requires_grad_()  # (total_k, 2, Hkv, D)
    out = fai.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max(lq), max(lk), **opts)
    (dkv,) = torch.autograd.grad(out, (kv,), dout)
    close(out, want[0], TOL[dt], "out (varlen kvpacked)")
    close(dkv[:, 0], want_grads[1], GRAD_TOL[dt], "dk (varlen kvpacked)")
    close(dkv[:, 1], want_grads[2], GRAD_TOL[dt], "dv (varlen kvpacked)")

    # qkvpacked: the key lengths are the query lengths
    qkv = torch.randn(sum(lq), 3, H, D, generator=gen).to(dt).to(device).requires_grad_()
    qs, ks, vs = (np64(qkv[:, i])[None] for i in range(3))
    ropts.update(cu_seqlens_k=ropts["cu_seqlens_q"])
    want, _ = ref.forward(qs, ks, vs, **ropts)
    want_grads = ref.backward(np64(dout)[None], qs, ks, vs, **ropts)
    out = fai.flash_attn_varlen_qkvpacked_func(qkv, cu_q, max(lq), **opts)
    (dqkv,) = torch.autograd.grad(out, (qkv,), dout)
    close(out, want[0], TOL[dt], "out (varlen qkvpacked)")
    for i, name in enumerate(("dq", "dk", "dv")):
        close(dqkv[:, i], want_grads[i][0], GRAD_TOL[dt], f"{name} (varlen qkvpacked)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", OPTIONS, ids=OPTION_IDS)
def test_varlen_over_a_paged_cache(device, opts):
    """flash_attn_varlen_func with block_table: packed queries (one sequence without any, one with
    more queries than keys) over a paged cache whose pages are shuffled, against the reference over
    each sequence's keys gathered in token order; softmax_lse (H, total_q)."""
    dt = wdt(device)
    gen = torch.Generator().manual_seed(300 + len(str(opts)))
    lq, lk, H, Hkv, D, page = [5, 1, 0, 9, 7], [9, 12, 4, 30, 3], 4, 2, 16, 4
    pages_per_seq = max(-(-n // page) for n in lk) + 1
    blocks = len(lk) * pages_per_seq + 3
    k_cache = torch.randn(blocks, page, Hkv, D, generator=gen).to(dt).to(device)
    v_cache = torch.randn(blocks, page, Hkv, D, generator=gen).to(dt).to(device)
    table = torch.randperm(blocks, generator=gen)[: len(lk) * pages_per_seq].view(len(lk), pages_per_seq)
    table = table.to(torch.int32).to(device)
    q = torch.randn(sum(lq), H, D, generator=gen).to(dt).to(device)
    # each sequence's keys in token order, packed as the reference's varlen input
    kd = torch.cat([k_cache[table[b].long()].reshape(-1, Hkv, D)[:n] for b, n in enumerate(lk)])
    vd = torch.cat([v_cache[table[b].long()].reshape(-1, Hkv, D)[:n] for b, n in enumerate(lk)])
    cu_q, cu_k = cu(lq, device), cu(lk, device)
    causal, window = opts.get("causal", False), ref_window(opts.get("causal", False), opts.get("window_size", (-1, -1)))
    want, want_lse = ref.forward(np64(q)[None], np64(kd)[None], np64(vd)[None], causal=causal, window=window,
                                 softcap=opts.get("softcap", 0.0), scale=opts.get("softmax_scale"),
                                 cu_seqlens_q=cu_q.cpu().numpy(), cu_seqlens_k=cu_k.cpu().numpy())
    k_before, v_before = k_cache.clone(), v_cache.clone()
    out, lse, probs = fai.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, max(lq), max(lk),
                                                 block_table=table, return_attn_probs=True, **opts)
    assert probs.numel() == 0
    close(out, want[0], TOL[dt], "out")
    close(lse, want_lse[0], TOL[dt], "lse")
    assert torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before), "the cache was written"
    out_only = fai.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, max(lq) + 3, max(lk), block_table=table,
                                          **opts)
    close(out_only, want[0], TOL[dt], "out (max_seqlen_q past the longest sequence)")
    with pytest.raises(ValueError, match="max_seqlen_q"):
        fai.flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, max(lq) - 1, max(lk), block_table=table, **opts)


@pytest.mark.parametrize("device", DEVICES)
def test_with_kvcache(device):
    """flash_attn_with_kvcache through the interface: the cache appended in place, the output and
    LSE as the reference's, causal together with a right window accepted (capped at 0)."""
    dt = wdt(device)
    gen = torch.Generator().manual_seed(7)
    B, S_max, Hkv, H, D, S_new = 2, 32, 2, 4, 16, 3
    k_cache = torch.randn(B, S_max, Hkv, D, generator=gen).to(dt).to(device)
    v_cache = torch.randn(B, S_max, Hkv, D, generator=gen).to(dt).to(device)
    q = torch.randn(B, S_new, H, D, generator=gen).to(dt).to(device)
    k_new, v_new = (torch.randn(B, S_new, Hkv, D, generator=gen).to(dt).to(device) for _ in range(2))
    lens = torch.tensor([7, 20], dtype=torch.int32, device=device)
    want_out, want_lse, want_k, want_v, _ = ref.kvcache_forward(
        np64(q), np64(k_cache), np64(v_cache), lens.cpu().numpy(), np64(k_new), np64(v_new), causal=True,
        window=(6, 0))
    out, lse = fai.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens, causal=True,
                                           window_size=(6, 2), return_softmax_lse=True)
    close(out, want_out, TOL[dt], "out")
    close(lse, want_lse, TOL[dt], "lse")
    close(k_cache, want_k, TOL[dt], "k_cache")
    close(v_cache, want_v, TOL[dt], "v_cache")


def test_deterministic_backward_is_bitwise_repeatable():
    gen = torch.Generator().manual_seed(8)
    q, k, v = (rand((2, 33, 4, 32), torch.float32, "cpu", gen) for _ in range(3))
    dout = torch.randn(2, 33, 4, 32, generator=gen)
    runs = [torch.autograd.grad(fai.flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), dout)
            for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_unsupported_arguments_name_themselves():
    q, k, v = (torch.randn(1, 4, 2, 16) for _ in range(3))
    with pytest.raises(NotImplementedError, match="dropout_p"):
        fai.flash_attn_func(q, k, v, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        fai.flash_attn_qkvpacked_func(torch.stack([q, k, v], 2), alibi_slopes=torch.ones(2))
    cu_ = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="block_table"):  # the paged form has no autograd
        fai.flash_attn_varlen_func(q[0].requires_grad_(), k.view(4, 1, 2, 16), v.view(4, 1, 2, 16), cu_, cu_, 4, 4,
                                   block_table=torch.arange(4, dtype=torch.int32).view(1, 4))
    with pytest.raises(NotImplementedError, match="cache_leftpad"):
        fai.flash_attn_with_kvcache(q, k, v, cache_seqlens=4, cache_leftpad=torch.zeros(1, dtype=torch.int32))


def test_errors_are_runtime_errors_too():
    """flash-attn raises RuntimeError for bad arguments, the library ValueError or TypeError: the
    interface's errors are both, with the library's message."""
    q, k, v = (torch.randn(1, 4, 2, 16) for _ in range(3))
    bad = [
        (lambda: fai.flash_attn_func(q, k.half(), v), TypeError, "dtype"),
        (lambda: fai.flash_attn_func(q, k[..., :8], v), ValueError, "k"),
        (lambda: fai.flash_attn_func(q, k, v, softmax_scale=0.0), ValueError, "scale"),
        (lambda: fai.flash_attn_kvpacked_func(q, k), ValueError, "kv"),
        (lambda: fai.flash_attn_varlen_func(q[0], k[0], v[0], torch.tensor([0, 4]), torch.tensor([0, 4]), 4, 4),
         TypeError, "cu_seqlens_q"),
        (lambda: fai.flash_attn_with_kvcache(q, k, v, cache_seqlens=9), ValueError, "cache_seqlens"),
    ]
    for call, library_class, name in bad:
        for caught in (RuntimeError, library_class):
            with pytest.raises(caught, match=name):
                call()


# ---- one attention(): the array front end and the torch front end --------------------------------------
def test_array_attention_routes_tensors_to_autograd():
    gen = torch.Generator().manual_seed(9)
    q, k, v = (rand((2, 11, 4, 16), torch.float32, "cpu", gen) for _ in range(3))
    out = flashattn.attention(q, k, v, causal=True)
    assert out.requires_grad
    dout = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = ref.backward(np64(dout), np64(q), np64(k), np64(v), causal=True)
    for g, w, name in zip(got, want, ("dq", "dk", "dv")):
        close(g, w, GRAD_TOL[torch.float32], name)
    same = torch.autograd.grad(ft.attention(q, k, v, causal=True), (q, k, v), dout)
    for a, b in zip(got, same):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="out"):
        flashattn.attention(q, k, v, out=torch.empty_like(q))
    with torch.no_grad():
        buf = torch.empty_like(q)
        assert flashattn.attention(q, k, v, causal=True, out=buf) is buf
        torch.testing.assert_close(buf, out.detach(), atol=0, rtol=0)


@pytest.mark.parametrize("scale", [0.0, float("inf"), float("nan"), "x"])
def test_front_ends_share_the_scale_check(scale):
    q = np.random.default_rng(0).standard_normal((1, 4, 2, 16)).astype(np.float32)
    t = torch.from_numpy(q)
    errors = []
    for call in (lambda: flashattn.attention(q, q, q, scale=scale), lambda: ft.attention(t, t, t, scale=scale),
                 lambda: flashattn.attention(t, t, t, scale=scale),
                 lambda: ft.flash_attn_func(t, t, t, softmax_scale=scale)):
        with pytest.raises((ValueError, TypeError)) as e:
            call()
        errors.append((type(e.value), str(e.value)))
    assert len(set(errors)) == 1, errors


def test_seqused_k_matches_the_reference():
    """flashattn.torch.attention's seqused_k (each row's first keys only; the rest never read, their
    gradients zero), forward and backward, against the reference on the truncated keys."""
    gen = torch.Generator().manual_seed(10)
    B, Sq, Sk, H, Hkv, D = 3, 7, 13, 4, 2, 16
    q, k, v = rand((B, Sq, H, D), torch.float32, "cpu", gen), rand((B, Sk, Hkv, D), torch.float32, "cpu", gen), \
        rand((B, Sk, Hkv, D), torch.float32, "cpu", gen)
    used = [13, 9, 0]
    with torch.no_grad():
        k[1, 9:] = float("nan")  # padding is never read
    out = ft.attention(q, k, v, causal=True, seqused_k=torch.tensor(used, dtype=torch.int32))
    dout = torch.randn(out.shape, generator=gen)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    for b, n in enumerate(used):
        w, _ = ref.forward(np64(q[b:b + 1]), np64(k[b:b + 1, :n]), np64(v[b:b + 1, :n]), causal=True)
        wq, wk, wv = ref.backward(np64(dout[b:b + 1]), np64(q[b:b + 1]), np64(k[b:b + 1, :n]), np64(v[b:b + 1, :n]),
                                  causal=True)
        close(out[b:b + 1], w, TOL[torch.float32], f"out {b}")
        close(dq[b:b + 1], wq, GRAD_TOL[torch.float32], f"dq {b}")
        close(dk[b:b + 1, :n], wk, GRAD_TOL[torch.float32], f"dk {b}")
        close(dv[b:b + 1, :n], wv, GRAD_TOL[torch.float32], f"dv {b}")
        assert not dk[b, n:].any() and not dv[b, n:].any()


def test_seqused_k_through_the_ops():
    """seqused_k on the custom ops (what torch.compile and export trace): schema and fake kernels
    (opcheck), and autograd through the op equal to the eager path bit for bit."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(s, generator=gen) for s in ((2, 5, 4, 16), (2, 9, 2, 16), (2, 9, 2, 16)))
    used = torch.tensor([9, 4], dtype=torch.int32)
    args = (q, k, v, 0.0, True, -1, -1, 0.0, None, None, 0, 0, "flash", True, used)
    torch.library.opcheck(torch.ops.flashattn.forward.default, args)
    out, lse = torch.ops.flashattn.forward(*args)
    dout = torch.randn(out.shape, generator=gen)
    torch.library.opcheck(torch.ops.flashattn.backward.default, (dout, q, k, v, out, lse) + args[3:])
    grads = []
    for use_op in (True, False):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        if use_op:
            o = torch.ops.flashattn.forward(qg, kg, vg, *args[3:])[0]
        else:
            o = ft.attention(qg, kg, vg, causal=True, deterministic=True, seqused_k=used)
        grads.append(torch.autograd.grad(o, (qg, kg, vg), dout))
    for a, b in zip(*grads):
        assert torch.equal(a, b)
