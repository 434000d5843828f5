// Hopper backward, f16, head_dim 192, causal: the d256 kernel with its fourth column chunk zero
// (bwd/kernel_wide.cuh, kCols).
#include "cuda/sm90/bwd/launch.cuh"

namespace flashattn::cuda::sm90 {
template cudaError_t launch_bwd<192, true, true>(const BwdArgs&, cudaStream_t);
}  // namespace flashattn::cuda::sm90
