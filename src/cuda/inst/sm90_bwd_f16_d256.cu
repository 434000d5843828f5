// Hopper backward, f16, head_dim 256 (bwd/kernel_wide.cuh).
#include "cuda/sm90/bwd/launch.cuh"

namespace flashattn::cuda::sm90 {
template cudaError_t launch_bwd<256, true, false>(const BwdArgs&, cudaStream_t);
}  // namespace flashattn::cuda::sm90
