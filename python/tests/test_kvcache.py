"""Attention over a KV cache against the float64 reference (reference.kvcache_forward).

flashattn.torch.flash_attn_with_kvcache is checked as a drop-in for flash-attn's function: the same
arguments give flash-attn's results and the same in-place cache update (decode, prefill, append
with rotary tables of both layouts, paged caches of page sizes 1, 16 and 256, GQA/MQA, causal
Sq > 1, windows, softcap, cache_batch_idx, every form of cache_seqlens); its op
torch.ops.flashattn.forward_kvcache under opcheck, torch.compile and (on a GPU) CUDA-graph capture;
the NumPy entry point flashattn.attention_with_kvcache. Inputs are fresh each run (the seed is
printed; FLASHATTN_TEST_SEED repeats one); every cache row that the call must not read (past
cache_seqlens[b] + S_new, unused pages) holds NaN, and so do the NumPy outputs before the call.
"""
import os
import re
import secrets

import numpy as np
import pytest

import flashattn
import reference as ref
from tolerances import TOL

try:
    import torch
except ImportError:  # the NumPy tests run without PyTorch
    torch = None

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BF16 = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
HAS_CUDA = torch is not None and torch.cuda.is_available() and flashattn.cuda_available()
needs_cuda = pytest.mark.skipif(
    not HAS_CUDA,
    reason="CUDA tests need a CUDA device and flashattn built with its CUDA backend "
           "(torch.cuda.is_available() and flashattn.cuda_available() are not both true here)")

# TOL per dtype name (tolerances.py): atol = rtol, relative to 1 + |want|, against float64 on the
# same rounded inputs.
DTYPES = ["float32", "float16", pytest.param("bfloat16", marks=pytest.mark.skipif(
    BF16 is None, reason="ml_dtypes not installed"))]


@pytest.fixture
def rng():
    seed = int(os.environ.get("FLASHATTN_TEST_SEED") or secrets.randbits(32))
    print(f"seed {seed} (FLASHATTN_TEST_SEED={seed} repeats it)")
    return np.random.default_rng(seed)


def assert_close(got, want, tol, what):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    fin = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), fin), f"{what}: non-finite entries differ"
    assert np.array_equal(got[~fin], want[~fin]), f"{what}: infinities differ"
    err = np.abs(got[fin] - want[fin])
    worst = (err - tol * (1.0 + np.abs(want[fin]))).max(initial=-1.0)
    assert worst <= 0, f"{what}: max error {err.max():.3g} (mean {err.mean():.3g}) exceeds tolerance {tol:g}"


def names(argument):
    """An error message's pattern naming `argument` (the message starts with it, or the core's
    "flashattn::forward_kvcache: " prefix or the function's name stands before it)."""
    return rf"(^|: ){re.escape(argument)}[: ]"


def same(a, b):
    """Equal values, NaN where NaN: what the call must leave as it was."""
    return np.array_equal(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), equal_nan=True)


# ---- cases -----------------------------------------------------------------------------------------
# lens: cache_seqlens (batch = its length); sq: query tokens; s_new: appended tokens; page: 0 =
# contiguous cache, else its page size; rotary: None, "interleaved" or "halves" (rotary_dim: the
# rotated features, default all); batch_idx: cache rows of a contiguous cache of cache_batch rows.
CASES = {
    "decode": dict(lens=[17, 0, 40], sq=1, s_new=1, d=128, causal=True),
    "decode-no-append": dict(lens=[33, 1], sq=1, s_new=0),
    "prefill": dict(lens=[0, 0], sq=7, s_new=7, causal=True),
    "append-rotary-interleaved": dict(lens=[20, 5], sq=3, s_new=3, rotary="interleaved", causal=True),
    "append-rotary-halves": dict(lens=[20, 5], sq=3, s_new=3, rotary="halves", rotary_dim=16, d=48),
    "rotary-window-paged": dict(lens=[30, 9], sq=2, s_new=2, rotary="halves", window=(6, 0), page=16, hkv=2),
    "paged-1": dict(lens=[9, 0, 4], sq=1, s_new=2, page=1, d=32, causal=True),
    "paged-16": dict(lens=[35, 16, 3], sq=2, s_new=2, page=16, h=8, hkv=2, causal=True),
    "paged-256": dict(lens=[300, 17], sq=1, s_new=1, page=256, causal=True),
    "gqa": dict(lens=[12, 31], sq=1, s_new=1, h=8, hkv=2, causal=True),
    "mqa-causal-sq>1": dict(lens=[12, 50], sq=4, s_new=0, h=6, hkv=1, d=40, causal=True),
    "causal-sq>total": dict(lens=[3, 20], sq=6, s_new=0, causal=True),  # first rows of seq 0 see no key
    "window-softcap-scale": dict(lens=[40, 11], sq=3, s_new=1, window=(8, 2), softcap=4.0, scale=0.3),
    "batch-idx": dict(lens=[7, 19], sq=1, s_new=1, batch_idx=[2, 0], cache_batch=3, rotary="interleaved",
                      causal=True),
}


