// merge_partial on CUDA: one warp per (batch, head, row), the two partials as online-softmax states
// merged with SoftmaxState::merge_scales, as the CPU backend does (src/cpu/merge.cpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/backend.hpp"
#include "cuda/common/runtime.hpp"
#include "flashattn/online_softmax.hpp"

namespace flashattn::cuda {

namespace {
struct MergeArgs {
  float* out;
  const void* part;
  float* lse;
  const float* lse_part;
  int64_t out_st[3], part_st[3], lse_st[3], lse_part_st[3];  // (batch, row, head) / (batch, head, row)
  DType part_dtype;
  int64_t rows, seqlen, heads, head_dim;
};

__device__ __forceinline__ float load_part(const void* p, int64_t i, DType t) {
  if (t == DType::f16) return __half2float(static_cast<const __half*>(p)[i]);
  if (t == DType::bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

__device__ __forceinline__ SoftmaxState<float> partial_state(float lse) {
  SoftmaxState<float> s;
  s.row_max = lse;
  s.row_sum = lse == softmax_math::neg_inf<float>() ? 0.f : 1.f;
  return s;
}

__device__ __forceinline__ int64_t at(const int64_t* st, int64_t x, int64_t y, int64_t z) {
  return x * st[0] + y * st[1] + z * st[2];
}

constexpr int kWarpsPerBlock = 8;

__global__ void __launch_bounds__(kWarpsPerBlock * 32) merge_kernel(MergeArgs a) {
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (r >= a.rows) return;
  const int64_t b = r / (a.heads * a.seqlen), h = (r / a.seqlen) % a.heads, i = r % a.seqlen;
  float* lse = a.lse + at(a.lse_st, b, h, i);
  SoftmaxState<float> s = partial_state(*lse);
  float wa = 0.f, wb = 0.f;
  if (!s.merge_scales(partial_state(a.lse_part[at(a.lse_part_st, b, h, i)]), wa, wb)) wa = wb = 0.f;
  const float inv = s.inv_sum();
  float* o = a.out + at(a.out_st, b, i, h);
  const int64_t po = at(a.part_st, b, i, h);
  for (int64_t c = lane; c < a.head_dim; c += 32) {  // a side of weight 0 is not read
    float x = wa != 0.f ? wa * o[c] : 0.f;
    if (wb != 0.f) x += wb * load_part(a.part, po + c, a.part_dtype);
    o[c] = x * inv;
  }
  __syncwarp();  // every lane has read *lse before it is replaced
  if (lane == 0) *lse = s.lse();
}
}  // namespace

void merge_partial(const detail::MergeParams& p) {
  const int dev = current_device();
  check_device_pointer(p.out.data, "out_acc", dev);
  check_device_pointer(p.lse.data, "lse_acc", dev);
  check_device_pointer(p.part.data, "part", dev);
  check_device_pointer(p.lse_part.data, "lse_part", dev);
  const int64_t rows = p.batch * p.heads * p.seqlen;
  if (rows == 0) return;
  MergeArgs a{static_cast<float*>(p.out.data),
              p.part.data,
              p.lse.data,
              p.lse_part.data,
              {p.out.batch_stride, p.out.row_stride, p.out.head_stride},
              {p.part.batch_stride, p.part.row_stride, p.part.head_stride},
              {p.lse.batch_stride, p.lse.head_stride, p.lse.row_stride},
              {p.lse_part.batch_stride, p.lse_part.head_stride, p.lse_part.row_stride},
              p.part_dtype,
              rows,
              p.seqlen,
              p.heads,
              p.head_dim};
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffff) throw Error("out_acc: merge_partial takes fewer than 2^34 rows on CUDA", Error::Kind::unsupported);
  merge_kernel<<<unsigned(blocks), kWarpsPerBlock * 32, 0, static_cast<cudaStream_t>(p.stream)>>>(a);
  check_launch("merge_kernel");
}

}  // namespace flashattn::cuda
