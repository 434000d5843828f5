// Host-side helpers the Hopper forward (dispatch_fwd.cu) and backward (dispatch_bwd.cu) dispatch share.
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
// (box_rows × 128 B) chunks (docs/hopper-sm90.md §3.2); x_chunked(D): (D, rows, 1, heads, batch), boxes
// of one chunk.
CUtensorMap make_map(const detail::TensorRef& t, int64_t batch, int64_t rows, int64_t heads, int64_t d,
                     int box_rows, int box_chunks, bool f16);

// Experiment knobs (FLASHATTN_SM90_* environment variables, for measurements): read only by a build
// configured with -DFLASHATTN_DEV_KNOBS=ON, where env_knob gives the variable's integer value, or
// `unset` when it is absent or empty (callers keep it in a function-local static). In every other
// build FLASHATTN_DEV_KNOB is its default and the library never looks at the variable.
#if FLASHATTN_DEV_KNOBS
int env_knob(const char* name, int unset);
#define FLASHATTN_DEV_KNOB(name, unset) ::flashattn::cuda::sm90::env_knob(name, unset)
#else
#define FLASHATTN_DEV_KNOB(name, unset) (unset)
#endif

bool device_is_sm90();                          // the current device is compute capability 9.0
bool strides_ok(const detail::TensorRef& t);  // TMA: 16-byte aligned base, strides multiples of 8 elements

}  // namespace flashattn::cuda::sm90
