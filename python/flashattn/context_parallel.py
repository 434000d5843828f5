"""Context-parallel attention over torch.distributed: each rank of a process group holds a shard of
the sequence and gets its shard of the exact attention output (and, through autograd, of the
gradients).

    from flashattn import context_parallel as cp       # also flashattn.torch.context_parallel
    q_loc, k_loc, v_loc = (cp.shard(t, group, "zigzag") for t in (q, k, v))   # (B, S/P, H, d)
    out_loc = cp.attention(q_loc, k_loc, v_loc, group, mode="ring", layout="zigzag", causal=True)
    out = cp.unshard(out_loc, group, "zigzag")                                # (B, S, H, d)

Two modes, on any torch.distributed backend (gloo between CPU processes, NCCL between GPUs):

- ``mode="ring"``: the K/V shards travel around the ring of ranks (``batch_isend_irecv``: the next
  block is sent and received while the current one is computed). Each step's partial (out, LSE),
  from ``torch.ops.flashattn.forward``, is merged into an fp32 accumulator; blocks that the causal
  mask or the window hides entirely are skipped. The backward recomputes every block with
  ``torch.ops.flashattn.backward`` given the global out and LSE, so the blocks' dQ, dK, dV partials
  sum to the exact gradients; dQ is summed locally in fp32 and the dK/dV accumulators travel the
  ring in fp32 back to their owners.
- ``mode="all2all"`` (Ulysses): an all-to-all turns the sequence shards into head shards, each rank
  runs ``flashattn.torch.attention`` over the whole sequence for H/P query heads and Hkv/P KV
  heads, and a second all-to-all turns the result back into sequence shards.

Layouts (how the global sequence of S tokens is cut over P ranks): ``"contiguous"`` (rank r holds
tokens [r·S/P, (r+1)·S/P)) and ``"zigzag"`` (2P chunks of S/2P tokens; rank r holds chunk r followed
by chunk 2P-1-r, which gives every rank the same causal work). docs/python.md has the details.
"""
from __future__ import annotations

import math
import struct
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import _checks
from . import torch as _fa_torch  # noqa: F401  (registers torch.ops.flashattn.*)

__all__ = ["attention", "shard", "unshard", "LAYOUTS", "MODES"]

LAYOUTS = ("contiguous", "zigzag")
MODES = ("ring", "all2all")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INF = 1 << 62  # an unbounded window side, as a number of tokens
_TAG_KV, _TAG_DKV = 11, 12


