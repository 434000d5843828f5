// Explicit instantiation: sm80 flash bwd, bf16, head_dim 192.
#include "cuda/sm80/flash_bwd.cuh"

template void flashattn::cuda::sm80::run_flash_bwd<__nv_bfloat16, 192>(const flashattn::cuda::AttnArgs&,
                                                               cudaStream_t);
