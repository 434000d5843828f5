// The Hopper backward's prologue and producer thread (TMA loads of K, V, then Q and dO per step):
// shared by both backward kernels (kernel.cuh, kernel_wide.cuh).
#pragma once

#include "cuda/sm90/args.hpp"
#include "cuda/sm90/bwd/tile.cuh"
#include "cuda/sm90/primitives/ptx.cuh"

namespace flashattn::cuda::sm90 {
namespace bwd {

// Both backward kernels' start: thread 0 prefetches the four TMA descriptors and initializes the
// mbarriers, then the whole CTA meets.
template <class Sm>
__device__ __forceinline__ void bwd_prologue(const BwdArgs& a, Sm& sm) {
  if (threadIdx.x == 0) {
    ptx::tma_prefetch_desc(&a.tm_q);
    ptx::tma_prefetch_desc(&a.tm_k);
    ptx::tma_prefetch_desc(&a.tm_v);
    ptx::tma_prefetch_desc(&a.tm_do);
    sm.init_barriers();
  }
  __syncthreads();
}

// Both backward kernels' producer thread: over this CTA's work tiles, K and V once per tile (after
// both consumer warpgroups released the previous tile's: a fresh barrier passes), then
// load_step(it, head, m, batch) for each (query head of the group, query tile) step, head-major,
// it counting the steps over the CTA's life (the ring positions continue across tiles), each
// preceded by an L2 prefetch of the step's LSE and D. kKVTxBytes: the
// bytes K and V bring together (head_dim 192 on the d256 kernel loads 3 of the 4 chunks).
template <class Tile, bool kCausal, bool kVarlen, int kKVTxBytes = 2 * Tile::kKVBytes, class Sm, class LoadStep>
__device__ __forceinline__ void bwd_produce(const BwdArgs& a, Sm& sm, LoadStep load_step) {
  const int tiles = a.n_blocks * a.heads_kv * a.batch;
  int it = 0, kv_loads = 0;
  for (long long idx = blockIdx.x; idx < tiles; idx += gridDim.x) {
    const BwdTileCoord tc = bwd_tile<Tile, kCausal, kVarlen>(a, int(idx));
    if (tc.steps == 0) continue;
    ptx::mbar_wait(sm.empty_kv, (kv_loads++ & 1) ^ 1);
    ptx::mbar_arrive_expect_tx(sm.full_kv, kKVTxBytes);
    const int key_row = tc.seq.k_start + tc.n_block * Tile::kBlockN;
    ptx::tma_load_tile<Tile::kChunks, Tile::kBlockN>(a.x_chunks, sm.k, &a.tm_k, sm.full_kv, key_row, tc.head_kv, tc.seq.batch);
    ptx::tma_load_tile<Tile::kChunks, Tile::kBlockN>(a.x_chunks, sm.v, &a.tm_v, sm.full_kv, key_row, tc.head_kv, tc.seq.batch);
    for (int st = 0; st < tc.steps; ++st, ++it) {
      const int head = tc.head_kv * a.group + st / tc.m_count, m = tc.m_begin + st % tc.m_count;
      // The consumers read this step's LSE and D with plain loads: have them in L2 by then (at
      // short N a query tile's statistics are read by only a few CTAs, the first read misses).
      const long long row = stat_row<Tile>(a, tc.batch, head, m);
      ptx::bulk_prefetch_l2(a.lse_log2 + row, Tile::kBlockM * 4);
      ptx::bulk_prefetch_l2(a.dsum + row, Tile::kBlockM * 4);
      load_step(it, head, tc.seq.q_start + m * Tile::kBlockM, tc.seq.batch);  // the step's first query row
    }
  }
}

}  // namespace bwd
}  // namespace flashattn::cuda::sm90
