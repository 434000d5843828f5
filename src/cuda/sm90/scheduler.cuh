// Which (query block, head, batch) tiles a CTA works on.
//
// Tile index order: query block fastest (reversed for causal, so the heaviest blocks go first),
// then head, then batch; CTAs that run at the same time share a head and so its K/V in L2.
// Four grids, chosen on the host (FwdArgs::sched, sched_mode below):
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
//   kSnake (causal d64, at least as many pairs as SMs): persistent; tiles ordered heaviest
//       first over all heads, round r gives CTA c tile r·G + c (r even) or r·G + G−1−c (r odd).
//       Balanced, but a head's query blocks run rounds apart: with many heads its K/V has left L2
//       in between (session 5: at N = 512, 512 heads' K/V = 128 MiB re-read from DRAM per query
//       block). It was the short-causal default until session 5; d64 keeps it (sched_mode).
#pragma once

#include "cuda/sm90/launch.hpp"

namespace flashattn::cuda::sm90 {

enum SchedMode : int { kStrided = 0, kOnePerCta = 1, kSnake = 2, kPaired = 3 };

struct TileCoord {
  int m_block, head, batch;  // m_block >= FwdArgs::m_blocks: a virtual tile (kPaired, odd M)
};

template <bool kCausal>
struct TileScheduler {
  int m_blocks, heads, hb_total, total, mode;
  __device__ explicit TileScheduler(const FwdArgs& a)
      : m_blocks(a.m_blocks), heads(a.heads), hb_total(a.heads * a.batch), mode(a.sched) {
    // kPaired: slot 2u + s is tile s (0 heavy, 1 light) of pair u; M pairs per two heads
    total = kCausal && mode == kPaired ? 2 * m_blocks * ((hb_total + 1) / 2) : m_blocks * hb_total;
  }
  // Tile index of this CTA's k-th round; >= total when the CTA is done.
  __device__ int tile(int k) const {
    const int g = int(gridDim.x), c = int(blockIdx.x);
    if (kCausal && mode == kPaired) return 2 * ((k >> 1) * g + c) + (k & 1);
    return k * g + (mode == kSnake && (k & 1) ? g - 1 - c : c);
  }
  __device__ bool valid(int idx) const { return idx < total; }
  __device__ TileCoord coord(int idx) const {
    if (kCausal && mode == kPaired) {
      const int u = (idx >> 1) % m_blocks, s = idx & 1, half = m_blocks / 2;
      int hb = 2 * ((idx >> 1) / m_blocks), m;
      if (u < 2 * half) {  // (M−1−p, p) of one head of the pair
        hb += u / half;
        m = s ? u % half : m_blocks - 1 - u % half;
      } else {             // M odd: the middle blocks of both heads
        hb += s;
        m = half;
      }
      if (hb >= hb_total) return {m_blocks, 0, 0};  // virtual: past the last head
      return {m, hb % heads, hb / heads};
    }
    if (kCausal && mode == kSnake) {  // heaviest query block of every head first
      const int hbs = total / m_blocks, m_rev = idx / hbs, hb = idx % hbs;
      return {m_blocks - 1 - m_rev, hb % heads, hb / heads};
    }
    const int m = idx % m_blocks, hb = idx / m_blocks;
    return {kCausal ? m_blocks - 1 - m : m, hb % heads, hb / heads};
  }
};

// The grid's mode when the host does not force one.
inline long long paired_units(int m_blocks, long long heads_batch) { return m_blocks * ((heads_batch + 1) / 2); }
// Causal d64 takes the snake: its kernel times (CUPTI, H200, session 6) were 5–6 % shorter than
// paired at N = 512 and 8192 (d128/d256: paired 7–13 % shorter at N ≤ 2048, 2 % at 8192).
inline int sched_mode(bool causal, int head_dim, int m_blocks, long long heads_batch, int sm_count) {
  if (!causal) return kStrided;
  if (paired_units(m_blocks, heads_batch) < sm_count) return kOnePerCta;
  return head_dim == 64 ? kSnake : kPaired;
}
// CTAs: one per tile, or persistent (at most one per SM, at most one per work unit).
inline int grid_size(int mode, int m_blocks, long long heads_batch, int sm_count) {
  const long long units = mode == kPaired ? paired_units(m_blocks, heads_batch) : m_blocks * heads_batch;
  return mode == kOnePerCta || units < sm_count ? int(units) : sm_count;
}

}  // namespace flashattn::cuda::sm90