class Case:
    """One call's inputs as float32/int32 NumPy arrays (the cache NaN where the call must not read)."""

    def __init__(self, spec, rng):
        self.spec = spec
        lens = np.array(spec["lens"], dtype=np.int32)
        B, sq, s_new = len(lens), spec["sq"], spec["s_new"]
        H, D = spec.get("h", 4), spec.get("d", 64)
        Hkv = spec.get("hkv", H)
        self.page = page = spec.get("page", 0)
        cap = int(lens.max()) + s_new + 3
        r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
        self.q, self.k, self.v = r(B, sq, H, D), r(B, s_new, Hkv, D), r(B, s_new, Hkv, D)
        self.table = self.batch_idx = None
        if page:
            max_pages = -(-cap // page)
            pages = B * max_pages + 3
            self.table = rng.permutation(pages)[: B * max_pages].reshape(B, max_pages).astype(np.int32)
            for b in range(B):  # entries past the pages in use are never read: make them invalid
                self.table[b, -(-(int(lens[b]) + s_new) // page):] = -1
            shape = (pages, page, Hkv, D)
        else:
            if "batch_idx" in spec:
                self.batch_idx = np.array(spec["batch_idx"], dtype=np.int32)
            shape = (spec.get("cache_batch", B), cap, Hkv, D)
        self.k_cache, self.v_cache = np.full(shape, np.nan, np.float32), np.full(shape, np.nan, np.float32)
        for b in range(B):
            for t in range(int(lens[b])):
                at = self.where(b, t)
                self.k_cache[at], self.v_cache[at] = r(Hkv, D), r(Hkv, D)
        self.lens = lens
        self.cos = self.sin = None
        if spec.get("rotary"):
            half = spec.get("rotary_dim", D) // 2
            angle = np.arange(cap + sq)[:, None] * 10000.0 ** (-np.arange(half) / half)[None, :]
            self.cos, self.sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
        self.causal = spec.get("causal", False)
        self.window = spec.get("window", (-1, -1))
        self.softcap = spec.get("softcap", 0.0)
        self.scale = spec.get("scale")

    def where(self, b, t):
        if self.page:
            return int(self.table[b, t // self.page]), t % self.page
        return (b if self.batch_idx is None else int(self.batch_idx[b])), t

    def expected(self, q, k_cache, v_cache, k, v, cos, sin, store):
        """The reference on the (rounded) inputs given as float64 arrays."""
        return ref.kvcache_forward(
            q, k_cache, v_cache, self.lens, k if self.spec["s_new"] else None, v if self.spec["s_new"] else None,
            cos, sin, self.spec.get("rotary") == "interleaved", self.batch_idx, self.table, self.causal,
            self.scale, self.window, self.softcap, store=store)


def check(case, dt, got, before, want):
    """got/before: float64 (out, lse, k_cache, v_cache); want: the reference's output."""
    out, lse, kc, vc = got
    kc0, vc0 = before
    w_out, w_lse, w_kc, w_vc, written = want
    tol = TOL[dt]
    assert_close(out, w_out, tol, "out")
    assert_close(lse, w_lse, tol, "lse")
    # The rows written hold the new tokens (the keys rotated, rounded once to the cache's dtype);
    # every other row is as it was, NaN included.
    assert np.array_equal(vc[written], w_vc[written]), "v_cache: the new values are copied exactly"
    assert_close(kc[written], w_kc[written], tol, "k_cache (written rows)")
    assert same(kc[~written], kc0[~written]) and same(vc[~written], vc0[~written]), "rows not written changed"


# ---- PyTorch, CPU ------------------------------------------------------------------------------------
def tdt(name):
    return getattr(torch, name)


def to_torch(a, dt, device="cpu"):
    return None if a is None else torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dt)


def f64(t):
    return None if t is None else t.detach().double().cpu().numpy()


def torch_store(dt):
    return lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dt).double().numpy()


class TorchInputs:
    def __init__(self, case, dt, device="cpu"):
        self.q, self.k, self.v = (to_torch(a, dt, device) for a in (case.q, case.k, case.v))
        self.k_cache, self.v_cache = to_torch(case.k_cache, dt, device), to_torch(case.v_cache, dt, device)
        self.cos, self.sin = to_torch(case.cos, torch.float32, device), to_torch(case.sin, torch.float32, device)
        i32 = lambda a: None if a is None else torch.from_numpy(a).to(device)  # noqa: E731
        self.lens, self.table, self.batch_idx = i32(case.lens), i32(case.table), i32(case.batch_idx)
        self.case, self.dt = case, dt

    def kwargs(self, **over):
        c = self.case
        kw = dict(rotary_cos=self.cos, rotary_sin=self.sin, cache_seqlens=self.lens, cache_batch_idx=self.batch_idx,
                  block_table=self.table, softmax_scale=c.scale, causal=c.causal, window_size=c.window,
                  softcap=c.softcap, rotary_interleaved=c.spec.get("rotary") == "interleaved",
                  return_softmax_lse=True)
        kw.update(over)
        return kw

    def new(self):
        return (self.k, self.v) if self.case.spec["s_new"] else (None, None)

    def expected(self):
        c = self.case
        return c.expected(f64(self.q), f64(self.k_cache), f64(self.v_cache), f64(self.k), f64(self.v),
                          f64(self.cos), f64(self.sin), torch_store(self.dt))


@needs_torch
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_torch_matches_flash_attn_semantics(name, dt, rng):
    from flashattn.torch import flash_attn_with_kvcache

    x = TorchInputs(Case(CASES[name], rng), tdt(dt))
    want = x.expected()
    before = f64(x.k_cache), f64(x.v_cache)
    out, lse = flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, *x.new(), **x.kwargs())
    assert flashattn.last_kernel_path() == "cpu.kvcache"
    assert out.dtype == x.q.dtype and out.shape == x.q.shape
    assert lse.dtype == torch.float32 and lse.shape == (x.q.shape[0], x.q.shape[2], x.q.shape[1])
    check(x.case, dt, (f64(out), f64(lse), f64(x.k_cache), f64(x.v_cache)), before, want)
    if name == "causal-sq>total":  # rows that see no key: output 0, LSE -inf (flashattn's edge rule)
        assert torch.all(out[0, :3] == 0) and torch.all(torch.isneginf(lse[0, :, :3]))


@needs_torch
def test_cache_seqlens_forms(rng):
    """flash-attn's forms of cache_seqlens give the int32 tensor's results bit for bit: an int
    (every sequence that long), None (every sequence fills its cache; contiguous and paged), and
    other integer tensors (converted to int32)."""
    from flashattn.torch import flash_attn_with_kvcache

    spec = dict(lens=[13, 13, 13], sq=2, s_new=2, h=4, hkv=2, causal=True, rotary="interleaved")
    case = Case(spec, rng)
    results = []
    for form in (torch.tensor(spec["lens"], dtype=torch.int32), 13, torch.tensor(spec["lens"]),
                 torch.tensor(spec["lens"], dtype=torch.int16)):
        x = TorchInputs(case, torch.float32)
        out, lse = flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, x.k, x.v, **x.kwargs(cache_seqlens=form))
        results.append((out, lse, x.k_cache, x.v_cache))
    want = TorchInputs(case, torch.float32).expected()
    check(case, "float32", tuple(f64(t) for t in results[0]), (case.k_cache, case.v_cache), want)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(bits(a), bits(b))
    # None: the whole cache is every sequence's (flash-attn's rule; not with k and v).
    for page in (0, 16):
        spec = dict(lens=[0, 0], sq=3, s_new=0, page=page)
        x = TorchInputs(Case(spec, rng), torch.float32)
        cap = x.k_cache.shape[1] * (x.table.shape[1] if page else 1)
        full = torch.full((2,), cap, dtype=torch.int32)
        x.k_cache.copy_(torch.randn(x.k_cache.shape))
        x.v_cache.copy_(torch.randn(x.v_cache.shape))
        x.table = torch.arange(x.table.numel(), dtype=torch.int32).view(x.table.shape) if page else None
        a = flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, **x.kwargs(cache_seqlens=None))
        b = flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, **x.kwargs(cache_seqlens=full))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@needs_torch
