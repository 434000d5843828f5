// The Hopper forward's pipeline bookkeeping, host and device (mainloop.cuh): the ring positions
// that the producer and the consumers carry across a CTA's tiles, the stage and barrier phase of a
// ring position, and the consumer warpgroups' turn barriers. tests/kernels/test_mbarrier_protocols.cpp
// and test_sync_protocols.cpp build the hand-offs they check from these.
#pragma once

#include <cstdint>

#include "cuda/sm90/primitives/hd.hpp"

namespace flashattn::cuda::sm90 {

// Ring state carried across the tiles of a persistent CTA (identical on producer and consumers).
struct PipeState {
  int kv_it = 0;    // K/V tiles consumed so far: stage = kv_it % kStages, phase = (kv_it / kStages) & 1
  int q_loads = 0;  // full_q phases so far: Q loads and tiles without keys (full_q parity)
  int tiles = 0;    // tiles finished so far (empty_q parity)
};

// Position g of a ring of kStages buffers (the K/V ring: PipeState::kv_it; sQ, one buffer: q_loads
// on the full side, tiles on the empty side): its stage, and the phase of that stage's barriers
// that it completes. A wait for the full barrier takes that parity; the producer's wait for the
// empty barrier takes parity ^ 1, the previous phase (a fresh barrier's passes at once).
template <int kStages>
FLASHATTN_HD int ring_stage(int g) { return g % kStages; }
template <int kStages>
FLASHATTN_HD uint32_t ring_phase(int g) { return (g / kStages) & 1; }

// The consumer warpgroups' ping-pong turn barriers (Consumer::turn_begin / turn_end): named barriers
// kFirst … kFirst + kWGs − 1, one per warpgroup, after the per-warpgroup epilogue barriers 1 … kWGs.
// A turn syncs on the warpgroup's own barrier and hands on with an arrival on the next one's (all
// but the rotation's very last turn: that test stays in turn_end, where a function of it made
// different code of the 3-warpgroup kernels).
template <int kWGs>
struct TurnBarriers {
  static constexpr int kFirst = 1 + kWGs;
  FLASHATTN_HD static int own(int wg) { return kFirst + wg; }
  FLASHATTN_HD static int next(int wg) { return kFirst + (wg + 1) % kWGs; }
};

}  // namespace flashattn::cuda::sm90
