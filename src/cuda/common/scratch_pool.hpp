// The memory pool the CUDA backend's scratch buffers come from (DeviceScratch, the Hopper tile
// counter). Header-only.
//
// Why not the device's default pool: its release threshold is 0, so every synchronization (an
// event or stream sync between training steps, or between timed calls) hands the scratch back to
// the driver, and the next call maps it again — measured on the H200 as a fixed cost per backward
// call that dominated short sequences (docs/perf/log.md, P-029). This pool keeps up to
// FLASHATTN_CUDA_SCRATCH_CACHE bytes (default 1 GiB; 0 = release at every synchronization) mapped
// between calls, the way PyTorch's caching allocator does, and releases the rest.
// The scratch counters (core/scratch.hpp) count live buffers, not what the pool keeps.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>

namespace flashattn::cuda {

inline uint64_t scratch_cache_bytes() {
  static const uint64_t bytes = [] {
    const char* v = std::getenv("FLASHATTN_CUDA_SCRATCH_CACHE");
    return v && *v ? uint64_t(std::strtoull(v, nullptr, 10)) : uint64_t(1) << 30;
  }();
  return bytes;
}

// The pool of `device`, created on first use; nullptr if the driver cannot create one (then the
// callers use cudaMallocAsync's default pool). After the first call per device no lock is taken.
inline cudaMemPool_t scratch_pool(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<cudaMemPool_t> pools[kMaxDevices] = {};
  static std::atomic<bool> tried[kMaxDevices] = {};
  static std::mutex mu;
  if (device < 0 || device >= kMaxDevices) return nullptr;
  if (tried[device].load(std::memory_order_acquire)) return pools[device].load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu);
  if (!tried[device].load(std::memory_order_relaxed)) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    if (cudaMemPoolCreate(&pool, &props) == cudaSuccess) {
      uint64_t keep = scratch_cache_bytes();
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
      pools[device].store(pool, std::memory_order_relaxed);
    } else {
      cudaGetLastError();
    }
    tried[device].store(true, std::memory_order_release);
  }
  return pools[device].load(std::memory_order_relaxed);
}

// Stream-ordered allocation from the current device's scratch pool. While `stream` is being
// captured into a CUDA graph the allocation becomes a node of the graph, which owns its memory:
// it then comes from cudaMallocAsync, so that a first call under capture does not create the pool.
inline cudaError_t scratch_malloc(void** ptr, size_t bytes, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess && capture != cudaStreamCaptureStatusNone)
    return cudaMallocAsync(ptr, bytes, stream);
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  cudaMemPool_t pool = scratch_pool(device);
  return pool ? cudaMallocFromPoolAsync(ptr, bytes, pool, stream) : cudaMallocAsync(ptr, bytes, stream);
}

}  // namespace flashattn::cuda
