"""flashattn.context_parallel on CPU processes over gloo: every rank's output and gradient shards,
put back in global order, against single-process flashattn.torch.attention on the full sequence
and against the float64 reference (python/tests/reference.py).

One spawn of P processes per P runs every case; the parent process compares. Tolerance rule: the
context-parallel error against float64 is at most twice the single-process error of the same dtype
plus the float64 reference's rounding noise at that dtype and an fp32 floor (bound() below), and
within the package's usual per-dtype tolerances. The inputs are fresh each run: the seed comes from
FLASHATTN_TEST_SEED when set, else at random, and every failure message names it.
"""
import datetime
import os
import random
import functools
import multiprocessing
import queue
import socket
import time
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import flashattn.torch as fat  # noqa: E402
from flashattn import context_parallel as cp  # noqa: E402

import reference as ref  # noqa: E402

if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

# Per dtype (atol = rtol, relative to 1 + |want|) against float64, as in test_torch.py.
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
GRAD_TOL = {torch.float32: 5e-5, torch.bfloat16: 6e-2}
# One seed for the parent and its spawned ranks (they inherit the environment).
os.environ.setdefault("FLASHATTN_TEST_SEED", str(random.randrange(1 << 31)))
SEED = int(os.environ["FLASHATTN_TEST_SEED"])
U = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8}  # unit roundoff per dtype


def bound(err_single, dtype, world):
    """What the context-parallel error (rel_err units) may reach: 2x the single-process error, the
    reference's rounding noise at the dtype (u/2), and an fp32 floor. The floor is 16 u_fp32 (a few
    ulps of fp32 rounding in the kernel, the single-process run and the reference, as the C++
    suite's rule has it: 2x alone fails on an unlucky draw) plus 2P u_fp32: a row's out and a key's
    dK/dV are sums of up to 2P block partials in the fp32 accumulators, each addition one more
    rounding that single-process attention does not have. Rounding the partials to bf16 (what the
    fp32 accumulators prevent) would add about P u_bf16, 65536 times more."""
    return 2 * err_single + U[dtype] / 2 + (16 + 2 * world) * U[torch.float32]
S = 96  # divisible by 2P for P = 1 ... 4
JOIN_TIMEOUT_S = 240
GROUP_TIMEOUT_S = 60


# ---- layouts, written independently of the module ------------------------------------------------
def positions(layout, rank, world, s_total):
    """Global token positions of rank's shard, in its local order."""
    if layout == "contiguous":
        n = s_total // world
        return list(range(rank * n, (rank + 1) * n))
    n = s_total // (2 * world)
    return (list(range(rank * n, (rank + 1) * n)) +
            list(range((2 * world - 1 - rank) * n, (2 * world - rank) * n)))


def assemble(shards, layout, world):
    """(B, S/P, ...) float64 arrays of every rank -> (B, S, ...) in global order."""
    s_total = shards[0].shape[1] * world
    full = np.zeros((shards[0].shape[0], s_total) + shards[0].shape[2:])
    for r, x in enumerate(shards):
        full[:, positions(layout, r, world, s_total)] = x
    return full


# ---- the ring's block decomposition (no processes) ------------------------------------------------
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (7, -1)),
                                           (False, (5, 3)), (False, (-1, 9)), (False, (0, 0)),
                                           (True, (40, -1)), (False, (30, 2))])
def test_ring_blocks_cover_the_mask_once(layout, world, causal, window):
    """The calls the ring makes, mapped to global positions, see every visible (query, key) pair
    exactly once and no hidden one."""
    s_total = 48
    s_local = s_total // world
    want = ref.visible(s_total, s_total, causal, window).astype(int)
    seen = np.zeros_like(want)
    for r in range(world):
        pr = np.array(positions(layout, r, world, s_total))
        for src in range(world):
            ps = np.array(positions(layout, src, world, s_total))
            for q0, q1, k0, k1, wl, wr in cp._ring_tasks(layout, r, src, world, s_local, causal, window[0],
                                                         window[1]):
                assert q1 - q0 == k1 - k0 or (wl, wr) == (-1, -1), "banded calls are square"
                m = ref.visible(q1 - q0, k1 - k0, False, (wl, wr)).astype(int)
                seen[np.ix_(pr[q0:q1], ps[k0:k1])] += m
    np.testing.assert_array_equal(seen, want)


