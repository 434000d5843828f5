// The rows of one sequence, for the forward's and the backward's kernels alike (FwdArgs and
// BwdArgs carry the same seqlen_q/k and cu_seqlens_q/k fields; launch.hpp).
#pragma once

#include "cuda/sm90/primitives/ptx.cuh"
#include "cuda/sm90/seq_rows.hpp"

namespace flashattn::cuda::sm90 {

// kVarlen false: a kernel (instance) without varlen, nothing loaded. True: varlen when the args
// carry cu_seqlens_q (the forward's varlen instance always; the backward's d64/d128 kernel serves
// both). Loaded with loads the compiler keeps where they are: the kernels load it where it is
// used, so no register holds it across a main loop (held there, consumers spilled).
template <bool kVarlen, class Args>
__device__ __forceinline__ SeqRows seq_rows(const Args& a, int b) {
  if (!kVarlen || a.cu_seqlens_q == nullptr) return {0, 0, a.seqlen_q, a.seqlen_k, b};
  const int q0 = ptx::ld_global_nc_reload(a.cu_seqlens_q + b), k0 = ptx::ld_global_nc_reload(a.cu_seqlens_k + b);
  return {q0, k0, ptx::ld_global_nc_reload(a.cu_seqlens_q + b + 1) - q0,
          ptx::ld_global_nc_reload(a.cu_seqlens_k + b + 1) - k0, 0};
}

}  // namespace flashattn::cuda::sm90
