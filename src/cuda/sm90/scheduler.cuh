// Which (query block, head, batch) tiles a CTA works on.
//
// Four schedules, chosen on the host (sm90.cu, FwdArgs::sched; FLASHATTN_SM90_FWD_SCHED overrides):
//   kStrided (non-causal default): persistent, min(#SMs, tiles) CTAs, CTA c takes tiles c, c+G,
//       c+2G, …; every tile costs the same, and the producer prefetches the next tile's K and Q
//       while the consumers finish the current one. Order: query block fastest, then head, batch.
//   kDynamic (causal default): persistent, min(#SMs, tiles) CTAs; CTA c starts with tile c and
//       then claims the next unclaimed tile from a global counter (atomicAdd + G), so whichever CTA
//       frees up first takes the heaviest tile left — balanced like kOnePerCta, but each CTA keeps
//       the cross-tile overlap of a persistent one. Order: the (batch, head) pairs are cut into
//       groups of `group_heads` whose K and V fit in about half of L2; inside a group the query
//       block runs slowest, heaviest first (causal: the last block), then the head. CTAs running at
//       the same time therefore work on the few heads of one group (K/V read from L2), and every
//       group ends with its lightest tiles, which fill the gaps at the end of the grid.
//   kOnePerCta (old causal default for long sequences): grid = tiles, query block reversed
//       fastest; the hardware block scheduler hands the next tile to whichever SM frees up first,
//       but no CTA overlaps one tile's tail with the next one's loads.
//   kSnake (old causal default for short sequences): persistent; heaviest first over all heads,
//       round r gives CTA c tile r·G + c (r even) or r·G + G−1−c (r odd), a static balance.
//
// Inside the CTA only the producer thread follows the schedule (and for kDynamic touches the
// counter): it finds the next tile when it starts loading the current one (the atomic's latency
// hides behind the loads; knowing one tile ahead is what lets it prefetch) and passes every tile's
// coordinates to the consumer warps through TileHandoff below, then a sentinel that ends their
// loop. Each CTA stops after its first failed claim, so the counter ends at exactly `total`.
#pragma once

#include "cuda/sm90/launch.hpp"
#include "cuda/sm90/ptx.cuh"

namespace flashattn::cuda::sm90 {

enum SchedMode : int { kStrided = 0, kOnePerCta = 1, kSnake = 2, kDynamic = 3 };

struct TileCoord {
  int m_block, head, batch;
};

// A value the compiler may keep in a uniform register: an OR-reduction over the lanes in `mask`
// where only lane 0 contributes (the others pass 0). The reduction's result is warp-uniform by
// construction (SASS REDUX writes a uniform register), so everything derived from a tile index
// read from memory (coordinates, loop bounds, TMA coordinates) stays in uniform registers, as it
// does for values derived from blockIdx. Without it the producer (24 registers) and d256's
// consumers (240, nearly all taken by the accumulators) spill (nvcc 13.0).
__device__ __forceinline__ int lane0_uniform(unsigned mask, int v) {
  return int(__reduce_or_sync(mask, threadIdx.x % 32 == 0 ? unsigned(v) : 0u));
}

// Known to the producer thread only: the consumers get each tile's coordinates from it
// (TileHandoff), so the schedule's arithmetic never competes for their registers.
template <bool kCausal>
struct TileScheduler {
  int m_blocks, heads, head_batches, total, mode, group_heads;
  int* counter;
  __device__ explicit TileScheduler(const FwdArgs& a)
      : m_blocks(a.m_blocks),
        heads(a.heads),
        head_batches(a.heads * a.batch),
        total(a.m_blocks * a.heads * a.batch),
        mode(a.sched),
        group_heads(a.group_heads),
        counter(a.tile_counter) {}
  // Tile index of this CTA's round k + 1 (>= total: the CTA is done); round 0 is tile blockIdx.x
  // in every schedule. kDynamic claims the next unclaimed tile instead.
  __device__ int next(int k) const {
    if (mode == kDynamic) return lane0_uniform(1u, atomicAdd(counter, 1)) + int(gridDim.x);
    const int g = int(gridDim.x), c = int(blockIdx.x);
    return (k + 1) * g + (mode == kSnake && ((k + 1) & 1) ? g - 1 - c : c);
  }
  __device__ bool valid(int idx) const { return idx < total; }
  __device__ TileCoord coord(int idx) const {
    if (mode == kDynamic) {
      const int span = group_heads * m_blocks;  // tiles of a full group
      const int grp = idx / span, hb0 = grp * group_heads;
      const int gh = min(group_heads, head_batches - hb0);  // the last group may be smaller
      const int r = idx - grp * span, m = r / gh, hb = hb0 + r % gh;
      return {kCausal ? m_blocks - 1 - m : m, hb % heads, hb / heads};
    }
    if (kCausal && mode == kSnake) {  // heaviest query block of every head first
      const int m_rev = idx / head_batches, hb = idx % head_batches;
      return {m_blocks - 1 - m_rev, hb % heads, hb / heads};
    }
    const int m = idx % m_blocks, hb = idx / m_blocks;
    return {kCausal ? m_blocks - 1 - m : m, hb % heads, hb / heads};
  }
};

// One tile as the consumers get it; m_block < 0 is the sentinel that ends the CTA. (Its key
// blocks are recomputed from m_block: one value fewer to carry through the consumers' loop.)
struct TileWork {
  int m_block, head, batch;
};

// Tiles from the producer thread to the consumer warps, for every schedule: a ring of kSlots
// 16-byte slots in shared memory, each with a full barrier (1 arrival: the producer's, after the
// store) and an empty barrier (one arrival per consumer warp, when its lane 0 is done with the
// slot). mbarrier arrive has release and the wait acquire semantics (CTA scope), which order the
// slot's store before its reads and the reads before the next store to it.
// A consumer warp reads its slot twice, at the start of the tile (wait) and again for the
// epilogue (reread, then release), rather than keeping the coordinates in registers through the
// main loop: d256's consumers have none to spare there. Three slots keep the producer from ever
// waiting: it publishes tile k after issuing tile k−1's loads, which waited for the consumers to
// release sQ of tile k−2, so they had finished tile k−3's epilogue and freed its slot.
// The k-th tile (k = 0, 1, …, the sentinel included) uses slot k % kSlots with phase
// (k / kSlots) & 1 on both sides: the same counting as the K/V ring (mainloop.cuh).
struct TileHandoff {
  static constexpr int kSlots = 3;
  static constexpr int kBytes = kSlots * (16 + 8 + 8);  // slots, then full and empty barriers
  int4* slot;       // [kSlots]
  uint64_t* full;   // [kSlots]
  uint64_t* empty;  // [kSlots]