def test_return_softmax_lse_and_num_splits(rng):
    """Without return_softmax_lse the call returns out alone, the same out; every num_splits gives the
    reference's result (splits merge to rounding)."""
    from flashattn.torch import flash_attn_with_kvcache

    case = Case(dict(lens=[200, 77], sq=2, s_new=1, h=4, hkv=1, causal=True), rng)
    want = TorchInputs(case, torch.float32).expected()
    outs = []
    for splits in (0, 1, 3, 8):
        x = TorchInputs(case, torch.float32)
        out, lse = flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, x.k, x.v, **x.kwargs(num_splits=splits))
        check(case, "float32", (f64(out), f64(lse), f64(x.k_cache), f64(x.v_cache)), (case.k_cache, case.v_cache),
              want)
        outs.append(out)
    x = TorchInputs(case, torch.float32)
    only = flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, x.k, x.v, **x.kwargs(return_softmax_lse=False))
    assert isinstance(only, torch.Tensor) and torch.equal(only, outs[0])


@needs_torch
def test_strided_inputs_not_copied_and_copied_when_needed(rng):
    """Inputs with a contiguous last dimension are read in place (a q sliced out of a packed qkv
    buffer); a q whose last dimension is strided is copied densely first, with the same result."""
    from flashattn.torch import flash_attn_with_kvcache

    case = Case(dict(lens=[9, 4], sq=1, s_new=1, h=4, hkv=4, d=32, causal=True), rng)
    x = TorchInputs(case, torch.float32)
    packed = torch.empty(2, 1, 3, 4, 32)
    packed[:, :, 0], packed[:, :, 1], packed[:, :, 2] = x.q, x.k, x.v
    q, k, v = packed[:, :, 0], packed[:, :, 1], packed[:, :, 2]
    out, lse = flash_attn_with_kvcache(q, x.k_cache, x.v_cache, k, v, **x.kwargs())
    check(case, "float32", (f64(out), f64(lse), f64(x.k_cache), f64(x.v_cache)), (case.k_cache, case.v_cache),
          TorchInputs(case, torch.float32).expected())
    y = TorchInputs(case, torch.float32)
    q_strided = torch.empty(2, 1, 4, 64)[..., ::2]
    q_strided.copy_(y.q)
    out2, _ = flash_attn_with_kvcache(q_strided, y.k_cache, y.v_cache, y.k, y.v, **y.kwargs())
    assert torch.equal(out, out2)


