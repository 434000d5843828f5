// What the dispatch (sm90.cu) and the per-configuration instantiations (src/cuda/inst/sm90_*.cu)
// share: the kernel's argument block and the launcher's declaration.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

namespace flashattn::cuda::sm90 {

struct FwdArgs {
  CUtensorMap tm_q, tm_k, tm_v, tm_o;  // 5-D maps (64, rows, D/64, heads, batch), see sm90.cu
  float* lse;                          // may be null
  long long lse_batch_stride, lse_head_stride, lse_row_stride;
  int seqlen_q, seqlen_k, heads, group;  // group = heads / heads_kv
  float scale_log2;                      // scale · log2(e)
  int batch, m_blocks;                   // tiles = m_blocks · heads · batch (scheduler.cuh)
  int sched;                             // SchedMode (scheduler.cuh), set by launch_fwd
};

// Defined in kernel_fwd.cuh; one explicit instantiation per src/cuda/inst/sm90_fwd_*.cu.
template <int kHeadDim, bool kF16, bool kCausal>
cudaError_t launch_fwd(const FwdArgs& a, cudaStream_t stream);

}  // namespace flashattn::cuda::sm90
