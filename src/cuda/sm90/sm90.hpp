// Hopper (sm_90a) forward kernel: TMA + wgmma, warp-specialized. Entry points for the dispatch.
#pragma once

#include "core/params.hpp"

namespace flashattn::cuda::sm90 {

// The causal kernels (forward and backward) serve every call with a window: Params folds causal in
// as window_right = 0, and their key (query) ranges and masks take both bounds at run time.
inline bool causal_kernel(const detail::Params& p) { return p.window_right >= 0 || p.window_left >= 0; }
// Their window as the kernels take it: window_left −1 (none) or below seqlen_k; window_right >= 0,
// an unbounded right side as seqlen_q (past every key: row + seqlen_k − seqlen_q + seqlen_q >= seqlen_k).
inline int kernel_window_left(const detail::Params& p) {
  return causal_kernel(p) && p.window_left >= 0 && p.window_left < p.seqlen_k ? int(p.window_left) : -1;
}
inline int kernel_window_right(const detail::Params& p) {
  if (!causal_kernel(p)) return -1;
  return int(p.window_right < 0 || p.window_right > p.seqlen_q ? p.seqlen_q : p.window_right);
}
// The causal kernels' bounds (a tile's last row + diag + window_right, its last key + window_left)
// stay within int.
inline bool window_bounds_fit(const detail::Params& p) {
  return !causal_kernel(p) || p.seqlen_q + p.seqlen_k + 256 < (int64_t(1) << 31);
}

// True when forward(p) handles this call: f16/bf16, head_dim 64/96/128/192/256 (96 on the d128
// kernels), any window (on the causal kernels), softcap except at d64 without a window, varlen,
// 16-byte aligned rows and strides, positive scale, an sm_90 device.
bool supports(const detail::Params& p);

// Runs the forward pass on p.stream; throws flashattn::Error carrying CUDA's message on failure.
void forward(const detail::Params& p);

// True when backward(p) handles this call: head_dim 64, 96 (on the d128 kernel), 128, 192 (on the
// d256 kernel) or 256, any window at d64/d96/d128 (on the causal kernels; d192/d256 causal only),
// softcap at d96/d128, varlen at d64/d96/d128, any nonzero scale, and not Options::deterministic
// (dQ is summed with unordered fp32 atomics).
bool supports_backward(const detail::Params& p);

// dQ, dK, dV on p.stream: a preprocessing kernel (D, LSE·log2e), the fused kernel, a dQ cast.
void backward(const detail::Params& p);

}  // namespace flashattn::cuda::sm90