@needs_torch
def test_kvcache_eager_path_matches_op(rng):
    """Plain eager calls run the op's body directly: the same out, lse and cache update as the op,
    bit for bit, and the caches' version counters move as the op moves them."""
    import flashattn.torch as ft

    case = Case(CASES["rotary-window-paged"], rng)
    results = []
    for use_op in (False, True):
        x = TorchInputs(case, torch.bfloat16)
        v0 = x.k_cache._version, x.v_cache._version
        if use_op:
            kw = x.kwargs()
            out, lse = torch.ops.flashattn.forward_kvcache(
                x.q, x.k_cache, x.v_cache, x.lens, x.k, x.v, x.cos, x.sin, None, x.table, 0.0, False,
                kw["window_size"][0], kw["window_size"][1], 0.0, False, 0, True)
        else:
            assert ft._plain_eager(x.q, x.k_cache, x.v_cache)
            out, lse = ft.flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, x.k, x.v, **x.kwargs())
        assert x.k_cache._version > v0[0] and x.v_cache._version > v0[1]
        results.append((out, lse, x.k_cache, x.v_cache))
    for a, b in zip(*results):
        assert torch.equal(bits(a), bits(b))


@needs_torch
def test_opcheck(rng):
    case = Case(dict(lens=[5, 2], sq=2, s_new=2, h=4, hkv=2, d=16, causal=True, rotary="halves"), rng)
    x = TorchInputs(case, torch.float32)
    # opcheck compares the caches across its runs: no NaN in them here
    x.k_cache.nan_to_num_(0.0)
    x.v_cache.nan_to_num_(0.0)
    for lse in (True, False):
        args = (x.q, x.k_cache, x.v_cache, x.lens, x.k, x.v, x.cos, x.sin, None, None, 0.0, True, -1, -1, 0.0,
                False, 0, lse)
        torch.library.opcheck(torch.ops.flashattn.forward_kvcache.default, args)


