// The wgmma issue loops the Hopper kernels share (forward mainloop.cuh, backward bwd/kernel.cuh and
// bwd/kernel_wide.cuh). Issue only: the caller fences its operands, commits and waits.
// Operand tiles live in smem as 64-element (128-byte) column chunks with the 128B swizzle
// (docs/hopper-sm90.md §2); `*_chunk` is the byte distance between two column chunks of a tile
// (its rows × 128).
#pragma once

#include <cstdint>

#include "cuda/sm90/primitives/ptx.cuh"
#include "cuda/sm90/primitives/wgmma.cuh"

namespace flashattn::cuda::sm90 {

// kStepped (the forward): each k16 step's descriptor is the tile's (ptx::SmemDescSw128, formed
// once) plus the step's offset / 16 in its low half, 1 uniform instruction per wgmma; its loops
// are 5–9 % shorter (docs/perf/log.md, P-121). Otherwise (the backward) each step's descriptor is formed from
// its address (mask, shift, OR: ~5 per wgmma): the stepped form made the d128 backward spill more.

// acc (64 × N) = A·Bᵀ: A (64 rows at a) and B (N rows at b) both K-major over kK elements;
// k16 step s = chunk s/4, +32 B inside the 128-byte row.
template <int N, bool kF16, int kK, bool kStepped = false>
__device__ __forceinline__ void gemm_kk(float (&acc)[N / 2], uint32_t a, uint32_t a_chunk, uint32_t b,
                                        uint32_t b_chunk) {
  if constexpr (kStepped) {
    const ptx::SmemDescSw128 da(a, 16, 1024), db(b, 16, 1024);
#pragma unroll
    for (int s = 0; s < kK / 16; ++s)
      Wgmma<N, kF16, 0>::ss(acc, da.at((s / 4) * a_chunk + (s % 4) * 32), db.at((s / 4) * b_chunk + (s % 4) * 32), s > 0);
  } else {
#pragma unroll
    for (int s = 0; s < kK / 16; ++s) {
      const uint64_t da = ptx::smem_desc_sw128(a + (s / 4) * a_chunk + (s % 4) * 32, 16, 1024);
      const uint64_t db = ptx::smem_desc_sw128(b + (s / 4) * b_chunk + (s % 4) * 32, 16, 1024);
      Wgmma<N, kF16, 0>::ss(acc, da, db, s > 0);
    }
  }
}

// acc (64 × N) += A·B: A in registers (k16 slice s in a[s], the accumulator layout of §1.4),
// B MN-major (16 k-rows = +2048 B per step, N columns in chunks b_chunk apart).
template <int N, bool kF16, int kSteps, bool kStepped = false>
__device__ __forceinline__ void gemm_rs_mn(float (&acc)[N / 2], const uint32_t (&a)[kSteps][4], uint32_t b,
                                           uint32_t b_chunk) {
  if constexpr (kStepped) {
    const ptx::SmemDescSw128 db(b, b_chunk, 1024);
#pragma unroll
    for (int s = 0; s < kSteps; ++s) Wgmma<N, kF16, 1>::rs(acc, a[s], db.at(s * 2048), 1);
  } else {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) Wgmma<N, kF16, 1>::rs(acc, a[s], ptx::smem_desc_sw128(b + s * 2048, b_chunk, 1024), 1);
  }
}

// acc (64 × N) = A·B with A and B both MN-major (k16 step = +2048 B in each): dQ = dS·K of the
// backward, A = the staged dSᵀ read transposed.
template <int N, bool kF16, int kSteps>
__device__ __forceinline__ void gemm_mn_mn(float (&acc)[N / 2], uint32_t a, uint32_t a_chunk, uint32_t b,
                                           uint32_t b_chunk) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s)
    WgmmaMN<N, kF16>::ss(acc, ptx::smem_desc_sw128(a + s * 2048, a_chunk, 1024),
                         ptx::smem_desc_sw128(b + s * 2048, b_chunk, 1024), s > 0);
}

}  // namespace flashattn::cuda::sm90
