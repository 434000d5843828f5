#!/usr/bin/env python3
"""Model check of the Hopper forward's tile schedules (src/cuda/sm90/scheduler.cuh), no GPU: for
many (query blocks M, heads·batch, CTAs) every real tile must be visited exactly once, virtual tiles
(index M, kPaired with an odd number of heads) carry no work, and the paired causal schedule must give every CTA
nearly the same number of key blocks (within one pair). The formulas below mirror scheduler.cuh (tile, valid, coord,
sched_mode, grid_size): keep them in step when it changes. Run by CTest.
"""
import sys

STRIDED, ONE_PER_CTA, SNAKE, PAIRED = 0, 1, 2, 3


def paired_units(m_blocks, hb):
    return m_blocks * ((hb + 1) // 2)


def sched_mode(causal, head_dim, m_blocks, hb, sms):
    if not causal:
        return STRIDED
    if paired_units(m_blocks, hb) < sms:
        return ONE_PER_CTA
    return SNAKE if head_dim == 64 else PAIRED


def grid_size(mode, m_blocks, hb, sms):
    units = paired_units(m_blocks, hb) if mode == PAIRED else m_blocks * hb
    return units if mode == ONE_PER_CTA or units < sms else sms


def cta_tiles(mode, causal, m_blocks, hb, g, c):
    """(m_block, hb) of CTA c's tiles in order, as the kernel's loop visits them."""
    total = 2 * m_blocks * ((hb + 1) // 2) if causal and mode == PAIRED else m_blocks * hb
    out, k = [], 0
    while True:
        if causal and mode == PAIRED:
            idx = 2 * ((k >> 1) * g + c) + (k & 1)
        else:
            idx = k * g + (g - 1 - c if mode == SNAKE and (k & 1) else c)
        if idx >= total:
            return out
        if causal and mode == PAIRED:
            u, sl, half = (idx >> 1) % m_blocks, idx & 1, m_blocks // 2
            h = 2 * ((idx >> 1) // m_blocks)
            if u < 2 * half:
                h += u // half
                m = u % half if sl else m_blocks - 1 - u % half
            else:
                h += sl
                m = half
            if h >= hb:
                m, h = m_blocks, 0
        elif causal and mode == SNAKE:
            hbs = total // m_blocks
            m, h = m_blocks - 1 - idx // hbs, idx % hbs
        else:
            m, h = idx % m_blocks, idx // m_blocks
            if causal:
                m = m_blocks - 1 - m
        out.append((m, h))
        k += 1


def main():
    fails = 0
    sms = 132
    for causal in (False, True):
        for m_blocks in (1, 2, 3, 4, 5, 8, 11, 16, 64, 128):
            for hb in (1, 3, 16, 67, 512):
                for mode in (64, 128, SNAKE, PAIRED) if causal else (128,):
                    # 64 / 128: the default for that head dim; else the mode forced
                    mode = sched_mode(causal, mode, m_blocks, hb, sms) if mode >= 64 else mode
                    g = grid_size(mode, m_blocks, hb, sms)
                    seen, load = {}, []
                    for c in range(g):
                        blocks = 0
                        for m, h in cta_tiles(mode, causal, m_blocks, hb, g, c):
                            if m >= m_blocks:  # virtual: only kPaired, only past the last head (odd hb)
                                if not (mode == PAIRED and m == m_blocks and hb % 2):
                                    print(f"bad virtual tile m={m} mode={mode} M={m_blocks}")
                                    fails += 1
                                continue
                            seen[(m, h)] = seen.get((m, h), 0) + 1
                            blocks += m + 1 if causal else m_blocks  # key blocks, square tiles
                        load.append(blocks)
                    want = {(m, h) for m in range(m_blocks) for h in range(hb)}
                    if set(seen) != want or any(v != 1 for v in seen.values()):
                        print(f"coverage FAILED causal={causal} M={m_blocks} hb={hb} mode={mode} g={g}")
                        fails += 1
                    if causal and mode == PAIRED:
                        # every CTA gets whole pairs of cost ~M+1; rounds differ by at most one pair
                        spread = max(load) - min(load)
                        if spread > m_blocks + 1:
                            print(f"imbalance causal M={m_blocks} hb={hb}: loads {min(load)}..{max(load)}")
                            fails += 1
    print("tile schedules:", "ok" if not fails else f"{fails} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
