// Explicit instantiation: sm80 flash bwd, f16, head_dim 32.
#include "cuda/sm80/flash_bwd.cuh"

template void flashattn::cuda::sm80::run_flash_bwd<__half, 32>(const flashattn::cuda::AttnArgs&,
                                                               cudaStream_t);