# ---- groups and layouts ------------------------------------------------------------------------------
def _group_rank_size(group) -> Tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def _global_rank(group, group_rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


def _comm_device(group, like: Optional[Tensor]) -> torch.device:
    """Where the small metadata tensors live: the GPU for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        if isinstance(like, Tensor) and like.is_cuda:
            return like.device
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_layout(layout) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")


def _chunks(layout: str, world: int) -> int:
    """The number of equal chunks the layout cuts the global sequence into."""
    return 2 * world if layout == "zigzag" else world


def _rank_chunks(layout: str, rank: int, world: int) -> List[int]:
    """The global chunk indices rank `rank` holds, in its local order."""
    return [rank, 2 * world - 1 - rank] if layout == "zigzag" else [rank]


def _segments(layout: str, rank: int, world: int, s_local: int) -> List[Tuple[int, int, int]]:
    """(local start, global start, length) of each run of consecutive global tokens on `rank`."""
    ids = _rank_chunks(layout, rank, world)
    n = s_local // len(ids)
    return [(i * n, c * n, n) for i, c in enumerate(ids)]


def shard(x: Tensor, group=None, layout: str = "zigzag", seq_dim: int = 1) -> Tensor:
    """This rank's shard of the full-sequence tensor x (every rank passes the same x), as a new
    contiguous tensor: S / P tokens along seq_dim, in the layout's local order. No communication.
    ValueError if the sequence length is not divisible by P (contiguous) or 2P (zigzag)."""
    _check_layout(layout)
    rank, world = _group_rank_size(group)
    seq_dim = seq_dim % x.dim()
    S, parts = x.shape[seq_dim], _chunks(layout, world)
    if S % parts:
        raise ValueError(f"seq_dim: the sequence length S={S} is not divisible by {parts} "
                         f"(layout {layout!r} over {world} ranks cuts it into {parts} chunks)")
    n = S // parts
    pieces = [x.narrow(seq_dim, c * n, n) for c in _rank_chunks(layout, rank, world)]
    if len(pieces) > 1:
        return torch.cat(pieces, dim=seq_dim)
    return pieces[0].clone(memory_format=torch.contiguous_format)  # never a view of x


def _natural_order(layout: str, world: int, x: Tensor, seq_dim: int) -> Tensor:
    """x (the rank shards concatenated in rank order along seq_dim) in global token order."""
    if layout == "contiguous":
        return x
    order = [c for r in range(world) for c in _rank_chunks(layout, r, world)]  # chunk at each position
    where = [order.index(c) for c in range(2 * world)]
    n = x.shape[seq_dim] // (2 * world)
    shape = list(x.shape)
    xs = x.reshape(shape[:seq_dim] + [2 * world, n] + shape[seq_dim + 1:])
    xs = xs.index_select(seq_dim, torch.tensor(where, device=x.device))
    return xs.reshape(shape)


def _layout_order(layout: str, world: int, x: Tensor, seq_dim: int) -> Tensor:
    """The inverse of _natural_order: x in global order -> the rank shards concatenated."""
    if layout == "contiguous":
        return x
    order = [c for r in range(world) for c in _rank_chunks(layout, r, world)]
    n = x.shape[seq_dim] // (2 * world)
    shape = list(x.shape)
    xs = x.reshape(shape[:seq_dim] + [2 * world, n] + shape[seq_dim + 1:])
    xs = xs.index_select(seq_dim, torch.tensor(order, device=x.device))
    return xs.reshape(shape)


def unshard(x: Tensor, group=None, layout: str = "zigzag", seq_dim: int = 1) -> Tensor:
    """The full-sequence tensor from every rank's shard x (an all_gather), in global token order;
    the inverse of shard(). Shapes, dtypes and layouts are checked across ranks first (every rank
    raises the same ValueError). Not differentiable."""
    bad = None
    try:
        _check_layout(layout)
        if not isinstance(x, Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        seq_dim = seq_dim % x.dim()
        if layout == "zigzag" and x.shape[seq_dim] % 2:
            raise ValueError(f"x: a zigzag shard holds two equal chunks, got an odd length "
                             f"{x.shape[seq_dim]} along seq_dim")
    except (TypeError, ValueError) as e:
        bad = e
    rank, world = _group_rank_size(group)
    if bad is None:
        fields = [x.dim(), seq_dim, _DTYPE_CODES.get(x.dtype, 99), LAYOUTS.index(layout)] + list(x.shape)
    else:
        fields = []
    _agree(group, "unshard", bad, [("dims", 1), ("seq_dim", 1), ("dtype", 1), ("layout", 1),
                                   ("x.shape", len(fields) - 4)], fields, x)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return _natural_order(layout, world, torch.cat(parts, dim=seq_dim), seq_dim)


# ---- agreement across ranks before any other communication ---------------------------------------
_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}
_META_LEN = 32


def _f64_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _agree(group, what: str, local_error: Optional[BaseException], names, fields, like) -> List[List[int]]:
    """One all_gather of a small int64 metadata tensor: [error flag, fields...]. If any rank found
    its arguments bad, the messages are gathered and every rank raises the first bad rank's error;
    else, if the fields differ across ranks, every rank raises the same ValueError naming the first
    field that differs. Returns every rank's fields."""
    _, world = _group_rank_size(group)
    dev = _comm_device(group, like)
    if len(fields) + 1 > _META_LEN:
        raise AssertionError("metadata too long")
    meta = torch.zeros(_META_LEN, dtype=torch.int64)
    meta[0] = 1 if local_error is not None else 0
    if local_error is None:
        meta[1:1 + len(fields)] = torch.tensor(fields, dtype=torch.int64)
    meta = meta.to(dev)
    gathered = [torch.empty_like(meta) for _ in range(world)]
    dist.all_gather(gathered, meta, group=group)
    rows = [g.cpu().tolist() for g in gathered]
    if any(row[0] for row in rows):
        report = (type(local_error).__name__, str(local_error)) if local_error is not None else None
        reports = [None] * world
        dist.all_gather_object(reports, report, group=group)
        first = next(i for i, rep in enumerate(reports) if rep is not None)
        kind, msg = reports[first]
        exc = {"TypeError": TypeError, "NotImplementedError": NotImplementedError}.get(kind, ValueError)
        raise exc(f"{what}: rank {first} of {world}: {msg}")
    rows = [row[1:1 + len(fields)] for row in rows]
    pos = 0
    for name, width in names:
        values = [tuple(row[pos:pos + width]) for row in rows]
        if len(set(values)) > 1:
            shown = [v[0] if width == 1 else v for v in values]
            raise ValueError(f"{what}: {name} differs across the {world} ranks: {shown} (rank order)")
        pos += width
    return rows


# ---- ring blocks -------------------------------------------------------------------------------------
def _pair_task(qs: int, ks: int, n: int, lo: int, hi: int):
    """The part of a (q segment, k segment) pair of n tokens each that some query sees, where query
    i sees key j iff lo <= j - i <= hi (local indices; the shift between the segments' global
    starts is already in lo and hi). Returns None (nothing visible) or (q0, q1, k0, k1, window_left,
    window_right): a square block whose band is expressed in the library's (bottom-right =
    top-left, Nq == Nk) alignment with windows >= 0 or -1 (unbounded)."""
    if hi < -(n - 1) or lo > n - 1 or lo > hi:
        return None
    if hi < 0:  # only the rows below the diagonal by -hi or more see keys: shift the block
        m = -hi
        q0, q1, k0, k1 = qs + m, qs + n, ks, ks + n - m
        wl, wr = (-(lo + m) if lo > -_INF else -1), 0
    elif lo > 0:  # only the keys right of the diagonal by lo or more are seen
        m = lo
        q0, q1, k0, k1 = qs, qs + n - m, ks + m, ks + n
        wl, wr = 0, (hi - m if hi < _INF else -1)
    else:
        q0, q1, k0, k1 = qs, qs + n, ks, ks + n
        wl, wr = (-lo if lo > -_INF else -1), (hi if hi < _INF else -1)
    side = q1 - q0
    wl = -1 if wl >= side - 1 else wl
    wr = -1 if wr >= side - 1 else wr
    return (q0, q1, k0, k1, wl, wr)


def _ring_tasks(layout: str, rank: int, src: int, world: int, s_local: int, causal: bool,
                window_left: int, window_right: int):
    """The attention calls for this rank's queries against rank src's keys: a list of
    (q0, q1, k0, k1, window_left, window_right) in local token indices, fully masked parts left out,
    adjacent full pairs joined into one call."""
    wr = 0 if causal else window_right
    qsegs = _segments(layout, rank, world, s_local)
    ksegs = _segments(layout, src, world, s_local)
    pairs = {}
    for a, (ql, qg, n) in enumerate(qsegs):
        for b, (kl, kg, _) in enumerate(ksegs):
            delta = qg - kg
            lo = delta - window_left if window_left >= 0 else -_INF
            hi = delta + wr if wr >= 0 else _INF
            pairs[a, b] = _pair_task(ql, kl, n, lo, hi)
    full = {ab: t is not None and t[4] == -1 and t[5] == -1 and t[1] - t[0] == qsegs[ab[0]][2]
            for ab, t in pairs.items()}
    nq, nk = len(qsegs), len(ksegs)
    if all(full.values()):
        return [(0, s_local, 0, s_local, -1, -1)]
    if src == rank and causal and window_left < 0:
        # The local order is the global order restricted to this rank: plain causal on the block.
        return [(0, s_local, 0, s_local, -1, 0)]
    tasks = []
    if all(all(full[a, b] for a in range(nq)) or all(pairs[a, b] is None for a in range(nq))
           for b in range(nk)):
        for b, (kl, _, n) in enumerate(ksegs):
            if full[0, b]:
                tasks.append((0, s_local, kl, kl + n, -1, -1))
        return tasks
    if all(all(full[a, b] for b in range(nk)) or all(pairs[a, b] is None for b in range(nk))
           for a in range(nq)):
        for a, (ql, _, n) in enumerate(qsegs):
            if full[a, 0]:
                tasks.append((ql, ql + n, 0, s_local, -1, -1))
        return tasks
    return [t for t in pairs.values() if t is not None]


def _exchange(send: Tensor, recv: Tensor, group, nxt: int, prv: int, tag: int):
    ops = [dist.P2POp(dist.isend, send, nxt, group, tag), dist.P2POp(dist.irecv, recv, prv, group, tag)]
    return dist.batch_isend_irecv(ops)


def _wait(reqs) -> None:
    for req in reqs or ():
        req.wait()


def _merge(acc: Tensor, acc_lse: Tensor, q0: int, q1: int, out: Tensor, lse: Tensor) -> None:
    """acc[:, q0:q1], acc_lse[..., q0:q1] <- the LSE merge with a partial (out, lse):
    new = logaddexp(lse_a, lse_b), acc = exp(lse_a - new)·acc + exp(lse_b - new)·out; rows where
    both LSEs are -inf (no key seen yet) stay 0 with LSE -inf."""
    lse_a = acc_lse[:, :, q0:q1]
    new = torch.logaddexp(lse_a, lse)
    base = new.masked_fill(new == -math.inf, 0.0)
    wa = torch.exp(lse_a - base).transpose(1, 2).unsqueeze(-1)
    wb = torch.exp(lse - base).transpose(1, 2).unsqueeze(-1)
    part = acc[:, q0:q1]
    part.mul_(wa).add_(out.float() * wb)
    acc_lse[:, :, q0:q1] = new


def _work_dtype(q: Tensor) -> torch.dtype:
    """The dtype the ring's blocks are computed in. On the CPU, float32 (16-bit inputs are widened
    exactly), so that every block's partial out, dQ, dK and dV reach the fp32 accumulators unrounded:
    rounded to 16 bits once per block they would add up to one more rounding of the result than
    single-process attention has. On CUDA the input dtype (its flash kernels are 16-bit only)."""
    return torch.float32 if q.device.type == "cpu" else q.dtype


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, layout, causal, scale, window_left, window_right, softcap):
        rank, world = _group_rank_size(group)
        nxt, prv = _global_rank(group, (rank + 1) % world), _global_rank(group, (rank - 1) % world)
        B, S, H, d = q.shape
        acc = torch.zeros((B, S, H, d), dtype=torch.float32, device=q.device)
        acc_lse = torch.full((B, H, S), -math.inf, dtype=torch.float32, device=q.device)
        work = _work_dtype(q)
        qw = q.to(work)
        kv = torch.stack((k, v))
        buf = torch.empty_like(kv)
        for step in range(world):
            src = (rank - step) % world
            reqs = _exchange(kv, buf, group, nxt, prv, _TAG_KV) if step < world - 1 else None
            for q0, q1, k0, k1, wl, wr in _ring_tasks(layout, rank, src, world, S, causal, window_left,
                                                      window_right):
                o, l = torch.ops.flashattn.forward(qw[:, q0:q1], kv[0, :, k0:k1].to(work),
                                                   kv[1, :, k0:k1].to(work), scale, False, wl, wr, softcap,
                                                   None, None, 0, 0, "flash", False, None)
                _merge(acc, acc_lse, q0, q1, o, l)
            if reqs is not None:
                _wait(reqs)
                kv, buf = buf, kv
        out = acc.to(q.dtype)
        # The backward's D = rowsum(dO ∘ O) takes the fp32 accumulator, not the output rounded to
        # q's dtype: on the CPU the blocks run in fp32 and would otherwise carry O's 16-bit rounding.
        ctx.save_for_backward(q, k, v, acc, acc_lse)
        ctx.args = (group, layout, causal, scale, window_left, window_right, softcap)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, layout, causal, scale, window_left, window_right, softcap = ctx.args
        rank, world = _group_rank_size(group)
        nxt, prv = _global_rank(group, (rank + 1) % world), _global_rank(group, (rank - 1) % world)
        S = q.shape[1]
        work = _work_dtype(q)
        qw, out, dout = q.to(work), out.to(work), dout.to(q.dtype).to(work)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack((k, v))
        buf = torch.empty_like(kv)
        dkv_recv, dkv_reqs = None, None
        for step in range(world):
            src = (rank - step) % world
            kv_reqs = _exchange(kv, buf, group, nxt, prv, _TAG_KV) if step < world - 1 else None
            part = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)  # this block's dK, dV
            for q0, q1, k0, k1, wl, wr in _ring_tasks(layout, rank, src, world, S, causal, window_left,
                                                      window_right):
                gq, gk, gv = torch.ops.flashattn.backward(
                    dout[:, q0:q1], qw[:, q0:q1], kv[0, :, k0:k1].to(work), kv[1, :, k0:k1].to(work),
                    out[:, q0:q1], lse[:, :, q0:q1], scale, False, wl, wr, softcap, None, None, 0, 0, "flash",
                    False, None)
                dq[:, q0:q1] += gq
                part[0, :, k0:k1] += gk
                part[1, :, k0:k1] += gv
            if dkv_reqs is not None:
                _wait(dkv_reqs)
                part += dkv_recv  # what the ranks before this one added to this block
            if world > 1:
                dkv_recv = torch.empty_like(part)
                dkv_send = part
                dkv_reqs = _exchange(dkv_send, dkv_recv, group, nxt, prv, _TAG_DKV)
            else:
                dkv_recv = part
            if kv_reqs is not None:
                _wait(kv_reqs)
                kv, buf = buf, kv
        _wait(dkv_reqs)  # the last send hands each block's sum to its owner
        return (dq.to(q.dtype), dkv_recv[0].to(k.dtype), dkv_recv[1].to(v.dtype)) + (None,) * 7