  __device__ static TileHandoff carve(uint8_t* raw) {  // raw: 16-byte aligned, kBytes
    TileHandoff h;
    h.slot = reinterpret_cast<int4*>(raw);
    h.full = reinterpret_cast<uint64_t*>(h.slot + kSlots);
    h.empty = h.full + kSlots;
    return h;
  }
  __device__ void init(int consumer_warps) const {
    for (int s = 0; s < kSlots; ++s) {
      ptx::mbar_init(full + s, 1);
      ptx::mbar_init(empty + s, consumer_warps);
    }
  }
  // Producer thread: publish the k-th tile.
  __device__ void put(int k, const TileWork& w) const {
    const int s = k % kSlots;
    ptx::mbar_wait(empty + s, ((k / kSlots) & 1) ^ 1);  // fresh barrier: parity 1 passes at once
    slot[s] = make_int4(w.m_block, w.head, w.batch, 0);
    ptx::mbar_arrive(full + s);
  }
  // Every thread of a consumer warp: the k-th tile (lane 0 waits for it and reads it; the
  // reductions hand the values to the other lanes and reconverge the warp for the wgmmas).
  __device__ TileWork wait(int k) const { return read(k, true, false); }
  // The same tile again, and the slot freed (the warp is done with it).
  __device__ TileWork reread_release(int k) const { return read(k, false, true); }

 private:
  __device__ TileWork read(int k, bool wait_full, bool release) const {
    const int s = k % kSlots;
    int4 v = make_int4(0, 0, 0, 0);
    if (threadIdx.x % 32 == 0) {
      if (wait_full) ptx::mbar_wait(full + s, (k / kSlots) & 1);
      asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];\n"  // volatile: really read it again
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(ptx::smem_addr(slot + s))
                   : "memory");
      if (release) ptx::mbar_arrive(empty + s);
    }
    return {lane0_uniform(~0u, v.x), lane0_uniform(~0u, v.y), lane0_uniform(~0u, v.z)};
  }
};

// ---- host side: the choice of schedule and grid (sm90.cu) ----------------------------------------
// kv_bytes_per_head = 2 · seqlen_k · head_dim · 2 (K and V of one KV head).
// The previous causal policy, kept for comparisons (FLASHATTN_SM90_FWD_SCHED=static): snake while
// the concurrent CTAs' heads fit in 2/3 of L2, else one CTA per tile.
inline int static_sched_mode(bool causal, long long kv_bytes_per_head, int concurrent_ctas, long long l2_bytes) {
  if (!causal) return kStrided;
  return kv_bytes_per_head * concurrent_ctas * 3 <= l2_bytes * 2 ? kSnake : kOnePerCta;
}
// kDynamic's group: as many KV heads as fill half of L2 (the other half holds Q, O and whatever
// else streams through), times the query heads sharing each KV head (GQA), so that a group never
// splits a KV head's query heads; at least one.
inline int dynamic_group_heads(long long kv_bytes_per_head, long long l2_bytes, int gqa_group, int head_batches) {
  long long kv_heads = l2_bytes / 2 / (kv_bytes_per_head > 0 ? kv_bytes_per_head : 1);
  if (kv_heads < 1) kv_heads = 1;
  const long long g = kv_heads * gqa_group;
  return g < head_batches ? int(g) : head_batches;
}
inline int grid_size(int mode, int tiles, int sm_count) {
  return mode == kOnePerCta || tiles < sm_count ? tiles : sm_count;
}

}  // namespace flashattn::cuda::sm90