def bits(t):
    """t's bit pattern (NaN compares equal to the same NaN)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@needs_torch
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_decode(backend, rng):
    """torch.compile(fullgraph=True) of decode steps (rotary, paged, tensor lengths advanced between
    steps; an int cache_seqlens too): the same out, lse and cache update as eager, bit for bit."""
    from flashattn.torch import flash_attn_with_kvcache

    case = Case(dict(lens=[20, 3], sq=1, s_new=1, h=4, hkv=2, d=32, page=16, causal=True, rotary="interleaved"),
                rng)
    r = lambda a: to_torch(rng.standard_normal(a.shape).astype(np.float32), torch.float32)  # noqa: E731
    steps = [(r(case.q), r(case.k), r(case.v)) for _ in range(3)]
    runs = []
    for compiled in (False, True):
        x = TorchInputs(case, torch.float32)

        def step(q, k, v, lens, x=x):
            return flash_attn_with_kvcache(q * 1.0, x.k_cache, x.v_cache, k, v, rotary_cos=x.cos, rotary_sin=x.sin,
                                           cache_seqlens=lens, block_table=x.table, causal=True,
                                           return_softmax_lse=True)

        def step_int(q, x=x):
            return flash_attn_with_kvcache(q, x.k_cache, x.v_cache, cache_seqlens=5, block_table=x.table, causal=True)

        if compiled:
            torch._dynamo.reset()
            step = torch.compile(step, fullgraph=True, backend=backend)
            step_int = torch.compile(step_int, fullgraph=True, backend=backend)
        lens, res = x.lens.clone(), []
        for q, k, v in steps:
            res.extend(step(q, k, v, lens))
            lens = lens + 1
        res.append(step_int(steps[0][0]))
        runs.append((res, x.k_cache, x.v_cache))
    (r0, kc0, vc0), (r1, kc1, vc1) = runs
    for i, (a, b) in enumerate(zip(r0, r1)):
        assert torch.equal(bits(a), bits(b)), f"compiled result {i} differs from eager"
    assert torch.equal(bits(kc0), bits(kc1)) and torch.equal(bits(vc0), bits(vc1)), "compiled cache update differs"
    # and eager's first step is right
    q, k, v = steps[0]
    want = case.expected(f64(q), case.k_cache, case.v_cache, f64(k), f64(v), case.cos, case.sin,
                         np_store("float32"))
    assert_close(f64(r0[0]), want[0], TOL["float32"], "out")
    assert_close(f64(r0[1]), want[1], TOL["float32"], "lse")


@needs_torch
def test_no_autograd(rng):
    """flash-attn's flash_attn_with_kvcache has no backward, and neither has this one: inputs that
    require grad are read (not copied), out and softmax_lse never require grad, and asking for a
    gradient through them is PyTorch's error for tensors outside the graph."""
    from flashattn.torch import flash_attn_with_kvcache

    case = Case(CASES["gqa"], rng)
    x = TorchInputs(case, torch.float32)
    q, k, v = (t.clone().requires_grad_() for t in (x.q, x.k, x.v))
    out, lse = flash_attn_with_kvcache(q, x.k_cache, x.v_cache, k, v, **x.kwargs())
    assert not out.requires_grad and out.grad_fn is None and not lse.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.sum().backward()
    check(case, "float32", (f64(out), f64(lse), f64(x.k_cache), f64(x.v_cache)), (case.k_cache, case.v_cache),
          TorchInputs(case, torch.float32).expected())


