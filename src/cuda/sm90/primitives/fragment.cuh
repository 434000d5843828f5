// The wgmma accumulator fragment (m64nN, fp32) as the consumer warpgroups of both Hopper kernels
// read and repack it (docs/hopper-sm90.md §1.3, §1.4); where its elements live: acc_layout.hpp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/sm90/primitives/acc_layout.hpp"
#include "cuda/sm90/primitives/ptx.cuh"

namespace flashattn::cuda::sm90 {

// Two floats as one 16-bit pair, lo in bits [15:0].
template <bool kF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kF16) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// The inverse of pack2.
template <bool kF16>
__device__ __forceinline__ float2 unpack2(uint32_t v) {
  if constexpr (kF16) return __half22float2(*reinterpret_cast<const __half2*>(&v));
  else return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}

// Registers [r0, r0 + 32) of an fp32 accumulator (its 64-column slice r0/32) as one 64 × 64 dQ
// block (dq_block_offset) in shared memory: the staging of the backward's bulk dQ reductions. Stored
// as st.shared: through a generic pointer they were generic stores, which wait in the global
// memory queue and made ptxas fence them with a MEMBAR.
template <int N>
__device__ __forceinline__ void stage_block64(float* block, const float (&acc)[N], int t, int r0 = 0) {
  const uint32_t base = ptx::smem_addr(block);
#pragma unroll
  for (int r = r0; r < r0 + 32; r += 2)
    ptx::st_shared_v2_f32(base + 4 * dq_block_offset(acc_row(t, r), acc_col(t, r) - 2 * r0), acc[r], acc[r + 1]);
}

// An m64 accumulator (64 × 16·kSteps) as the register A operand of the next wgmma, k16 slice s in
// a[s]: the layouts line up, so no shuffles (§1.4).
template <bool kF16, int kSteps>
__device__ __forceinline__ void acc_to_a(const float (&acc)[8 * kSteps], uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s)
#pragma unroll
    for (int j = 0; j < 4; ++j) a[s][j] = pack2<kF16>(acc[8 * s + 2 * j], acc[8 * s + 2 * j + 1]);
}

}  // namespace flashattn::cuda::sm90
