// The wgmma accumulator fragment (m64nN, fp32) as the consumer warpgroups of both Hopper kernels
// read and repack it (hopper-sm90.md §1.3, §1.4). Thread t of the warpgroup, register r:
//   row(t, r) = 16·(t/32) + (t%32)/4 + 8·((r>>1)&1),   col(t, r) = 8·(r>>2) + 2·(t%4) + (r&1).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashattn::cuda::sm90 {

__device__ __forceinline__ int acc_row(int t, int r) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((r >> 1) & 1); }
__device__ __forceinline__ int acc_col(int t, int r) { return 8 * (r >> 2) + 2 * (t % 4) + (r & 1); }

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

// Registers [r0, r0 + 32) of an fp32 accumulator (its 64-column slice r0/32) as one row-major
// 64 × 64 fp32 block: the staging layout of the backward's bulk dQ reductions.
template <int N>
__device__ __forceinline__ void stage_block64(float* block, const float (&acc)[N], int t, int r0 = 0) {
#pragma unroll
  for (int r = r0; r < r0 + 32; r += 2)
    *reinterpret_cast<float2*>(block + acc_row(t, r) * 64 + acc_col(t, r) - 2 * r0) = make_float2(acc[r], acc[r + 1]);
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
