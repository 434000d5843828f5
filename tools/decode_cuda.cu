// The CUDA pieces of `flashattn decode` (tools/decode.cpp): the read bandwidth it measures the
// decoding step against — a kernel that only reads, every thread streaming 16-byte loads over a
// large buffer with four loads in flight — and the random fill of a cache that may be tens of GB,
// generated on the device (a counter-based hash, Box–Muller), since filling it from the host
// would take minutes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "commands.hpp"

namespace flashattn::tools {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(std::string("flashattn decode: ") + what + ": " + cudaGetErrorString(e));
  }
}

// Sums (xor) n 16-byte words of p, grid-stride, four independent loads per iteration. The store
// depends on every load, so none can be dropped; it happens only if the xor matches `never`.
__global__ void read_words(const uint4* __restrict__ p, size_t n, unsigned never, unsigned* out) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = p[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == never) *out = acc;
}

__device__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Element i: N(0, 1) from the hash of (seed, i) by Box–Muller, rounded to T.
template <typename T>
__global__ void fill_normal(T* p, size_t n, uint64_t seed) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint64_t h = splitmix64(seed ^ splitmix64(i));
    const float u1 = (float(uint32_t(h >> 40)) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]: log is finite
    const float u2 = float(uint32_t(h & 0xFFFFFFu)) * (1.0f / 16777216.0f);
    const float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    if constexpr (sizeof(T) == 4)
      p[i] = z;
    else
      p[i] = T(z);  // __half / __nv_bfloat16: round to nearest even
  }
}

int grid_for(int per_sm) {
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  return std::max(sms, 1) * per_sm;
}

}  // namespace

double cuda_read_bandwidth(size_t bytes, int reps) {
  bytes = bytes / sizeof(uint4) * sizeof(uint4);
  Buffer buf(Device::cuda, bytes), out(Device::cuda, sizeof(unsigned));
  buf.fill_bytes(0x5a);
  const size_t n = bytes / sizeof(uint4);
  const int threads = 512, blocks = grid_for(4);  // 2048 threads per SM: full occupancy
  cudaEvent_t begin = nullptr, end = nullptr;
  check(cudaEventCreate(&begin), "cudaEventCreate");
  check(cudaEventCreate(&end), "cudaEventCreate");
  float best = 0;
  for (int r = 0; r <= reps; ++r) {  // the first is a warm-up
    check(cudaEventRecord(begin, nullptr), "cudaEventRecord");
    read_words<<<blocks, threads>>>(static_cast<const uint4*>(buf.data()), n, 0x12345u,
                                    static_cast<unsigned*>(out.data()));
    check(cudaGetLastError(), "read kernel launch");
    check(cudaEventRecord(end, nullptr), "cudaEventRecord");
    check(cudaEventSynchronize(end), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
    if (r > 0 && (best == 0 || ms < best)) best = ms;
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  return double(bytes) / (double(best) * 1e-3);
}

// The kernel's store target is the buffer's own first word (a store happens only if the xor of all
// words is 0x12345u; the flush buffer's contents do not matter).
void cuda_read_flush(const void* data, size_t bytes) {
  read_words<<<grid_for(4), 512>>>(static_cast<const uint4*>(data), bytes / sizeof(uint4), 0x12345u,
                                   static_cast<unsigned*>(const_cast<void*>(data)));
  check(cudaGetLastError(), "read flush kernel launch");
}

__global__ void wait_ns(uint64_t ns) {
  uint64_t t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

void cuda_queue_wait(double us) {
  wait_ns<<<1, 1>>>(uint64_t(us * 1e3));
  check(cudaGetLastError(), "queue wait kernel launch");
}

void cuda_fill_normal(void* data, DType dtype, size_t count, uint64_t seed) {
  const int threads = 256, blocks = grid_for(8);
  if (dtype == DType::f32)
    fill_normal<<<blocks, threads>>>(static_cast<float*>(data), count, seed);
  else if (dtype == DType::f16)
    fill_normal<<<blocks, threads>>>(static_cast<__half*>(data), count, seed);
  else
    fill_normal<<<blocks, threads>>>(static_cast<__nv_bfloat16*>(data), count, seed);
  check(cudaGetLastError(), "fill kernel launch");
  check(cudaDeviceSynchronize(), "fill kernel");
}

}  // namespace flashattn::tools
