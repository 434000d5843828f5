"""flashattn's NumPy path against the NumPy float64 reference (tests/reference.py)."""
import numpy as np
import pytest

import flashattn
import reference as ref
from tolerances import grad_tol, tol

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BF16 = None

# Per dtype: tolerance (atol = rtol) against the float64 reference computed from the same
# (rounded) inputs. f32: fp32 accumulation; f16/bf16: output rounding plus P rounded to the
# working precision before P @ V (flash and standard both may), ~4 ulps of the format.
TOL = {dt: tol(dt) for dt in (np.float32, np.float16, "bf16")}
GRAD_TOL = {dt: grad_tol(dt) for dt in (np.float32, np.float16, "bf16")}
DTYPES = [np.float32, np.float16, pytest.param("bf16", marks=pytest.mark.skipif(BF16 is None, reason="ml_dtypes not installed"))]


def np_dtype(dt):
    return BF16 if dt == "bf16" else np.dtype(dt)


def make(shape, dt, rng, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(np_dtype(dt))


def f64(a):
    return np.asarray(a).astype(np.float64)


def assert_close(got, want, tol, what=""):
    got, want = f64(got), f64(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    fin = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), fin), f"{what}: non-finite entries differ"
    assert np.array_equal(got[~fin], want[~fin]), f"{what}: infinities differ"
    err = np.abs(got[fin] - want[fin])
    bound = tol * (1.0 + np.abs(want[fin]))
    worst = (err - bound).max(initial=-1.0)
    assert worst <= 0, f"{what}: max error {err.max():.3g} exceeds tolerance {tol:g}"


CASES = [
    # B, Sq, Sk, H, Hkv, D, options
    (2, 17, 17, 4, 4, 32, dict()),
    (2, 17, 17, 4, 4, 32, dict(causal=True)),
    (1, 13, 29, 4, 2, 64, dict(causal=True)),          # Sq < Sk (decoding-like), GQA
    (1, 29, 13, 6, 2, 16, dict(causal=True)),          # Sq > Sk: leading rows see no key
    (2, 33, 33, 2, 1, 40, dict(window=(5, 3))),        # MQA, sliding window
    (1, 33, 40, 2, 2, 32, dict(window=(4, 0), causal=True)),
    (2, 19, 23, 2, 2, 32, dict(softcap=3.0, scale=0.3)),
    (1, 64, 64, 2, 2, 128, dict(causal=True, softcap=10.0)),
    (1, 9, 9, 1, 1, 256, dict()),
]
CASE_IDS = ["dense", "causal", "causal-sq<sk-gqa", "causal-sq>sk", "window-mqa", "window-causal",
            "softcap-scale", "d128-causal-softcap", "d256"]


@pytest.mark.parametrize("algorithm", ["flash", "standard"])
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_forward_backward(case, dt, algorithm):
    B, Sq, Sk, H, Hkv, D, opts = case
    rng = np.random.default_rng(hash((Sq, Sk, H, D)) & 0xFFFF)
    q, k, v = make((B, Sq, H, D), dt, rng), make((B, Sk, Hkv, D), dt, rng), make((B, Sk, Hkv, D), dt, rng)
    out, lse = flashattn.attention(q, k, v, return_lse=True, algorithm=algorithm, **opts)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (B, H, Sq)
    want_out, want_lse = ref.forward(q, k, v, **opts)
    assert_close(out, want_out, TOL[dt], "out")
    assert_close(lse, want_lse, TOL[dt], "lse")

    dout = make(out.shape, dt, rng)
    dq, dk, dv = flashattn.attention_backward(dout, q, k, v, out, lse, algorithm=algorithm, **opts)
    for g, x in ((dq, q), (dk, k), (dv, v)):
        assert g.dtype == q.dtype and g.shape == x.shape
    wq, wk, wv = ref.backward(dout, q, k, v, **opts)
    tol = GRAD_TOL[dt]
    assert_close(dq, wq, tol, "dq")
    assert_close(dk, wk, tol, "dk")
    assert_close(dv, wv, tol, "dv")


