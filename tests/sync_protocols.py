#!/usr/bin/env python3
"""Exhaustive interleaving check of the synchronization protocols between the warpgroups of the
Hopper kernels (src/cuda/sm90): the ping-pong turns of the forward (mainloop.cuh turn_begin /
turn_end, cta_begin / cta_end) together with its tile hand-off from the producer thread to the
consumers (scheduler.cuh TileHandoff, kernel_fwd.cuh), the backward's turns (kernel_bwd.cuh,
barriers 4/5) and its summed-dQ hand-off (barriers 6/7). No GPU needed; run by CTest.

Each warpgroup (and the forward's producer thread) is modelled as its sequence of operations:
  ('arrive', id) / ('sync', id)   named barrier, 256 threads = two warpgroup operations per phase;
                                  a `sync` blocks until the phase it joined completes.
  ('marrive', m) / ('mwait', m, parity)
                                  mbarrier with a fixed arrival count: a phase completes when that
                                  many arrivals are in; waiting on a parity passes once the phase of
                                  that parity has completed (a fresh barrier passes parity 1), as
                                  mbarrier.try_wait.parity does.
  ('write', slot, v) / ('read', slot, v)
                                  shared-memory data: a read must see the value the protocol means
                                  it to see (else the slot was overwritten or not yet written).
Every interleaving is explored. Errors: a named-barrier phase completed by two arrivals (nobody
was waiting: the protocol has slipped a turn, and on the GPU the warpgroups end up waiting on each
other), a deadlock, a wrong read, or named-barrier arrivals left over when the CTA ends. The
sequences below mirror the kernels' code: keep them in step when the protocols change.
"""
import itertools
import sys


def check(seqs, mbar_counts=None):
    n = len(seqs)
    mbar_counts = mbar_counts or {}
    start = (tuple(0 for _ in seqs), (), tuple(None for _ in seqs),
             tuple((m, 0, 0) for m in sorted(mbar_counts)), ())
    seen = {start}
    stack = [start]
    while stack:
        pos, counts, waiting, mbars, slots = stack.pop()
        # counts: sorted (barrier, arrivals, syncers) of named barriers with a phase in progress;
        # waiting: named barrier each process is blocked on (or None); mbars: (name, arrivals in the
        # current phase, phases completed); slots: sorted (slot, value).
        cdict = {b: (a, s) for b, a, s in counts}
        mdict = {m: (a, c) for m, a, c in mbars}
        sdict = dict(slots)
        if all(pos[i] == len(seqs[i]) for i in range(n)) and not any(w is not None for w in waiting):
            if any(a or s for a, s in cdict.values()):
                return f"leftover arrivals at end: {cdict}"
            continue
        progressed = False
        for i in range(n):
            if waiting[i] is not None or pos[i] == len(seqs[i]):
                continue
            op = seqs[i][pos[i]]
            npos = list(pos)
            npos[i] += 1
            nwait = list(waiting)
            nc, nm, ns = dict(cdict), dict(mdict), dict(sdict)
            kind = op[0]
            if kind in ("arrive", "sync"):
                b = op[1]
                a, s = cdict.get(b, (0, ()))
                if kind == "arrive":
                    a += 1
                else:
                    s = tuple(sorted(s + (i,)))
                    nwait[i] = b
                if a + len(s) == 2:  # phase completes
                    if len(s) == 0:
                        return f"barrier {b}: phase completed by two arrivals (process {i} at op {pos[i]})"
                    for j in s:
                        nwait[j] = None
                    nc[b] = (0, ())
                else:
                    nc[b] = (a, s)
            elif kind == "marrive":
                a, c = mdict[op[1]]
                nm[op[1]] = (0, c + 1) if a + 1 == mbar_counts[op[1]] else (a + 1, c)
            elif kind == "mwait":
                if mdict[op[1]][1] & 1 == op[2]:
                    continue  # the phase of that parity has not completed: blocked
            elif kind == "write":
                ns[op[1]] = op[2]
            elif kind == "read":
                if sdict.get(op[1]) != op[2]:
                    return f"process {i} at op {pos[i]}: slot {op[1]} holds {sdict.get(op[1])}, expected {op[2]}"
            progressed = True
            state = (tuple(npos), tuple(sorted((bb, aa, ss) for bb, (aa, ss) in nc.items() if aa or ss)),
                     tuple(nwait), tuple(sorted((m, a, c) for m, (a, c) in nm.items())), tuple(sorted(ns.items())))
            if state not in seen:
                seen.add(state)
                stack.append(state)
        if not progressed:
            return f"deadlock at positions {pos}, waiting {waiting}"
    return None


def backward_seq(g, tiles_steps, pingpong, sum_dq):
    ops = []
    total = sum(tiles_steps)
    if pingpong and g == 0 and total > 0:
        ops.append(("arrive", 4))
    it = 0
    last_tile = max((k for k, s in enumerate(tiles_steps) if s > 0), default=-1)
    for k, steps in enumerate(tiles_steps):
        for st in range(steps):
            last = k == last_tile and st == steps - 1
            if pingpong:
                ops += [("sync", 4 + g), ("arrive", 4 + (1 - g))]
                ops.append(("sync", 4 + g))
                if not (g == 1 and last):
                    ops.append(("arrive", 4 + (1 - g)))
            if sum_dq:
                if g == 0:
                    if it > 0:
                        ops.append(("sync", 7))
                    ops.append(("arrive", 6))
                else:
                    ops.append(("sync", 6))
                    if not last:
                        ops.append(("arrive", 7))
            it += 1
    return ops


