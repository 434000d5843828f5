#!/usr/bin/env python3
"""Exhaustive interleaving check of the Hopper forward's sQ hand-off (src/cuda/sm90/mainloop.cuh,
producer_tile and Consumer::run; kernel_fwd.cuh): the producer thread and the consumer warpgroups
pass the one Q buffer through two mbarriers over a CTA's tiles, some of which have no key tile
(varlen tiles past their sequence, fully masked query blocks, the paired schedules' virtual tiles).
No GPU needed; run by CTest.

mbarrier model (PTX ISA, mbarrier): a phase completes when its expected number of arrivals has
arrived; then the phase number goes up by one. try_wait.parity(P) passes while the current phase's
parity differs from P — i.e. "the last phase of parity P has completed" — so a waiter that falls two
phases behind sees the parity it started from and blocks until a phase that may never come.
full_q expects 1 arrival (the producer's arrive.expect_tx; the TMA bytes are a delay, which the
interleavings cover), empty_q one per consumer warpgroup.

Checked over every interleaving, for each pattern of tiles with and without keys:
  - no deadlock (every party finishes);
  - the producer writes sQ for tile k (a Q load) only after every consumer released tile k − 1;
  - a consumer reads tile k's sQ (its full_q wait for a tile with keys passes) only after the
    producer's load of tile k.
The protocol before session 10 (a tile without keys: the producer waited on empty_q and loaded nothing, its
consumers released sQ without waiting) must be found to deadlock here; the current one (the producer
also arrives on full_q for such a tile, its consumers wait for that first) must pass.
"""
import itertools
import sys
from functools import lru_cache

FULL, EMPTY = 0, 1


def producer_ops(tiles, fixed):
    ops = []
    for k, keys in enumerate(tiles):
        ops.append(("wait", EMPTY, (k & 1) ^ 1, k))  # the previous tile's release (fresh: passes)
        if keys:
            ops.append(("load", FULL, None, k))      # arrive.expect_tx + the Q load into sQ
        elif fixed:
            ops.append(("arrive", FULL, None, k))    # no bytes: lets the consumers go on
    return ops


def consumer_ops(tiles, fixed):
    ops, q = [], 0
    for k, keys in enumerate(tiles):
        if keys or fixed:
            ops.append(("read" if keys else "wait", FULL, q & 1, k))
            q += 1
        ops.append(("arrive", EMPTY, None, k))       # release (after the last Q·Kᵀ or the epilogue)
    return ops


def check(tiles, n_consumers, fixed):
    expected = {FULL: 1, EMPTY: n_consumers}
    parties = [producer_ops(tiles, fixed)] + [consumer_ops(tiles, fixed) for _ in range(n_consumers)]

    def released(pos, c):  # releases consumer c has done
        return sum(1 for op in parties[c][:pos[c]] if op[0] == "arrive" and op[1] == EMPTY)

    def loaded(pos):
        return sum(1 for op in parties[0][:pos[0]] if op[0] == "load")

    @lru_cache(maxsize=None)
    def explore(pos, phase, pending):
        if all(pos[i] == len(parties[i]) for i in range(len(parties))):
            return None
        moved = False
        for i, ops in enumerate(parties):
            if pos[i] == len(ops):
                continue
            kind, bar, parity, k = ops[pos[i]]
            ph, pe = list(phase), list(pending)
            if kind in ("wait", "read"):
                if (phase[bar] & 1) == parity:
                    continue  # blocked
                if kind == "read" and loaded(pos) < sum(1 for t in tiles[:k + 1] if t):
                    return f"consumer {i} reads sQ of tile {k} before its load"
            else:  # arrive / load
                if kind == "load":
                    for c in range(1, len(parties)):
                        if released(pos, c) < k:
                            return f"the producer loads tile {k}'s Q while consumer {c} holds tile {released(pos, c)}"
                pe[bar] += 1
                if pe[bar] == expected[bar]:
                    pe[bar] = 0
                    ph[bar] += 1
            moved = True
            npos = list(pos)
            npos[i] += 1
            err = explore(tuple(npos), tuple(ph), tuple(pe))
            if err:
                return err
        if not moved:
            return f"deadlock at {pos} (phases full {phase[FULL]}, empty {phase[EMPTY]})"
        return None

    return explore(tuple(0 for _ in parties), (0, 0), (0, 0))


def main():
    patterns = [t for n in range(1, 6) for t in itertools.product((True, False), repeat=n)]
    bad = 0
    for n_consumers in (2, 3):  # 128- and 192-row tiles
        fixed_errs = [(t, check(t, n_consumers, True)) for t in patterns]
        old_errs = [(t, check(t, n_consumers, False)) for t in patterns]
        for t, e in fixed_errs:
            if e:
                bad += 1
                print(f"FAIL {n_consumers} consumers, tiles {['keys' if x else 'none' for x in t]}: {e}")
        # The model must see session 10's hang: a tile without keys (the CTA's only one, say).
        caught = [t for t, e in old_errs if e and "deadlock" in e]
        if (False,) not in caught:
            bad += 1
            print(f"FAIL the model misses the old protocol's deadlock ({n_consumers} consumers, one tile without keys)")
        print(f"{n_consumers} consumers: {len(patterns)} tile patterns, current protocol "
              f"{sum(1 for _, e in fixed_errs if not e)} pass; old protocol deadlocks in {len(caught)}")
    print("q hand-off:", "FAIL" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
