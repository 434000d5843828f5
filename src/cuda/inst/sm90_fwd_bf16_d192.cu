// Hopper forward, bf16, head_dim 192.
#include "cuda/sm90/fwd/kernel.cuh"

namespace flashattn::cuda::sm90 {
template cudaError_t launch_fwd<192, false, false>(const FwdArgs&, cudaStream_t);
}  // namespace flashattn::cuda::sm90