@needs_torch
def test_unsupported_and_bad_arguments_write_nothing(rng):
    """cache_leftpad and alibi_slopes raise NotImplementedError naming them; bad input raises
    ValueError/TypeError naming the argument; either way the cache is as it was."""
    from flashattn.torch import flash_attn_with_kvcache

    case = Case(dict(lens=[10, 3], sq=1, s_new=1, h=4, hkv=2, d=16, page=4, causal=True, rotary="halves"), rng)
    x = TorchInputs(case, torch.float32)
    kc0, vc0 = f64(x.k_cache), f64(x.v_cache)
    q, k, v = x.q, x.k, x.v

    def call(**over):
        return flash_attn_with_kvcache(q, x.k_cache, x.v_cache, over.pop("k", k), over.pop("v", v), **x.kwargs(**over))

    for arg, value in (("cache_leftpad", torch.zeros(2, dtype=torch.int32)), ("alibi_slopes", torch.ones(4))):
        with pytest.raises(NotImplementedError, match=names(arg)):
            call(**{arg: value})
    bad_table = x.table.clone()
    bad_table[1, 0] = 10_000
    shared_page = x.table.clone()
    shared_page[1, 0] = shared_page[0, 2]  # both sequences append into one page
    cases = [
        (ValueError, "cache_seqlens", dict(cache_seqlens=torch.tensor([10, 40], dtype=torch.int32))),  # past capacity
        (ValueError, "cache_seqlens", dict(cache_seqlens=torch.tensor([10, -1], dtype=torch.int32))),
        (ValueError, "cache_seqlens", dict(cache_seqlens=2**40)),
        (ValueError, "cache_seqlens", dict(cache_seqlens=torch.tensor([10, 2**40]))),  # saturated, then rejected
        (ValueError, "cache_seqlens", dict(cache_seqlens=None)),  # None with k and v
        (TypeError, "cache_seqlens", dict(cache_seqlens=torch.tensor([10.0, 3.0]))),
        (TypeError, "cache_seqlens", dict(cache_seqlens=3.5)),
        (ValueError, "cache_seqlens", dict(cache_seqlens=torch.tensor([10, 3, 1], dtype=torch.int32))),
        (ValueError, "block_table", dict(block_table=bad_table)),
        (ValueError, "block_table", dict(block_table=shared_page)),
        (TypeError, "block_table", dict(block_table=x.table.long())),
        (ValueError, "cache_batch_idx", dict(cache_batch_idx=torch.tensor([0, 1], dtype=torch.int32))),
        (ValueError, "v", dict(v=None)),
        (ValueError, "rotary_sin", dict(rotary_sin=None)),
        (ValueError, "rotary_cos", dict(rotary_cos=x.cos[:5], rotary_sin=x.sin[:5])),  # too few positions
        (ValueError, "k_new", dict(k=k[..., :8])),
        (TypeError, "k_new", dict(k=k.half(), v=v.half())),
        (ValueError, "window_left", dict(window_size=(-3, -1))),
        (ValueError, "window_size", dict(window_size=3)),
        (ValueError, "num_splits", dict(num_splits=-2)),
        (ValueError, "softcap", dict(softcap=-1.0)),
    ]
    for exc, name, over in cases:
        with pytest.raises(exc, match=names(name)):
            call(**over)
        assert same(f64(x.k_cache), kc0) and same(f64(x.v_cache), vc0), f"{name} {over}: the cache was written"
    with pytest.raises(ValueError, match=names("k_cache")):  # a strided last dimension is never copied: refused
        wide = torch.zeros(x.k_cache.shape[:-1] + (32,))
        flash_attn_with_kvcache(q, wide[..., ::2], x.v_cache, k, v, **x.kwargs())
    with pytest.raises(ValueError, match=names("q")):
        flash_attn_with_kvcache(q[0], x.k_cache, x.v_cache, k, v, **x.kwargs())
    assert same(f64(x.k_cache), kc0) and same(f64(x.v_cache), vc0)


# ---- NumPy ---------------------------------------------------------------------------------------------
def np_dt(dt):
    return BF16 if dt == "bfloat16" else np.dtype(dt)


def np_store(dt):
    return lambda a: a.astype(np_dt(dt)).astype(np.float64)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_numpy_matches_reference(name, dt, rng):
    case = Case(CASES[name], rng)
    d = np_dt(dt)
    q, k, v, kc, vc = (a.astype(d) for a in (case.q, case.k, case.v, case.k_cache, case.v_cache))
    want = case.expected(q, kc, vc, k, v, case.cos, case.sin, np_store(dt))
    before = kc.astype(np.float64), vc.astype(np.float64)
    out = np.full(q.shape, np.nan, d)  # poisoned: every element must be written
    new = dict(k=k, v=v) if case.spec["s_new"] else {}
    got, lse = flashattn.attention_with_kvcache(
        q, kc, vc, case.lens, **new, rotary_cos=case.cos, rotary_sin=case.sin,
        rotary_interleaved=case.spec.get("rotary") == "interleaved", cache_batch_idx=case.batch_idx,
        block_table=case.table, causal=case.causal, scale=case.scale, window=case.window, softcap=case.softcap,
        return_lse=True, out=out)
    assert got is out and flashattn.last_kernel_path() == "cpu.kvcache"
    assert lse.dtype == np.float32 and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    check(case, dt, (out, lse, kc, vc), before, want)