def test_ring_skips_hidden_blocks_and_balances_zigzag():
    """Causal zigzag: every rank computes the same number of (query, key) pairs; contiguous: rank r
    skips the P - 1 - r blocks after its own."""
    world, s_local = 4, 24

    def work(layout, r):
        total, calls = 0, 0
        for src in range(world):
            for q0, q1, k0, k1, wl, wr in cp._ring_tasks(layout, r, src, world, s_local, True, -1, -1):
                total += (q1 - q0) * (k1 - k0)
                calls += 1
        return total, calls

    zig = [work("zigzag", r)[0] for r in range(world)]
    assert len(set(zig)) == 1, zig
    assert [work("contiguous", r)[1] for r in range(world)] == [1, 2, 3, 4]


# ---- spawned ranks ---------------------------------------------------------------------------------
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, job, results):
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
        out = JOBS[job](rank, world)
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, "ok", out))
    except BaseException:  # reported to the parent, which fails the test with it
        results.put((rank, "error", traceback.format_exc()))


def spawn(world, job):
    """Runs JOBS[job] on `world` spawned ranks; returns their results in rank order. Fails if a
    rank raised or if any rank has not finished within JOIN_TIMEOUT_S (its process is killed)."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, job, results), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    got = {}
    try:
        while len(got) < world and time.monotonic() < deadline:
            try:
                rank, status, out = results.get(timeout=1.0)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    break  # a rank died without a report (it would be named below)
                continue
            got[rank] = (status, out)
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert not hung, f"ranks {hung} did not finish within {JOIN_TIMEOUT_S} s"
    assert len(got) == world, f"ranks {sorted(set(range(world)) - set(got))} exited without a result"
    errors = [f"rank {r}:\n{out}" for r, (status, out) in sorted(got.items()) if status != "ok"]
    assert not errors, "\n".join(errors)
    return [got[r][1] for r in range(world)]


# ---- correctness cases ----------------------------------------------------------------------------
def cases():
    """(mode, layout, causal, dtype, d, window, softcap): every combination of the main options, and
    windows and softcap in float32."""
    out = []
    for mode in ("ring", "all2all"):
        for layout in ("contiguous", "zigzag"):
            for causal in (False, True):
                for dtype in (torch.float32, torch.bfloat16):
                    for d in (64, 128):
                        out.append((mode, layout, causal, dtype, d, (-1, -1), 0.0))
            for causal, window, softcap in ((False, (13, 5), 0.0), (True, (20, -1), 0.0), (True, (-1, -1), 4.0)):
                out.append((mode, layout, causal, torch.float32, 64, window, softcap))
    return out


def heads(mode):
    # all2all needs H and Hkv divisible by every P tested (1 ... 4); both with GQA.
    return (4, 2) if mode == "ring" else (24, 12)


def inputs(case, index):
    """The full-sequence q, k, v, dout of a case: the same on every rank and in the parent."""
    mode, layout, causal, dtype, d, window, softcap = case
    H, hkv = heads(mode)
    B = 2 if mode == "ring" else 1
    gen = torch.Generator().manual_seed(SEED + 1000 * index)
    q, k, v, dout = (torch.randn(shape, generator=gen).to(dtype)
                     for shape in ((B, S, H, d), (B, S, hkv, d), (B, S, hkv, d), (B, S, H, d)))
    return q, k, v, dout


def _job_cases(rank, world):
    res = []
    for index, case in enumerate(cases()):
        mode, layout, causal, dtype, d, window, softcap = case
        q, k, v, dout = (cp.shard(t, None, layout) for t in inputs(case, index))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = cp.attention(q, k, v, mode=mode, layout=layout, causal=causal, window_size=window, softcap=softcap)
        out.backward(dout)
        arrays = [t.detach().double().numpy() for t in (out, q.grad, k.grad, v.grad)]
        if index < 2:
            arrays.append(cp.unshard(out.detach(), None, layout).double().numpy())
        res.append(arrays)
    return res


def _job_bad_inputs(rank, world):
    """Each call is bad on some ranks or all; every rank records what it raised."""
    def q_shape(r):
        return (1, 16 if r == 1 else 32, 4, 64)

    t = lambda shape, dtype=torch.float32: torch.randn(shape).to(dtype)  # noqa: E731
    good = (t((1, 32, 6, 64)), t((1, 32, 3, 64)), t((1, 32, 3, 64)))
    calls = {
        "shape differs": lambda: cp.attention(t(q_shape(rank)), t(q_shape(rank)), t(q_shape(rank))),
        "heads for all2all": lambda: cp.attention(t((1, 32, 4, 64)), t((1, 32, 2, 64)), t((1, 32, 2, 64)),
                                                  mode="all2all"),
        "varlen on one rank": lambda: cp.attention(*good, cu_seqlens_q=torch.tensor([0, 32], dtype=torch.int32)
                                                   if rank == 2 else None),
        "dtype differs": lambda: cp.attention(*(x.to(torch.bfloat16 if rank == 0 else torch.float32) for x in good)),
        "bad layout": lambda: cp.attention(*good, layout="striped"),
        "odd zigzag shard": lambda: cp.attention(t((1, 31, 4, 64)), t((1, 31, 2, 64)), t((1, 31, 2, 64))),
        "window on one rank": lambda: cp.attention(*good, window_size=(-2, 0) if rank == 1 else (-1, -1)),
        "requires_grad on one rank": lambda: cp.attention(*(x.clone().requires_grad_(rank == 0) for x in good)),
        "k shorter than q": lambda: cp.attention(good[0], good[1][:, :16], good[2][:, :16]),
        "shard of S=100": lambda: cp.shard(t((1, 100, 4, 64)), None, "zigzag"),
        "unshard shape differs": lambda: cp.unshard(t(q_shape(rank)), None, "contiguous"),
    }
    res = {}
    for name, call in calls.items():
        try:
            call()
            res[name] = None
        except Exception as e:  # recorded for the parent to compare across ranks
            res[name] = (type(e).__name__, str(e))
    # The group still works afterwards: a correct ring call with its backward.
    case = ("ring", "zigzag", True, torch.float32, 64, (-1, -1), 0.0)
    q, k, v, dout = (cp.shard(x, None, "zigzag") for x in inputs(case, 7))
    q.requires_grad_()
    out = cp.attention(q, k, v, causal=True)
    out.backward(dout)
    res["after"] = [out.detach().double().numpy(), q.grad.double().numpy()]
    # A group that is not the default one (global ranks 1 and 2): its ranks are peers by global rank.
    sub = dist.new_group([1, 2])
    if rank in (1, 2):
        for mode in ("ring", "all2all"):
            case = (mode, "zigzag", True, torch.float32, 64, (-1, -1), 0.0)
            q, k, v, dout = (cp.shard(x, sub, "zigzag") for x in inputs(case, 8))
            k.requires_grad_()
            out = cp.attention(q, k, v, sub, mode=mode, causal=True)
            out.backward(dout)
            res[mode, "subgroup"] = [out.detach().double().numpy(), k.grad.double().numpy()]
    return res


JOBS = {"cases": _job_cases, "bad_inputs": _job_bad_inputs}


@functools.lru_cache(maxsize=None)
def run_cases(world):
    return spawn(world, "cases")


@functools.lru_cache(maxsize=None)
def single_process(index):
    """(plain, float64) results of a case on the full sequence: out, dq, dk, dv each."""
    case = cases()[index]
    mode, layout, causal, dtype, d, window, softcap = case
    q, k, v, dout = inputs(case, index)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out = fat.attention(qg, kg, vg, causal=causal, window=window, softcap=softcap)
    out.backward(dout)
    plain = [t.detach().double().numpy() for t in (out, qg.grad, kg.grad, vg.grad)]
    n = [t.double().numpy() for t in (q, k, v, dout)]
    o64, _ = ref.forward(n[0], n[1], n[2], causal=causal, window=window, softcap=softcap)
    g64 = ref.backward(n[3], n[0], n[1], n[2], causal=causal, window=window, softcap=softcap)
    return plain, [o64] + list(g64)


def rel_err(got, want):
    return float(np.max(np.abs(got - want) / (1.0 + np.abs(want))))


def case_errors(world, index):
    """(context-parallel, single-process) errors against float64 for out, dq, dk, dv."""
    case = cases()[index]
    layout = case[1]
    per_rank = [res[index] for res in run_cases(world)]
    plain, exact = single_process(index)
    got = [assemble([r[i] for r in per_rank], layout, world) for i in range(4)]
    return [(rel_err(g, e), rel_err(p, e)) for g, p, e in zip(got, plain, exact)]


NAMES = ("out", "dq", "dk", "dv")


@pytest.mark.parametrize("world", [2, 3, 4])
def test_matches_single_process(world):
    failures = []
    for index, case in enumerate(cases()):
        dtype = case[3]
        for name, (err, err_plain) in zip(NAMES, case_errors(world, index)):
            tol = TOL[dtype] if name == "out" else GRAD_TOL[dtype]
            if not (err <= bound(err_plain, dtype, world) and err <= tol):
                failures.append(f"{case} {name}: error {err:.3g}, single process {err_plain:.3g}, tol {tol:g}")
    assert not failures, f"P={world}, FLASHATTN_TEST_SEED={SEED}:\n" + "\n".join(failures)


@pytest.mark.parametrize("world", [2, 4])
def test_unshard_inverts_shard(world):
    for index in range(2):
        layout = cases()[index][1]
        per_rank = run_cases(world)
        want = assemble([res[index][0] for res in per_rank], layout, world)
        for res in per_rank:
            np.testing.assert_array_equal(res[index][4], want)


def test_one_rank_is_the_single_process_result():
    """P = 1: one block computed in one call, the call single-process attention makes, so the same
    result bit for bit: the output in every dtype, the gradients in float32. (bf16 gradients differ:
    the ring's backward runs in fp32 with the fp32 O, single-process bf16 with its own bf16 O; their
    accuracy is compared in test_error_does_not_grow_with_p. A zigzag shard with a window is two
    chunks, computed as chunk pairs: those cases are there too.)"""
    res = run_cases(1)[0]
    for index, case in enumerate(cases()):
        if case[1] == "zigzag" and case[5] != (-1, -1):
            continue
        plain, _ = single_process(index)
        for name, got, want in zip(NAMES, res[index], plain):
            if name != "out" and case[3] != torch.float32:
                continue
            np.testing.assert_array_equal(got, want, err_msg=f"{cases()[index]} {name}")


def test_error_does_not_grow_with_p():
    """The same problems on P = 1 ... 4 ranks: the error against float64 at P ranks stays within
    the bound() of P = 1's error (which is the single-process error)."""
    failures = []
    for index, case in enumerate(cases()):
        base = [e for e, _ in case_errors(1, index)]
        for world in (2, 3, 4):
            for name, b, (err, _) in zip(NAMES, base, case_errors(world, index)):
                if err > bound(b, case[3], world):
                    failures.append(f"{case} {name}: P=1 {b:.3g}, P={world} {err:.3g}")
    assert not failures, f"FLASHATTN_TEST_SEED={SEED}:\n" + "\n".join(failures)


