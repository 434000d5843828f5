// Which (query block, head, batch) tiles a CTA works on.
//
// Tile index order: query block fastest (reversed for causal, so the heaviest blocks go first),
// then head, then batch; CTAs that run at the same time share a head and so its K/V in L2.
// Five modes, chosen on the host (FwdArgs::sched, sched_mode below):
//   kStrided (non-causal): persistent, min(#SMs, tiles) CTAs, CTA c takes tiles c, c+G, c+2G, …;
//       every tile costs the same, and the producer prefetches the next tile's K and Q while the
//       consumers finish the current one.
//   kPaired (causal, at least as many pairs as SMs): persistent; query blocks are paired heaviest
//       with lightest, (M−1−p, p) within a head, so every pair costs M + 1 key blocks (square
//       tiles); with M odd the two middle blocks of a head pair form one more pair. Two heads thus
//       make M pairs of equal cost, and CTA c takes pairs c, c+G, … (heavy tile, then light): equal
//       work per CTA without giving up L2, since the pairs running at once cover 2G / M
//       consecutive heads, whose K and V take 8·G·kBlockM·D bytes (17 MiB at d128) whatever N is.
//       An odd number of heads·batch leaves virtual tiles in the last head pair (m_block = M: no
//       keys, nothing loaded or stored).
//   kOnePerCta (causal, fewer pairs than SMs): grid = tiles; the hardware block scheduler hands
//       the heaviest remaining tile to whichever SM frees up first.
//   kPairedTail (causal, at least as many pairs as SMs; the default):
//       kPaired for all but the last one to two rounds' worth of pairs, then the snake over the
//       remaining heads' tiles, heaviest first. Pairs are large, equal units, so kPaired ends with
//       P mod G CTAs running one more pair than the rest (P / G = 7.76 on the d128 grid: 3 % of the
//       kernel idle at the end); the snake's last round holds the lightest tiles. Phase 1 covers
//       the first hp0 = floor((P/G − 1)·G / M) head pairs (head-pair aligned, so phase 2 is whole
//       heads); phase 2 continues the round-robin where phase 1 stopped (position u0 mod G), so the
//       CTAs that ran one pair fewer take the heaviest remaining tiles. Model (tests/kernels/test_tile_schedule.cpp):
//       largest CTA load / mean 1.031 (paired) → 1.000–1.011 on the grid for N ≥ 1024.
//   kSnake (causal; measurements only, FLASHATTN_SM90_FWD_SCHED=2): persistent; tiles ordered heaviest
//       first over all heads, round r gives CTA c tile r·G + c (r even) or r·G + G−1−c (r odd).
//       Balanced, but a head's query blocks run rounds apart: with many heads its K/V has left L2
//       in between (at N = 512, 512 heads' K/V = 128 MiB re-read from DRAM per query block;
//       docs/perf/log.md, P-059).
#pragma once

#include "cuda/sm90/args.hpp"
#include "cuda/sm90/primitives/hd.hpp"

