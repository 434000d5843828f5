// Explicit instantiation: KV-cache attention, bf16, head_dim 128, both CTA shapes.
#include "cuda/kvcache/attend_launch.cuh"

template void flashattn::cuda::kv::run_attend<__nv_bfloat16, 128, 1>(const flashattn::cuda::kv::KvArgs&, bool, cudaStream_t);
template void flashattn::cuda::kv::run_attend<__nv_bfloat16, 128, 4>(const flashattn::cuda::kv::KvArgs&, bool, cudaStream_t);
template int flashattn::cuda::kv::attend_ctas_per_sm<__nv_bfloat16, 128, 1>();
template int flashattn::cuda::kv::attend_ctas_per_sm<__nv_bfloat16, 128, 4>();