def test_bad_inputs_raise_on_every_rank_and_subgroups_work():
    world = 3
    res = spawn(world, "bad_inputs")
    expect = {"shape differs": ("ValueError", "q.shape differs"),
              "heads for all2all": ("ValueError", "divisible by the number of ranks"),
              "varlen on one rank": ("NotImplementedError", "rank 2 of 3: cu_seqlens"),
              "dtype differs": ("ValueError", "dtype differs"),
              "bad layout": ("ValueError", "layout"),
              "odd zigzag shard": ("ValueError", "odd local sequence length 31"),
              "window on one rank": ("ValueError", "rank 1 of 3"),
              "requires_grad on one rank": ("ValueError", "requires_grad differs"),
              "k shorter than q": ("ValueError", "same local sequence length"),
              "shard of S=100": ("ValueError", "S=100"),
              "unshard shape differs": ("ValueError", "x.shape differs")}
    for name, (kind, text) in expect.items():
        raised = [r[name] for r in res]
        assert all(x is not None for x in raised), (name, raised)
        assert len(set(raised)) == 1, (name, raised)  # the same error on every rank
        assert raised[0][0] == kind and text in raised[0][1], (name, raised[0])
    case = ("ring", "zigzag", True, torch.float32, 64, (-1, -1), 0.0)
    q, k, v, dout = inputs(case, 7)
    qg = q.clone().requires_grad_()
    out = fat.attention(qg, k, v, causal=True)
    out.backward(dout)
    got_out = assemble([r["after"][0] for r in res], "zigzag", world)
    got_dq = assemble([r["after"][1] for r in res], "zigzag", world)
    np.testing.assert_allclose(got_out, out.detach().double().numpy(), rtol=TOL[torch.float32],
                               atol=TOL[torch.float32])
    np.testing.assert_allclose(got_dq, qg.grad.double().numpy(), rtol=GRAD_TOL[torch.float32],
                               atol=GRAD_TOL[torch.float32])
    for mode in ("ring", "all2all"):
        case = (mode, "zigzag", True, torch.float32, 64, (-1, -1), 0.0)
        q, k, v, dout = inputs(case, 8)
        kg = k.clone().requires_grad_()
        out = fat.attention(q, kg, v, causal=True)
        out.backward(dout)
        assert all((mode, "subgroup") not in r for r in res[:1])
        got_out = assemble([r[mode, "subgroup"][0] for r in res[1:]], "zigzag", 2)
        got_dk = assemble([r[mode, "subgroup"][1] for r in res[1:]], "zigzag", 2)
        np.testing.assert_allclose(got_out, out.detach().double().numpy(), rtol=TOL[torch.float32],
                                   atol=TOL[torch.float32], err_msg=mode)
        np.testing.assert_allclose(got_dk, kg.grad.double().numpy(), rtol=GRAD_TOL[torch.float32],
                                   atol=GRAD_TOL[torch.float32], err_msg=mode)


