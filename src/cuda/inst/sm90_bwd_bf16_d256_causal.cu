// Hopper backward, bf16, head_dim 256, causal (bwd/kernel_wide.cuh).
#include "cuda/sm90/bwd/launch.cuh"

namespace flashattn::cuda::sm90 {
template cudaError_t launch_bwd<256, false, true>(const BwdArgs&, cudaStream_t);
}  // namespace flashattn::cuda::sm90
