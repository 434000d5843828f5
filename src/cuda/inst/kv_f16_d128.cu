// Explicit instantiation: KV-cache attention, f16, head_dim 128, both CTA shapes.
#include "cuda/kvcache/attend_launch.cuh"

template void flashattn::cuda::kv::run_attend<__half, 128, 1>(const flashattn::cuda::kv::KvArgs&, bool, cudaStream_t);
template void flashattn::cuda::kv::run_attend<__half, 128, 4>(const flashattn::cuda::kv::KvArgs&, bool, cudaStream_t);
template int flashattn::cuda::kv::attend_ctas_per_sm<__half, 128, 1>();
template int flashattn::cuda::kv::attend_ctas_per_sm<__half, 128, 4>();
