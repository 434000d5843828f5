#!/usr/bin/env python3
"""Exhaustive interleaving check of the Hopper kernels' mbarrier hand-offs between the producer
thread (TMA loads) and the consumer warpgroups, over a CTA's tiles (src/cuda/sm90). No GPU needed;
run by CTest (sync.mbarriers). The named-barrier protocols between the consumers are
tests/sync_protocols.py's.

mbarrier model (PTX ISA, mbarrier): a phase completes when its expected number of arrivals has
arrived, and the phase number goes up by one. try_wait.parity(P) passes while the current phase's
parity differs from P, i.e. "the last phase of parity P has completed" — so a waiter that falls two
phases behind sees the parity it started from and blocks until a phase that may never come. A full
barrier expects 1 arrival (the producer's arrive.expect_tx; the TMA bytes are a delay, which the
interleavings cover), an empty barrier one per consumer warpgroup.

Operations of a party: ("wait", barrier, parity), ("arrive", barrier), ("load", slot, item,
barrier) — the producer's TMA load of `item` into the shared-memory `slot` and its arrival —,
("use", slot, item) — a consumer starts reading the slot and expects `item` there (item None: it
writes the slot, expecting nothing, as the forward's epilogue staging O in sQ) — and ("done",
slot, item). Checked over every interleaving:
  - no deadlock (every party finishes);
  - a load into a slot comes after every consumer finished every earlier use of that slot;
  - a use finds its item loaded and not yet replaced.

The operation lists mirror the kernels' code (mainloop.cuh producer_tile / Consumer::run and
kernel_fwd.cuh for the forward; kernel_bwd.cuh bwd_produce and the consumers of kernel_bwd.cuh and
kernel_bwd_wide.cuh for the backward):
keep them in step when a protocol changes. The forward's hand-off of sQ before session 10 (a tile
without keys: the producer waited on empty_q and loaded nothing, its consumers released sQ without
waiting) must be found to deadlock; the current one (the producer also arrives on full_q for such a
tile, its consumers wait for that first) must pass. Causal consumer warpgroups may skip a tile's
first key blocks (session 11): they release each skipped stage after waiting for its load; a
release before the load must be found to deadlock.
"""
import itertools
import sys
from functools import lru_cache


def check(parties, expected):
    """parties[0] is the producer. Returns None or the first error found."""
    n = len(parties)
    bars = sorted(expected)
    bidx = {b: i for i, b in enumerate(bars)}

    def slot_item(pos, slot):  # the item the producer loaded last into slot (None: none yet)
        item = None
        for op in parties[0][:pos[0]]:
            if op[0] == "load" and op[1] == slot:
                item = op[2]
        return item

    def load_ok(pos, slot, item):
        # every use of slot before this item's turn (use order < item; loads carry their order) is done
        for c in range(1, n):
            done = {(op[1], op[2], j) for j, op in enumerate(parties[c][:pos[c]]) if op[0] == "done"}
            for j, op in enumerate(parties[c]):
                if op[0] == "use" and op[1] == slot and op[3] < item and \
                        not any(d[0] == slot and d[1] == op[2] and d[2] > j for d in done):
                    return f"the producer loads item {item} into {slot} while consumer {c} still uses it (item {op[2]})"
        return None

    @lru_cache(maxsize=None)
    def explore(pos, phase, pending):
        if all(pos[i] == len(parties[i]) for i in range(n)):
            return None
        moved = False
        for i in range(n):
            if pos[i] == len(parties[i]):
                continue
            op = parties[i][pos[i]]
            ph, pe = list(phase), list(pending)
            kind = op[0]
            if kind == "wait":
                if (phase[bidx[op[1]]] & 1) == op[2]:
                    continue  # blocked
            elif kind in ("arrive", "load"):
                if kind == "load":
                    err = load_ok(pos, op[1], op[2])
                    if err:
                        return err
                b = bidx[op[-1] if kind == "load" else op[1]]
                pe[b] += 1
                if pe[b] == expected[bars[b]]:
                    pe[b] = 0
                    ph[b] += 1
            elif kind == "use" and op[2] is not None:
                have = slot_item(pos, op[1])
                if have != op[2]:
                    return f"consumer {i} uses {op[1]} expecting item {op[2]}, finds {have}"
            moved = True
            npos = list(pos)
            npos[i] += 1
            err = explore(tuple(npos), tuple(ph), tuple(pe))
            if err:
                return err
        if not moved:
            return f"deadlock at {pos} of {[len(p) for p in parties]} (phases {dict(zip(bars, phase))})"
        return None

    sys.setrecursionlimit(10000)
    return explore(tuple(0 for _ in parties), tuple(0 for _ in bars), tuple(0 for _ in bars))


