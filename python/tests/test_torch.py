"""flashattn.torch: custom ops, autograd, opcheck, torch.compile; against PyTorch in float64.

Skipped when PyTorch is not installed. CUDA cases run where torch sees a GPU and flashattn was
built with its CUDA backend.
"""
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import flashattn  # noqa: E402
from flashattn.torch import flash_attn_func, flash_attn_varlen_func, sdpa  # noqa: E402
from tolerances import grad_tol, tol, torch_devices  # noqa: E402

DEVICES = torch_devices()

# Per dtype (atol = rtol) against float64 PyTorch on the same rounded inputs (tolerances.py).
TOL = {dt: tol(dt) for dt in (torch.float32, torch.float16, torch.bfloat16)}
GRAD_TOL = {dt: grad_tol(dt) for dt in (torch.float32, torch.float16, torch.bfloat16)}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def wdt(device):
    """The working dtype of the device-generic tests: float32 on the CPU; float16 on CUDA, whose
    flash kernels are 16-bit only (float32 there is a TypeError, test_matches_sdpa_float64)."""
    return torch.float32 if device == "cpu" else torch.float16


def rand(shape, dtype, device, gen, requires_grad=True):
    t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype=dtype, device=device)
    return t.requires_grad_(requires_grad)


def close(got, want, tol, what=""):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    torch.testing.assert_close(got, want, atol=tol, rtol=tol, equal_nan=False, msg=lambda m: f"{what}: {m}")


def reference(q, k, v, causal=False, scale=None, window=(-1, -1), softcap=0.0):
    """float64 attention in (B, S, H, D), bottom-right aligned masks, differentiable."""
    q, k, v = q.double(), k.double(), v.double()
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // Hkv, dim=2)
    v = v.repeat_interleave(H // Hkv, dim=2)
    scale = 1 / math.sqrt(D) if scale is None else scale
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Sq, device=q.device)[:, None]
    j = torch.arange(Sk, device=q.device)[None, :]
    diag = i + Sk - Sq
    wl, wr = window
    if causal:
        wr = 0
    mask = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if wl >= 0:
        mask &= j >= diag - wl
    if wr >= 0:
        mask &= j <= diag + wr
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows that see no key: 0
    return torch.einsum("bhij,bjhd->bihd", p, v)


def grads(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout)


# ---- forward + backward vs PyTorch float64 ----------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_matches_sdpa_float64(device, dtype, causal, hkv):
    gen = torch.Generator().manual_seed(0)
    B, S, H, D = 2, 37, 4, 64
    q, k, v = rand((B, S, H, D), dtype, device, gen), rand((B, S, hkv, D), dtype, device, gen), rand((B, S, hkv, D), dtype, device, gen)
    if device == "cuda" and dtype == torch.float32:
        # The CUDA flash kernels are 16-bit only (as FlashAttention's): UnsupportedError naming dtype.
        with pytest.raises(flashattn.UnsupportedError, match="dtype"):
            flash_attn_func(q, k, v, causal=causal)
        return
    out = flash_attn_func(q, k, v, causal=causal)
    assert out.dtype == dtype and out.shape == q.shape
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(q64.transpose(1, 2), k64.transpose(1, 2), v64.transpose(1, 2),
                                          is_causal=causal, enable_gqa=hkv != H).transpose(1, 2)
    close(out, want, TOL[dtype], "out")
    dout = rand(out.shape, dtype, device, gen, requires_grad=False)
    got = grads(out, (q, k, v), dout)
    ref = grads(want, (q64, k64, v64), dout.double())
    for g, r, name in zip(got, ref, ("dq", "dk", "dv")):
        assert g.dtype == dtype
        close(g, r, GRAD_TOL[dtype], name)


