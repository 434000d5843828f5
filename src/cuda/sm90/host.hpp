// Host-side helpers the Hopper forward (sm90.cu) and backward (sm90_bwd.cu) dispatch share.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/params.hpp"

namespace flashattn::cuda::sm90 {

// Throws flashattn::Error("flashattn sm90: <what>: <CUDA's message>").
[[noreturn]] void fail(const std::string& what, cudaError_t e);

// Whether a head dim's maps hold the row's D elements as dimension 0, one 64-column chunk loaded
// per box at x = 64·c, columns past D read as zeros (D = 96 on the d128 kernels; FwdArgs::x_chunks).
inline bool x_chunked(int64_t d) { return d % 64 != 0; }

// A (batch, rows, heads, D) 16-bit tensor as a 5-D TMA map (64, rows, D/64, heads, batch) with
// boxes of (64, box_rows, box_chunks): they land in smem as box_chunks consecutive 128B-swizzled
// (box_rows × 128 B) chunks (hopper-sm90.md §3.2); x_chunked(D): (D, rows, 1, heads, batch), boxes
// of one chunk.
CUtensorMap make_map(const detail::TensorRef& t, int64_t batch, int64_t rows, int64_t heads, int64_t d,
                     int box_rows, int box_chunks, bool f16);

// Measurement switches (FLASHATTN_SM90_*, docs/perf-log.md): the integer value of the environment
// variable `name`, or `unset` when it is absent or empty. Callers keep it in a function-local static.
int env_knob(const char* name, int unset);

bool device_is_sm90();                          // the current device is compute capability 9.0
bool strides_ok(const detail::TensorRef& t);  // TMA: 16-byte aligned base, strides multiples of 8 elements

}  // namespace flashattn::cuda::sm90
