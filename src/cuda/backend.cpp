// flashattn::cuda: the CUDA backend's entry points (src/core/backend.hpp) and the kernel registry.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "core/backend.hpp"
#include "cuda/common/args.hpp"
#include "cuda/common/runtime.hpp"
#include "cuda/registry.hpp"
#include "cuda/sm90/sm90.hpp"
#include "cuda/standard/standard.hpp"

namespace flashattn::cuda {

[[noreturn]] void throw_cuda(cudaError_t e, const char* what) {
  cudaGetLastError();  // clear a sticky launch error so the next call starts clean
  throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(e) + ": " +
              cudaGetErrorString(e));
}

[[noreturn]] void throw_cublas(cublasStatus_t s, const char* what) {
  throw Error(std::string("cuBLAS error in ") + what + ": " + cublasGetStatusName(s) + ": " +
              cublasGetStatusString(s));
}

bool available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

void check_device_pointer(const void* ptr, const char* name, int device) {
  if (ptr == nullptr) return;
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(std::string(name) + ": expected device memory of CUDA device " + std::to_string(device) +
                ", got a pointer CUDA does not know (" + cudaGetErrorString(e) + ")",
                Error::Kind::type);
  }
  if (attr.type == cudaMemoryTypeUnregistered || attr.type == cudaMemoryTypeHost) {
    throw Error(std::string(name) + ": expected device memory of CUDA device " + std::to_string(device) +
                ", got host memory", Error::Kind::type);
  }
  if (attr.device != device) {
    throw Error(std::string(name) + ": expected device memory of CUDA device " + std::to_string(device) +
                " (the current device), got memory of device " + std::to_string(attr.device), Error::Kind::type);
  }
}

int current_device() {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  return dev;
}

namespace {

int device_arch(int dev) {
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute");
  return major * 10 + minor;
}

// The flash kernels move 16-byte chunks (cp.async) and store 2-element pairs: every row must start
// on a 16-byte boundary. Violations are reported, never silently copied around.
void check_flash_layout(const detail::TensorRef& t, const char* name, int64_t batch) {
  if (t.data == nullptr) return;
  const bool ok = reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && t.row_stride % 8 == 0 &&
                  t.head_stride % 8 == 0 && (batch <= 1 || t.batch_stride % 8 == 0);
  if (!ok) {
    std::ostringstream os;
    os << name << ": the CUDA flash kernels need 16-byte aligned rows (data pointer aligned to 16 "
       << "bytes, batch/row/head strides multiples of 8 elements); got pointer " << t.data
       << ", strides (" << t.batch_stride << ", " << t.row_stride << ", " << t.head_stride
       << ") — use Algorithm::standard for this layout";
    throw Error(os.str(), Error::Kind::unsupported);
  }
}

const KernelEntry& flash_kernel_for(const detail::Params& p, bool backward) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    throw Error(std::string("dtype: the CUDA flash kernels take float16 or bfloat16, got ") + to_string(p.dtype) +
                    " (Algorithm::standard takes float32)",
                Error::Kind::unsupported);
  // The portable kernels take the row maximum of the raw scores q·k and mask with -inf before the
  // scale is applied, which is only right for a positive scale.
  if (!(p.scale > 0))
    throw Error("scale: the CUDA flash kernels need scale > 0, got " + std::to_string(p.scale) +
                " (use Algorithm::standard)", Error::Kind::unsupported);
  if (p.head_dim % 8 != 0)
    throw Error("head_dim: the CUDA flash kernels need a multiple of 8, got " + std::to_string(p.head_dim) +
                " (use Algorithm::standard)", Error::Kind::unsupported);
  const int64_t batch = p.varlen() ? 1 : p.batch;
  check_flash_layout(p.q, "q", batch);
  check_flash_layout(p.k, "k", batch);
  check_flash_layout(p.v, "v", batch);
  check_flash_layout(p.out, "out", batch);
  if (backward) {
    check_flash_layout(p.dout, "dout", batch);
    check_flash_layout(p.dq, "dq", batch);
    check_flash_layout(p.dk, "dk", batch);
    check_flash_layout(p.dv, "dv", batch);
  }
  if (p.heads > 65535 || p.heads_kv > 65535 || p.batch > 65535)
    throw Error("heads/batch: the CUDA flash kernels take at most 65535 heads and 65535 sequences, got heads " +
                std::to_string(p.heads) + ", batch " + std::to_string(p.batch), Error::Kind::unsupported);
  const KernelKey key{device_arch(current_device()), p.dtype, kernel_head_dim(int(p.head_dim)),
                      p.window_right == 0};
  return find_kernel(key);
}

}  // namespace

