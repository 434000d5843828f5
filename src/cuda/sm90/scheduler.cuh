// Which (query block, head, batch) tiles a CTA works on.
//
// Tile index order: query block fastest (reversed for causal, so the heaviest blocks go first),
// then head, then batch; CTAs that run at the same time share a head and so its K/V in L2.
// Three grids, chosen on the host (FwdArgs::sched):
//   kStrided (non-causal): persistent, min(#SMs, tiles) CTAs, CTA c takes tiles c, c+G, c+2G, …;
//       every tile costs the same, and the producer prefetches the next tile's K and Q while the
//       consumers finish the current one.
//   kOnePerCta (causal, long sequences): grid = tiles; the hardware block scheduler hands the
//       heaviest remaining tile to whichever SM frees up first (a static stride cannot balance
//       tiles of different cost).
//   kSnake (causal, short sequences): persistent; tiles ordered heaviest first over all heads,
//       and round r gives CTA c tile r·G + c (r even) or r·G + G−1−c (r odd), which balances the
//       per-CTA work while keeping the cross-tile overlap that short sequences need. Concurrent
//       CTAs then read different heads, so it is used only while G heads' K and V fit in 2/3 of
//       L2 (measured on H200: +23% d64 N=512, +7% d128 N=512; -13% d256 N=512 and -6% d128
//       N=2048 where they did not fit; docs/perf-log.md, Hopper).
// A dynamic scheduler (atomic tile counter) would cover all three; next step.
#pragma once

#include "cuda/sm90/launch.hpp"

namespace flashattn::cuda::sm90 {

enum SchedMode : int { kStrided = 0, kOnePerCta = 1, kSnake = 2 };

struct TileCoord {
  int m_block, head, batch;
};

template <bool kCausal>
struct TileScheduler {
  int m_blocks, heads, total, mode;
  __device__ explicit TileScheduler(const FwdArgs& a)
      : m_blocks(a.m_blocks), heads(a.heads), total(a.m_blocks * a.heads * a.batch), mode(a.sched) {}
  // Tile index of this CTA's k-th round; >= total when the CTA is done.
  __device__ int tile(int k) const {
    const int g = int(gridDim.x), c = int(blockIdx.x);
    return k * g + (mode == kSnake && (k & 1) ? g - 1 - c : c);
  }
  __device__ bool valid(int idx) const { return idx < total; }
  __device__ TileCoord coord(int idx) const {
    if (kCausal && mode == kSnake) {  // heaviest query block of every head first
      const int hbs = total / m_blocks, m_rev = idx / hbs, hb = idx % hbs;
      return {m_blocks - 1 - m_rev, hb % heads, hb / heads};
    }
    const int m = idx % m_blocks, hb = idx / m_blocks;
    return {kCausal ? m_blocks - 1 - m : m, hb % heads, hb / heads};
  }
};

// kv_bytes_per_head = 2 · seqlen_k · head_dim · 2 (K and V of one head).
inline int sched_mode(bool causal, long long kv_bytes_per_head, int concurrent_ctas, long long l2_bytes) {
  if (!causal) return kStrided;
  return kv_bytes_per_head * concurrent_ctas * 3 <= l2_bytes * 2 ? kSnake : kOnePerCta;
}
inline int grid_size(int mode, int tiles, int sm_count) {
  return mode == kOnePerCta || tiles < sm_count ? tiles : sm_count;
}

}  // namespace flashattn::cuda::sm90
