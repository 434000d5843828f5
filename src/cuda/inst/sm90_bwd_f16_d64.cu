// Hopper backward, f16, head_dim 64, non-causal.
#include "cuda/sm90/bwd/launch.cuh"

namespace flashattn::cuda::sm90 {
template cudaError_t launch_bwd<64, true, false>(const BwdArgs&, cudaStream_t);
}  // namespace flashattn::cuda::sm90
