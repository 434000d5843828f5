// Options::deterministic on the Hopper backward: the bulk reductions into one dQ block taken in the
// fixed order of query_tiles.hpp dq_turn. The thread that issues the reductions (the dQ writer's
// lane 0 in the d64/d128 kernel, bwd/dq_writer.cuh; thread 0 of each consumer warpgroup in the d256
// kernel) waits before each one until the block's counter (BwdArgs::dq_turn) shows its turn, and
// advances the counter once that reduction has completed: deferred to the next step's issue
// (bulk_wait<kBlocks>: the earlier groups are then usually long done), or to the end of the work
// tile. The d256 kernel keeps the state in shared memory, one per consumer warpgroup (held in the
// consumers' registers across the steps, it made them spill); the dQ writer in its registers.
#pragma once

#include "cuda/sm90/args.hpp"
#include "cuda/sm90/primitives/ptx.cuh"

namespace flashattn::cuda::sm90 {
namespace bwd {

// kBlocks: the dQ blocks one step adds (one bulk group each); they share a turn.
template <int kBlocks>
struct DqTurns {
  int* held[kBlocks];  // the counters of the last step's blocks, not advanced yet (null: none)
  int next;            // the value they advance to

  __device__ void reset() { held[0] = nullptr; }
  // The counter of dQ block `block` (a 64 × 64 block of BwdArgs::dq_accum).
  __device__ static int* counter(const BwdArgs& a, const float* block) {
    return a.dq_turn + (block - a.dq_accum) / 4096;
  }
  // Before the reduction into `block`: wait until `turn` key tiles have added to it.
  __device__ static void wait(const BwdArgs& a, const float* block, int turn) {
    const int* c = counter(a, block);
    while (ptx::ld_acquire_gpu(c) != turn) __nanosleep(32);
    ptx::fence_proxy_async_global();  // the acquire before this thread's async-proxy reduction
  }
  // After this step's kBlocks reductions were committed: advance the previous step's counters (their
  // groups are the older ones), then hold this step's.
  __device__ void added(const BwdArgs& a, float* const (&blocks)[kBlocks], int turn) {
    if (held[0] != nullptr) {
      ptx::bulk_wait<kBlocks>();
      release();
    }
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) held[b] = counter(a, blocks[b]);
    next = turn + 1;
  }
  // At the end of a work tile (or before any wait that could depend on it): complete and advance.
  __device__ void flush() {
    if (held[0] == nullptr) return;
    ptx::bulk_wait_all();
    release();
  }

 private:
  __device__ void release() {
    ptx::fence_proxy_async_global();  // the completed reductions' writes before the release store
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      ptx::st_release_gpu(held[b], next);
      held[b] = nullptr;
    }
  }
};

}  // namespace bwd
}  // namespace flashattn::cuda::sm90
