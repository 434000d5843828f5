#!/usr/bin/env python3
"""Model check (no GPU) of the Hopper kernels' tile ranges and masks for windows, against the
visibility rule of include/flashattn (bottom-right aligned: row i sees key j < Nk with
i + diag − wl <= j <= i + diag + wr, diag = Nk − Nq, a negative bound meaning none). The causal
kernels serve every window (causal = the window (−1, 0)); sm90.hpp clamps it (kernel_window_*).
Forward (mainloop.cuh key_range, Consumer::run's needs_mask, softmax.cuh FragmentSoftmax::mask):
  - every key a row of the query block sees lies in the block's key tiles [begin, end);
  - a key tile run without the mask (needs_mask false) is visible to every row of the block that
    exists (rows < Nq);
  - the mask keeps exactly the visible keys of every row;
  - an unbounded right side clamped to Nq means the same keys as none;
  - a block has no key tile exactly when (m + 1)·bm + diag + wr <= 0 (set_schedule's rule);
  - the first key tile's exponentials skipped per warp (Consumer::run, FragmentSoftmax::step<true>:
    column blocks from 8·live on) hold no key visible to any row of the warp.
Backward (kernel_bwd.cuh query_range, step_needs_mask, StepMask; both backward kernels):
  - every query that sees a key of the key tile lies in the tile's query tiles [m_begin, m_end);
  - a step without the mask is visible for every existing (query, key) pair; the mask is exact.
Run for the forward's and the backward's tile shapes.
"""
import random


def visible(i, j, nq, nk, wl, wr):
    diag = nk - nq
    if not 0 <= j < nk:
        return False
    if wr >= 0 and j > i + diag + wr:
        return False
    if wl >= 0 and j < i + diag - wl:
        return False
    return True


def clamp(nq, nk, wl, wr):
    """sm90.cu: window_left below Nk (else none), an unbounded right side as Nq."""
    wl = wl if 0 <= wl < nk else -1
    wr = nq if wr < 0 else min(wr, nq)
    return wl, wr


