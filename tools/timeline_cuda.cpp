// flashattn timeline on a CUDA device: the standard algorithm's stages (cuBLAS GEMMs and the
// softmax kernels of src/cuda/standard) timed with CUDA events through the library's StageProfile
// hook, beside the flash kernel's time for the same call; each stage's achieved bandwidth and
// FLOP rate against ceilings measured here and now: a large device-to-device copy (bandwidth) and
// a large cuBLAS GEMM in the call's dtype with fp32 accumulation (FLOP/s).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <ostream>
#include <random>
#include <vector>

#include "commands.hpp"
#include "core/backend.hpp"
#include "core/check.hpp"
#include "traffic_model.hpp"

namespace flashattn::tools {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(std::string("flashattn timeline: ") + what + ": " + cudaGetErrorString(e));
  }
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("flashattn timeline: ") + what + ": " + cublasGetStatusString(s));
}

struct Events {
  cudaEvent_t begin = nullptr, end = nullptr;
  Events() {
    check(cudaEventCreate(&begin), "cudaEventCreate");
    check(cudaEventCreate(&end), "cudaEventCreate");
  }
  ~Events() {
    cudaEventDestroy(begin);
    cudaEventDestroy(end);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

// Median GPU time in ms of fn (work on the default stream) over `reps` runs after one warm-up,
// from CUDA events around each run.
double gpu_ms(const std::function<void()>& fn, int reps) {
  fn();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  Events ev;
  std::vector<float> times;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(ev.begin, nullptr), "cudaEventRecord");
    fn();
    check(cudaEventRecord(ev.end, nullptr), "cudaEventRecord");
    check(cudaEventSynchronize(ev.end), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ev.begin, ev.end), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Read + write bytes per second of a large device-to-device copy: the ceiling of the standard
// path's memory-bound stages. 1 GiB each way (far beyond the L2), less if memory is short.
double measure_copy_bandwidth(size_t* copied) {
  size_t free_bytes = 0, total = 0;
  check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  const size_t bytes = std::min<size_t>(size_t(1) << 30, free_bytes / 4) / 256 * 256;
  Buffer a(Device::cuda, bytes), b(Device::cuda, bytes);
  a.fill_bytes(1);
  b.fill_bytes(2);
  const double ms = gpu_ms([&] { check(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, nullptr),
                                       "cudaMemcpyAsync"); },
                           10);
  *copied = bytes;
  return 2.0 * double(bytes) / (ms * 1e-3);
}

// Random values in dtype over a whole device buffer: one random block from the host, replicated
// on the device (constant data would let the multipliers idle and overstate the GEMM ceiling).
void fill_random_device(Buffer& buf, DType dtype, std::mt19937_64& rng) {
  const size_t e = element_size(dtype), count = buf.bytes() / e;
  const size_t block = std::min<size_t>(count, size_t(1) << 20);
  std::vector<uint8_t> host(block * e);
  fill_random(host.data(), dtype, block, rng);
  buf.upload(host.data(), host.size());
  auto* base = static_cast<uint8_t*>(buf.data());
  for (size_t done = block * e; done < count * e;) {
    const size_t n = std::min(done, count * e - done);
    check(cudaMemcpy(base + done, base, n, cudaMemcpyDeviceToDevice), "cudaMemcpy");
    done += n;
  }
}

cudaDataType_t cuda_type(DType t) {
  return t == DType::f32 ? CUDA_R_32F : t == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
}

// FLOP/s of a large square cuBLAS GEMM (8192³) in the call's dtype with fp32 accumulation, as the
// standard path calls cuBLAS (CUBLAS_COMPUTE_32F: no TF32 for f32).
double measure_gemm_rate(DType dtype, int n) {
  const size_t bytes = size_t(n) * n * element_size(dtype);
  Buffer a(Device::cuda, bytes), b(Device::cuda, bytes), c(Device::cuda, bytes);
  std::mt19937_64 rng(fresh_seed());
  fill_random_device(a, dtype, rng);
  fill_random_device(b, dtype, rng);
  cublasHandle_t h = nullptr;
  check(cublasCreate(&h), "cublasCreate");
  const float alpha = 1, beta = 0;
  const cudaDataType_t t = cuda_type(dtype);
  double ms = 0;
  try {
    ms = gpu_ms([&] {
      check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.data(), t, n, b.data(), t, n, &beta, c.data(),
                         t, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
    }, 5);
  } catch (...) {
    cublasDestroy(h);
    throw;
  }
  cublasDestroy(h);
  return 2.0 * double(n) * n * n / (ms * 1e-3);
}

}  // namespace

