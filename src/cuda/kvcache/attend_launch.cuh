// The launcher behind run_attend (launch.hpp), included by the explicit instantiations.
#pragma once

#include <atomic>

#include "cuda/common/runtime.hpp"
#include "cuda/kvcache/attend.cuh"
#include "cuda/kvcache/launch.hpp"

namespace flashattn::cuda::kv {

// The kernel with its dynamic shared memory size allowed (set on every device that runs it:
// the attribute is per device).
template <class T, int kHeadDim, int kWarpsM>
auto attend_kernel() {
  using C = KvConfig<kHeadDim, kWarpsM>;
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> allowed[kMaxDevices] = {};
  auto kernel = kv_attend_kernel<T, kHeadDim, kWarpsM>;
  const int dev = current_device();
  if (dev < 0 || dev >= kMaxDevices || !allowed[dev].load(std::memory_order_acquire)) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes),
               "cudaFuncSetAttribute(kv_attend_kernel)");
    if (dev >= 0 && dev < kMaxDevices) allowed[dev].store(true, std::memory_order_release);
  }
  return kernel;
}

template <class T, int kHeadDim, int kWarpsM>
int attend_ctas_per_sm() {
  using C = KvConfig<kHeadDim, kWarpsM>;
  static const int n = [] {
    int ctas = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, attend_kernel<T, kHeadDim, kWarpsM>(),
                                                             C::kThreads, C::kSmemBytes),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor(kv_attend_kernel)");
    return ctas > 0 ? ctas : 1;
  }();
  return n;
}

template <class T, int kHeadDim, int kWarpsM>
void run_attend(const KvArgs& a, bool after_kernel, cudaStream_t stream) {
  using C = KvConfig<kHeadDim, kWarpsM>;
  static_assert(C::kBlockM == block_rows(kWarpsM), "launch.hpp's block_rows matches the config");
  const int64_t ctas = int64_t(a.batch) * a.heads_kv * ((a.rows + C::kBlockM - 1) / C::kBlockM) * a.splits;
  if (ctas == 0) return;
  attend_kernel<T, kHeadDim, kWarpsM>();  // the shared-memory attribute set
  launch_dependent<kv_attend_kernel<T, kHeadDim, kWarpsM>>(after_kernel, unsigned(ctas), C::kThreads, C::kSmemBytes,
                                                           stream, "kv_attend_kernel", a);
}

}  // namespace flashattn::cuda::kv
