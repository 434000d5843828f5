#!/usr/bin/env python3
"""Model check of the Hopper forward's tile schedules (src/cuda/sm90/scheduler.cuh), no GPU: for
many (query blocks M, heads·batch, CTAs) every real tile must be visited exactly once, virtual tiles
(index M, kPaired with an odd number of heads) carry no work, and the paired causal schedule must give every CTA
nearly the same number of key blocks (within one pair); the chain (first, next) must equal the per-round closed forms
where those exist, and on the FlashAttention grid the paired schedule with a snake tail must balance at least as well
as pure pairs. The formulas below mirror scheduler.cuh (set_schedule, first, next, valid, coord, sched_mode,
grid_size): keep them in step when it changes. Run by CTest.
"""
import sys

STRIDED, ONE_PER_CTA, SNAKE, PAIRED, PAIRED_TAIL = 0, 1, 2, 3, 4


def paired_units(m_blocks, hb):
    return m_blocks * ((hb + 1) // 2)


def sched_mode(causal, m_blocks, hb, sms):
    if not causal:
        return STRIDED
    if paired_units(m_blocks, hb) < sms:
        return ONE_PER_CTA
    return PAIRED_TAIL


def grid_size(mode, m_blocks, hb, sms):
    units = paired_units(m_blocks, hb) if mode in (PAIRED, PAIRED_TAIL) else m_blocks * hb
    return units if mode == ONE_PER_CTA or units < sms else sms


def set_schedule(mode, causal, m_blocks, hb, g):
    """The host's FwdArgs fields (scheduler.cuh set_schedule / tail_split): total, tail_u0, tail_hp0, tail_off."""
    p = dict(mode=mode, causal=causal, M=m_blocks, hb=hb, g=g, u0=0, hp0=0, off=0, total=m_blocks * hb)
    if causal and mode in (PAIRED, PAIRED_TAIL):
        pairs = paired_units(m_blocks, hb)
        if mode == PAIRED:
            p["hp0"], p["u0"] = (hb + 1) // 2, pairs
        else:
            r1 = pairs // g - 1 if pairs // g > 1 else 0
            p["hp0"] = r1 * g // m_blocks
            p["u0"] = p["hp0"] * m_blocks
        p["off"] = p["u0"] % g
        p["total"] = 2 * p["u0"] + m_blocks * max(0, hb - 2 * p["hp0"])
    return p


def is_paired(p):
    return p["causal"] and p["mode"] in (PAIRED, PAIRED_TAIL)


def phase2_first(p, c):
    g, off = p["g"], p["off"]
    return 2 * p["u0"] + (c - off if c >= off else 2 * g - 1 - c - off)


def first(p, c):
    if is_paired(p):
        return 2 * c if 2 * c < 2 * p["u0"] else phase2_first(p, c)
    return c


def next_tile(p, idx, c):
    g = p["g"]
    if is_paired(p):
        if idx < 2 * p["u0"]:
            n = idx + (2 * g - 1 if idx & 1 else 1)
            return n if n < 2 * p["u0"] else phase2_first(p, c)
        r = (idx - 2 * p["u0"] + p["off"]) // g
        return idx + (2 * c + 1 if r & 1 else 2 * g - 1 - 2 * c)
    if p["mode"] == SNAKE:
        return idx + (2 * c + 1 if (idx // g) & 1 else 2 * g - 1 - 2 * c)
    return idx + g


def coord(p, idx):
    M, hb = p["M"], p["hb"]
    if is_paired(p) and idx >= 2 * p["u0"]:
        nh2, i = hb - 2 * p["hp0"], idx - 2 * p["u0"]
        return M - 1 - i // nh2, 2 * p["hp0"] + i % nh2
    if is_paired(p):
        u, sl, half = (idx >> 1) % M, idx & 1, M // 2
        h = 2 * ((idx >> 1) // M)
        if u < 2 * half:
            h += u // half
            m = u % half if sl else M - 1 - u % half
        else:
            h += sl
            m = half
        return (M, 0) if h >= hb else (m, h)
    if p["causal"] and p["mode"] == SNAKE:
        return M - 1 - idx // hb, idx % hb
    m, h = idx % M, idx // M
    return (M - 1 - m if p["causal"] else m), h


def cta_tiles(mode, causal, m_blocks, hb, g, c):
    """(m_block, hb) of CTA c's tiles in order, as the kernel's loops visit them (first, next)."""
    p = set_schedule(mode, causal, m_blocks, hb, g)
    out, idx = [], first(p, c)
    while idx < p["total"]:
        out.append(coord(p, idx))
        idx = next_tile(p, idx, c)
    return out


def cta_tiles_by_round(mode, causal, m_blocks, hb, g, c):
    """The same sequence by the closed forms per round k (session 5's tile(k)): a second derivation
    of the chain for the modes that have one."""
    p = set_schedule(mode, causal, m_blocks, hb, g)
    out, k = [], 0
    while True:
        if is_paired(p) and mode == PAIRED:
            idx = 2 * ((k >> 1) * g + c) + (k & 1)
        else:
            idx = k * g + (g - 1 - c if mode == SNAKE and (k & 1) else c)
        if idx >= p["total"]:
            return out
        out.append(coord(p, idx))
        k += 1


def fast_div(n, d):
    """FastDiv (launch.hpp): n // d by a multiply-high, an add and a shift, for 0 <= n < 2**31."""
    shift = 0
    while (1 << shift) < d:
        shift += 1
    mul = ((1 << 32) * ((1 << shift) - d)) // d + 1
    mul &= 0xFFFFFFFF
    return (((n * mul) >> 32) + n) >> shift  # umulhi + n < 2**32 for n < 2**31


def check_fast_div():
    import random
    rng = random.Random(7)
    divisors = list(range(1, 2050)) + [rng.randrange(1, 2**31) for _ in range(3000)] + [2**31 - 1, 2**30, 2**30 + 1]
    fails = 0
    for d in divisors:
        for n in {0, 1, d - 1, d, d + 1, 2 * d - 1, 2**31 - 1, 2**31 - 2, rng.randrange(0, 2**31)}:
            if 0 <= n < 2**31 and fast_div(n, d) != n // d:
                print(f"fast_div({n}, {d}) = {fast_div(n, d)}, not {n // d}")
                fails += 1
    return fails


# ---- the non-causal schedule's stream-K tail (scheduler.cuh: set_stream_k, StreamKTail) ----------
STREAM_K_MIN_BLOCKS = 16  # scheduler.cuh, kStreamKMinBlocks


def set_stream_k(tiles, g, blocks):
    """sk_begin, or tiles for no tail."""
    if tiles <= g or tiles % g == 0 or blocks < STREAM_K_MIN_BLOCKS:
        return tiles
    begin = (tiles // g - 1) * g
    if (tiles - begin) * blocks * g >= 2**31:
        return tiles
    return begin


def stream_k_items(tiles, g, blocks, c):
    """CTA c's items (tile, kb_begin, kb_end, slot) in order: its strided tiles, then its tail."""
    begin = set_stream_k(tiles, g, blocks)
    items = [(idx, 0, blocks, -1) for idx in range(c, begin, g)]
    if begin < tiles:
        units = (tiles - begin) * blocks
        u0, u1 = fast_div(c * units, g), fast_div((c + 1) * units, g)
        for t in range(u0 // blocks, (u1 - 1) // blocks + 1):
            lo = t * blocks
            b, e = max(u0, lo) - lo, min(u1, lo + blocks) - lo
            items.append((begin + t, b, e, c if b > 0 else c + 1 if e < blocks else -1))
    return items


def check_stream_k(sms=132):
    fails = 0
    for tiles in list(range(1, 3 * sms + 7)) + [2048, 2816, 1024, 3072, 10000]:
        for blocks in (1, 4, 8, 15, 16, 17, 47, 128):
            g = min(tiles, sms)
            begin = set_stream_k(tiles, g, blocks)
            cover, parts, loads = {}, {}, []
            for c in range(g):
                its = stream_k_items(tiles, g, blocks, c)
                loads.append(sum(e - b for _, b, e, _ in its))
                for k, (idx, b, e, slot) in enumerate(its):
                    for kb in range(b, e):
                        cover[(idx, kb)] = cover.get((idx, kb), 0) + 1
                    if slot >= 0:
                        # the low part is the CTA's last item, the high part its first (a later CTA's)
                        low, k0 = b == 0, sum(1 for it in its if it[0] < begin)
                        if (low and (k != len(its) - 1 or slot != c + 1)) or (not low and (k != k0 or slot != c)):
                            fails += 1
                            print(f"stream-K: tiles={tiles} g={g} blocks={blocks} c={c}: cut part {idx} [{b},{e}) out of place")
                        if not 1 <= slot < g:
                            fails += 1
                            print(f"stream-K: slot {slot} out of range (g={g})")
                        parts.setdefault(slot, []).append((idx, b, e, c))
            if set(cover) != {(i, kb) for i in range(tiles) for kb in range(blocks)} or any(v != 1 for v in cover.values()):
                fails += 1
                print(f"stream-K coverage FAILED tiles={tiles} g={g} blocks={blocks}")
            for slot, ps in parts.items():  # two parts of one tile, from CTAs slot-1 and slot, meeting
                if len(ps) != 2 or ps[0][0] != ps[1][0] or sorted(p[3] for p in ps) != [slot - 1, slot] or \
                        sorted((p[1], p[2]) for p in ps)[0][1] != sorted((p[1], p[2]) for p in ps)[1][0]:
                    fails += 1
                    print(f"stream-K: slot {slot} parts {ps} (tiles={tiles} g={g} blocks={blocks})")
            if begin < tiles and max(loads) - min(loads) > 1:
                fails += 1
                print(f"stream-K imbalance tiles={tiles} g={g} blocks={blocks}: {min(loads)}..{max(loads)}")
    # the FlashAttention grid at d128 (2048 tiles): every CTA ends within one key block
    g = sms
    for n in (2048, 4096, 8192):
        nb = n // 128
        loads = [sum(e - b for _, b, e, _ in stream_k_items(2048, g, nb, c)) for c in range(g)]
        print(f"  stream-K d128 grid N={n}: {2048 * nb / g:.1f} key blocks per CTA on average, "
              f"largest {max(loads)} (16 rounds of whole tiles: {16 * nb})")
    return fails


def main():
    fails = check_fast_div()
    fails += check_stream_k()
    sms = 132
    tail_ratio = []
    for causal in (False, True):
        for m_blocks in (1, 2, 3, 4, 5, 8, 11, 16, 64, 128):
            for hb in (1, 3, 16, 67, 512):
                for mode in (None, SNAKE, PAIRED, PAIRED_TAIL) if causal else (None,):
                    # None: the default; else the mode forced
                    mode = sched_mode(causal, m_blocks, hb, sms) if mode is None else mode
                    g = grid_size(mode, m_blocks, hb, sms)
                    seen, load, virtual = {}, [], False
                    for c in range(g):
                        if mode != PAIRED_TAIL and cta_tiles(mode, causal, m_blocks, hb, g, c) != \
                                cta_tiles_by_round(mode, causal, m_blocks, hb, g, c):
                            print(f"chain differs from the per-round form: mode={mode} M={m_blocks} hb={hb} c={c}")
                            fails += 1
                        blocks = 0
                        for m, h in cta_tiles(mode, causal, m_blocks, hb, g, c):
                            if m >= m_blocks:  # virtual: only kPaired, only past the last head (odd hb)
                                if not (mode == PAIRED and m == m_blocks and hb % 2):
                                    print(f"bad virtual tile m={m} mode={mode} M={m_blocks}")
                                    fails += 1
                                virtual = True
                                continue
                            seen[(m, h)] = seen.get((m, h), 0) + 1
                            blocks += m + 1 if causal else m_blocks  # key blocks, square tiles
                        load.append(blocks)
                    # set_schedule's FwdArgs::every_tile_has_keys (its virtual-tile half): the
                    # kernel trusts it to take the chain's last tile as its last with keys
                    p = set_schedule(mode, causal, m_blocks, hb, g)
                    if virtual != (causal and mode in (PAIRED, PAIRED_TAIL) and 2 * p["hp0"] > hb):
                        print(f"virtual tiles {virtual} but set_schedule says otherwise: mode={mode} M={m_blocks} hb={hb}")
                        fails += 1
                    want = {(m, h) for m in range(m_blocks) for h in range(hb)}
                    if set(seen) != want or any(v != 1 for v in seen.values()):
                        print(f"coverage FAILED causal={causal} M={m_blocks} hb={hb} mode={mode} g={g}")
                        fails += 1
                    if causal and mode in (PAIRED, PAIRED_TAIL):
                        # every CTA gets whole pairs of cost ~M+1; rounds differ by at most one pair
                        # (PAIRED_TAIL: at most one pair's cost too, its tail being finer)
                        spread = max(load) - min(load)
                        if spread > m_blocks + 1:
                            print(f"imbalance causal M={m_blocks} hb={hb} mode={mode}: loads {min(load)}..{max(load)}")
                            fails += 1
                        if mode == PAIRED_TAIL and g == sms:
                            tail_ratio.append((max(load) * g / sum(load), m_blocks, hb))
    # The FlashAttention grid (batch·N = 16384, heads·d = 2048): the tail must balance at least as
    # well as pure pairs (largest CTA load over the mean, key blocks of square tiles).
    for d in (64, 128, 256):
        for n in (512, 1024, 2048, 4096, 8192, 16384):
            bm = 192 if d == 64 and n >= 2048 else 128
            m_blocks, hb = -(-n // bm), (16384 // n) * (2048 // d)
            ratio = {}
            for mode in (PAIRED, PAIRED_TAIL):
                g = grid_size(mode, m_blocks, hb, sms)
                loads = [sum(m + 1 for m, h in cta_tiles(mode, True, m_blocks, hb, g, c) if m < m_blocks)
                         for c in range(g)]
                ratio[mode] = max(loads) * g / sum(loads)
            if ratio[PAIRED_TAIL] > ratio[PAIRED] + 1e-9:
                print(f"tail worse than pairs: d{d} N={n}: {ratio[PAIRED_TAIL]:.3f} > {ratio[PAIRED]:.3f}")
                fails += 1
            print(f"  grid d{d} N={n}: largest/mean load paired {ratio[PAIRED]:.3f}, with tail {ratio[PAIRED_TAIL]:.3f}")
    worst = max(tail_ratio) if tail_ratio else None
    print(f"paired with tail: largest CTA load / mean, worst case {worst[0]:.3f} (M={worst[1]}, heads·batch={worst[2]})")
    print("tile schedules:", "ok" if not fails else f"{fails} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
