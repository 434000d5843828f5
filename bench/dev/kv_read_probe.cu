// How a KV-cache-shaped read reaches the L2 and DRAM, without the attention around it: one CTA of
// 128 threads per (sequence, KV head) streams its rows of K and V (256 bytes each: d 128, bf16)
// through a 3-stage shared-memory ring of 64-row tiles, as src/cuda/kvcache/attend.cuh's decode
// kernel does, in several copy forms; the consumer only reads one 16-byte chunk per thread and
// tile. Each (form, layout) is its own kernel so a profiler can tell them apart.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a bench/dev/kv_read_probe.cu -o kv_read_probe
//   kv_read_probe [BATCH=128] [CACHE=4096] [REPS=7]       (H_kv 8; a table: form, layout, µs, TB/s)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int kThreads = 128, kRows = 64, kStages = 3, kChunks = 16, kHeadsKv = 8;
constexpr int kTileU4 = kRows * (kChunks + 1);  // uint4 per K or V tile (room for padded rows)

enum Form : int {
  kOurs = 0,     // cp.async.cg 16: thread (grp = tid/16, chunk = tid%16) copies chunk of rows grp·8 + [0, 8)
  kL2Hint = 1,   // the same with the L2::128B prefetch hint
  kStrided = 2,  // cp.async.cg 16: thread copies chunk of rows grp + 8·[0, 8) (a warp: rows 2w', 2w'+1)
  kWarpRow = 3,  // cp.async.cg 16: warp w copies rows w·16 + [0, 16), two rows per instruction: each
                 //   warp instruction covers 512 consecutive bytes where the rows are adjacent
  kLdgSts = 4,   // ld.global.nc v4 into registers, then st.shared (ours' mapping)
  kLdgOnly = 5,  // ld.global.nc v4 summed in registers, no shared memory
  kCa = 6,       // cp.async.ca 16 (through L1), ours' mapping
  kPadded = 7,   // ours, the shared-memory rows padded by one 16-byte chunk (272-byte rows), as
                 //   SmemTile pads them
};
constexpr const char* kFormNames[] = {"ours", "l2hint128", "strided", "warprow", "ldg+sts", "ldg-only", "cp.async.ca", "padded-dst"};

__device__ __forceinline__ unsigned smem_u32(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }

template <int kForm>
__device__ __forceinline__ void copy16(uint4* dst, const uint4* src) {
  if constexpr (kForm == kL2Hint)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
  else if constexpr (kForm == kCa)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}

__device__ __forceinline__ uint4 ldg_nc(const uint4* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// Row r of tile nb for thread tid in the given form: which row this thread's pass copies.
template <int kForm>
__device__ __forceinline__ int row_of(int tid, int pass) {
  if constexpr (kForm == kStrided) return tid / kChunks + 8 * pass;
  if constexpr (kForm == kWarpRow) return (tid / 32) * 16 + 2 * pass + (tid % 32) / kChunks;
  return (tid / kChunks) * 8 + pass;
}

// kHeadsFirst: (B, Hkv, S, d), else (B, S, Hkv, d); strides in uint4.
template <int kForm, bool kHeadsFirst>
__global__ void __launch_bounds__(kThreads) probe_kernel(const uint4* __restrict__ K, const uint4* __restrict__ V,
                                                         int cache, uint4* sink) {
  extern __shared__ __align__(128) uint4 smem[];
  uint4* sK = smem;
  uint4* sV = smem + kStages * kTileU4;
  const int b = blockIdx.x / kHeadsKv, h = blockIdx.x % kHeadsKv, tid = threadIdx.x, chunk = tid % kChunks;
  const int64_t row_st = kHeadsFirst ? kChunks : int64_t(kHeadsKv) * kChunks;
  const int64_t base = kHeadsFirst ? (int64_t(b) * kHeadsKv + h) * cache * kChunks
                                   : int64_t(b) * cache * kHeadsKv * kChunks + int64_t(h) * kChunks;
  const uint4* gK = K + base + chunk;
  const uint4* gV = V + base + chunk;
  const int tiles = cache / kRows;
  uint4 acc = make_uint4(0, 0, 0, 0);
  auto fold = [&](uint4 x) {
    acc.x ^= x.x;
    acc.y += x.y;
    acc.z ^= x.z;
    acc.w += x.w;
  };

  if constexpr (kForm == kLdgOnly) {
    for (int nb = 0; nb < tiles; ++nb) {
      uint4 r[16];
#pragma unroll
      for (int p = 0; p < 8; ++p) r[p] = ldg_nc(gK + (int64_t(nb) * kRows + row_of<kOurs>(tid, p)) * row_st);
#pragma unroll
      for (int p = 0; p < 8; ++p) r[8 + p] = ldg_nc(gV + (int64_t(nb) * kRows + row_of<kOurs>(tid, p)) * row_st);
#pragma unroll
      for (int p = 0; p < 16; ++p) fold(r[p]);
    }
  } else if constexpr (kForm == kLdgSts) {
    // Registers hold the next tile while the current one is consumed (2 stages in shared memory).
    uint4 r[16];
    auto fetch = [&](int nb) {
#pragma unroll
      for (int p = 0; p < 8; ++p) r[p] = ldg_nc(gK + (int64_t(nb) * kRows + row_of<kOurs>(tid, p)) * row_st);
#pragma unroll
      for (int p = 0; p < 8; ++p) r[8 + p] = ldg_nc(gV + (int64_t(nb) * kRows + row_of<kOurs>(tid, p)) * row_st);
    };
    auto store = [&](int stage) {
#pragma unroll
      for (int p = 0; p < 8; ++p) {
        sK[stage * kTileU4 + row_of<kOurs>(tid, p) * kChunks + chunk] = r[p];
        sV[stage * kTileU4 + row_of<kOurs>(tid, p) * kChunks + chunk] = r[8 + p];
      }
    };
    fetch(0);
    for (int nb = 0; nb < tiles; ++nb) {
      const int stage = nb & 1;
      store(stage);
      if (nb + 1 < tiles) fetch(nb + 1);
      __syncthreads();
      fold(sK[stage * kTileU4 + (tid * 7) % kTileU4]);
      fold(sV[stage * kTileU4 + (tid * 5) % kTileU4]);
    }
  } else {
    constexpr int kSmemRow = kForm == kPadded ? kChunks + 1 : kChunks;
    auto load = [&](int nb, int stage) {
#pragma unroll
      for (int p = 0; p < 8; ++p) {
        const int r = row_of<kForm>(tid, p);
        copy16<kForm>(sK + stage * kTileU4 + r * kSmemRow + chunk, gK + (int64_t(nb) * kRows + r) * row_st);
      }
#pragma unroll
      for (int p = 0; p < 8; ++p) {
        const int r = row_of<kForm>(tid, p);
        copy16<kForm>(sV + stage * kTileU4 + r * kSmemRow + chunk, gV + (int64_t(nb) * kRows + r) * row_st);
      }
    };
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < tiles) load(s, s);
      asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int nb = 0; nb < tiles; ++nb) {
      asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2));
      __syncthreads();
      if (nb + kStages - 1 < tiles) load(nb + kStages - 1, (nb + kStages - 1) % kStages);
      asm volatile("cp.async.commit_group;\n" ::);
      const int stage = nb % kStages;
      fold(sK[stage * kTileU4 + (tid * 7) % kTileU4]);
      fold(sV[stage * kTileU4 + (tid * 5) % kTileU4]);
    }
  }
  sink[int64_t(blockIdx.x) * kThreads + tid] = acc;
}

