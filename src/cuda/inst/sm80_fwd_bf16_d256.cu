// Explicit instantiation: sm80 flash fwd, bf16, head_dim 256.
#include "cuda/sm80/flash_fwd.cuh"

template void flashattn::cuda::sm80::run_flash_fwd<__nv_bfloat16, 256>(const flashattn::cuda::AttnArgs&,
                                                               cudaStream_t);
