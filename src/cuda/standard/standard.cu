// The standard algorithm on the GPU, the measured baseline: every intermediate makes a trip
// through device memory.  Per (sequence, KV head), batched over the query heads of its group:
//   forward:  S = Q Kᵀ (cuBLAS, fp32)  ->  P = softmax(scale·S, softcap, mask) (kernel, storage
//             dtype) + LSE  ->  O = P V (cuBLAS)
//   backward: S, P again; dP = dO Vᵀ (fp32); dV = Σ_group Pᵀ dO; dS = P ∘ (dP − D) [∘ (1 − t²)];
//             dK = scale Σ_group dSᵀ Q; dQ = scale dS K.
// Extra device memory: S, P (and dP) for one (sequence, KV head): grows as group·Nq·Nk.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "core/params.hpp"
#include "cuda/common/runtime.hpp"
#include "cuda/standard/standard.hpp"

namespace flashattn::cuda::standard {
namespace {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

constexpr int kThreads = 256;

__device__ float block_reduce(float x, bool is_max, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) red[warp] = x;
  __syncthreads();
  x = red[0];
  for (int w = 1; w < kThreads / 32; ++w) x = is_max ? fmaxf(x, red[w]) : x + red[w];
  return x;
}

struct RowMask {  // bottom-right aligned window, local indices
  int q_len, k_len, left, right;
  __device__ bool visible(int i, int j) const {
    const int diag = i + k_len - q_len;
    return (left < 0 || j >= diag - left) && (right < 0 || j <= diag + right);
  }
};

// One block per (query row, head of the group). S (g, Nq, Nk) fp32 -> P (g, Nq, Nk) in T, LSE.
template <class T>
__global__ void softmax_kernel(const float* S, T* P, int nq, int nk, float scale, float softcap,
                               RowMask mask, float* lse, int64_t lse_head, int64_t lse_row,
                               int64_t lse_off) {
  __shared__ float red[kThreads / 32];
  const int i = blockIdx.x, hl = blockIdx.y;
  const float* s = S + (int64_t(hl) * nq + i) * nk;
  T* pr = P + (int64_t(hl) * nq + i) * nk;
  auto score = [&](int j) {
    if (!mask.visible(i, j)) return -INFINITY;
    float x = s[j] * scale;
    if (softcap > 0) x = softcap * tanhf(x / softcap);
    return x;
  };
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < nk; j += kThreads) mx = fmaxf(mx, score(j));
  mx = block_reduce(mx, true, red);
  const float off = mx == -INFINITY ? 0.f : mx;
  float sum = 0.f;
  for (int j = threadIdx.x; j < nk; j += kThreads) sum += expf(score(j) - off);
  sum = block_reduce(sum, false, red);
  const float inv = sum > 0 ? 1.f / sum : 0.f;
  for (int j = threadIdx.x; j < nk; j += kThreads) pr[j] = from_f<T>(expf(score(j) - off) * inv);
  if (lse != nullptr && threadIdx.x == 0)
    lse[lse_off + hl * lse_head + int64_t(i) * lse_row] = sum > 0 ? mx + logf(sum) : -INFINITY;
}

// One block per (query row, head of the group): D = rowsum(dO ∘ O), then
// dS = P ∘ (dP − D) [∘ (1 − t²)] written over P (T).
template <class T>
__global__ void dsoftmax_kernel(const float* S, const float* dP, T* P, int nq, int nk, float scale,
                                float softcap, const T* out, int64_t out_head, int64_t out_row,
                                const T* dout, int64_t dout_head, int64_t dout_row, int d) {
  __shared__ float red[kThreads / 32];
  const int i = blockIdx.x, hl = blockIdx.y;
  const T* o = out + hl * out_head + int64_t(i) * out_row;
  const T* g = dout + hl * dout_head + int64_t(i) * dout_row;
  float dd = 0.f;
  for (int c = threadIdx.x; c < d; c += kThreads) dd += to_f(o[c]) * to_f(g[c]);
  dd = block_reduce(dd, false, red);
  const int64_t base = (int64_t(hl) * nq + i) * nk;
  for (int j = threadIdx.x; j < nk; j += kThreads) {
    float ds = to_f(P[base + j]) * (dP[base + j] - dd);
    if (softcap > 0) {
      const float t = tanhf(S[base + j] * scale / softcap);
      ds *= 1.f - t * t;
    }
    P[base + j] = from_f<T>(ds);
  }
}

