// Row reductions over the 4 lanes of a quad. In both the mma.sync (m16n8k16) and the wgmma
// accumulator layouts a score row lives in the 4 lanes that share l/4, so a row's max or sum is a
// thread-local reduction plus two xor-shuffles.
#pragma once

namespace flashattn::cuda {

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace flashattn::cuda