SLOTS = 3  # TileHandoff::kSlots
TURN = 10  # first turn barrier id (any: the ids are only labels here)


def forward_producer(tiles_blocks, no_empty_wait=False):
    """The producer thread: TileHandoff::put of every tile, then the sentinel ('end')."""
    ops = []
    for k in range(len(tiles_blocks) + 1):
        s, ph = k % SLOTS, (k // SLOTS) & 1
        if not no_empty_wait:
            ops.append(("mwait", f"empty{s}", ph ^ 1))
        ops += [("write", s, k if k < len(tiles_blocks) else "end"), ("marrive", f"full{s}")]
    return ops


def forward_consumer(w, n_wgs, tiles_blocks, variant="ok"):
    """Consumer warpgroup w over its CTA's tiles (key blocks per tile, 0 = fully masked tile).

    Variants (deliberately broken, each must fail): 'no_absorb' (warpgroup 0 does not take the
    last hand-off after the sentinel), 'skip_last' (the old rule: the last warpgroup skips its
    hand-off after the CTA's last tile with keys, which also needs that tile known in advance),
    'early_release' (the slot freed after the first read, before the reread for the epilogue),
    'restart' (the first version: the rotation restarted at every tile)."""
    ops = []
    works = [k for k, nb in enumerate(tiles_blocks) if nb > 0]
    last_k = works[-1] if works else -1
    if w == 0 and variant != "restart":
        ops.append(("arrive", TURN + 0))  # cta_begin
    for k, nb in enumerate(tiles_blocks):
        s, ph = k % SLOTS, (k // SLOTS) & 1
        ops += [("mwait", f"full{s}", ph), ("read", s, k)]  # handoff.wait
        if variant == "early_release":
            ops.append(("marrive", f"empty{s}"))
        if nb > 0:
            if w == 0 and variant == "restart":
                ops.append(("arrive", TURN + 0))
            for turn in range(nb + 1):  # Consumer::run: n_blocks + 1 turns
                ops.append(("sync", TURN + w))
                final = turn == nb and w == n_wgs - 1
                if final and ((variant == "skip_last" and k == last_k) or variant == "restart"):
                    continue
                ops.append(("arrive", TURN + (w + 1) % n_wgs))
        ops.append(("read", s, k))  # handoff.reread_release
        if variant != "early_release":
            ops.append(("marrive", f"empty{s}"))
    k = len(tiles_blocks)
    ops += [("mwait", f"full{k % SLOTS}", (k // SLOTS) & 1), ("read", k % SLOTS, "end")]
    if w == 0 and variant not in ("no_absorb", "restart"):
        ops.append(("sync", TURN + 0))  # cta_end
    return ops


def forward_check(n_wgs, tiles, variant="ok", no_empty_wait=False):
    seqs = [forward_producer(tiles, no_empty_wait)] + [forward_consumer(w, n_wgs, tiles, variant)
                                                      for w in range(n_wgs)]
    counts = {}
    for s in range(SLOTS):
        counts[f"full{s}"] = 1
        counts[f"empty{s}"] = n_wgs  # one arrival per consumer warp on the GPU, per warpgroup here
    return check(seqs, counts)


def main():
    fails = 0
    # Backward: per CTA, the steps of each of its tiles (0 = a causal key tile no query sees).
    for tiles in [(1,), (2,), (3,), (1, 1), (2, 0, 1), (0, 2), (1, 2, 1), (0,)]:
        for pp, sd in itertools.product((False, True), repeat=2):
            err = check([backward_seq(g, tiles, pp, sd) for g in (0, 1)])
            print(f"backward tiles={tiles} pingpong={pp} sum_dq={sd}: {err or 'ok'}")
            fails += err is not None
    # Forward: per CTA, the key blocks of each of its tiles (any schedule: the producer hands
    # them over whether it computed or claimed them), 2 or 3 consumer warpgroups. The CTA never
    # knows in advance which tile is its last; the sentinel ends it.
    fwd_tiles = [(), (1,), (2,), (0,), (1, 1), (2, 0, 1), (0, 1, 2), (1, 0, 0), (1, 1, 1, 1), (0, 0, 0, 1),
                 (2, 1, 0, 1, 1)]  # 4+ tiles: the 3-slot ring wraps
    for n_wgs in (2, 3):
        for tiles in fwd_tiles:
            err = forward_check(n_wgs, tiles)
            print(f"forward wgs={n_wgs} tiles={tiles}: {err or 'ok'}")
            fails += err is not None
    # The broken variants must be caught wherever they can go wrong.
    broken = [
        ("no_absorb", {}, lambda t: True),                              # leftover arrival
        ("skip_last", {}, lambda t: any(t)),                            # warpgroup 0 waits forever
        ("restart", {}, lambda t: len([b for b in t if b > 0]) > 1),   # a turn slips
        ("early_release", {}, lambda t: len(t) >= SLOTS - 1),          # slot overwritten before the reread
        ("ok", {"no_empty_wait": True}, lambda t: len(t) >= SLOTS),    # producer laps the ring
    ]
    for variant, kw, must_fail in broken:
        for tiles in [(1,), (2, 0, 1), (1, 1, 1, 1), (0, 0, 0, 1)]:
            err = forward_check(2, tiles, variant, **kw)
            tag = variant + (" producer without empty wait" if kw else "")
            print(f"forward broken '{tag}' tiles={tiles}: {err or 'no error found'}")
            if must_fail(tiles):
                fails += err is None
    print("failures:", fails)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
