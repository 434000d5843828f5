// Standalone check of the Hopper forward kernel without PyTorch: random inputs, NaN-poisoned
// outputs, a naive fp32 reference kernel on the GPU (one thread per query row, two passes), and a
// timing per configuration. The thorough check (fp64 reference, FlashAttention's error rule, cuDNN
// and FA2 timings) is bench/sm90_check.py.
//
// build (sm90 objects from bench/sm90_build.sh):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc bench/sm90_check.cu \
//        build-sm90/obj/sm90.o build-sm90/obj/sm90_fwd_*.o -o build-sm90/sm90_check
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/sm90/sm90.hpp"

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);       \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

template <class T>
__device__ float to_f(T x) { return float(x); }

// (B, N, H, D) contiguous; bottom-right causal; O and LSE in fp32.
template <class T>
__global__ void reference(const T* q, const T* k, const T* v, float* o, float* lse, int B, int Nq, int Nk,
                          int H, int Hkv, int D, float scale, bool causal) {
  const long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (idx >= (long long)B * H * Nq) return;
  const int i = idx % Nq, h = (idx / Nq) % H, b = idx / ((long long)Nq * H);
  const int hk = h / (H / Hkv);
  const T* qr = q + (((long long)b * Nq + i) * H + h) * D;
  const int hi = causal ? min(Nk, i + Nk - Nq + 1) : Nk;
  float m = -INFINITY, l = 0.f;
  for (int j = 0; j < hi; ++j) {
    const T* kr = k + (((long long)b * Nk + j) * Hkv + hk) * D;
    float s = 0.f;
    for (int c = 0; c < D; ++c) s += to_f(qr[c]) * to_f(kr[c]);
    m = fmaxf(m, s * scale);
  }
  float* orow = o + (((long long)b * Nq + i) * H + h) * D;
  for (int c = 0; c < D; ++c) orow[c] = 0.f;
  for (int j = 0; j < hi; ++j) {
    const T* kr = k + (((long long)b * Nk + j) * Hkv + hk) * D;
    const T* vr = v + (((long long)b * Nk + j) * Hkv + hk) * D;
    float s = 0.f;
    for (int c = 0; c < D; ++c) s += to_f(qr[c]) * to_f(kr[c]);
    const float p = expf(s * scale - m);
    l += p;
    for (int c = 0; c < D; ++c) orow[c] += p * to_f(vr[c]);
  }
  for (int c = 0; c < D; ++c) orow[c] = l > 0.f ? orow[c] / l : 0.f;
  lse[((long long)b * H + h) * Nq + i] = l > 0.f ? m + logf(l) : -INFINITY;
}

