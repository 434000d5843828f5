// The Hopper backward's epilogue: dK and dV from the accumulators to the caller's tensors.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/sm90/args.hpp"
#include "cuda/sm90/primitives/fragment.cuh"
#include "cuda/sm90/seq.cuh"

namespace flashattn::cuda::sm90 {
namespace bwd {

// Epilogue of both backward kernels: this warpgroup's dV and scale·dK straight from the
// accumulators to the caller's tensors — key rows key_row0 and key_row0 + 8 (keys past seqlen_k
// are not written), head-dim columns col0 + acc_col; with kClip (the d128 kernel, which also runs
// head_dim 96) only those below BwdArgs::cols.
template <bool kF16, bool kClip, int kRegs>
__device__ __forceinline__ void store_dk_dv(const BwdArgs& a, const SeqRows& s, int head_kv, int col0, int key_row0,
                                            const float (&acc_dk)[kRegs], const float (&acc_dv)[kRegs], int t) {
  using T = typename std::conditional<kF16, __half, __nv_bfloat16>::type;
  T* dk = static_cast<T*>(a.dk) + s.batch * a.dk_batch_stride + s.k_start * a.dk_row_stride +
          head_kv * a.dk_head_stride + col0;
  T* dv = static_cast<T*>(a.dv) + s.batch * a.dv_batch_stride + s.k_start * a.dv_row_stride +
          head_kv * a.dv_head_stride + col0;
#pragma unroll
  for (int r = 0; r < kRegs; r += 2) {
    const int key = key_row0 + 8 * ((r >> 1) & 1), col = acc_col(t, r);
    if (key < s.k_len && (!kClip || col0 + col < a.cols)) {  // cols, col even: both columns or neither
      *reinterpret_cast<uint32_t*>(dv + key * a.dv_row_stride + col) = pack2<kF16>(acc_dv[r], acc_dv[r + 1]);
      *reinterpret_cast<uint32_t*>(dk + key * a.dk_row_stride + col) =
          pack2<kF16>(acc_dk[r] * a.scale, acc_dk[r + 1] * a.scale);
    }
  }
}

}  // namespace bwd
}  // namespace flashattn::cuda::sm90