namespace flashattn::cuda::sm90 {

enum SchedMode : int { kStrided = 0, kOnePerCta = 1, kSnake = 2, kPaired = 3, kPairedTail = 4 };
// The two modes that walk pairs of query blocks (and share first/next/coord below).
__host__ __device__ constexpr bool paired_mode(int mode) { return mode == kPaired || mode == kPairedTail; }

struct TileCoord {
  int m_block, head, batch;  // m_block >= FwdArgs::m_blocks: a virtual tile (paired modes, odd heads·batch)
};

template <bool kCausal>
struct TileScheduler {
  // Stateless: every field is read from the kernel parameters (constant bank) where it is used.
  // kPaired and kPairedTail run the same code: slots 2u + s (tile s, 0 heavy / 1 light, of pair u)
  // for pairs [0, tail_u0), then 2·tail_u0 + i for tile i of the phase-2 snake; kPaired is the
  // boundary at the end (tail_u0 = all pairs, no phase 2). Set on the host (tail_split).
  FLASHATTN_HOST_DEVICE static bool paired(const FwdArgs& a) { return kCausal && paired_mode(a.sched); }
  // The CTA's tiles as a chain: first() and next(idx); an index >= FwdArgs::sched_total ends it.
  // The causal consumers take next() before a tile's main loop, where few registers are live
  // (computed after it, the consumer of d256 causal spills); the strided ones after the
  // tile (fwd/kernel.cuh).
  // (On the host, the tests give the grid g and the CTA c: first(a, g, c), next(a, idx, g, c).)
#if defined(__CUDACC__)
  __device__ static int first(const FwdArgs& a) { return first(a, int(gridDim.x), int(blockIdx.x)); }
  __device__ static int next(const FwdArgs& a, int idx) { return next(a, idx, int(gridDim.x), int(blockIdx.x)); }
#endif
  FLASHATTN_HD static int first(const FwdArgs& a, int g, int c) {
    if (paired(a)) return 2 * c < 2 * a.tail_u0 ? 2 * c : phase2_first(a, g, c);
    return c;
  }
  FLASHATTN_HD static int next(const FwdArgs& a, int idx, int g, int c) {
    if (paired(a)) {
      if (idx < 2 * a.tail_u0) {  // phase 1: heavy (even) → light, light → the next pair's heavy
        const int n = idx + ((idx & 1) ? 2 * g - 1 : 1);
        return n < 2 * a.tail_u0 ? n : phase2_first(a, g, c);
      }
      const int i = idx - 2 * a.tail_u0, r = a.div_grid.div(i + a.tail_off);  // phase-2 round
      return idx + ((r & 1) ? 2 * c + 1 : 2 * g - 1 - 2 * c);
    }
    if (kCausal && a.sched == kSnake) return idx + ((a.div_grid.div(idx) & 1) ? 2 * c + 1 : 2 * g - 1 - 2 * c);
    return idx + g;
  }
  // Phase 2 continues the round-robin at position tail_off: CTAs c >= off start in round 0 at
  // position c, the others in round 1 at position g − 1 − c.
  FLASHATTN_HOST_DEVICE static int phase2_first(const FwdArgs& a, int g, int c) {
    const int off = a.tail_off;
    return 2 * a.tail_u0 + (c >= off ? c - off : 2 * g - 1 - c - off);
  }
  FLASHATTN_HOST_DEVICE static bool valid(const FwdArgs& a, int idx) { return idx < a.sched_total; }
  FLASHATTN_HOST_DEVICE static TileCoord coord(const FwdArgs& a, int idx) {
    const int m_blocks = a.m_blocks, hb_total = a.heads * a.batch;
    int m, hb;
    if (paired(a) && idx >= 2 * a.tail_u0) {  // phase 2: heaviest first, then head
      const int i = idx - 2 * a.tail_u0, q = a.div_nh2.div(i);
      hb = 2 * a.tail_hp0 + (i - q * a.div_nh2.d);
      m = m_blocks - 1 - q;
    } else if (paired(a)) {
      const int pu = a.div_m.div(idx >> 1), u = (idx >> 1) - pu * m_blocks, s = idx & 1, half = m_blocks / 2;
      hb = 2 * pu;
      if (u < 2 * half) {  // (M−1−p, p) of one head of the pair
        const int h = a.div_half.div(u), p = u - h * half;
        hb += h;
        m = s ? p : m_blocks - 1 - p;
      } else {             // M odd: the middle blocks of both heads
        hb += s;
        m = half;
      }
      if (hb >= hb_total) return {m_blocks, 0, 0};  // virtual: past the last head
    } else if (kCausal && a.sched == kSnake) {  // heaviest query block of every head first
      const int m_rev = a.div_hb.div(idx);
      hb = idx - m_rev * hb_total;
      m = m_blocks - 1 - m_rev;
    } else {
      hb = a.div_m.div(idx);
      m = idx - hb * m_blocks;
      if (kCausal) m = m_blocks - 1 - m;
    }
    const int batch = a.div_heads.div(hb);
    return {m, hb - batch * a.heads, batch};
  }
};

// Stream-K tail (non-causal kernels without varlen; FwdArgs::sk_*). The strided schedule runs
// ceil(tiles / G) rounds, the last one partly idle (the grid: 2048 d128 tiles on 132 SMs = 15.5
// rounds run as 16). With a tail, the rounds before the last full one stay whole tiles, and the
// remaining W tiles (G <= W < 2G) become W · sk_blocks key-block units: CTA c takes units
// [c·U/G, (c+1)·U/G) in tile order, so every CTA ends within one key block of the others. Each
// CTA's share is at least a tile, so a tile is cut at most once, between CTAs c and c+1: c takes
// its low key blocks (c's last item), c+1 its high ones (c+1's first item). The two parts meet in
// a split slot numbered c+1 (sk_part, sk_sync): whichever finishes first leaves its state there,
// the second merges it and stores the tile (fwd/kernel.cuh). No CTA waits for another to start.
struct SkItem {
  int idx;                 // the tile
  int kb_begin, kb_end;    // its key blocks [kb_begin, kb_end) this CTA runs
  int slot;                // split slot, or -1: the whole tile
};
struct StreamKTail {
  int u0, u1;  // this CTA's units
  // 32-bit products and the grid's FastDiv (the host keeps G · units below 2^31, set_stream_k):
  // a 64-bit division made the producer, at 24 registers, spill.
  // (On the host, the tests give the CTA c: of(a, c), item(a, t, c).)
#if defined(__CUDACC__)
  __device__ static StreamKTail of(const FwdArgs& a) { return of(a, int(blockIdx.x)); }
  __device__ SkItem item(const FwdArgs& a, int t) const { return item(a, t, int(blockIdx.x)); }
#endif
  FLASHATTN_HD static StreamKTail of(const FwdArgs& a, int c) {
    const int units = (a.sk_total - a.sk_begin) * a.sk_blocks;
    return {a.div_grid.div(c * units), a.div_grid.div((c + 1) * units)};
  }
  // Items t in [first(a), end(a)), tail-relative tile numbers.
  FLASHATTN_HOST_DEVICE int first(const FwdArgs& a) const { return u0 / a.sk_blocks; }
  FLASHATTN_HOST_DEVICE int end(const FwdArgs& a) const { return (u1 - 1) / a.sk_blocks + 1; }
  FLASHATTN_HD SkItem item(const FwdArgs& a, int t, int c) const {
    const int nb = a.sk_blocks, lo = t * nb;
    const int b = max(u0, lo) - lo, e = min(u1, lo + nb) - lo;
    return {a.sk_begin + t, b, e, b > 0 ? c : e < nb ? c + 1 : -1};
  }
};
// Host: the tail for a strided grid of g CTAs over `tiles` tiles of `blocks` key blocks each, or
// none (sk_begin = tiles): with fewer tiles than CTAs, a whole number of rounds, or tiles shorter
// than kStreamKMinBlocks, or too many units for 32-bit arithmetic. Returns the split slots (0: none).
// Measured (H200; docs/perf/log.md, P-115): kernel time −2.6 % at d64 N = 2048 and −2.2 % at d128 N = 8192, but
// per call −2…−3 % at d64 N = 512 (4 key blocks) and d128 N = 1024 (8), where an item's fixed costs
// and the counters' memset weigh more than half a round of short tiles.
constexpr int kStreamKMinBlocks = 16;
inline int set_stream_k(FwdArgs& a, int tiles, int g, int blocks, bool enabled) {
  a.sk_begin = a.sk_total = tiles;
  a.sk_blocks = blocks;
  if (!enabled || tiles <= g || tiles % g == 0 || blocks < kStreamKMinBlocks) return 0;
  const int begin = (tiles / g - 1) * g;
  if ((long long)(tiles - begin) * blocks * g >= (1LL << 31)) return 0;  // StreamKTail::of's products
  a.sk_begin = a.sched_total = begin;  // the strided chains stop where the tail starts
  return g;
}

// The grid's mode when the host does not force one.
inline long long paired_units(int m_blocks, long long heads_batch) { return m_blocks * ((heads_batch + 1) / 2); }
// Causal: the paired schedule with a snake tail. Measured (CUPTI kernel time, H200): plain paired
// 7–13 % shorter than the snake at d128/d256 for N ≤ 2048, 2 % at 8192 (docs/perf/log.md,
// P-059); the tail 1.5–4.5 % shorter than plain paired at d128/d256 on every causal
// row; at d64, where the snake is 5–6 % shorter than plain paired, the tail ties the snake at
// N = 512, 1024 and 16384 and is 1–3 % shorter at 2048/4096 (twice each, and interleaved per call;
// P-076, P-080).
inline int sched_mode(bool causal, int m_blocks, long long heads_batch, int sm_count) {
  if (!causal) return kStrided;
  if (paired_units(m_blocks, heads_batch) < sm_count) return kOnePerCta;
  return kPairedTail;
}
// The paired schedules' phase boundary for a grid of g CTAs: kPaired all pairs; kPairedTail all
// whole rounds of pairs but one, cut down to whole head pairs (so phase 2 is whole heads).
inline void tail_split(FwdArgs& a, long long heads_batch, int g) {
  const long long pairs = paired_units(a.m_blocks, heads_batch);
  if (a.sched == kPaired) {  // no phase 2
    a.tail_hp0 = int((heads_batch + 1) / 2);
    a.tail_u0 = int(pairs);
  } else {
    const long long r1 = pairs / g > 1 ? pairs / g - 1 : 0;
    a.tail_hp0 = int(r1 * g / a.m_blocks);
    a.tail_u0 = a.tail_hp0 * a.m_blocks;
  }
  a.tail_off = a.tail_u0 % g;
}
// FwdArgs::sched (the mode) and its derived fields: sched_total (tile slots), the paired boundary.
inline void set_schedule(FwdArgs& a, bool causal, long long heads_batch, int grid) {
  a.sched_total = int(a.m_blocks * heads_batch);
  const bool paired = causal && paired_mode(a.sched);
  bool virtual_tiles = false;
  if (paired) {
    tail_split(a, heads_batch, grid);
    a.sched_total = 2 * a.tail_u0 + a.m_blocks * int(heads_batch > 2LL * a.tail_hp0 ? heads_batch - 2LL * a.tail_hp0 : 0);
    virtual_tiles = 2LL * a.tail_hp0 > heads_batch;  // the pairs include the last, half-virtual head pair
  }
  // A query block of the causal kernels sees no key when its last row's right bound is below the
  // first key: the first block's, (0 + 1)·block_m + seqlen_k − seqlen_q + window_right <= 0
  // (mainloop.cuh, key_range; a left window never empties a block: tests/kernels/test_key_tiles.cpp).
  const bool empty_blocks = causal && a.block_m + a.seqlen_k - a.seqlen_q + a.window_right <= 0;
  // Varlen: a sequence shorter than the longest leaves tiles past its rows (mainloop.cuh, tile_keys).
  a.every_tile_has_keys = !virtual_tiles && !empty_blocks && a.cu_seqlens_q == nullptr;
  a.div_m = FastDiv(a.m_blocks);
  a.div_heads = FastDiv(a.heads);
  a.div_hb = FastDiv(int(heads_batch));
  a.div_grid = FastDiv(grid);
  a.div_half = FastDiv(a.m_blocks / 2);
  a.div_nh2 = FastDiv(virtual_tiles || !paired ? 1 : int(heads_batch - 2LL * a.tail_hp0));
}
// CTAs: one per tile, or persistent (at most one per SM, at most one per work unit).
inline int grid_size(int mode, int m_blocks, long long heads_batch, int sm_count) {
  const long long units =
      paired_mode(mode) ? paired_units(m_blocks, heads_batch) : m_blocks * heads_batch;
  return mode == kOnePerCta || units < sm_count ? int(units) : sm_count;
}

}  // namespace flashattn::cuda::sm90