def key_range(m, bm, bn, nq, nk, wl, wr):
    diag = nk - nq
    end, begin = nk, 0
    end = min(end, (m + 1) * bm + diag + wr)
    if wl >= 0:
        begin = max(0, m * bm + diag - wl)
    first = begin // bn
    return first, (first if end <= 0 else max(first, -(-end // bn)))


def needs_mask(n, m, bm, bn, nq, nk, wl, wr):
    key_end = (n + 1) * bn
    diag_row_min = m * bm + nk - nq
    return key_end > nk or (wr >= 0 and key_end - 1 > diag_row_min + wr) or \
        (wl >= 0 and n * bn < diag_row_min + bm - 1 - wl)


def mask_keeps(i, j, nq, nk, wl, wr):
    """FragmentSoftmax::mask for one score: last/lo relative to the row's diagonal."""
    diag = (nk - nq) + i
    bound = min(nk - 1, diag + wr)  # the causal kernels: wr >= 0
    if j > bound:
        return False
    if wl >= 0 and j < diag - wl:
        return False
    return True


def live_blocks(m, wg, w, n, bm, bn, nq, nk, wr):
    """mainloop.cuh Consumer::run's prologue: the column blocks of key tile n warp w of warpgroup
    wg computes (the rest are masked for all 16 of its rows)."""
    warp_last_row = m * bm + 64 * wg + 16 * w + 15
    last_key = min(nk - 1, warp_last_row + nk - nq + wr)
    live_cols = last_key - n * bn + 1
    return 0 if live_cols <= 0 else min(bn // 8, (live_cols + 7) // 8)


def check(nq, nk, wl_in, wr_in, bm, bn):
    fails = 0
    wl, wr = clamp(nq, nk, wl_in, wr_in)
    for m in range(-(-nq // bm)):
        rows = range(m * bm, min((m + 1) * bm, nq))
        begin, end = key_range(m, bm, bn, nq, nk, wl, wr)
        # scheduler.cuh set_schedule (every_tile_has_keys): a block is empty exactly when its last
        # row's right bound is below the first key, whatever the left window
        if (end <= begin) != ((m + 1) * bm + (nk - nq) + wr <= 0):
            print(f"empty-block rule wrong: nq={nq} nk={nk} w=({wl_in},{wr_in}) bm={bm} bn={bn} m={m} [{begin},{end})")
            return 1
        for i in rows:
            for j in range(nk):
                vis = visible(i, j, nq, nk, wl_in, wr_in)
                if vis != visible(i, j, nq, nk, wl, wr):
                    print(f"clamping changed visibility nq={nq} nk={nk} window=({wl_in},{wr_in}) i={i} j={j}")
                    return 1
                if vis and not begin <= j // bn < end:
                    print(f"visible key outside the tiles: nq={nq} nk={nk} w=({wl_in},{wr_in}) bm={bm} bn={bn} m={m} i={i} j={j} tiles=[{begin},{end})")
                    return 1
                if begin <= j // bn < end and mask_keeps(i, j, nq, nk, wl, wr) != vis:
                    print(f"mask wrong: nq={nq} nk={nk} w=({wl_in},{wr_in}) i={i} j={j}")
                    return 1
        if end > begin:  # the first key tile (n = end - 1): skipped exponentials
            n = end - 1
            for wg in range(bm // 64):
                for w in range(4):
                    live = live_blocks(m, wg, w, n, bm, bn, nq, nk, wr)
                    for i in range(m * bm + 64 * wg + 16 * w, min(m * bm + 64 * wg + 16 * w + 16, nq)):
                        for j in range(n * bn + 8 * live, min((n + 1) * bn, nk)):
                            if visible(i, j, nq, nk, wl_in, wr_in):
                                print(f"skipped a visible key: nq={nq} nk={nk} w=({wl_in},{wr_in}) bm={bm} bn={bn} m={m} i={i} j={j} live={live}")
                                return 1
        for n in range(begin, end):
            if not needs_mask(n, m, bm, bn, nq, nk, wl, wr):
                for i in rows:
                    for j in range(n * bn, (n + 1) * bn):
                        if not visible(i, j, nq, nk, wl_in, wr_in):
                            print(f"unmasked tile hides an invisible key: nq={nq} nk={nk} w=({wl_in},{wr_in}) bm={bm} bn={bn} m={m} n={n} i={i} j={j}")
                            return 1
    return fails


def query_range(n, bm, bn, nq, nk, wl, wr):
    """kernel_bwd.cuh query_range: the query tiles [m_begin, m_end) of key tile n."""
    m_blocks = -(-nq // bm)
    diag = nk - nq
    first_query = n * bn - diag - wr
    m_begin = 0 if first_query <= 0 else first_query // bm
    m_end = m_blocks
    if wl >= 0:
        last_query = (n + 1) * bn - 1 - diag + wl
        m_end = 0 if last_query < 0 else min(m_end, last_query // bm + 1)
    return m_begin, m_end


def step_needs_mask(n, q0, bm, bn, nq, nk, wl, wr):
    diag = nk - nq
    return (n + 1) * bn > nk or (n + 1) * bn - 1 > q0 + diag + wr or \
        (wl >= 0 and n * bn < q0 + bm - 1 + diag - wl)


def mask_keeps_bwd(key, query, q0, bm, nq, nk, wl, wr):
    """kernel_bwd.cuh StepMask for one element of query tile q0: the thread's first column
    first_query = q0 + 2(lane % 4), per key the visible columns [lo, hi] relative to it."""
    diag = nk - nq
    past = 1 << 30
    first_query = q0 + 2 * (((query - q0) // 2) % 4)
    c = query - first_query  # 8(r >> 2) + (r & 1)
    assert 0 <= c < bm and c % 8 in (0, 1)
    lo = past if key >= nk else key - diag - wr - first_query
    hi = key - diag + wl - first_query if wl >= 0 else past
    return not (c < lo or c > hi)


def check_backward(nq, nk, wl_in, wr_in, bm, bn):
    wl, wr = clamp(nq, nk, wl_in, wr_in)
    for n in range(-(-nk // bn)):
        m_begin, m_end = query_range(n, bm, bn, nq, nk, wl, wr)
        keys = range(n * bn, min((n + 1) * bn, nk))
        for j in keys:
            for i in range(nq):
                vis = visible(i, j, nq, nk, wl_in, wr_in)
                if vis and not m_begin <= i // bm < m_end:
                    print(f"bwd: visible query outside the tiles: nq={nq} nk={nk} w=({wl_in},{wr_in}) bm={bm} bn={bn} n={n} i={i} j={j} [{m_begin},{m_end})")
                    return 1
                if m_begin <= i // bm < m_end and mask_keeps_bwd(j, i, i // bm * bm, bm, nq, nk, wl, wr) != vis:
                    print(f"bwd: StepMask wrong: nq={nq} nk={nk} w=({wl_in},{wr_in}) i={i} j={j}")
                    return 1
        for m in range(m_begin, m_end):
            if not step_needs_mask(n, m * bm, bm, bn, nq, nk, wl, wr):
                for i in range(m * bm, min((m + 1) * bm, nq)):
                    for j in range(n * bn, (n + 1) * bn):
                        if not visible(i, j, nq, nk, wl_in, wr_in):
                            print(f"bwd: unmasked step hides an invisible key: nq={nq} nk={nk} w=({wl_in},{wr_in}) bm={bm} bn={bn} n={n} m={m} i={i} j={j}")
                            return 1
    return 0


def main():
    rng = random.Random(11)
    fails = cases = 0
    shapes = [(128, 128), (192, 128), (128, 112), (128, 80)]  # forward (query, key) tiles
    bwd_shapes = [(128, 128), (64, 128), (64, 64)]  # backward steps: d64, d128, d256 (causal only)
    fixed = [(1, 1, -1, 0), (17, 17, 0, 0), (113, 203, -1, 0), (203, 113, -1, 0), (300, 300, 64, 16),
             (300, 200, -1, 40), (256, 512, 64, -1), (700, 900, 100, 0), (513, 513, 100, 100), (130, 70, 5, 3)]
    rand = [(rng.randrange(1, 420), rng.randrange(1, 420), rng.choice([-1, 0, 3, 50, 129, 500]),
             rng.choice([-1, 0, 1, 7, 64, 300])) for _ in range(60)]
    for nq, nk, wl, wr in fixed + rand:
        if wl < 0 and wr < 0:
            continue  # no window: the non-causal kernels
        for bm, bn in shapes:
            fails += check(nq, nk, wl, wr, bm, bn)
            cases += 1
        for bm, bn in bwd_shapes:
            fails += check_backward(nq, nk, wl, wr, bm, bn)
            cases += 1
    print(f"key tiles: {cases} cases, {'ok' if fails == 0 else f'{fails} FAILED'}")
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
