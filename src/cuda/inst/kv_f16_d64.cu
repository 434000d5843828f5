// Explicit instantiation: KV-cache attention, f16, head_dim 64, both CTA shapes.
#include "cuda/kvcache/attend_launch.cuh"

template void flashattn::cuda::kv::run_attend<__half, 64, 1>(const flashattn::cuda::kv::KvArgs&, bool, cudaStream_t);
template void flashattn::cuda::kv::run_attend<__half, 64, 4>(const flashattn::cuda::kv::KvArgs&, bool, cudaStream_t);
template int flashattn::cuda::kv::attend_ctas_per_sm<__half, 64, 1>();
template int flashattn::cuda::kv::attend_ctas_per_sm<__half, 64, 4>();