CASES = [
    (13, 29, dict(causal=True)),                   # bottom-right: decoding-like
    (29, 13, dict(causal=True)),                   # first rows see no key: zeros, no NaN
    (33, 40, dict(window_size=(4, 2))),
    (33, 33, dict(window_size=(6, 0), causal=True)),
    (19, 23, dict(softcap=2.5, softmax_scale=0.4)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sq,sk,opts", CASES, ids=["causal-sq<sk", "causal-sq>sk", "window", "window-causal", "softcap"])
def test_bottom_right_masks_window_softcap(device, sq, sk, opts):
    gen = torch.Generator().manual_seed(1)
    dt = wdt(device)
    q, k, v = rand((2, sq, 4, 32), dt, device, gen), rand((2, sk, 2, 32), dt, device, gen), rand((2, sk, 2, 32), dt, device, gen)
    out = flash_attn_func(q, k, v, **opts)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = reference(q64, k64, v64, causal=opts.get("causal", False), scale=opts.get("softmax_scale"),
                     window=opts.get("window_size", (-1, -1)), softcap=opts.get("softcap", 0.0))
    close(out, want, TOL[dt], "out")
    dout = torch.randn(out.shape, generator=gen).to(device=device, dtype=dt)
    for g, r, name in zip(grads(out, (q, k, v), dout), grads(want, (q64, k64, v64), dout.double()), ("dq", "dk", "dv")):
        assert torch.isfinite(g).all()
        close(g, r, GRAD_TOL[dt], name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sq,sk", [(24, 24), (10, 31), (31, 10)])
@pytest.mark.parametrize("gqa", [False, True])
def test_sdpa_wrapper_top_left(device, sq, sk, gqa):
    """flashattn.torch.sdpa follows PyTorch: (B, H, S, D) and top-left causal alignment."""
    gen = torch.Generator().manual_seed(2)
    hkv = 2 if gqa else 4
    dt = wdt(device)
    q, k, v = rand((2, 4, sq, 32), dt, device, gen), rand((2, hkv, sk, 32), dt, device, gen), rand((2, hkv, sk, 32), dt, device, gen)
    for is_causal in (False, True):
        out = sdpa(q, k, v, is_causal=is_causal, enable_gqa=gqa)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        want = F.scaled_dot_product_attention(q64, k64, v64, is_causal=is_causal, enable_gqa=gqa)
        close(out, want, TOL[dt], f"out causal={is_causal}")
        dout = torch.randn(out.shape, generator=gen).to(device=device, dtype=dt)
        for g, r, name in zip(grads(out, (q, k, v), dout), grads(want, (q64, k64, v64), dout.double()), ("dq", "dk", "dv")):
            close(g, r, GRAD_TOL[dt], f"{name} causal={is_causal}")


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_func(device):
    gen = torch.Generator().manual_seed(3)
    lq, lk = [5, 12, 1, 7], [9, 12, 4, 7]
    cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32, device=device)
    dt = wdt(device)
    q = rand((sum(lq), 4, 32), dt, device, gen)
    k, v = rand((sum(lk), 2, 32), dt, device, gen), rand((sum(lk), 2, 32), dt, device, gen)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=True)
    assert out.shape == q.shape
    dout = torch.randn(out.shape, generator=gen).to(device=device, dtype=dt)
    dq, dk, dv = grads(out, (q, k, v), dout)
    for s in range(len(lq)):
        a, b, c, d = int(cu_q[s]), int(cu_q[s + 1]), int(cu_k[s]), int(cu_k[s + 1])
        q64, k64, v64 = (t.detach()[x:y].double().unsqueeze(0).requires_grad_() for t, x, y in ((q, a, b), (k, c, d), (v, c, d)))
        want = reference(q64, k64, v64, causal=True)
        close(out[a:b], want[0], TOL[dt], f"out seq {s}")
        r = grads(want, (q64, k64, v64), dout[a:b].double().unsqueeze(0))
        close(dq[a:b], r[0][0], GRAD_TOL[dt], f"dq seq {s}")
        close(dk[c:d], r[1][0], GRAD_TOL[dt], f"dk seq {s}")
        close(dv[c:d], r[2][0], GRAD_TOL[dt], f"dv seq {s}")


def test_return_attn_probs_gives_lse():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (rand((1, 9, 2, 16), torch.float32, "cpu", gen) for _ in range(3))
    out, lse, probs = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert probs is None and lse.shape == (1, 2, 9) and lse.dtype == torch.float32
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) / 4
    s = s.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
    close(lse, torch.logsumexp(s, dim=-1), 1e-5, "lse")
    assert not lse.requires_grad