def test_fully_masked_rows_are_zero_not_nan():
    # Sq > Sk with causal: query i sees keys j <= i - (Sq - Sk); the first 6 rows see none.
    rng = np.random.default_rng(1)
    q, k, v = make((1, 10, 2, 16), np.float32, rng), make((1, 4, 2, 16), np.float32, rng), make((1, 4, 2, 16), np.float32, rng)
    out, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    assert np.all(out[:, :6] == 0) and np.all(np.isneginf(lse[:, :, :6]))
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse[:, :, 6:]))
    dq, dk, dv = flashattn.attention_backward(np.ones_like(out), q, k, v, out, lse, causal=True)
    for g in (dq, dk, dv):
        assert np.all(np.isfinite(g))
    assert np.all(dq[:, :6] == 0)


def test_last_kernel_path_names_what_ran():
    rng = np.random.default_rng(4)
    q, k, v = (make((1, 9, 2, 16), np.float32, rng) for _ in range(3))
    for algorithm in ("flash", "standard"):
        out, lse = flashattn.attention(q, k, v, algorithm=algorithm, return_lse=True)
        assert flashattn.last_kernel_path() == "cpu." + algorithm
        flashattn.attention_backward(np.ones_like(out), q, k, v, out, lse, algorithm=algorithm)
        assert flashattn.last_kernel_path() == "cpu." + algorithm
    with pytest.raises(ValueError):  # a rejected call leaves the last path as it was
        flashattn.attention(q, k[:, :, :1, :8], v)
    assert flashattn.last_kernel_path() == "cpu.standard"
    assert issubclass(flashattn.UnsupportedError, ValueError)