// dst row r (row stride ld) = src row r (dense, d columns); rows x d.
template <class T>
__global__ void store_rows_kernel(const float* src, T* dst, int64_t ld, int rows, int d) {
  const int64_t n = int64_t(rows) * d;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x)
    dst[(e / d) * ld + e % d] = from_f<T>(src[e]);
}

// Rows [0, rows) of `heads` heads set to 0 (outputs of rows that see no key at all).
template <class T>
__global__ void zero_rows_kernel(T* dst, int64_t head_stride, int64_t ld, int rows, int d) {
  const int64_t n = int64_t(rows) * d;
  T* base = dst + blockIdx.y * head_stride;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x)
    base[(e / d) * ld + e % d] = from_f<T>(0.f);
}
__global__ void fill_lse_kernel(float* lse, int64_t head_stride, int64_t row_stride, int rows) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += gridDim.x * blockDim.x)
    lse[blockIdx.y * head_stride + int64_t(i) * row_stride] = -INFINITY;
}

unsigned blocks_for(int64_t n) { return unsigned(std::min<int64_t>((n + 255) / 256, 65535 * 8)); }

// One cuBLAS handle per (host thread, device): a handle holds its stream, so threads sharing one
// would set each other's streams between cublasSetStream and the GEMMs (cuBLAS's documentation
// asks for a handle per thread; a shared handle failed with CUBLAS_STATUS_INTERNAL_ERROR under six
// threads on six streams, tests/attention/test_cuda_determinism.cpp). Destroyed at thread exit.
struct ThreadHandles {
  std::vector<cublasHandle_t> per_device;
  ~ThreadHandles() {
    for (cublasHandle_t h : per_device)
      if (h) cublasDestroy(h);  // at process exit the context may be gone already: ignored
  }
};

cublasHandle_t handle_for(cudaStream_t stream) {
  thread_local ThreadHandles handles;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (int(handles.per_device.size()) <= dev) handles.per_device.resize(dev + 1, nullptr);
  cublasHandle_t& h = handles.per_device[size_t(dev)];
  if (!h) check_cublas(cublasCreate(&h), "cublasCreate");
  check_cublas(cublasSetStream(h, stream), "cublasSetStream");
  return h;
}

template <class T> cudaDataType_t data_type();
template <> cudaDataType_t data_type<float>() { return CUDA_R_32F; }
template <> cudaDataType_t data_type<__half>() { return CUDA_R_16F; }
template <> cudaDataType_t data_type<__nv_bfloat16>() { return CUDA_R_16BF; }

// Column-major strided-batched GEMM, fp32 accumulation (no TF32: the baseline must be exact-ish).
void gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
          float alpha, const void* A, cudaDataType_t at, int64_t lda, int64_t sa, const void* B,
          cudaDataType_t bt, int64_t ldb, int64_t sb, float beta, void* C, cudaDataType_t ct,
          int64_t ldc, int64_t sc, int batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  check_cublas(cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &alpha, A, at, int(lda), sa, B, bt,
                                          int(ldb), sb, &beta, C, ct, int(ldc), sc, batch,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx");
}

// Stage timings for `flashattn timeline` (p.profile is set by the program, never by the public
// API): CUDA events around each stage, read once at the end of the call so that the stages still
// run back to back. Without a profile a stage is a plain call behind one branch.
class StageTimer {
 public:
  StageTimer(detail::StageProfile* profile, cudaStream_t stream) : profile_(profile), stream_(stream) {}
  ~StageTimer() {
    for (const Mark& m : marks_) {
      if (m.begin) cudaEventDestroy(m.begin);
      if (m.end) cudaEventDestroy(m.end);
    }
  }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

  // flops and bytes: the stage's arithmetic and the main-memory traffic it implies.
  template <class Fn>
  void run(const char* name, double flops, double bytes, Fn&& fn) {
    if (!profile_) return fn();
    marks_.push_back({name, flops, bytes, nullptr, nullptr});
    Mark& m = marks_.back();
    check_cuda(cudaEventCreate(&m.begin), "cudaEventCreate (stage timer)");
    check_cuda(cudaEventCreate(&m.end), "cudaEventCreate (stage timer)");
    check_cuda(cudaEventRecord(m.begin, stream_), "cudaEventRecord (stage timer)");
    fn();
    check_cuda(cudaEventRecord(m.end, stream_), "cudaEventRecord (stage timer)");
  }

