// Hopper (sm_90a) forward kernel: TMA + wgmma, warp-specialized. Entry points for the dispatch.
#pragma once

#include "core/params.hpp"

namespace flashattn::cuda::sm90 {

// True when forward(p) handles this call: f16/bf16, head_dim 64/128/256, no window other than
// causal, no softcap, no varlen, 16-byte aligned rows and strides, positive scale, an sm_90 device.
bool supports(const detail::Params& p);

// Runs the forward pass on p.stream; throws flashattn::Error carrying CUDA's message on failure.
void forward(const detail::Params& p);

}  // namespace flashattn::cuda::sm90