__global__ void flush_kernel(const uint4* p, int64_t n, uint4* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 x = p[i];
    acc.x ^= x.x;
    acc.y ^= x.y;
  }
  if (acc.x == 0x12345678u && acc.y == 0x9abcdefu) sink[0] = acc;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

using Kernel = void (*)(const uint4*, const uint4*, int, uint4*);
struct Variant {
  Kernel k;
  int form;
  bool heads_first;
};

}  // namespace

int main(int argc, char** argv) {
  const int batch = argc > 1 ? std::atoi(argv[1]) : 128;
  const int cache = argc > 2 ? std::atoi(argv[2]) : 4096;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 7;
  const int64_t n_u4 = int64_t(batch) * cache * kHeadsKv * kChunks;
  uint4 *K, *V, *sink, *flush;
  const int64_t flush_u4 = int64_t(256) << 20 >> 4;  // 256 MB, over twice the L2
  check(cudaMalloc(&K, n_u4 * 16), "cudaMalloc K");
  check(cudaMalloc(&V, n_u4 * 16), "cudaMalloc V");
  check(cudaMalloc(&flush, flush_u4 * 16), "cudaMalloc flush");
  check(cudaMalloc(&sink, int64_t(batch) * kHeadsKv * kThreads * 16), "cudaMalloc sink");
  check(cudaMemset(K, 0x3c, n_u4 * 16), "memset");
  check(cudaMemset(V, 0x3b, n_u4 * 16), "memset");
  check(cudaMemset(flush, 1, flush_u4 * 16), "memset");
  const Variant variants[] = {
      {probe_kernel<kOurs, false>, kOurs, false},       {probe_kernel<kOurs, true>, kOurs, true},
      {probe_kernel<kL2Hint, false>, kL2Hint, false},   {probe_kernel<kStrided, false>, kStrided, false},
      {probe_kernel<kWarpRow, false>, kWarpRow, false}, {probe_kernel<kWarpRow, true>, kWarpRow, true},
      {probe_kernel<kLdgSts, false>, kLdgSts, false},   {probe_kernel<kLdgOnly, false>, kLdgOnly, false},
      {probe_kernel<kLdgOnly, true>, kLdgOnly, true},   {probe_kernel<kCa, false>, kCa, false},
      {probe_kernel<kPadded, false>, kPadded, false},   {probe_kernel<kPadded, true>, kPadded, true},
  };
  // About 100 KB of shared memory per CTA for every form: two CTAs per SM, as the decode kernel runs.
  const int smem = 2 * kStages * kTileU4 * 16 + 4096;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::printf("KV read probe: B %d, cache %d, H_kv 8, d 128 bf16, %.2f GB of K and V, %d CTAs\n", batch, cache,
              2.0 * n_u4 * 16 / 1e9, batch * kHeadsKv);
  std::printf("%-12s %-12s %10s %8s\n", "form", "layout", "us", "TB/s");
  for (const Variant& v : variants) {
    check(cudaFuncSetAttribute(v.k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem attribute");
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
      flush_kernel<<<1056, 256>>>(flush, flush_u4, sink);
      cudaEventRecord(e0);
      v.k<<<batch * kHeadsKv, kThreads, smem>>>(K, V, cache, sink);
      cudaEventRecord(e1);
      check(cudaEventSynchronize(e1), "kernel");
      float t = 0;
      cudaEventElapsedTime(&t, e0, e1);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double t = ms[ms.size() / 2];
    std::printf("%-12s %-12s %10.1f %8.3f\n", kFormNames[v.form], v.heads_first ? "heads-first" : "tokens-first",
                t * 1e3, 2.0 * n_u4 * 16 / (t * 1e-3) / 1e12);
  }
  return 0;
}
