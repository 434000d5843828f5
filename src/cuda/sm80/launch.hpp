// Entry points of the sm80 kernels; one explicit instantiation per (dtype, head_dim) lives in
// src/cuda/inst/. T is __half or __nv_bfloat16; kHeadDim is the kernel's head dim (the call's
// head_dim rounded up to it; the tail columns are zero-filled on load and never stored).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/args.hpp"

namespace flashattn::cuda::sm80 {

template <class T, int kHeadDim>
void run_flash_fwd(const AttnArgs& a, cudaStream_t stream);

// a.dsum must point to batch*heads*seqlen_q floats of scratch (dense, (b, h, i)).
template <class T, int kHeadDim>
void run_flash_bwd(const AttnArgs& a, cudaStream_t stream);

}  // namespace flashattn::cuda::sm80
