// Hopper (sm_90a) forward kernel: TMA + wgmma, warp-specialized. Entry points for the dispatch.
#pragma once

#include "core/params.hpp"

namespace flashattn::cuda::sm90 {

// True when forward(p) handles this call: f16/bf16, head_dim 64/96/128/192/256 (96 on the d128
// kernels), causal windows (left, 0), softcap (not at d64 without causal), no varlen, 16-byte
// aligned rows and strides, positive scale, an sm_90 device.
bool supports(const detail::Params& p);

// Runs the forward pass on p.stream; throws flashattn::Error carrying CUDA's message on failure.
void forward(const detail::Params& p);

// True when backward(p) handles this call: as supports(), head_dim 64 or 128, any nonzero scale,
// and not Options::deterministic (dQ is summed with unordered fp32 atomics).
bool supports_backward(const detail::Params& p);

// dQ, dK, dV on p.stream: a preprocessing kernel (D, LSE·log2e), the fused kernel, a dQ cast.
void backward(const detail::Params& p);

}  // namespace flashattn::cuda::sm90
