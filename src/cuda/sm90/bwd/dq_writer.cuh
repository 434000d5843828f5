// The d64/d128 Hopper backward's dQ writer (bwd/kernel.cuh): warp 1 of the producer warpgroup,
// which adds the consumers' staged dQ blocks to the fp32 accumulator by bulk reductions.
#pragma once

#include "cuda/sm90/args.hpp"
#include "cuda/sm90/bwd/dq_turns.cuh"
#include "cuda/sm90/bwd/query_tiles.hpp"
#include "cuda/sm90/bwd/smem.cuh"
#include "cuda/sm90/primitives/ptx.cuh"
#include "cuda/sm90/seq.cuh"

namespace flashattn::cuda::sm90 {
namespace bwd {

// dQ_accum's 64 × 64 block that consumer warpgroup g adds at query tile m of (batch, head): the
// 64-row block of the tile and head-dim chunk g (d128), or the tile's 64-row block g (d64).
template <class Tile>
__device__ __forceinline__ float* dq_block(const BwdArgs& a, int batch, int head, int m, int g) {
  constexpr bool kSplitQueries = Tile::kChunks == 1;
  const int row64 = m * (Tile::kBlockM / 64) + (kSplitQueries ? g : 0);
  return a.dq_accum + ((static_cast<long long>(batch) * a.heads + head) * (a.m_pad / 64) + row64) * Tile::kChunks * 4096 +
         (kSplitQueries ? 0 : g * 4096);
}

// The dQ writer (warp 1 of the producer warpgroup; lane 0 issues): takes the consumer warpgroups'
// staged dQ blocks in step order (both warpgroups' buffer it & 1 at step it, as DqJob says) and
// adds each to dQ_accum by one bulk reduction. A buffer goes back to its warpgroup once its
// reduction has read it, checked one step later so the reductions run while the next step
// computes: an arrival on the warpgroup's named barrier kDqFreeBar + g, which the warpgroup syncs
// on before it writes a buffer for the third time or more (each of the writer's arrivals, for
// steps 0 .. S − 2, meets one of the warpgroup's syncs, at steps 2 .. S, S the end marker's; a
// named barrier rather than an mbarrier wait, whose spin loop in the consumer made ptxas spill in
// the softcap instance). With kBwdDeterministic each reduction first waits for its turn, and a work
// tile's last turns are completed and passed on before the next tile's first wait (dq_turns.cuh).
// The consumers only stage and arrive; the waits and the issue stay off their path (and the writer
// walks no tiles itself: a second tile loop in the kernel made ptxas spill 40–200 bytes in the
// consumers). A job with batch −1 ends the loop.
constexpr int kDqFreeBar = 1;  // named barriers 1, 2: 128 consumer threads + the writer's warp
template <class Tile, bool kCausal>
__device__ __forceinline__ void bwd_write_dq(const BwdArgs& a, Smem<Tile>& sm, int lane) {
  const bool deterministic = a.flags & kBwdDeterministic;
  DqTurns<2> turns;
  turns.reset();
  for (int it = 0;; ++it) {
    float* blocks[2];
    DqJob job;
    int turn = 0;
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      const int buf = 2 * g + (it & 1);
      ptx::mbar_wait(sm.dq_full + buf, (it >> 1) & 1);
      job = sm.dq_job[buf];
      if (job.batch < 0) {  // both warpgroups are done
        if (lane == 0) {
          ptx::bulk_wait_all();  // the staged blocks must outlive the reductions that read them
          if (deterministic) turns.flush();
        }
        return;
      }
      blocks[g] = dq_block<Tile>(a, job.batch, job.head, job.m, g);
      if (lane == 0) {
        if (deterministic) {
          turn = dq_turn<Tile, kCausal>(a, seq_rows<true>(a, job.batch), job.n_block & (DqJob::kLastStep - 1), job.m);
          turns.wait(a, blocks[g], turn);
        }
        ptx::bulk_reduce_add_f32(blocks[g], sm.dq_stage + buf * 4096, Tile::kDqStageBytes);
        ptx::tma_store_commit();
      }
    }
    if (lane == 0) {
      if (deterministic) turns.added(a, blocks, turn);  // bulk_wait<2>: the previous step's groups complete
      else ptx::bulk_wait_read<2>();                     // the previous step's groups have read their buffers
      if (deterministic && (job.n_block & DqJob::kLastStep)) turns.flush();
    }
    __syncwarp();
    if (it > 0) {
      ptx::named_bar_arrive(kDqFreeBar, 160);
      ptx::named_bar_arrive(kDqFreeBar + 1, 160);
    }
  }
}

}  // namespace bwd
}  // namespace flashattn::cuda::sm90
