// CUDA / cuBLAS failures surfaced as flashattn::Error carrying the library's own message.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/scratch.hpp"
#include "cuda/common/scratch_pool.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::cuda {

[[noreturn]] void throw_cuda(cudaError_t e, const char* what);
[[noreturn]] void throw_cublas(cublasStatus_t s, const char* what);

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_cuda(e, what);
}
inline void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw_cublas(s, what);
}
// Error (kind type) naming `name` unless ptr is null or memory of CUDA device `device`.
void check_device_pointer(const void* ptr, const char* name, int device);
int current_device();  // cudaGetDevice, Error on failure

// After a kernel launch: configuration errors appear here, asynchronous faults at the next sync.
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

// Stream-ordered device scratch memory from the scratch pool (scratch_pool.hpp), freed on scope
// exit (also when an Error unwinds).
class DeviceScratch {
 public:
  DeviceScratch(size_t bytes, cudaStream_t stream) : stream_(stream), bytes_(bytes) {
    if (!bytes) return;
    check_cuda(scratch_malloc(&ptr_, bytes, stream), "cudaMallocFromPoolAsync (scratch)");
    detail::count_alloc(detail::device_scratch_counter(), int64_t(bytes));
  }
  ~DeviceScratch() {
    if (!ptr_) return;
    cudaFreeAsync(ptr_, stream_);
    detail::count_free(detail::device_scratch_counter(), int64_t(bytes_));
  }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
  size_t bytes_ = 0;
};

}  // namespace flashattn::cuda
