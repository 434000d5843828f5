// Hopper forward, bf16, head_dim 64, causal.
#include "cuda/sm90/fwd/kernel.cuh"

namespace flashattn::cuda::sm90 {
template cudaError_t launch_fwd<64, false, true>(const FwdArgs&, cudaStream_t);
}  // namespace flashattn::cuda::sm90