def test_a_rank_that_never_calls_fails_the_spawn_instead_of_hanging():
    """The launcher itself: a rank stuck in a collective is killed at the join timeout and named."""
    global JOIN_TIMEOUT_S
    saved = JOIN_TIMEOUT_S
    JOIN_TIMEOUT_S = 15
    try:
        with pytest.raises(AssertionError, match="did not finish"):
            spawn(2, "stuck")
    finally:
        JOIN_TIMEOUT_S = saved


def _job_stuck(rank, world):
    if rank == 0:
        dist.all_reduce(torch.zeros(1))  # rank 1 never joins it
    else:
        time.sleep(600)


JOBS["stuck"] = _job_stuck


def test_shard_is_a_new_tensor():
    """shard() copies, for both layouts (a contiguous shard of a batch-1 tensor is a contiguous
    slice of it). It takes the rank and size from the default group: here a gloo group of this one
    process over an in-memory store."""
    store = dist.HashStore()
    group_ok = not dist.is_initialized()
    if group_ok:
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        x = torch.randn(1, 8, 2, 4)
        for layout in ("contiguous", "zigzag"):
            y = cp.shard(x, None, layout)
            assert y.is_contiguous() and y.data_ptr() != x.data_ptr()
            torch.testing.assert_close(y, x)
    finally:
        if group_ok:
            dist.destroy_process_group()


def test_module_is_reachable_from_flashattn_and_flashattn_torch():
    import flashattn

    assert flashattn.context_parallel is cp
    assert fat.context_parallel is cp
    assert flashattn.torch is fat
