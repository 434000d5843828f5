// Hopper forward, bf16, head_dim 256, non-causal.
#include "cuda/sm90/fwd/kernel.cuh"

namespace flashattn::cuda::sm90 {
template cudaError_t launch_fwd<256, false, false>(const FwdArgs&, cudaStream_t);
}  // namespace flashattn::cuda::sm90
