// The Hopper forward kernel: skeleton (shared memory, barriers, roles) and its host launcher.
//
//   warpgroup 0 (producer): setmaxnreg.dec 24; one thread issues the TMA loads of Q and of the
//                            K/V ring, tile after tile (mainloop.cuh, producer_tile)
//   warpgroups 1, 2 (consumers): setmaxnreg.inc 240; 64 query rows each; S = Q·Kᵀ (wgmma SS),
//                            online softmax in registers, O += P·V (wgmma RS), ping-pong between
//                            the two (mainloop.cuh, Consumer::run), then epilogue.cuh.
// Tiles follow the schedule chosen on the host (scheduler.cuh). Only the producer thread computes
// (for kDynamic: claims) them; it hands each tile's coordinates to the consumers through shared
// memory (TileHandoff), and a sentinel ends their loop.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm90/epilogue.cuh"
#include "cuda/sm90/mainloop.cuh"
#include "cuda/sm90/scheduler.cuh"

namespace flashattn::cuda::sm90 {

template <int kHeadDim, int kBlockM, bool kF16, bool kCausal>
__global__ void __launch_bounds__(FwdTile<kHeadDim, kBlockM>::kThreads, 1)
    fwd_kernel(const __grid_constant__ FwdArgs a) {
  using Tile = FwdTile<kHeadDim, kBlockM>;
  extern __shared__ uint8_t smem_raw[];
  Smem<Tile> sm = Smem<Tile>::carve(smem_raw);
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    ptx::tma_prefetch_desc(&a.tm_q);
    ptx::tma_prefetch_desc(&a.tm_k);
    ptx::tma_prefetch_desc(&a.tm_v);
    ptx::tma_prefetch_desc(&a.tm_o);
    sm.init_barriers();
  }
  __syncthreads();

  PipeState ps;  // ring positions, carried across this CTA's tiles
  if (wg == 0) {
    ptx::setmaxnreg_dec<Tile::kProducerRegs>();
    if (threadIdx.x == 0) {
      // The producer thread alone follows the schedule. It finds the next tile (for kDynamic:
      // claims it) before issuing this one's loads, so the atomic's round trip hides behind them,
      // and hands every tile to the consumers, then the sentinel.
      const TileScheduler<kCausal> sched(a);
      for (int k = 0, idx = int(blockIdx.x);; ++k) {
        if (!sched.valid(idx)) {
          sm.handoff.put(k, TileWork{-1, 0, 0});
          break;
        }
        const int next = sched.next(k);
        const TileCoord tc = sched.coord(idx);
        const int n_blocks = key_blocks<Tile, kCausal>(tc.m_block, a.seqlen_q, a.seqlen_k);
        sm.handoff.put(k, TileWork{tc.m_block, tc.head, tc.batch});
        producer_tile<Tile>(a, sm, ps, tc.m_block, tc.head, tc.batch, n_blocks);
        idx = next;
      }
    }
  } else {
    ptx::setmaxnreg_inc<Tile::kConsumerRegs>();
    using C = Consumer<Tile, kF16, kCausal, kHeadDim>;
    // The ping-pong turns run across tiles (mainloop.cuh): warpgroup 0 takes the first turn here
    // and, after the loop, the turn the last warpgroup handed over last, so no tile needs to know
    // whether it is the CTA's last one.
    C::cta_begin(wg - 1);
    for (int k = 0;; ++k) {
      const TileWork w = sm.handoff.wait(k);
      if (w.m_block < 0) break;
      C c;
      c.run(a, sm, ps, wg - 1, w.m_block, key_blocks<Tile, kCausal>(w.m_block, a.seqlen_q, a.seqlen_k));
      // Read the tile again rather than keep it in registers through run() (d256 has none spare).
      const TileWork t = sm.handoff.reread_release(k);
      const int n_blocks = key_blocks<Tile, kCausal>(t.m_block, a.seqlen_q, a.seqlen_k);
      // A tile with no keys skipped every barrier: make sure the previous tile's TMA store has
      // finished reading sO (thread 0 waits for it) before this epilogue overwrites it. Otherwise
      // the ping-pong barriers in run() already ordered thread 0's wait before these writes.
      if (n_blocks == 0) ptx::named_bar_sync(1 + (wg - 1), 128);
      epilogue<Tile, kF16, kCausal, kHeadDim>(a, sm, c, wg - 1, t.m_block, t.head, t.batch);
      // O was staged in sQ (d256) or the tile had no keys (run() released nothing): release sQ
      // now, after thread 0's wait for the store's smem reads.
      if ((!Tile::kSeparateO || n_blocks == 0) && threadIdx.x % 128 == 0) ptx::mbar_arrive(sm.empty_q);
    }
    C::cta_end(wg - 1);
  }
}

// Host side: launches fwd_kernel for one (head_dim, query tile, dtype, causal); args encoded, the
// schedule and grid chosen (sm90.cu).
template <int kHeadDim, int kBlockM, bool kF16, bool kCausal>
cudaError_t launch_fwd_tile(const FwdArgs& a, cudaStream_t stream) {
  using Tile = FwdTile<kHeadDim, kBlockM>;
  auto kernel = fwd_kernel<kHeadDim, kBlockM, kF16, kCausal>;
  constexpr int smem = Smem<Tile>::kBytes;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  if (a.grid <= 0 || (a.sched == kDynamic && a.tile_counter == nullptr)) return cudaErrorInvalidValue;
  kernel<<<a.grid, Tile::kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

// The query tile was chosen on the host (fwd_block_m; FwdArgs::block_m, the Q map's box).
template <int kHeadDim, bool kF16, bool kCausal>
cudaError_t launch_fwd(const FwdArgs& a, cudaStream_t stream) {
  if constexpr (kHeadDim == 64)
    if (a.block_m == 192) return launch_fwd_tile<kHeadDim, 192, kF16, kCausal>(a, stream);
  if (a.block_m != 128) return cudaErrorInvalidValue;
  return launch_fwd_tile<kHeadDim, 128, kF16, kCausal>(a, stream);
}

}  // namespace flashattn::cuda::sm90
