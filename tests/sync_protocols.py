#!/usr/bin/env python3
"""Exhaustive interleaving check of the named-barrier protocols between the consumer warpgroups of
the Hopper kernels (src/cuda/sm90): the ping-pong turns of the forward (mainloop.cuh turn_begin /
turn_end, kernel_fwd.cuh). No GPU needed; run by CTest. (The backward kernels' consumer warpgroups
only meet at barriers both sync on, once or twice per step — nothing that can slip a turn; the
retired 64-query d64 backward step had ping-pong turns and a summed-dQ hand-off modelled here.)

Each warpgroup is modelled as its sequence of ('arrive', id) / ('sync', id) operations (128
threads each, bar.arrive / bar.sync with 256 threads). A barrier phase completes when two
warpgroup-operations have reached it; a `sync` blocks until the phase it joined completes. Every
interleaving is explored. Errors: a phase completed by two arrivals (nobody was waiting: the
protocol has slipped a turn, and on the GPU the warpgroups end up waiting on each other), a
deadlock, or arrivals left over when the CTA ends. The sequences below mirror the kernels' code:
keep them in step when the protocols change.
"""
import sys
from functools import lru_cache


def check(seqs):
    n = len(seqs)

    @lru_cache(maxsize=None)
    def explore(pos, counts, waiting):
        # pos: tuple of op index per WG; counts: tuple of (barrier, arrivals, syncers) sorted;
        # waiting: tuple of barrier id each WG is blocked on (or None)
        cdict = {b: (a, s) for b, a, s in counts}
        progressed = False
        if all(pos[i] == len(seqs[i]) for i in range(n)) and not any(w is not None for w in waiting):
            if any(a or s for a, s in cdict.values()):
                return f"leftover arrivals at end: {cdict}"
            return None
        for i in range(n):
            if waiting[i] is not None or pos[i] == len(seqs[i]):
                continue
            op, b = seqs[i][pos[i]]
            a, s = cdict.get(b, (0, ()))
            npos = list(pos)
            npos[i] += 1
            nwait = list(waiting)
            nc = dict(cdict)
            if op == "arrive":
                a += 1
            else:
                s = tuple(sorted(s + (i,)))
                nwait[i] = b
            if a + len(s) == 2:  # phase completes
                if len(s) == 0:
                    return f"barrier {b}: phase completed by two arrivals (WG {i} at op {pos[i]})"
                for j in s:
                    nwait[j] = None
                nc[b] = (0, ())
            else:
                nc[b] = (a, s)
            progressed = True
            key = tuple(sorted((bb, aa, ss) for bb, (aa, ss) in nc.items() if aa or ss))
            err = explore(tuple(npos), key, tuple(nwait))
            if err:
                return err
        if not progressed:
            return f"deadlock at positions {pos}, waiting {waiting}"
        return None

    return explore(tuple(0 for _ in seqs), (), tuple(None for _ in seqs))


def forward_seq(w, n_wgs, tiles_blocks, per_tile_restart=False):
    ops = []
    works = [k for k, nb in enumerate(tiles_blocks) if nb > 0]
    first, last_k = (works[0], works[-1]) if works else (-1, -1)
    base = 10
    for k, nb in enumerate(tiles_blocks):
        if nb == 0:
            continue
        if w == 0 and (k == first or per_tile_restart):
            ops.append(("arrive", base + 0))
        for turn in range(nb + 1):
            ops.append(("sync", base + w))
            final = turn == nb and (k == last_k or per_tile_restart)
            if not (final and w == n_wgs - 1):
                ops.append(("arrive", base + (w + 1) % n_wgs))
    return ops


def main():
    fails = 0
    # Forward: per CTA, the key blocks of each of its tiles, 2 or 3 consumer warpgroups. The
    # rotation restarted at every tile (the first version) must be caught slipping.
    for n_wgs in (2, 3):
        for tiles in [(1,), (2,), (1, 1), (2, 0, 1), (0, 1, 2)]:
            for restart in (False, True):
                err = check([forward_seq(w, n_wgs, tiles, restart) for w in range(n_wgs)])
                tag = "per-tile restart (old)" if restart else "whole-CTA rotation"
                print(f"forward wgs={n_wgs} tiles={tiles} {tag}: {err or 'ok'}")
                if not restart:
                    fails += err is not None
                elif len([b for b in tiles if b > 0]) > 1:
                    fails += err is None  # the model must see the old protocol's slip
    print("failures:", fails)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
