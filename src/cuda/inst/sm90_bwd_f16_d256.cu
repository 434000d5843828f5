// Hopper backward, f16, head_dim 256 (kernel_bwd_wide.cuh).
#include "cuda/sm90/kernel_bwd.cuh"

namespace flashattn::cuda::sm90 {
template cudaError_t launch_bwd<256, true, false>(const BwdArgs&, cudaStream_t);
}  // namespace flashattn::cuda::sm90
