// The CUDA backend of forward_kvcache: what its kernels need of the call (Error otherwise), the
// split count, and the launches on the call's stream:
//   [validate]  with check_on_device or under graph capture, over more than kValidateInKernel
//               entries: lengths and page indices checked on the device (fewer: by the first
//               kernel below, in every CTA)
//   [append]    the new tokens into the cache (keys rotated), kv_append_kernel
//   attend      kv_attend_kernel, decode or prefill shape, one CTA per (sequence, KV head, row
//               block, split)
//   [combine]   with several splits, kv_combine_kernel merges them in a fixed order
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "core/backend.hpp"
#include "cuda/common/runtime.hpp"
#include "cuda/kvcache/attend.cuh"
#include "cuda/kvcache/launch.hpp"

namespace flashattn::cuda {
namespace kv {

KvArgs make_kv_args(const detail::KVParams& p) {
  constexpr float kLog2e = 1.4426950408889634f;
  KvArgs a;
  a.q = p.q.data;
  a.out = p.out.data;
  a.q_st = strides_of(p.q);
  a.q_vec16 = reinterpret_cast<uintptr_t>(p.q.data) % 16 == 0 && a.q_st.batch % 8 == 0 && a.q_st.row % 8 == 0 &&
              a.q_st.head % 8 == 0;
  a.out_st = strides_of(p.out);
  a.lse = p.lse.data;
  a.lse_batch = p.lse.batch_stride;
  a.lse_head = p.lse.head_stride;
  a.lse_row = p.lse.row_stride;
  a.k_cache = p.k_cache.data;
  a.v_cache = p.v_cache.data;
  a.k_st = strides_of(p.k_cache);
  a.v_st = strides_of(p.v_cache);
  a.seqlens = p.seqlens;
  a.batch_idx = p.batch_idx;
  a.block_table = p.block_table;
  a.bt_stride = p.block_table_stride;
  a.page_size = p.paged ? int(p.cache_rows) : 0;
  if (a.page_size > 0 && (a.page_size & (a.page_size - 1)) == 0)
    for (a.page_shift = 0; (1 << a.page_shift) < a.page_size; ++a.page_shift) {
    }
  a.seqlen_new = int(p.seqlen_new);
  a.k_new = p.k_new.data;
  a.v_new = p.v_new.data;
  a.kn_st = strides_of(p.k_new);
  a.vn_st = strides_of(p.v_new);
  a.rot_cos = p.rotary_cos;
  a.rot_sin = p.rotary_sin;
  a.rot_dtype = p.rotary_dtype;
  a.rot_stride = p.rotary_stride;
  a.rotary_dim = int(p.rotary_dim);
  a.rot_interleaved = p.rotary_interleaved;
  a.rot_by_token = p.causal || p.windowed();
  a.batch = int(p.batch);
  a.seqlen_q = int(p.seqlen_q);
  a.heads = int(p.heads);
  a.heads_kv = int(p.heads_kv);
  a.group = int(p.group_size());
  a.head_dim = int(p.head_dim);
  a.rows = int(p.seqlen_q * p.group_size());
  if (p.softcap > 0) {
    a.score_scale = p.softcap * kLog2e;
    a.cap_in = p.scale / p.softcap;
  } else {
    a.score_scale = p.scale * kLog2e;
  }
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  return a;
}

namespace {

// check_on_device and graph capture: the range checks check_kvcache makes on the host when it
// reads the values (src/core/check_kvcache.cpp), here on the device, one thread per (sequence,
// block-table entry) so that long paged caches are checked in parallel; any failure sets *invalid
// (zeroed before it) and every later kernel of the call returns without writing. Calls with at
// most kValidateInKernel entries skip this kernel: the first kernel of the call checks them in
// every CTA (call_rejected), one memory round trip in place of a kernel ahead of it.
constexpr int kValidateThreads = 256;
constexpr int kValidateInKernel = 1024;  // 8 a thread of a 128-thread CTA

__global__ void __launch_bounds__(kValidateThreads) kv_validate_kernel(const KvArgs a) {
  allow_dependent_launch();
  const int64_t n = int64_t(a.batch) * a.entries_per_seq;
  bool any = false;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    any |= entry_invalid(a, int(e / a.entries_per_seq), e % a.entries_per_seq);
  if (any) atomicExch(a.invalid, 1);
}

int sm_count(int device) {
  int n = 0;
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return n;
}

int kernel_head_dim(int64_t d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }

constexpr int kMinTilesPerSplit = 4;

// The caller's split count (at most one per key tile), or the one that fills the GPU's CTA slots
// (resident CTAs per SM × SMs) best: the fraction of the slots the last wave of CTAs uses is
// ctas·s / (waves · slots); the smallest s within 5 % of the best fraction, each split at least
// kMinTilesPerSplit key tiles of the cache's capacity (fewer, and the per-split fixed costs and the
// combine outweigh the wider spread). Chosen from shapes only (the lengths live on the device; a
// graph captured once replays with any lengths).
int choose_splits(const detail::KVParams& p, int64_t ctas, int block_n, int64_t slots) {
  const int64_t capacity = p.paged ? p.max_pages * p.cache_rows : p.cache_rows;
  const int64_t tiles = std::max<int64_t>(1, (capacity + block_n - 1) / block_n);
  if (p.num_splits > 0) return int(std::min<int64_t>({int64_t(p.num_splits), tiles, kMaxSplits}));
  const int64_t most = std::clamp<int64_t>(tiles / kMinTilesPerSplit, 1, kMaxSplits);
  auto filled = [&](int64_t s) {
    const int64_t n = ctas * s;
    return double(n) / double((n + slots - 1) / slots * slots);
  };
  double best = 0;
  for (int64_t s = 1; s <= most; ++s) best = std::max(best, filled(s));
  for (int64_t s = 1; s <= most; ++s)
    if (filled(s) >= 0.95 * best) return int(s);
  return 1;
}

// cp.async moves 16-byte chunks of cache rows.
void check_cache_layout(const detail::TensorRef& t, const char* name) {
  const bool ok = reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.row_stride % 8 == 0 && t.head_stride % 8 == 0 &&
                  t.batch_stride % 8 == 0;
  if (!ok)
    throw Error(std::string(name) + ": the CUDA KV-cache kernels need 16-byte aligned cache rows (data pointer "
                "aligned to 16 bytes, batch/page, row and head strides multiples of 8 elements); got strides (" +
                    std::to_string(t.batch_stride) + ", " + std::to_string(t.row_stride) + ", " +
                    std::to_string(t.head_stride) + ")",
                Error::Kind::unsupported);
}

template <class T>
int launch(const detail::KVParams& p, KvArgs a, cudaStream_t stream) {
  const int device = current_device();
  const int hd = kernel_head_dim(p.head_dim);
  const bool decode = a.rows <= block_rows(1);
  const int block_m = decode ? block_rows(1) : block_rows(4);
  const int block_n = decode || hd <= 128 ? 64 : 32;
  const int64_t ctas = p.batch * p.heads_kv * ((a.rows + block_m - 1) / block_m);
  const int warps_m = decode ? 1 : 4;
  using Run = void (*)(const KvArgs&, bool, cudaStream_t);
  using Fit = int (*)();
  const Run runs[3][2] = {{run_attend<T, 64, 1>, run_attend<T, 64, 4>},
                          {run_attend<T, 128, 1>, run_attend<T, 128, 4>},
                          {run_attend<T, 256, 1>, run_attend<T, 256, 4>}};
  const Fit fits[3][2] = {{attend_ctas_per_sm<T, 64, 1>, attend_ctas_per_sm<T, 64, 4>},
                          {attend_ctas_per_sm<T, 128, 1>, attend_ctas_per_sm<T, 128, 4>},
                          {attend_ctas_per_sm<T, 256, 1>, attend_ctas_per_sm<T, 256, 4>}};
  const int which = hd == 64 ? 0 : hd == 128 ? 1 : 2, shape = warps_m == 1 ? 0 : 1;
  a.splits = choose_splits(p, ctas, block_n, int64_t(fits[which][shape]()) * sm_count(device));
  if (ctas * a.splits > (int64_t(1) << 31) - 1)
    throw Error("q: the CUDA KV-cache kernels take at most 2^31 CTAs (batch · heads_kv · row blocks · splits)",
                Error::Kind::unsupported);

  // One scratch allocation per call: the split partials (state, then accumulators) and the
  // validation flag.
  const int64_t rows_total = p.batch * p.heads_kv * a.rows;
  const size_t state_bytes = a.splits > 1 ? (size_t(rows_total * a.splits) * sizeof(float2) + 15) / 16 * 16 : 0;  // acc: float4 loads
  const size_t part_bytes = a.splits > 1 ? size_t(rows_total * a.splits * p.head_dim) * sizeof(float) : 0;
  const size_t flag_bytes = p.values_on_device ? sizeof(int) : 0;
  DeviceScratch scratch(state_bytes + part_bytes + flag_bytes, stream);
  char* base = scratch.as<char>();
  if (a.splits > 1) {
    a.part_state = reinterpret_cast<float2*>(base);
    a.part = reinterpret_cast<float*>(base + state_bytes);
  }
  // Each kernel after the first is a programmatic dependent of the one before (sm_90): its launch
  // overlaps that kernel's tail, and it waits for that kernel's writes before reading them.
  bool after_kernel = false;
  if (p.values_on_device) {
    a.invalid = reinterpret_cast<int*>(base + state_bytes + part_bytes);
    a.capacity = p.paged ? p.max_pages * p.cache_rows : p.cache_rows;
    a.slots = p.cache_batch;
    a.rotary_len = p.rotary_len;
    a.entries_per_seq = p.paged ? p.max_pages : 1;
    const int64_t n = p.batch * a.entries_per_seq;
    if (n <= kValidateInKernel) {
      a.validate_first = true;
    } else {
      const unsigned blocks = unsigned(std::clamp<int64_t>((n + kValidateThreads - 1) / kValidateThreads, 1, 1024));
      check_cuda(cudaMemsetAsync(a.invalid, 0, sizeof(int), stream), "cudaMemsetAsync (kv validation flag)");
      kv_validate_kernel<<<blocks, kValidateThreads, 0, stream>>>(a);
      check_launch("kv_validate_kernel");
      after_kernel = true;
    }
  }
  if (p.seqlen_new > 0) {
    const int64_t items = p.batch * p.seqlen_new * p.heads_kv;
    launch_dependent<kv_append_kernel<T>>(after_kernel, unsigned((items + 3) / 4), 128, 0, stream, "kv_append_kernel", a);
    after_kernel = true;
    a.validate_first = false;  // the append kernel checked, attend and combine read its flag
  }
  runs[which][shape](a, after_kernel, stream);
  if (a.splits > 1)
    launch_dependent<kv_combine_kernel<T>>(true, unsigned(rows_total), 32 * kCombineWarps, 0, stream, "kv_combine_kernel", a);
  return a.splits;
}

}  // namespace
}  // namespace kv

int forward_kvcache(const detail::KVParams& p) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    throw Error(std::string("q: the CUDA KV-cache kernels take float16 or bfloat16, got ") + to_string(p.dtype),
                Error::Kind::unsupported);
  if (p.head_dim % 8 != 0 || p.head_dim > 256)
    throw Error("q: the CUDA KV-cache kernels need head_dim a multiple of 8 up to 256, got " +
                    std::to_string(p.head_dim),
                Error::Kind::unsupported);
  if (p.batch * p.heads_kv * p.seqlen_q * p.group_size() > (int64_t(1) << 31) - 1 || p.seqlen_q > (1 << 30))
    throw Error("q: the CUDA KV-cache kernels take fewer than 2^31 query rows", Error::Kind::unsupported);
  const int dev = current_device();
  check_device_pointer(p.q.data, "q", dev);
  check_device_pointer(p.out.data, "out", dev);
  check_device_pointer(p.lse.data, "lse", dev);
  check_device_pointer(p.k_cache.data, "k_cache", dev);
  check_device_pointer(p.v_cache.data, "v_cache", dev);
  check_device_pointer(p.seqlens, "cache_seqlens", dev);
  check_device_pointer(p.batch_idx, "cache_batch_idx", dev);
  check_device_pointer(p.block_table, "block_table", dev);
  check_device_pointer(p.k_new.data, "k_new", dev);
  check_device_pointer(p.v_new.data, "v_new", dev);
  check_device_pointer(p.rotary_cos, "rotary_cos", dev);
  check_device_pointer(p.rotary_sin, "rotary_sin", dev);
  kv::check_cache_layout(p.k_cache, "k_cache");
  kv::check_cache_layout(p.v_cache, "v_cache");

  detail::set_kernel_path("cuda.kvcache");
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const kv::KvArgs a = kv::make_kv_args(p);
  return p.dtype == DType::f16 ? kv::launch<__half>(p, a, stream) : kv::launch<__nv_bfloat16>(p, a, stream);
}

}  // namespace flashattn::cuda