# ---- all-to-all (Ulysses) ------------------------------------------------------------------------------
def _seq_to_head(x: Tensor, group, world: int) -> Tensor:
    """(B, S/P, H, d) sequence shards -> (B, S, H/P, d) head shards, the rank shards concatenated
    in rank order along the sequence."""
    B, s, H, d = x.shape
    send = x.reshape(B, s, world, H // world, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 0, 2, 3, 4).reshape(B, world * s, H // world, d)


def _head_to_seq(y: Tensor, group, world: int) -> Tensor:
    """The inverse of _seq_to_head: (B, S, H/P, d) -> (B, S/P, H, d)."""
    B, S, h, d = y.shape
    send = y.reshape(B, world, S // world, h, d).permute(1, 0, 2, 3, 4).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(B, S // world, world * h, d)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, world, to_heads):
        ctx.args = (group, world, to_heads)
        return (_seq_to_head if to_heads else _head_to_seq)(x, group, world)

    @staticmethod
    def backward(ctx, g):
        group, world, to_heads = ctx.args
        return (_head_to_seq if to_heads else _seq_to_head)(g.contiguous(), group, world), None, None, None


def _ulysses(q, k, v, group, layout, causal, scale, window, softcap):
    _, world = _group_rank_size(group)
    full = [_natural_order(layout, world, _AllToAll.apply(t, group, world, True), 1) for t in (q, k, v)]
    out = _fa_torch.attention(*full, causal=causal, scale=scale, window=window, softcap=softcap)
    return _AllToAll.apply(_layout_order(layout, world, out, 1).contiguous(), group, world, False)


# ---- the public function -------------------------------------------------------------------------------
def _local_checks(q, k, v, mode, layout, causal, softmax_scale, window_size, softcap, varlen):
    """What one rank can check alone: returns the scalars the core takes."""
    if varlen:
        raise NotImplementedError("cu_seqlens_q/cu_seqlens_k: variable-length batches are not supported "
                                  "by context-parallel attention")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected 4 dimensions (batch, seqlen_local, heads, head_dim), "
                             f"got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: expected dtype float32, float16 or bfloat16, got {t.dtype}")
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    _check_layout(layout)
    scale = _checks.scale_value(softmax_scale, "softmax_scale")
    wl, wr = _checks.window_pair(window_size, "window_size")
    # The core's own checks (dtypes, devices, heads, head_dim, window and softcap ranges) on one
    # token of the shards: an error here is raised on every rank before any communication.
    n = min(1, q.shape[1], k.shape[1])
    _fa_torch.attention(q[:, :n].detach(), k[:, :n].detach(), v[:, :n].detach(), causal=causal,
                        scale=softmax_scale, window=(wl, wr), softcap=softcap)
    return scale, wl, wr


def attention(q: Tensor, k: Tensor, v: Tensor, group=None, *, mode: str = "ring", layout: str = "zigzag",
              causal: bool = False, softmax_scale: Optional[float] = None,
              window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
              cu_seqlens_q=None, cu_seqlens_k=None) -> Tensor:
    """Exact attention over a sequence sharded across the ranks of `group` (None: the default group).

    q (B, S/P, H, d), k and v (B, S/P, Hkv, d): this rank's shard in `layout` ("zigzag" or
    "contiguous"; see shard()). Returns this rank's shard of the output (B, S/P, H, d), equal to the
    same shard of flashattn.torch.attention on the full sequence up to rounding; differentiable
    (each rank's backward gives its shard's gradients; every rank must run the backward).
    causal, window_size (left, right; -1 unbounded) and softcap are those of the global sequence:
    query at global position i sees keys j with i - left <= j <= i (+ right), as in
    flashattn.torch.attention with S queries and S keys. softmax_scale None = 1/sqrt(d).
    mode "ring" or "all2all" (H and Hkv divisible by P). cu_seqlens_* (varlen) raise
    NotImplementedError.

    Before any other communication the ranks exchange their arguments' metadata in one all_gather:
    a bad argument on any rank, or shapes, dtypes and options that differ across ranks, raise the
    same error on every rank (ValueError, TypeError or NotImplementedError naming it).
    """
    bad, scale, wl, wr = None, 0.0, -1, -1
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    try:
        scale, wl, wr = _local_checks(q, k, v, mode, layout, causal, softmax_scale, window_size, softcap, varlen)
    except (TypeError, ValueError, NotImplementedError) as e:
        bad = e
    rank, world = _group_rank_size(group)
    grad = torch.is_grad_enabled() and bad is None and any(t.requires_grad for t in (q, k, v))
    names = [("q.shape", 4), ("k.shape", 4), ("v.shape", 4), ("dtype", 1), ("device type", 1),
             ("mode", 1), ("layout", 1), ("causal", 1), ("window_size", 2), ("softmax_scale", 1),
             ("softcap", 1), ("requires_grad", 1)]
    fields = []
    if bad is None:
        fields = (list(q.shape) + list(k.shape) + list(v.shape) +
                  [_DTYPE_CODES[q.dtype], 1 if q.is_cuda else 0, MODES.index(mode), LAYOUTS.index(layout),
                   int(bool(causal)), wl, wr, _f64_bits(scale), _f64_bits(softcap), int(grad)])
    _agree(group, "context_parallel.attention", bad, names, fields, q if isinstance(q, Tensor) else None)

    # Every rank holds the same values from here on: the checks below raise on all of them.
    B, s, H, d = q.shape
    hkv = k.shape[2]
    where = "context_parallel.attention"
    if s != k.shape[1] or s != v.shape[1]:
        raise ValueError(f"{where}: k, v: expected the same local sequence length as q ({s}), got "
                         f"{k.shape[1]} and {v.shape[1]}")
    if layout == "zigzag" and s % 2:
        raise ValueError(f"{where}: q: a zigzag shard holds two equal chunks, got an odd local sequence "
                         f"length {s} (the global length {s * world} must be divisible by 2P = {2 * world})")
    if mode == "all2all" and (H % world or hkv % world):
        raise ValueError(f"{where}: mode='all2all' needs the query heads ({H}) and the KV heads ({hkv}) "
                         f"divisible by the number of ranks ({world})")
    if mode == "all2all":
        return _ulysses(q, k, v, group, layout, causal, softmax_scale, (wl, wr), softcap)
    return _Ring.apply(q, k, v, group, layout, bool(causal), scale, wl, wr, float(softcap))