  // Waits for the last stage and adds every stage's time to the profile.
  void finish() {
    if (!profile_ || marks_.empty()) return;
    check_cuda(cudaEventSynchronize(marks_.back().end), "cudaEventSynchronize (stage timer)");
    for (const Mark& m : marks_) {
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, m.begin, m.end), "cudaEventElapsedTime (stage timer)");
      profile_->add(m.name, 1e-3 * ms, m.flops, m.bytes);
    }
  }

 private:
  struct Mark {
    const char* name;
    double flops, bytes;
    cudaEvent_t begin, end;
  };
  detail::StageProfile* profile_;
  cudaStream_t stream_;
  std::vector<Mark> marks_;
};

// Each sequence's rows: k_len keys (seqused_k[b] when given) of the k_rows its tensors hold.
std::vector<detail::SeqSpan> spans_of(const detail::Params& p, cudaStream_t stream) {
  std::vector<detail::SeqSpan> spans;
  std::vector<int32_t> cq, ck, used;
  auto fetch = [&](std::vector<int32_t>& v, const int32_t* src, int64_t n, const char* what) {
    v.resize(size_t(n));
    check_cuda(cudaMemcpyAsync(v.data(), src, v.size() * 4, cudaMemcpyDeviceToHost, stream), what);
  };
  if (p.varlen()) {
    fetch(cq, p.cu_seqlens_q, p.batch + 1, "cudaMemcpyAsync(cu_seqlens_q)");
    fetch(ck, p.cu_seqlens_k, p.batch + 1, "cudaMemcpyAsync(cu_seqlens_k)");
  }
  if (p.seqused_k != nullptr) fetch(used, p.seqused_k, p.batch, "cudaMemcpyAsync(seqused_k)");
  if (p.varlen() || p.seqused_k != nullptr) check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (int64_t b = 0; b < p.batch; ++b) {
    detail::SeqSpan s{b, 0, 0, p.seqlen_q, p.seqlen_k, p.seqlen_k};
    if (p.varlen()) s = {0, cq[b], ck[b], cq[b + 1] - cq[b], ck[b + 1] - ck[b], ck[b + 1] - ck[b]};
    if (p.seqused_k != nullptr) s.k_len = used[size_t(b)];
    spans.push_back(s);
  }
  return spans;
}

template <class T>
T* at(const detail::TensorRef& t, int64_t b, int64_t row, int64_t h) {
  return static_cast<T*>(t.data) + t.offset(b, row, h);
}

template <class T>
void forward_impl(const detail::Params& p, cudaStream_t stream) {
  const auto spans = spans_of(p, stream);
  const int g = int(p.group_size()), d = int(p.head_dim);
  int64_t max_qk = 0;
  for (const auto& s : spans) max_qk = std::max(max_qk, s.q_len * s.k_len);
  DeviceScratch s_buf(size_t(g) * max_qk * sizeof(float), stream);
  DeviceScratch p_buf(size_t(g) * max_qk * sizeof(T), stream);
  cublasHandle_t h = handle_for(stream);
  const cudaDataType_t tt = data_type<T>();
  StageTimer timer(p.profile, stream);
  const double e = sizeof(T);
  for (const auto& s : spans) {
    const int nq = int(s.q_len), nk = int(s.k_len);
    if (nq == 0) continue;
    // Elements per (sequence, KV head) for the stage timer: scores, query-side rows, key rows.
    const double nn = double(g) * nq * nk, qd = double(g) * nq * d, kd = double(nk) * d;
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      const int64_t h0 = hk * g;
      T* out = at<T>(p.out, s.batch_index, s.q_start, h0);
      if (nk == 0) {
        zero_rows_kernel<T><<<dim3(blocks_for(int64_t(nq) * d), g), 256, 0, stream>>>(
            out, p.out.head_stride, p.out.row_stride, nq, d);
        check_launch("zero_rows_kernel");
        if (p.lse.data) {
          fill_lse_kernel<<<dim3(blocks_for(nq), g), 256, 0, stream>>>(
              p.lse.data + p.lse.offset(s.batch_index, h0, s.q_start), p.lse.head_stride,
              p.lse.row_stride, nq);
          check_launch("fill_lse_kernel");
        }
        continue;
      }
      float* S = s_buf.as<float>();
      T* P = p_buf.as<T>();
      // Sᵀ (col-major Nk x Nq) = Kᵀ(col-major d x Nk)ᵀ · Q(col-major d x Nq)
      timer.run("S = QKᵀ          (cuBLAS; write S, fp32)", 2 * nn * d, e * (qd + kd) + 4 * nn, [&] {
        gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, nk, nq, d, 1.f, at<T>(p.k, s.batch_index, s.k_start, hk), tt,
             p.k.row_stride, 0, at<T>(p.q, s.batch_index, s.q_start, h0), tt, p.q.row_stride,
             p.q.head_stride, 0.f, S, CUDA_R_32F, nk, int64_t(nq) * nk, g);
      });
      float* lse = p.lse.data ? p.lse.data + p.lse.offset(s.batch_index, h0, s.q_start) : nullptr;
      timer.run("P = softmax(S)   (read S, write P)", 0, (4 + e) * nn + (lse ? 4.0 * g * nq : 0), [&] {
        softmax_kernel<T><<<dim3(nq, g), kThreads, 0, stream>>>(
            S, P, nq, nk, p.scale, p.softcap, {nq, nk, p.window_left, p.window_right}, lse,
            p.lse.head_stride, p.lse.row_stride, 0);
        check_launch("softmax_kernel");
      });
      // O (col-major d x Nq) = V (col-major d x Nk) · Pᵀ-as-stored (col-major Nk x Nq)
      timer.run("O = P·V          (cuBLAS; read P)", 2 * nn * d, e * (nn + kd + qd), [&] {
        gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, d, nq, nk, 1.f, at<T>(p.v, s.batch_index, s.k_start, hk), tt,
             p.v.row_stride, 0, P, tt, nk, int64_t(nq) * nk, 0.f, out, tt, p.out.row_stride,
             p.out.head_stride, g);
      });
    }
  }
  timer.finish();
}

