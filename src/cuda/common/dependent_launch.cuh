// Programmatic dependent launch (sm_90 and later): a kernel launched by launch_dependent may be
// scheduled while the kernel before it on the stream is still running, so its launch latency hides
// behind that kernel's tail. It must call wait_for_prior_grid() before it reads anything the earlier
// kernel writes (the wait returns once that grid has finished and its writes are visible). Where the
// kernel's code lacks the wait (SASS built for an older architecture), or the device predates
// sm_90, launch_dependent launches it the ordinary way.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include "cuda/common/runtime.hpp"

namespace flashattn::cuda {

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel of the stream, if launched by launch_dependent, be scheduled before this
// grid ends (it still waits in wait_for_prior_grid for this grid's writes).
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Whether kKernel's code on the current device was built for sm_90 or later (so holds the
// griddepcontrol instructions above), checked once per kernel and device.
template <auto kKernel>
bool supports_dependent_launch() {
  constexpr int kMaxDevices = 64;
  static std::atomic<signed char> known[kMaxDevices] = {};  // 0 unknown, 1 yes, -1 no
  const int dev = current_device();
  if (dev < 0 || dev >= kMaxDevices) return false;
  signed char k = known[dev].load(std::memory_order_acquire);
  if (k == 0) {
    cudaFuncAttributes attr{};
    check_cuda(cudaFuncGetAttributes(&attr, kKernel), "cudaFuncGetAttributes");
    k = attr.binaryVersion >= 90 ? 1 : -1;
    known[dev].store(k, std::memory_order_release);
  }
  return k > 0;
}

// Launches kKernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the
// stream's previous kernel where `dependent` is true and the kernel supports it.
template <auto kKernel, class... Args>
void launch_dependent(bool dependent, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const char* what,
                      Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = dependent && supports_dependent_launch<kKernel>() ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, kKernel, std::forward<Args>(args)...), what);
}

}  // namespace flashattn::cuda