template <class T>
bool run(bool f16, int D, bool causal, int B, int Nq, int Nk, int H, int Hkv, std::mt19937& rng) {
  using namespace flashattn;
  const size_t nq = size_t(B) * Nq * H * D, nk = size_t(B) * Nk * Hkv * D;
  std::vector<T> hq(nq), hk(nk), hv(nk);
  std::normal_distribution<float> nd;
  for (auto& x : hq) x = T(nd(rng));
  for (auto& x : hk) x = T(nd(rng));
  for (auto& x : hv) x = T(nd(rng));
  T *q, *k, *v, *o;
  float *lse, *oref, *lseref;
  CK(cudaMalloc(&q, nq * 2)); CK(cudaMalloc(&k, nk * 2)); CK(cudaMalloc(&v, nk * 2)); CK(cudaMalloc(&o, nq * 2));
  CK(cudaMalloc(&lse, size_t(B) * H * Nq * 4)); CK(cudaMalloc(&oref, nq * 4));
  CK(cudaMalloc(&lseref, size_t(B) * H * Nq * 4));
  CK(cudaMemcpy(q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(k, hk.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(v, hv.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(o, 0xFF, nq * 2));  // NaN poison
  CK(cudaMemset(lse, 0xFF, size_t(B) * H * Nq * 4));

  detail::Params p;
  p.dtype = f16 ? DType::f16 : DType::bf16;
  p.device = Device::cuda;
  p.batch = B; p.seqlen_q = p.max_seqlen_q = Nq; p.seqlen_k = p.max_seqlen_k = Nk;
  p.heads = H; p.heads_kv = Hkv; p.head_dim = D;
  auto ref = [&](void* d, int N, int h) {
    detail::TensorRef t; t.data = d; t.batch_stride = (int64_t)N * h * D; t.row_stride = (int64_t)h * D;
    t.head_stride = D; return t;
  };
  p.q = ref(q, Nq, H); p.k = ref(k, Nk, Hkv); p.v = ref(v, Nk, Hkv); p.out = ref(o, Nq, H);
  p.lse.data = lse; p.lse.batch_stride = (int64_t)H * Nq; p.lse.head_stride = Nq; p.lse.row_stride = 1;
  p.scale = 1.f / std::sqrt(float(D)); p.causal = causal; p.window_right = causal ? 0 : -1;
  if (!cuda::sm90::supports(p)) { std::printf("unsupported\n"); return false; }
  cuda::sm90::forward(p);
  CK(cudaDeviceSynchronize());
  const long long rows = (long long)B * H * Nq;
  reference<T><<<(rows + 127) / 128, 128>>>(q, k, v, oref, lseref, B, Nq, Nk, H, Hkv, D, p.scale, causal);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<T> ho(nq);
  std::vector<float> hor(nq), hl(rows), hlr(rows);
  CK(cudaMemcpy(ho.data(), o, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hor.data(), oref, nq * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hl.data(), lse, rows * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hlr.data(), lseref, rows * 4, cudaMemcpyDeviceToHost));
  double err = 0, lerr = 0;
  bool bad = false;
  for (size_t i = 0; i < nq; ++i) {
    const float x = float(ho[i]);
    if (std::isnan(x)) bad = true;
    err = std::max(err, (double)std::fabs(x - hor[i]));
  }
  for (long long i = 0; i < rows; ++i) {
    if (std::isinf(hlr[i]) != std::isinf(hl[i]) || std::isnan(hl[i])) bad = true;
    else if (!std::isinf(hlr[i])) lerr = std::max(lerr, (double)std::fabs(hl[i] - hlr[i]));
  }
  const double tol = f16 ? 2e-3 : 1.6e-2;  // ~4 ulp of an O entry of magnitude < 1
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  cuda::sm90::forward(p);
  CK(cudaEventRecord(e0));
  for (int r = 0; r < 10; ++r) cuda::sm90::forward(p);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  ms /= 10;
  const double flops = 4.0 * B * H * double(Nq) * Nk * D / (causal ? 2 : 1);
  const bool ok = !bad && err <= tol && lerr <= 1e-3;
  std::printf("%s d%-3d %s B%d Nq%d Nk%d H%d/%d: %.3f ms %.0f TFLOP/s max_err %.1e lse_err %.1e [%s]\n",
              f16 ? "f16 " : "bf16", D, causal ? "causal" : "full  ", B, Nq, Nk, H, Hkv, ms, flops / ms / 1e9,
              err, lerr, ok ? "ok" : "FAIL");
  cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(o); cudaFree(lse); cudaFree(oref); cudaFree(lseref);
  return ok;
}

int main() {
  std::mt19937 rng(std::random_device{}());
  int fails = 0, n = 0;
  const int shapes[][5] = {{2, 113, 203, 4, 4}, {2, 799, 3, 4, 4}, {1, 1023, 1024, 4, 2}, {1, 2048, 2048, 8, 1}};
  for (int f16 = 0; f16 < 2; ++f16)
    for (int D : {64, 128, 256})
      for (int causal = 0; causal < 2; ++causal)
        for (auto& s : shapes) {
          ++n;
          const bool ok = f16 ? run<__half>(true, D, causal, s[0], s[1], s[2], s[3], s[4], rng)
                              : run<__nv_bfloat16>(false, D, causal, s[0], s[1], s[2], s[3], s[4], rng);
          fails += !ok;
        }
  std::printf("%d/%d passed\n", n - fails, n);
  return fails ? 1 : 0;
}