template <class T>
void backward_impl(const detail::Params& p, cudaStream_t stream) {
  const auto spans = spans_of(p, stream);
  const int g = int(p.group_size()), d = int(p.head_dim);
  int64_t max_qk = 0, max_k = 0;
  for (const auto& s : spans) {
    max_qk = std::max(max_qk, s.q_len * s.k_len);
    max_k = std::max(max_k, s.k_len);
  }
  DeviceScratch s_buf(size_t(g) * max_qk * sizeof(float), stream);
  DeviceScratch dp_buf(size_t(g) * max_qk * sizeof(float), stream);
  DeviceScratch p_buf(size_t(g) * max_qk * sizeof(T), stream);
  DeviceScratch dkv_buf(size_t(2) * max_k * d * sizeof(float), stream);
  cublasHandle_t h = handle_for(stream);
  const cudaDataType_t tt = data_type<T>();
  StageTimer timer(p.profile, stream);
  const double e = sizeof(T);
  for (const auto& s : spans) {
    const int nq = int(s.q_len), nk = int(s.k_len);
    // Elements per (sequence, KV head) for the stage timer: scores, query-side rows, key rows.
    const double nn = double(g) * nq * nk, qd = double(g) * nq * d, kd = double(nk) * d;
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      const int64_t h0 = hk * g;
      const int64_t bi = s.batch_index;
      if (nq > 0 && nk == 0) {  // rows that see no key: dQ = 0
        zero_rows_kernel<T><<<dim3(blocks_for(int64_t(nq) * d), g), 256, 0, stream>>>(
            at<T>(p.dq, bi, s.q_start, h0), p.dq.head_stride, p.dq.row_stride, nq, d);
        check_launch("zero_rows_kernel");
      }
      if (s.k_rows > nk) {  // seqused_k's padding rows: zero dK, dV
        const int pad = int(s.k_rows - nk);
        for (const detail::TensorRef* t : {&p.dk, &p.dv}) {
          zero_rows_kernel<T><<<dim3(blocks_for(int64_t(pad) * d), 1), 256, 0, stream>>>(
              at<T>(*t, bi, s.k_start + nk, hk), t->head_stride, t->row_stride, pad, d);
          check_launch("zero_rows_kernel");
        }
      }
      if (nk == 0) continue;
      float* dK = dkv_buf.as<float>();
      float* dV = dK + int64_t(nk) * d;
      timer.run("dK, dV = 0       (fp32 accumulators)", 0, 8 * kd, [&] {
        check_cuda(cudaMemsetAsync(dK, 0, size_t(2) * nk * d * sizeof(float), stream), "cudaMemsetAsync");
      });
      if (nq > 0) {
        float* S = s_buf.as<float>();
        float* dP = dp_buf.as<float>();
        T* P = p_buf.as<T>();
        const T* K = at<T>(p.k, bi, s.k_start, hk);
        const T* V = at<T>(p.v, bi, s.k_start, hk);
        const T* Q = at<T>(p.q, bi, s.q_start, h0);
        const T* dO = at<T>(p.dout, bi, s.q_start, h0);
        const int64_t qk = int64_t(nq) * nk;
        timer.run("S = QKᵀ          (cuBLAS; write S, fp32)", 2 * nn * d, e * (qd + kd) + 4 * nn, [&] {
          gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, nk, nq, d, 1.f, K, tt, p.k.row_stride, 0, Q, tt,
               p.q.row_stride, p.q.head_stride, 0.f, S, CUDA_R_32F, nk, qk, g);
        });
        timer.run("P = softmax(S)   (read S, write P)", 0, (4 + e) * nn, [&] {
          softmax_kernel<T><<<dim3(nq, g), kThreads, 0, stream>>>(
              S, P, nq, nk, p.scale, p.softcap, {nq, nk, p.window_left, p.window_right}, nullptr, 0, 0, 0);
          check_launch("softmax_kernel");
        });
        // dPᵀ (col-major Nk x Nq) = V(col-major d x Nk)ᵀ · dO(col-major d x Nq)
        timer.run("dP = dO·Vᵀ       (cuBLAS; write dP, fp32)", 2 * nn * d, e * (qd + kd) + 4 * nn, [&] {
          gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, nk, nq, d, 1.f, V, tt, p.v.row_stride, 0, dO, tt,
               p.dout.row_stride, p.dout.head_stride, 0.f, dP, CUDA_R_32F, nk, qk, g);
        });
        timer.run("dV += Pᵀ·dO      (cuBLAS; read P)", 2 * nn * d, e * (nn + qd) + 8 * kd, [&] {
          for (int hl = 0; hl < g; ++hl)  // dV (col-major d x Nk) += dO (d x Nq) · P-as-stored ᵀ
            gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, d, nk, nq, 1.f, dO + hl * p.dout.head_stride, tt,
                 p.dout.row_stride, 0, P + hl * qk, tt, nk, 0, 1.f, dV, CUDA_R_32F, d, 0, 1);
        });
        timer.run("dS = P∘(dP−D)    (read P, dP; write dS)", 0,
                  (2 * e + 4 + (p.softcap > 0 ? 4 : 0)) * nn + 2 * e * qd, [&] {
          dsoftmax_kernel<T><<<dim3(nq, g), kThreads, 0, stream>>>(
              S, dP, P, nq, nk, p.scale, p.softcap, at<T>(p.out, bi, s.q_start, h0), p.out.head_stride,
              p.out.row_stride, dO, p.dout.head_stride, p.dout.row_stride, d);
          check_launch("dsoftmax_kernel");
        });
        timer.run("dK += dSᵀ·Q      (cuBLAS; read dS)", 2 * nn * d, e * (nn + qd) + 8 * kd, [&] {
          for (int hl = 0; hl < g; ++hl)  // dK += scale · Q (d x Nq) · dSᵀ
            gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, d, nk, nq, p.scale, Q + hl * p.q.head_stride, tt,
                 p.q.row_stride, 0, P + hl * qk, tt, nk, 0, 1.f, dK, CUDA_R_32F, d, 0, 1);
        });
        // dQ (col-major d x Nq) = scale · K (d x Nk) · dS-as-stored (Nk x Nq)
        timer.run("dQ = dS·K        (cuBLAS; read dS)", 2 * nn * d, e * (nn + kd + qd), [&] {
          gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, d, nq, nk, p.scale, K, tt, p.k.row_stride, 0, P, tt, nk, qk,
               0.f, at<T>(p.dq, bi, s.q_start, h0), tt, p.dq.row_stride, p.dq.head_stride, g);
        });
      }
      timer.run("dK, dV → dtype   (read fp32, write)", 0, (8 + 2 * e) * kd, [&] {
        store_rows_kernel<T><<<blocks_for(int64_t(nk) * d), 256, 0, stream>>>(
            dK, at<T>(p.dk, bi, s.k_start, hk), p.dk.row_stride, nk, d);
        check_launch("store_rows_kernel");
        store_rows_kernel<T><<<blocks_for(int64_t(nk) * d), 256, 0, stream>>>(
            dV, at<T>(p.dv, bi, s.k_start, hk), p.dv.row_stride, nk, d);
        check_launch("store_rows_kernel");
      });
    }
  }
  timer.finish();
}

}  // namespace

void forward(const detail::Params& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::f32: return forward_impl<float>(p, stream);
    case DType::f16: return forward_impl<__half>(p, stream);
    case DType::bf16: return forward_impl<__nv_bfloat16>(p, stream);
  }
}

void backward(const detail::Params& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::f32: return backward_impl<float>(p, stream);
    case DType::f16: return backward_impl<__half>(p, stream);
    case DType::bf16: return backward_impl<__nv_bfloat16>(p, stream);
  }
}

}  // namespace flashattn::cuda::standard