def test_numpy_index_forms_and_defaults(rng):
    """An int cache_seqlens, lists and int64 index arrays (converted), a bfloat16 rotary table
    (widened exactly) and the defaults (out allocated, no LSE) give the same results."""
    case = Case(dict(lens=[6, 6], sq=1, s_new=1, page=4, rotary="interleaved", causal=True), rng)
    results = []
    for lens, table in ((case.lens, case.table), (6, case.table.astype(np.int64)), ([6, 6], case.table.tolist())):
        kc, vc = case.k_cache.copy(), case.v_cache.copy()
        out = flashattn.attention_with_kvcache(case.q, kc, vc, lens, k=case.k, v=case.v, rotary_cos=case.cos,
                                               rotary_sin=case.sin, block_table=table, causal=True)
        assert isinstance(out, np.ndarray) and out.dtype == np.float32
        results.append((out, kc, vc))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert same(a, b)
    want = case.expected(case.q, case.k_cache, case.v_cache, case.k, case.v, case.cos, case.sin, np_store("float32"))
    assert_close(results[0][0], want[0], TOL["float32"], "out")
    if BF16 is not None:
        cos, sin = case.cos.astype(BF16), case.sin.astype(BF16)
        kc, vc = case.k_cache.copy(), case.v_cache.copy()
        out = flashattn.attention_with_kvcache(case.q, kc, vc, 6, k=case.k, v=case.v, rotary_cos=cos, rotary_sin=sin,
                                               block_table=case.table, causal=True)
        want = case.expected(case.q, case.k_cache, case.v_cache, case.k, case.v, cos, sin, np_store("float32"))
        assert_close(out, want[0], TOL["float32"], "out (bfloat16 rotary tables)")


def test_numpy_bad_arguments_write_nothing(rng):
    case = Case(dict(lens=[10, 3], sq=2, s_new=1, h=4, hkv=2, d=16, causal=True), rng)
    kc, vc = case.k_cache.copy(), case.v_cache.copy()
    out = np.full(case.q.shape, np.nan, np.float32)
    call = lambda **over: flashattn.attention_with_kvcache(  # noqa: E731
        case.q, kc, vc, over.pop("cache_seqlens", case.lens), **{**dict(k=case.k, v=case.v, out=out, causal=True),
                                                                  **over})
    cases = [
        (ValueError, "cache_seqlens", dict(cache_seqlens=[10, 60])),
        (ValueError, "cache_seqlens", dict(cache_seqlens=np.array([10, 2**40]))),
        (TypeError, "cache_seqlens", dict(cache_seqlens=np.array([1.0, 2.0]))),
        (ValueError, "cache_batch_idx", dict(cache_batch_idx=[1, 1])),  # two sequences append to one row
        (ValueError, "v", dict(v=None)),
        (TypeError, "k_new", dict(k=case.k.astype(np.float16), v=case.v.astype(np.float16))),
        (ValueError, "window", dict(window=(2,))),
        (ValueError, "scale", dict(scale=0.0)),
        (ValueError, "out", dict(out=out[:, :1])),
    ]
    for exc, name, over in cases:
        with pytest.raises(exc, match=names(name)):
            call(**over)
        assert np.isnan(out).all(), f"{name}: out was written"
        assert same(kc, case.k_cache) and same(vc, case.v_cache), f"{name}: the cache was written"
    ro = kc.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=names("k_cache")):
        flashattn.attention_with_kvcache(case.q, ro, vc, case.lens, k=case.k, v=case.v)


# ---- CUDA (skipped without a GPU and the CUDA backend) --------------------------------------------------
CUDA_CASES = ["decode", "prefill", "append-rotary-interleaved", "append-rotary-halves", "rotary-window-paged",
              "paged-1", "paged-16", "paged-256", "gqa", "mqa-causal-sq>1", "causal-sq>total", "window-softcap-scale",
              "batch-idx"]


@needs_cuda
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", CUDA_CASES)
def test_cuda_matches_flash_attn_semantics(name, dt, rng):
    from flashattn.torch import flash_attn_with_kvcache

    x = TorchInputs(Case(CASES[name], rng), tdt(dt), "cuda")
    want = x.expected()
    before = f64(x.k_cache), f64(x.v_cache)
    out, lse = flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, *x.new(), **x.kwargs())
    torch.cuda.synchronize()
    assert flashattn.last_kernel_path().startswith("cuda.")
    check(x.case, dt, (f64(out), f64(lse), f64(x.k_cache), f64(x.v_cache)), before, want)


