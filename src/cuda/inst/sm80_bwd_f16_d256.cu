// Explicit instantiation: sm80 flash bwd, f16, head_dim 256.
#include "cuda/sm80/flash_bwd.cuh"

template void flashattn::cuda::sm80::run_flash_bwd<__half, 256>(const flashattn::cuda::AttnArgs&,
                                                               cudaStream_t);