def use(slot, item, order):
    return ("use", slot, item, order)


# ---- forward: sQ (Q in, O out where staged there) and the K/V ring ---------------------------
def fwd_producer(tiles, stages, fixed):
    """tiles: key blocks per tile (0: a tile without keys)."""
    ops, g = [], 0
    for k, nb in enumerate(tiles):
        q_free = (k & 1) ^ 1
        if nb == 0:
            ops.append(("wait", "empty_q", q_free))
            if fixed:
                ops.append(("arrive", "full_q"))
            continue
        for it in range(nb):
            n = g + it
            st, ph = n % stages, (n // stages) & 1
            if it == 0 and k == 0:
                ops.append(("load", "q", k, "full_q"))
            ops += [("wait", f"empty_k{st}", ph ^ 1), ("load", f"k{st}", n, f"full_k{st}")]
            if it == 0 and k != 0:
                ops += [("wait", "empty_q", q_free), ("load", "q", k, "full_q")]
            elif it == 0 and not fixed:  # before session 10 the first tile waited too
                ops.append(("wait", "empty_q", q_free))
            ops += [("wait", f"empty_v{st}", ph ^ 1), ("load", f"v{st}", n, f"full_v{st}")]
        g += nb
    return ops


def fwd_consumer(tiles, stages, fixed, separate_o, skips=None):
    """skips[k]: the first key blocks of tile k this warpgroup skips (causal: right of its rows'
    bound; Consumer::run) — it releases each once loaded, without using it."""
    ops, g, q = [], 0, 0
    for k, nb in enumerate(tiles):
        sk = skips[k] if skips else 0
        if nb == 0:
            if fixed:
                ops.append(("wait", "full_q", q & 1))
                q += 1
            if not separate_o:  # the epilogue stages O (zeros) in sQ
                ops += [use("q", None, k), ("done", "q", None)]
            ops.append(("arrive", "empty_q"))
            continue
        ops.append(("wait", "full_q", q & 1))
        q += 1
        for it in range(sk):
            n = g + it
            st, ph = n % stages, (n // stages) & 1
            ops += [("wait", f"full_k{st}", ph), ("arrive", f"empty_k{st}"),
                    ("wait", f"full_v{st}", ph), ("arrive", f"empty_v{st}")]
        if sk == nb:  # no row of this warpgroup sees a key of the tile
            ops += [("arrive", "empty_q")] if separate_o else [use("q", None, k), ("done", "q", None), ("arrive", "empty_q")]
            g += nb
            continue
        ops.append(use("q", k, k))
        s0 = (g + sk) % stages
        ops += [("wait", f"full_k{s0}", ((g + sk) // stages) & 1), use(f"k{s0}", g + sk, g + sk),
                ("done", f"k{s0}", g + sk), ("arrive", f"empty_k{s0}")]
        for it in range(sk + 1, nb):
            n = g + it
            st, pv = n % stages, (n - 1) % stages
            ops += [("wait", f"full_k{st}", (n // stages) & 1), ("wait", f"full_v{pv}", ((n - 1) // stages) & 1),
                    use(f"k{st}", n, n), use(f"v{pv}", n - 1, n - 1), ("done", f"k{st}", n),
                    ("arrive", f"empty_k{st}"), ("done", f"v{pv}", n - 1), ("arrive", f"empty_v{pv}")]
        if separate_o:  # every Q·Kᵀ done: sQ goes back before the last P·V
            ops += [("done", "q", k), ("arrive", "empty_q")]
        last = g + nb - 1
        sl = last % stages
        ops += [("wait", f"full_v{sl}", (last // stages) & 1), use(f"v{sl}", last, last), ("done", f"v{sl}", last),
                ("arrive", f"empty_v{sl}")]
        if not separate_o:  # O staged in sQ by the epilogue, released after the store read it
            ops += [("done", "q", k), ("arrive", "empty_q")]
        g += nb
    return ops


def fwd_expected(stages, consumers):
    e = {"full_q": 1, "empty_q": consumers}
    for s in range(stages):
        e.update({f"full_k{s}": 1, f"full_v{s}": 1, f"empty_k{s}": consumers, f"empty_v{s}": consumers})
    return e


def check_fwd(tiles, stages, consumers, fixed, separate_o, skips=None):
    """skips: per consumer, per tile, the key blocks it skips (None: none)."""
    parties = [fwd_producer(tiles, stages, fixed)] + \
              [fwd_consumer(tiles, stages, fixed, separate_o, skips[c] if skips else None) for c in range(consumers)]
    return check(parties, fwd_expected(stages, consumers))


# ---- backward: K/V once per tile, the Q/dO ring per step; tiles without steps skipped by both ---
# wide (kernel_bwd_wide.cuh, d192/d256): Q in its own ring, dO in one buffer released mid-step.
def bwd_producer(tiles, stages, wide):
    ops, it, kv = [], 0, 0
    for steps in tiles:
        if steps == 0:
            continue
        ops += [("wait", "empty_kv", (kv & 1) ^ 1), ("load", "kv", kv, "full_kv")]
        kv += 1
        for _ in range(steps):
            st = it % stages
            ops += [("wait", f"empty{st}", ((it // stages) & 1) ^ 1), ("load", f"q{st}", it, f"full{st}")]
            if wide:
                ops += [("wait", "empty_do", (it & 1) ^ 1), ("load", "do", it, "full_do")]
            it += 1
    return ops


def bwd_consumer(tiles, stages, wide):
    ops, it, kv = [], 0, 0
    for steps in tiles:
        if steps == 0:
            continue
        ops += [("wait", "full_kv", kv & 1), use("kv", kv, kv)]
        for _ in range(steps):
            st = it % stages
            ops += [("wait", f"full{st}", (it // stages) & 1), use(f"q{st}", it, it)]
            if wide:  # dO: both dV GEMMs, then released; Q until dK
                ops += [("wait", "full_do", it & 1), use("do", it, it), ("done", "do", it), ("arrive", "empty_do")]
            ops += [("done", f"q{st}", it), ("arrive", f"empty{st}")]
            it += 1
        ops += [("done", "kv", kv), ("arrive", "empty_kv")]
        kv += 1
    return ops


def check_bwd(tiles, stages, wide, consumers=2):
    e = {"full_kv": 1, "empty_kv": consumers, "full_do": 1, "empty_do": consumers}
    for s in range(stages):
        e.update({f"full{s}": 1, f"empty{s}": consumers})
    return check([bwd_producer(tiles, stages, wide)] + [bwd_consumer(tiles, stages, wide) for _ in range(consumers)], e)


def main():
    bad = 0

    def report(name, cases, want_pass=True):
        nonlocal bad
        errs = [(t, e) for t, e in cases if e]
        if want_pass and errs:
            bad += 1
            for t, e in errs[:3]:
                print(f"FAIL {name}, tiles {t}: {e}")
        print(f"{name}: {len(cases)} tile patterns, {len(cases) - len(errs)} pass")
        return errs

    # The forward's sQ alone (no K/V ring): every pattern of 1–5 tiles with and without keys.
    q_only = [t for n in range(1, 6) for t in itertools.product((1, 0), repeat=n)]
    for consumers in (2, 3):  # 128- and 192-row query tiles
        for sep in (True, False):
            tag = f"forward sQ, {consumers} consumers, O {'separate' if sep else 'in sQ'}"
            # A reduced model: one key block per tile and one stage, so only sQ's hand-off varies.
            report(tag, [(t, check_fwd(t, 1, consumers, True, sep)) for t in q_only])
            old = [(t, check_fwd(t, 1, consumers, False, sep)) for t in q_only]
            caught = [t for t, e in old if e and "deadlock" in e]
            if (0,) not in caught:
                bad += 1
                print(f"FAIL the model misses the old protocol's deadlock ({tag}, one tile without keys)")
            print(f"  the protocol before session 10 deadlocks in {len(caught)} of {len(old)}")
    # The whole forward hand-off, K/V ring included: 1–3 tiles of 0–2 key blocks, 2 and 3 stages.
    full = [t for n in range(1, 4) for t in itertools.product((0, 1, 2), repeat=n)]
    for stages in (2, 3):
        for sep in (True, False):
            report(f"forward sQ + K/V ring, {stages} stages, O {'separate' if sep else 'in sQ'}",
                   [(t, check_fwd(t, stages, 2, True, sep)) for t in full])
    # Causal warpgroups that skip a tile's first key blocks (fully masked for their rows; a
    # warpgroup's skip is at least the next one's, its rows coming first): 1–2 tiles of 0–2 key
    # blocks, 2 stages; 2 consumers (O separate or in sQ) and 3 (192-row tiles: O separate; at
    # most 3 key blocks in all, 2 + 2 alone took 20 s).
    def skip_cases(consumers, sep):
        cases = []
        for t in [t for n in range(1, 3) for t in itertools.product((0, 1, 2), repeat=n)
                  if consumers == 2 or sum(t) <= 3]:
            per_wg = list(itertools.product(*[range(nb + 1) for nb in t]))
            for skips in itertools.product(per_wg, repeat=consumers):
                if any(any(s) for s in skips) and all(
                        a >= b for c in range(consumers - 1) for a, b in zip(skips[c], skips[c + 1])):
                    cases.append(((t, skips), check_fwd(t, 2, consumers, True, sep, skips)))
        return cases
    for consumers, seps in ((2, (True, False)), (3, (True,))):
        for sep in seps:
            report(f"forward with skipped key blocks, {consumers} consumers, O {'separate' if sep else 'in sQ'}",
                   skip_cases(consumers, sep))
    # A skipped stage released without waiting for its load must be caught: the release can
    # complete the stage's first phase before the producer's first wait (parity 1, a fresh barrier's
    # pass), which then blocks.
    early = [op for op in fwd_consumer((2,), 2, True, True, (1,)) if op != ("wait", "full_k0", 0) and op != ("wait", "full_v0", 0)]
    caught = check([fwd_producer((2,), 2, True), early, early], fwd_expected(2, 2))
    print("  a skipped stage released before its load:", "caught" if caught else "NOT caught")
    if not caught:
        bad += 1
    # The backward: 1–3 tiles of 0–3 query steps; Q and dO in a 2-stage ring (d64/d128), or Q in a
    # 2-stage ring and dO in one buffer (d192/d256).
    bwd = [t for n in range(1, 4) for t in itertools.product((0, 1, 2, 3), repeat=n)]
    report("backward K/V + Q/dO ring, 2 stages", [(t, check_bwd(t, 2, False)) for t in bwd])
    report("backward (wide) K/V + Q ring + dO buffer, 2 stages", [(t, check_bwd(t, 2, True)) for t in bwd])
    print("mbarrier protocols:", "FAIL" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