# ---- gradcheck ---------------------------------------------------------------------------------
def test_gradcheck_through_float32():
    """The library computes in f32/f16/bf16, never float64, so gradcheck runs on a float64
    function that rounds its inputs to float32, calls the op and widens the result. Its analytic
    Jacobian is the library's backward (the casts' backward is the identity); its numerical one is
    a central difference with eps = 1e-3, whose float32 rounding noise (~1e-7 / 1e-3 = 1e-4) and
    truncation error (O(eps^2)) fit well inside atol = rtol = 2e-3 — while a wrong gradient (a
    missing scale, a dropped mask or GQA sum) is off by O(1e-1) or more. The tight check of the
    backward is test_matches_sdpa_float64 (float32 grads vs float64 autograd within 5e-5)."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 5, 2, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 6, 1, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 6, 1, 8, generator=gen, dtype=torch.float64, requires_grad=True)

    for opts in (dict(causal=True), dict(window_size=(2, 1), softcap=2.0)):
        def f(q, k, v):
            return flash_attn_func(q.float(), k.float(), v.float(), **opts).double()

        assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-3, atol=2e-3, rtol=2e-3, nondet_tol=1e-6)


# ---- custom-op registration and torch.compile -----------------------------------------------------
def _op_args(device, dtype=torch.float32, sq=7, sk=9, causal=True):
    gen = torch.Generator().manual_seed(6)
    q = rand((2, sq, 4, 16), dtype, device, gen)
    k, v = rand((2, sk, 2, 16), dtype, device, gen), rand((2, sk, 2, 16), dtype, device, gen)
    return (q, k, v, 0.0, causal, -1, -1, 0.0, None, None, 0, 0, "flash", False)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    args = _op_args(device, wdt(device))
    torch.library.opcheck(torch.ops.flashattn.forward.default, args)
    q, k, v = (t.detach() for t in args[:3])
    out, lse = torch.ops.flashattn.forward(q, k, v, *args[3:])
    dout = torch.randn_like(out)
    bargs = (dout, q, k, v, out, lse) + args[3:]
    torch.library.opcheck(torch.ops.flashattn.backward.default, bargs)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph(backend):
    device = DEVICES[-1]
    dt = wdt(device)
    gen = torch.Generator().manual_seed(7)

    def block(x, wq, wk, wv):
        B, S, _ = x.shape
        q = (x @ wq).view(B, S, 4, 16).to(dt)
        k = (x @ wk).view(B, S, 2, 16).to(dt)
        v = (x @ wv).view(B, S, 2, 16).to(dt)
        o = flash_attn_func(q, k, v, causal=True)
        return o.float().reshape(B, S, 64).square().mean()

    x = torch.randn(2, 20, 64, generator=gen).to(device)
    ws = [(torch.randn(64, n, generator=gen) * 0.1).to(device).requires_grad_() for n in (64, 32, 32)]
    eager = block(x, *ws)
    g_eager = torch.autograd.grad(eager, ws)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    loss = compiled(x, *ws)
    g = torch.autograd.grad(loss, ws)
    tol = 1e-5 if dt == torch.float32 else TOL[dt]  # compiled matmuls may round q, k, v differently
    close(loss, eager, tol, "loss")
    for a, b in zip(g, g_eager):
        close(a, b, tol, "grad")


# ---- eager paths (attention() calls the ops' bodies directly when nothing needs the ops) ----------
@pytest.mark.parametrize("device", DEVICES)
def test_eager_paths_match_ops(device):
    import flashattn.torch as ft

    args = list(_op_args(device, wdt(device)))
    args[-1] = True  # deterministic backward: the two paths' gradients compare bitwise
    q, k, v = (t.detach() for t in args[:3])
    assert ft._plain_eager(q, k, v)
    # No gradient to record: the forward body alone.
    fast = ft.attention(q, k, v, causal=True, return_lse=True, deterministic=True)
    via_op = torch.ops.flashattn.forward(q, k, v, *args[3:])
    for a, b in zip(fast, via_op):
        assert torch.equal(a, b), "the fast path gives the op's result bit for bit"
    # With gradients: the autograd.Function over the same bodies.
    grads = []
    for use_op in (False, True):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        if use_op:
            out = torch.ops.flashattn.forward(qg, kg, vg, *args[3:])[0]
        else:
            out = ft.attention(qg, kg, vg, causal=True, deterministic=True)
            assert type(out.grad_fn).__name__.startswith("_EagerAttention")
        dout = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
        grads.append(torch.autograd.grad(out, (qg, kg, vg), dout))
    for a, b in zip(*grads):
        assert torch.equal(a, b), "the eager autograd path gives the op's gradients bit for bit"


def test_eager_autograd_is_once_differentiable():
    args = _op_args("cpu")
    q, k, v = (t.detach().requires_grad_() for t in args[:3])
    out = flashattn.torch.attention(q, k, v, causal=True)
    (g,) = torch.autograd.grad(out.square().sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), (q,))


def test_eager_paths_not_under_tracing():
    import flashattn.torch as ft
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = _op_args("cpu")
    q, k, v = (t.detach() for t in args[:3])
    with FakeTensorMode() as mode:  # export / make_fx trace with fake tensors and a dispatch mode
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        assert not ft._plain_eager(fq, fk, fv)
        out = ft.attention(fq, fk, fv, causal=True)  # the op's fake kernel, no real computation
        assert out.shape == q.shape
    with torch.device("cpu"):  # a torch-function mode: left to the op
        assert not ft._plain_eager(q, k, v)


# ---- errors ------------------------------------------------------------------------------------
def test_unsupported_arguments_raise():
    q, k, v = (torch.randn(1, 4, 2, 16) for _ in range(3))
    with pytest.raises(NotImplementedError, match="dropout"):
        flash_attn_func(q, k, v, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="alibi"):
        flash_attn_func(q, k, v, alibi_slopes=torch.ones(2))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    with pytest.raises(NotImplementedError, match="attn_mask"):
        sdpa(qt, kt, vt, attn_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="dropout"):
        sdpa(qt, kt, vt, dropout_p=0.5)
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa(qt, kt[:, :1], vt[:, :1])


def test_errors_carry_the_core_message():
    q, k, v = (torch.randn(1, 4, 2, 16) for _ in range(3))
    with pytest.raises(TypeError, match="q"):
        flash_attn_func(q.double(), k.double(), v.double())
    with pytest.raises(TypeError, match="dtype"):
        flash_attn_func(q, k.half(), v)
    with pytest.raises(ValueError, match="k"):
        flash_attn_func(q, k[..., :8], v)
    with pytest.raises(ValueError, match="window_left"):
        flash_attn_func(q, k, v, window_size=(-3, -1))
    with pytest.raises(TypeError, match="cu_seqlens_q"):
        flash_attn_varlen_func(q[0], k[0], v[0], torch.tensor([0, 4]), torch.tensor([0, 4], dtype=torch.int32), 4, 4)
    # the array API accepts tensors too (no autograd there)
    out = flashattn.attention(q, k, v, causal=True)
    close(out, reference(q, k, v, causal=True), TOL[torch.float32])
    if "cuda" in DEVICES:
        with pytest.raises(TypeError, match="device"):
            flash_attn_func(q.cuda(), k, v)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA and flashattn's CUDA backend")
def test_cuda_layout_error_message():
    """A head stride of 68 elements is not 16-byte aligned: the CUDA flash kernels refuse it with a
    message that formats the strides (std::ostringstream inside the CUDA backend — the path that
    crashed the Python process in issue 6 when the module exported its static C++ runtime)."""
    base = torch.randn(1, 8, 2, 68, device="cuda", dtype=torch.float16)
    q = k = v = base[..., :64]
    with pytest.raises(ValueError, match=r"q: .*strides \(\d+, 136, 68\)"):
        flash_attn_func(q, k, v)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA and flashattn's CUDA backend")
def test_cuda_graph_replay():
    """A forward captured in a CUDA graph, replayed on fresh inputs (as torch.compile's
    mode="reduce-overhead" does): whatever a call sets up per launch must be part of the graph, not
    of the capture. bf16 d128, 2048 × 2048, 20 heads: 320 query tiles leave a partial last round on
    a 132-SM H200, so the Hopper forward's stream-K tail, with its per-call scratch words, runs
    inside the graph (a tail keyed on a per-launch host value would wait for good on the second
    replay). The output is poisoned before each replay."""
    gen = torch.Generator().manual_seed(7)
    dt = torch.bfloat16
    q, k, v = (torch.empty((1, 2048, 20, 128), device="cuda", dtype=dt) for _ in range(3))

    def fresh_inputs():
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, generator=gen).to(dt))

    fresh_inputs()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as PyTorch's docs ask
        flash_attn_func(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_func(q, k, v)
    for replay in range(3):
        fresh_inputs()
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        close(out, reference(q, k, v), TOL[dt], f"replay {replay}")
