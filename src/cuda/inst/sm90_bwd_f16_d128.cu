// Hopper backward, f16, head_dim 128, non-causal.
#include "cuda/sm90/bwd/launch.cuh"

namespace flashattn::cuda::sm90 {
template cudaError_t launch_bwd<128, true, false>(const BwdArgs&, cudaStream_t);
}  // namespace flashattn::cuda::sm90
