// The standard (materializing) algorithm on CUDA: cuBLAS GEMMs around softmax kernels.
#pragma once

#include <cuda_runtime.h>

#include "core/params.hpp"

namespace flashattn::cuda::standard {
void forward(const detail::Params& p, cudaStream_t stream);
void backward(const detail::Params& p, cudaStream_t stream);
}  // namespace flashattn::cuda::standard