int run_timeline_cuda(const Config& c, bool backward, std::ostream& os) {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  size_t copied = 0;
  const int gemm_n = 8192;
  const double bw = measure_copy_bandwidth(&copied), peak = measure_gemm_rate(c.dtype, gemm_n);
  os << strprintf("flashattn timeline — cuda (%s, %d SMs, sm_%d%d), %s%s\n", prop.name, prop.multiProcessorCount,
                  prop.major, prop.minor, c.label().c_str(), backward ? ", backward" : ", forward");
  os << strprintf("ceilings measured now: device-to-device copy %.0f GB/s (read + write, %s each way), "
                  "cuBLAS %s GEMM %d³ %.1f TFLOP/s (fp32 accumulation)\n\n",
                  bw / 1e9, human_bytes(double(copied)).c_str(), to_string(c.dtype), gemm_n, peak / 1e12);

  Problem pb(c, backward, fresh_seed());
  Options opt;
  opt.causal = c.causal;
  // One call straight into the CUDA backend, so that the stage profile can ride along in Params.
  auto call = [&](Algorithm alg, detail::StageProfile* prof) {
    opt.algorithm = alg;
    detail::Params p = backward ? detail::check_backward(pb.tq, pb.tk, pb.tv, pb.tout, pb.tdout, pb.tlse, pb.tdq,
                                                         pb.tdk, pb.tdv, opt)
                                : detail::check_forward(pb.tq, pb.tk, pb.tv, pb.tout, &pb.tlse, opt);
    p.profile = prof;
    if (backward)
      cuda::backward(p);
    else
      cuda::forward(p);
  };
  if (backward) {  // backward needs out and lse of a forward: flash where it runs, else standard
    try {
      call(Algorithm::flash, nullptr);
    } catch (const Error&) {
      call(Algorithm::standard, nullptr);
    }
  }
  const int reps = 5;
  call(Algorithm::standard, nullptr);  // warm-up: cuBLAS handle, memory pool
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  detail::StageProfile prof;
  call(Algorithm::standard, &prof);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const double std_s = 1e-3 * gpu_ms([&] { call(Algorithm::standard, nullptr); }, reps);
  double flash_s = 0;
  std::string flash_missing;
  try {
    flash_s = 1e-3 * gpu_ms([&] { call(Algorithm::flash, nullptr); }, reps);
  } catch (const Error& e) {
    flash_missing = e.what();
  }

  os << strprintf("%-46s %11s %6s %9s %6s %9s %6s  %s\n", "standard, stage (CUDA events)", "time", "share", "GB/s",
                  "of bw", "TFLOP/s", "of pk", "bound by");
  double mem_s = 0, stages_s = 0;
  for (const auto& st : prof.stages) {
    const double t_mem = st.bytes / bw, t_math = st.flops / peak;
    mem_s += std::min(st.seconds, t_mem);
    stages_s += st.seconds;
    os << strprintf("%s %8.3f ms %5.0f%% %9.0f %5.0f%% %9.1f %5.0f%%  %s\n", pad_right(st.name, 46).c_str(),
                    st.seconds * 1e3,
                    100 * st.seconds / std_s, st.bytes / st.seconds / 1e9, 100 * t_mem / st.seconds,
                    st.flops / st.seconds / 1e12, 100 * t_math / st.seconds, t_mem > t_math ? "memory" : "arithmetic");
  }
  const double flops = backward ? backward_flops(c) : forward_flops(c);
  os << strprintf("%-46s %8.3f ms\n", "standard, sum of the stages", stages_s * 1e3);
  os << strprintf("%-46s %8.3f ms %6s %9s %6s %9.1f %5.0f%%\n", "standard, whole call", std_s * 1e3, "", "", "",
                  flops / std_s / 1e12, 100 * flops / std_s / peak);
  if (flash_missing.empty()) {
    // Flash's bytes are the model's (compulsory) bytes: `flashattn traffic --device cuda` measures them.
    const Traffic ft = backward ? backward_traffic(c, Algorithm::flash) : forward_traffic(c, Algorithm::flash);
    os << strprintf("%-46s %8.3f ms %6s %9.0f %5.0f%% %9.1f %5.0f%%\n", "flash, whole call (S, P stay on chip)",
                    flash_s * 1e3, "", ft.total() / flash_s / 1e9, 100 * ft.total() / bw / flash_s,
                    flops / flash_s / 1e12, 100 * flops / flash_s / peak);
  } else {
    os << "flash, whole call: not run — " << flash_missing << "\n";
  }
  os << strprintf("\nAt the copy ceiling, moving the standard path's bytes alone takes %.3f ms of its %.3f ms",
                  mem_s * 1e3, std_s * 1e3);
  if (flash_missing.empty()) os << strprintf("; flash is %.1fx faster", std_s / flash_s);
  os << strprintf(".\n(Stage times include the launch gaps between stages; whole calls are medians of %d runs; "
                  "TFLOP/s of whole calls use the 4·B·H·N²·d convention%s; flash's GB/s counts its analytic bytes.)\n",
                  reps, backward ? " ×2.5" : "");
  return 0;
}

}  // namespace flashattn::tools