void check_device_pointers(const detail::Params& p, bool backward) {
  const int dev = current_device();
  check_device_pointer(p.q.data, "q", dev);
  check_device_pointer(p.k.data, "k", dev);
  check_device_pointer(p.v.data, "v", dev);
  check_device_pointer(p.out.data, "out", dev);
  check_device_pointer(p.lse.data, "lse", dev);
  check_device_pointer(p.cu_seqlens_q, "cu_seqlens_q", dev);
  check_device_pointer(p.cu_seqlens_k, "cu_seqlens_k", dev);
  check_device_pointer(p.seqused_k, "seqused_k", dev);
  if (backward) {
    check_device_pointer(p.dout.data, "dout", dev);
    check_device_pointer(p.dq.data, "dq", dev);
    check_device_pointer(p.dk.data, "dk", dev);
    check_device_pointer(p.dv.data, "dv", dev);
  }
}

namespace {
// FLASHATTN_PORTABLE_ONLY=1 keeps the Hopper kernels out (to compare or test the portable ones on sm_90).
bool hopper_allowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("FLASHATTN_PORTABLE_ONLY");
    return !(v && *v && std::string(v) != "0");
  }();
  return allowed;
}
}  // namespace

void forward(const detail::Params& p) {
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if (p.algorithm == Algorithm::standard) {
    detail::set_kernel_path("cuda.standard");
    return standard::forward(p, stream);
  }
  if (hopper_allowed() && sm90::supports(p)) {
    detail::set_kernel_path("cuda.sm90");
    return sm90::forward(p);
  }
  const KernelEntry& k = flash_kernel_for(p, false);
  detail::set_kernel_path("cuda.sm80");
  k.forward(make_args(p), stream);
}

void backward(const detail::Params& p) {
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if (p.algorithm == Algorithm::standard) {
    detail::set_kernel_path("cuda.standard");
    return standard::backward(p, stream);
  }
  if (hopper_allowed() && sm90::supports_backward(p)) {
    detail::set_kernel_path("cuda.sm90");
    return sm90::backward(p);
  }
  const KernelEntry& k = flash_kernel_for(p, true);
  detail::set_kernel_path("cuda.sm80");
  AttnArgs a = make_args(p);
  const int64_t tensor_batch = p.varlen() ? 1 : p.batch;
  DeviceScratch dsum(size_t(tensor_batch * p.heads * p.seqlen_q) * sizeof(float), stream);
  a.dsum = dsum.as<float>();
  k.backward(a, stream);
}

bool stream_capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

void copy_to_host(void* host, const void* device_ptr, size_t bytes) {
  check_cuda(cudaMemcpy(host, device_ptr, bytes, cudaMemcpyDefault), "cudaMemcpy (cu_seqlens to host)");
}

std::string info() {
  std::ostringstream os;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    os << "CUDA backend built; no CUDA device";
  } else {
    const int dev = current_device();
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    os << "CUDA device " << dev << ": " << prop.name << " (sm_" << prop.major << prop.minor << ", "
       << prop.multiProcessorCount << " SMs), runtime " << rt / 1000 << "." << (rt % 1000) / 10
       << ", driver " << drv / 1000 << "." << (drv % 1000) / 10;
  }
  os << "; kernels: " << registry_summary() << ", standard (cuBLAS, f32/f16/bf16)";
  return os.str();
}

}  // namespace flashattn::cuda
