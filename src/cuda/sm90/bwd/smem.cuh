// The d64/d128 Hopper backward's shared memory (bwd/kernel.cuh): K, V, the Q/dO ring, the dSᵀ
// and dQ staging buffers, their mbarriers and the jobs the consumers hand the dQ writer.
#pragma once

#include <cstdint>

#include "cuda/sm90/primitives/ptx.cuh"

namespace flashattn::cuda::sm90 {
namespace bwd {

// One staged dQ block, as a consumer warpgroup hands it to the dQ writer (bwd_write_dq): the step's
// query tile, head, batch and key tile (kLastStep: the work tile's last step). Batch −1: the
// warpgroup has no more steps.
struct DqJob {
  int m, head, batch, n_block;
  static constexpr int kLastStep = 1 << 30;
};

template <class Tile>
struct Smem {
  uint8_t* k;
  uint8_t* v;
  uint8_t* q;   // stage s at + s·kQBytes
  uint8_t* dO;
  uint8_t* ds;  // buffer b at + b·kDSBytes
  float* dq_stage;  // warpgroup g, buffer b at + (2g + b)·64·64
  uint64_t* full_kv;
  uint64_t* empty_kv;  // both consumer warpgroups are done with this tile's K and V
  uint64_t* full;   // [kStages]: Q and dO of one query tile
  uint64_t* empty;  // [kStages]: both consumer warpgroups are done with the stage
  uint64_t* dq_full;   // [2g + b]: warpgroup g's dQ block is in its buffer b (one arrival per warp)
  DqJob* dq_job;       // [2g + b]: what buffer b of warpgroup g holds (bwd_write_dq)

  __device__ static Smem carve(uint8_t* raw) {
    uint8_t* base = ptx::align_1024(raw);
    Smem s;
    s.k = base;
    s.v = s.k + Tile::kKVBytes;
    s.q = s.v + Tile::kKVBytes;
    s.dO = s.q + Tile::kStages * Tile::kQBytes;
    s.ds = s.dO + Tile::kStages * Tile::kQBytes;
    s.dq_stage = reinterpret_cast<float*>(s.ds + 2 * Tile::kDSBytes);
    uint64_t* bars = reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(s.dq_stage) + 4 * Tile::kDqStageBytes);
    s.full_kv = bars;
    s.empty_kv = bars + 1;
    s.full = bars + 2;
    s.empty = s.full + Tile::kStages;
    s.dq_full = s.empty + Tile::kStages;
    s.dq_job = reinterpret_cast<DqJob*>(s.dq_full + 2 * Tile::kConsumerWGs);
    return s;
  }
  static constexpr int kBytes = 1024 + Tile::kSmemBytes + 8 * (2 + 2 * Tile::kStages + 2 * Tile::kConsumerWGs) +
                                2 * Tile::kConsumerWGs * int(sizeof(DqJob));

  __device__ void init_barriers() {
    ptx::mbar_init_ring(full_kv, empty_kv, 1, Tile::kConsumerWGs);
    ptx::mbar_init_ring(full, empty, Tile::kStages, Tile::kConsumerWGs);
    for (int i = 0; i < 2 * Tile::kConsumerWGs; ++i) ptx::mbar_init(dq_full + i, 4);  // one arrival per warp
    ptx::fence_barrier_init();
  }
};

}  // namespace bwd
}  // namespace flashattn::cuda::sm90
