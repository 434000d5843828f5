// Entry points of the KV-cache attention kernels; one explicit instantiation per (dtype, head dim)
// lives in src/cuda/inst/kv_*.cu. T is __half or __nv_bfloat16; kHeadDim (64, 128, 256) is the
// call's head_dim rounded up (the tail columns are zero-filled on load and never stored); kWarpsM
// picks the CTA shape (attend.cuh: 1 = decode, 16 packed query rows; 4 = prefill, 64 rows).
#pragma once

#include <cuda_runtime.h>

#include "cuda/kvcache/kv_args.hpp"

namespace flashattn::cuda::kv {

// Launches kv_attend_kernel over a.batch · a.heads_kv · row blocks · a.splits CTAs; after_kernel:
// the call launched a kernel before it on the stream (the attend kernel is then launched as its
// programmatic dependent, common/dependent_launch.cuh).
template <class T, int kHeadDim, int kWarpsM>
void run_attend(const KvArgs& a, bool after_kernel, cudaStream_t stream);

// CTAs of that kernel resident per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor, its shared
// memory included), for the split choice.
template <class T, int kHeadDim, int kWarpsM>
int attend_ctas_per_sm();

// Packed query rows per CTA of each shape.
constexpr int block_rows(int warps_m) { return 16 * warps_m; }

}  // namespace flashattn::cuda::kv
