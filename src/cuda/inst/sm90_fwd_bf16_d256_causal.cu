// Hopper forward, bf16, head_dim 256, causal.
#include "cuda/sm90/fwd/kernel.cuh"

namespace flashattn::cuda::sm90 {
template cudaError_t launch_fwd<256, false, true>(const FwdArgs&, cudaStream_t);
}  // namespace flashattn::cuda::sm90
