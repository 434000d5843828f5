// Hopper forward, f16, head_dim 64, non-causal.
#include "cuda/sm90/fwd/kernel.cuh"

namespace flashattn::cuda::sm90 {
template cudaError_t launch_fwd<64, true, false>(const FwdArgs&, cudaStream_t);
}  // namespace flashattn::cuda::sm90