@needs_cuda
@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("page", [0, 16])
def test_cuda_graph_decode_replay(dt, page, rng):
    """A decode step (append one token, attend) captured in a CUDA graph and replayed with new
    cache_seqlens values and fresh q, k, v: each replay gives the reference's out, LSE and cache
    update, and eager's on the same cache (the update bit for bit). Outputs are poisoned before each
    replay; cache rows past every replay's lengths hold NaN."""
    from flashattn.torch import flash_attn_with_kvcache

    dtype = tdt(dt)
    B, H, Hkv, D, cap = 4, 8, 2, 128, 512
    replays = [[100, 1, 257, 31], [101, 2, 258, 32], [0, 300, 5, 511], [17, 17, 17, 17]]
    spec = dict(lens=[max(r[b] for r in replays) for b in range(B)], sq=1, s_new=1, h=H, hkv=Hkv, d=D,
                page=page, causal=True)
    case = Case(spec, rng)
    if page:  # every page of the capacity mapped: the lengths change from replay to replay
        case.table = rng.permutation(case.table.size).reshape(case.table.shape).astype(np.int32)
        case.k_cache = np.full((case.table.size,) + case.k_cache.shape[1:], np.nan, np.float32)
        case.v_cache = case.k_cache.copy()
    else:
        case.k_cache = np.full((B, cap) + case.k_cache.shape[2:], np.nan, np.float32)
        case.v_cache = case.k_cache.copy()
    for b in range(B):
        for t in range(max(r[b] for r in replays)):
            at = case.where(b, t)
            case.k_cache[at], case.v_cache[at] = rng.standard_normal((2, Hkv, D)).astype(np.float32)
    x = TorchInputs(case, dtype, "cuda")
    seqlens = x.lens.clone()

    def step():
        return flash_attn_with_kvcache(x.q, x.k_cache, x.v_cache, x.k, x.v, cache_seqlens=seqlens,
                                       block_table=x.table, causal=True, return_softmax_lse=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as PyTorch's docs ask
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    for i, lens in enumerate(replays):
        for t in (x.q, x.k, x.v):
            t.copy_(torch.from_numpy(rng.standard_normal(t.shape).astype(np.float32)).to(dtype))
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        kc0, vc0 = x.k_cache.clone(), x.v_cache.clone()
        case.lens = np.array(lens, dtype=np.int32)
        want = case.expected(f64(x.q), f64(kc0), f64(vc0), f64(x.k), f64(x.v), None, None, torch_store(dtype))
        graph.replay()
        torch.cuda.synchronize()
        check(case, dt, (f64(out), f64(lse), f64(x.k_cache), f64(x.v_cache)), (f64(kc0), f64(vc0)), want)
        kc_e, vc_e = kc0.clone(), vc0.clone()
        out_e, lse_e = flash_attn_with_kvcache(x.q, kc_e, vc_e, x.k, x.v, cache_seqlens=seqlens, block_table=x.table,
                                               causal=True, return_softmax_lse=True)
        torch.cuda.synchronize()
        assert_close(f64(out), f64(out_e), TOL[dt], f"replay {i}: out against eager")
        assert_close(f64(lse), f64(lse_e), TOL[dt], f"replay {i}: lse against eager")
        assert same(f64(x.k_cache), f64(kc_e)) and same(f64(x.v_cache), f64(vc_e)), f"replay {i}: cache"


@needs_cuda
def test_cuda_compile_fullgraph_decode(rng):
    from flashattn.torch import flash_attn_with_kvcache

    case = Case(dict(lens=[40, 7], sq=1, s_new=1, h=8, hkv=2, d=64, page=16, causal=True, rotary="halves"), rng)
    runs = []
    for compiled in (False, True):
        x = TorchInputs(case, torch.bfloat16, "cuda")

        def step(q, k, v, lens, x=x):
            return flash_attn_with_kvcache(q, x.k_cache, x.v_cache, k, v, rotary_cos=x.cos, rotary_sin=x.sin,
                                           cache_seqlens=lens, block_table=x.table, causal=True,
                                           return_softmax_lse=True)

        if compiled:
            torch._dynamo.reset()
            step = torch.compile(step, fullgraph=True)
        gen = torch.Generator(device="cuda").manual_seed(11)
        lens, res = x.lens.clone(), []
        for _ in range(3):
            q, k, v = (torch.randn(t.shape, generator=gen, device="cuda").to(t.dtype) for t in (x.q, x.k, x.v))
            res.append(step(q, k, v, lens))
            lens = lens + 1
        torch.cuda.synchronize()
        runs.append((res, x.k_cache, x.v_cache))
    (r0, kc0, vc0), (r1, kc1, vc1) = runs
    for a, b in zip(r0, r1):
        for s, t in zip(a, b):
            assert_close(f64(t), f64(s), TOL["bfloat16"], "compiled against eager")
    assert same(f64(kc0), f64(kc1)) and same(f64(vc0), f64(vc1))
