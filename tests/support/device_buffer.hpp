// A minimal owning buffer in CUDA device memory, for tests that run the library on Device::cuda.
//
// The CUDA runtime is used only when FLASHATTN_TEST_CUDA is defined (tests/CMakeLists.txt defines it
// and links CUDA::cudart when the library is built with its CUDA backend). Without it every
// operation throws std::runtime_error; the tests check flashattn::cuda_available() first and skip,
// so that path is never reached in a CPU-only build.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

#if defined(FLASHATTN_TEST_CUDA)
#include <cuda_runtime.h>
#endif

namespace fa_test {

// True when this test binary was built with the CUDA runtime.
inline constexpr bool kTestsHaveCuda =
#if defined(FLASHATTN_TEST_CUDA)
    true;
#else
    false;
#endif

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
#if defined(FLASHATTN_TEST_CUDA)
    if (bytes_ > 0) check(cudaMalloc(&ptr_, bytes_), "cudaMalloc");
#else
    if (bytes_ > 0) no_cuda();
#endif
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

  void upload(const void* host, size_t bytes) {
    if (bytes > bytes_) throw std::runtime_error("DeviceBuffer::upload: too many bytes");
#if defined(FLASHATTN_TEST_CUDA)
    if (bytes) check(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
#else
    (void)host;
    if (bytes) no_cuda();
#endif
  }
  void download(void* host, size_t bytes) const {
    if (bytes > bytes_) throw std::runtime_error("DeviceBuffer::download: too many bytes");
#if defined(FLASHATTN_TEST_CUDA)
    // cudaMemcpy on the legacy default stream waits for the library's work on that stream; the
    // library is called with Options::stream = nullptr in the tests, so this also synchronizes.
    if (bytes) check(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
#else
    (void)host;
    if (bytes) no_cuda();
#endif
  }

  // Waits for all work on the device and reports any asynchronous error (a kernel fault).
  static void synchronize() {
#if defined(FLASHATTN_TEST_CUDA)
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
  }

 private:
  void release() {
#if defined(FLASHATTN_TEST_CUDA)
    if (ptr_) cudaFree(ptr_);
#endif
    ptr_ = nullptr;
    bytes_ = 0;
  }
#if defined(FLASHATTN_TEST_CUDA)
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
#else
  [[noreturn]] static void no_cuda() {
    throw std::runtime_error("DeviceBuffer: the tests were built without FLASHATTN_TEST_CUDA");
  }
#endif

  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace fa_test
