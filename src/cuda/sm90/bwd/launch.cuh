// The Hopper backward's launch: picks the kernel (d64/d128 in kernel.cuh, d192/d256 in
// kernel_wide.cuh; d128's softcap instance), sets its shared memory, launches it. Included by the
// explicit instantiations in src/cuda/inst/sm90_bwd_*.cu.
#pragma once

#include <atomic>

#include "cuda/sm90/bwd/kernel.cuh"
#include "cuda/sm90/bwd/kernel_wide.cuh"

namespace flashattn::cuda::sm90 {

// kHeadDim 192 runs the d256 kernel with its fourth column chunk zero (bwd/kernel_wide.cuh, kCols).
template <int kHeadDim, bool kF16, bool kCausal>
cudaError_t launch_bwd(const BwdArgs& a, cudaStream_t stream) {
  constexpr bool kWide = kHeadDim >= 192;
  using Tile = BwdTile<kWide ? 256 : kHeadDim>;
  const bool softcap = kHeadDim == 128 && a.softcap_scale > 0.f;  // the d128 kernel's softcap instance
  auto kernel = [softcap] {
    if constexpr (kWide) return bwd::bwd_wide_kernel<kF16, kCausal, kHeadDim>;
    else if constexpr (kHeadDim == 128)
      return softcap ? bwd::bwd_kernel<128, kF16, kCausal, true> : bwd::bwd_kernel<128, kF16, kCausal, false>;
    else return bwd::bwd_kernel<kHeadDim, kF16, kCausal, false>;
  }();
  constexpr int smem = [] {
    if constexpr (kWide) return bwd::WideSmem::kBytes;
    else return bwd::Smem<Tile>::kBytes;
  }();
  static std::atomic<uint64_t> smem_set[2];  // devices each kernel's attribute is set on (static: zeroed)
  cudaError_t e = ensure_dynamic_smem(kernel, smem, smem_set[softcap]);
  if (e != cudaSuccess) return e;
  kernel<<<a.grid, Tile::kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace flashattn::cuda::sm90