def test_strided_inputs_zero_copy():
    """Any strides with a contiguous last dimension: a packed qkv buffer and a (B, H, S, D) transpose."""
    rng = np.random.default_rng(2)
    B, S, H, D = 2, 21, 3, 32
    qkv = make((B, S, 3, H, D), np.float32, rng)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.flags.c_contiguous
    out, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    want, _ = ref.forward(q, k, v, causal=True)
    assert_close(out, want, TOL[np.float32])
    same = flashattn.attention(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v), causal=True)
    np.testing.assert_array_equal(out, same)

    # (B, H, S, D) storage seen as (B, S, H, D)
    kt = np.ascontiguousarray(k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(flashattn.attention(q, kt, v, causal=True), out)

    # gradients written into caller-provided strided buffers ((B, H, S, D) storage)
    bufs = [np.full((B, H, S, D), np.nan, np.float32) for _ in range(3)]
    dout = make(out.shape, np.float32, rng)
    dq, dk, dv = flashattn.attention_backward(dout, q, k, v, out, lse, causal=True,
                                              **{n: b.transpose(0, 2, 1, 3) for n, b in zip(("dq", "dk", "dv"), bufs)})
    assert all(np.shares_memory(g, b) for g, b in zip((dq, dk, dv), bufs))
    for g, w, name in zip((dq, dk, dv), ref.backward(dout, q, k, v, causal=True), ("dq", "dk", "dv")):
        assert_close(g, w, GRAD_TOL[np.float32], name)


def test_packed_dqkv_gradients():
    rng = np.random.default_rng(2)
    qkv = make((2, 9, 3, 2, 16), np.float32, rng)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    out, lse = flashattn.attention(q, k, v, return_lse=True)
    dqkv = np.empty_like(qkv)
    dout = make(out.shape, np.float32, rng)
    flashattn.attention_backward(dout, q, k, v, out, lse, dq=dqkv[:, :, 0], dk=dqkv[:, :, 1], dv=dqkv[:, :, 2])
    for i, w in enumerate(ref.backward(dout, q, k, v)):
        assert_close(dqkv[:, :, i], w, GRAD_TOL[np.float32])


def test_out_is_written_in_place_and_readonly_inputs_accepted():
    rng = np.random.default_rng(3)
    q, k, v = (make((1, 8, 2, 16), np.float32, rng) for _ in range(3))
    for a in (q, k, v):
        a.setflags(write=False)
    out = np.empty_like(q)
    res = flashattn.attention(q, k, v, out=out)
    assert res is out
    assert_close(out, ref.forward(q, k, v)[0], TOL[np.float32])


def test_broadcast_stride0_inputs_are_right_or_rejected():
    """Stride-0 (broadcast) keys: either computed correctly or rejected with ValueError, never wrong."""
    rng = np.random.default_rng(3)
    q, k, v = (make((1, 8, 2, 16), np.float32, rng) for _ in range(3))
    kb = np.broadcast_to(k[:, :1], k.shape)
    vb = np.broadcast_to(v[:, :1], v.shape)
    for algorithm in ("flash", "standard"):
        try:
            got = flashattn.attention(q, kb, vb, algorithm=algorithm)
        except ValueError as e:
            assert "k" in str(e)
            continue
        assert_close(got, ref.forward(q, kb, vb)[0], TOL[np.float32], algorithm)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_reference_and_per_sequence(causal):
    rng = np.random.default_rng(4)
    lq, lk = [5, 1, 12, 0, 7], [9, 3, 12, 4, 7]
    cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    H, Hkv, D = 4, 2, 32
    q = make((1, cu_q[-1], H, D), np.float32, rng)
    k = make((1, cu_k[-1], Hkv, D), np.float32, rng)
    v = make((1, cu_k[-1], Hkv, D), np.float32, rng)
    kw = dict(causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    out, lse = flashattn.attention(q, k, v, return_lse=True, **kw)
    want_out, want_lse = ref.forward(q, k, v, **kw)
    assert_close(out, want_out, TOL[np.float32])
    assert_close(lse, want_lse, 1e-5)
    for s in range(len(lq)):
        if lq[s] == 0:
            continue
        sl_q, sl_k = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        o = flashattn.attention(q[:, sl_q], k[:, sl_k], v[:, sl_k], causal=causal)
        np.testing.assert_allclose(out[:, sl_q], o, rtol=1e-6, atol=1e-6)
    dout = make(out.shape, np.float32, rng)
    got = flashattn.attention_backward(dout, q, k, v, out, lse, max_seqlen_q=max(lq), max_seqlen_k=max(lk), **kw)
    for g, w, name in zip(got, ref.backward(dout, q, k, v, **kw), ("dq", "dk", "dv")):
        assert_close(g, w, GRAD_TOL[np.float32], name)


def test_deterministic_backward_is_bitwise_reproducible():
    rng = np.random.default_rng(5)
    q, k, v = make((2, 40, 4, 32), np.float32, rng), make((2, 40, 2, 32), np.float32, rng), make((2, 40, 2, 32), np.float32, rng)
    out, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    dout = make(out.shape, np.float32, rng)
    a = flashattn.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    b = flashattn.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_default_scale_and_explicit_scale_agree():
    rng = np.random.default_rng(6)
    q, k, v = (make((1, 8, 2, 64), np.float32, rng) for _ in range(3))
    np.testing.assert_array_equal(flashattn.attention(q, k, v), flashattn.attention(q, k, v, scale=np.float32(1 / 8)))


class DLPackOnly:
    """An array that is neither NumPy's nor PyTorch's: DLPack export and the array-API namespace
    only (what CuPy and JAX arrays offer), backed by a NumPy buffer."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *args, **kwargs):
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()

    def __array_namespace__(self, api_version=None):
        return np

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    device = property(lambda self: "cpu")
    ndim = property(lambda self: self._a.ndim)


def test_dlpack_only_arrays_zero_copy():
    """Inputs and caller-provided outputs that reach the core through DLPack alone."""
    rng = np.random.default_rng(11)
    q, k, v = make((1, 19, 4, 32), np.float32, rng), make((1, 23, 2, 32), np.float32, rng), make((1, 23, 2, 32), np.float32, rng)
    want = flashattn.attention(q, k, v, causal=True)
    got = flashattn.attention(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v), causal=True)
    np.testing.assert_array_equal(np.asarray(got), want)
    buf = np.full(q.shape, np.nan, np.float32)
    flashattn.attention(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v), causal=True, out=DLPackOnly(buf))
    np.testing.assert_array_equal(buf, want)  # written in place through the DLPack view


def test_module_info():
    assert isinstance(flashattn.__version__, str) and flashattn.__version__
    assert "cpu" in flashattn.build_info()
    assert isinstance(flashattn.cuda_available(), bool)


# ---- bad inputs: a Python exception naming the argument, nothing written ---------------------
def _qkv(rng=None, B=1, S=8, H=2, D=16, dt=np.float32):
    rng = rng or np.random.default_rng(7)
    return make((B, S, H, D), dt, rng), make((B, S, H, D), dt, rng), make((B, S, H, D), dt, rng)


def _bad(name):
    q, k, v = _qkv()
    cu = np.array([0, 3, 8], np.int32)
    f16 = lambda a: a.astype(np.float16)  # noqa: E731
    return {
        # dtypes and devices -> TypeError
        "q-float64": (TypeError, "q", (q.astype(np.float64), k, v), {}),
        "k-int32": (TypeError, "k", (q, k.astype(np.int32), v), {}),
        "v-dtype-mismatch": (TypeError, "v", (q, k, f16(v)), {}),
        "q-list": (TypeError, "q", (q.tolist(), k, v), {}),
        "cu-int64": (TypeError, "cu_seqlens_q", (q, k, v), dict(cu_seqlens_q=cu.astype(np.int64), cu_seqlens_k=cu)),
        "out-dtype": (TypeError, "out", (q, k, v), dict(out=np.empty(q.shape, np.float16))),
        # shapes and values -> ValueError
        "q-3d": (ValueError, "q", (q[0], k, v), {}),
        "k-head-dim": (ValueError, "k", (q, k[..., :8], v), {}),
        "k-heads-not-dividing": (ValueError, "k", (q[:, :, :1].repeat(3, 2), k, v), {}),
        "v-seqlen": (ValueError, "v", (q, k, v[:, :5]), {}),
        "k-batch": (ValueError, "k", (q, np.concatenate([k, k]), v), {}),
        "head-dim-too-big": (ValueError, "head_dim", tuple(make((1, 2, 1, 300), np.float32, np.random.default_rng(0)) for _ in range(3)), {}),
        "q-last-dim-strided": (ValueError, "q", (make((1, 8, 2, 32), np.float32, np.random.default_rng(0))[..., ::2], k, v), {}),
        "algorithm": (ValueError, "algorithm", (q, k, v), dict(algorithm="fast")),
        "scale-zero": (ValueError, "scale", (q, k, v), dict(scale=0.0)),
        "scale-nan": (ValueError, "scale", (q, k, v), dict(scale=float("nan"))),
        "softcap-negative": (ValueError, "softcap", (q, k, v), dict(softcap=-1.0)),
        "window-left": (ValueError, "window_left", (q, k, v), dict(window=(-2, 0))),
        "window-right-causal": (ValueError, "window_right", (q, k, v), dict(window=(-1, 2), causal=True)),
        "window-not-pair": (ValueError, "window", (q, k, v), dict(window=3)),
        "cu-only-q": (ValueError, "cu_seqlens_k", (q, k, v), dict(cu_seqlens_q=cu)),
        "cu-last-entry": (ValueError, "cu_seqlens_q", (q, k, v), dict(cu_seqlens_q=np.array([0, 3, 7], np.int32), cu_seqlens_k=cu)),
        "cu-decreasing": (ValueError, "cu_seqlens_k", (q, k, v), dict(cu_seqlens_q=cu, cu_seqlens_k=np.array([0, 9, 8], np.int32))),
        "cu-2d": (ValueError, "cu_seqlens_q", (q, k, v), dict(cu_seqlens_q=cu[None], cu_seqlens_k=cu)),
        "varlen-batch-2": (ValueError, "q", (np.concatenate([q, q]), np.concatenate([k, k]), np.concatenate([v, v])), dict(cu_seqlens_q=cu, cu_seqlens_k=cu)),
        "max-seqlen-too-small": (ValueError, "max_seqlen_q", (q, k, v), dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=2)),
        "out-shape": (ValueError, "out", (q, k, v), dict(out=np.empty((1, 8, 2, 8), np.float32))),
        "out-aliases-q": (ValueError, "out", (q, k, v), dict(out=q)),
    }[name]


BAD = ["q-float64", "k-int32", "v-dtype-mismatch", "q-list", "cu-int64", "out-dtype", "q-3d",
       "k-head-dim", "k-heads-not-dividing", "v-seqlen", "k-batch", "head-dim-too-big",
       "q-last-dim-strided", "algorithm", "scale-zero", "scale-nan", "softcap-negative",
       "window-left", "window-right-causal", "window-not-pair", "cu-only-q", "cu-last-entry",
       "cu-decreasing", "cu-2d", "varlen-batch-2", "max-seqlen-too-small", "out-shape",
       "out-aliases-q"]


@pytest.mark.parametrize("name", BAD)
def test_bad_forward_inputs_raise_and_write_nothing(name):
    exc, arg, args, kw = _bad(name)
    before = [np.array(a, copy=True) for a in args if isinstance(a, np.ndarray)]
    out_sentinel = kw.get("out")
    if out_sentinel is not None and out_sentinel is not args[0]:
        out_sentinel.fill(1234.0)
    with pytest.raises(exc) as info:
        flashattn.attention(*args, **kw)
    assert arg in str(info.value), f"message should name {arg!r}: {info.value}"
    after = [a for a in args if isinstance(a, np.ndarray)]
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)
    if out_sentinel is not None and out_sentinel is not args[0]:
        assert np.all(out_sentinel == 1234.0)


def test_bad_backward_inputs():
    q, k, v = _qkv()
    out, lse = flashattn.attention(q, k, v, return_lse=True)
    dout = np.ones_like(out)
    with pytest.raises(TypeError, match="lse"):
        flashattn.attention_backward(dout, q, k, v, out, lse.astype(np.float64))
    with pytest.raises(ValueError, match="lse"):
        flashattn.attention_backward(dout, q, k, v, out, lse[:, :1])
    with pytest.raises(ValueError, match="lse"):
        flashattn.attention_backward(dout, q, k, v, out, lse[..., None])
    with pytest.raises(TypeError, match="dout"):
        flashattn.attention_backward(dout.astype(np.float16), q, k, v, out, lse)
    with pytest.raises(ValueError, match="dout"):
        flashattn.attention_backward(dout[:, :4], q, k, v, out, lse)
    dq = np.full_like(q, 7.0)
    with pytest.raises(ValueError, match="dk"):
        flashattn.attention_backward(dout, q, k, v, out, lse, dq=dq, dk=np.empty((1, 8, 2, 8), np.float32))
    assert np.all(dq == 7.0)
    with pytest.raises(ValueError, match="dq"):
        flashattn.attention_backward(dout, q, k, v, out, lse, dq=q)  # aliases an input


def test_bf16_uint16_is_not_bfloat16():
    if BF16 is None:
        pytest.skip("ml_dtypes not installed")
    q, k, v = _qkv(dt="bf16")
    with pytest.raises(TypeError, match="k"):
        flashattn.attention(q, k.view(np.uint16), v)
