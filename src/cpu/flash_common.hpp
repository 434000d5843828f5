// Pieces shared by the CPU flash forward and backward: tile sizes, packing, masking.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/params.hpp"
#include "core/scratch.hpp"
#include "cpu/tile_kernels.hpp"

namespace flashattn::cpu {

using detail::KeyRange;

constexpr float kLog2e = 1.4426950408889634f;

// A counted, 64-byte aligned scratch buffer of n floats, zero-filled (padding columns of the tiles
// are never written afterwards and must read as zeros).
inline detail::Scratch<float> zeroed(size_t n) {
  detail::Scratch<float> b(n);
  std::fill(b.data(), b.data() + n, 0.0f);
  return b;
}

inline size_t dtype_bytes(DType t) { return t == DType::f32 ? 4 : 2; }

// Tile sizes (the arithmetic behind them: docs/cpu-kernels.md). Per thread at d = 128, fp32:
// forward sQ 128 KiB + sS 256 KiB + acc 128 KiB = 512 KiB (+ sK, sV 128 KiB each for f16/bf16),
// inside the 1 MiB L2 of a Zen 4 core, next to the panels OpenBLAS packs for each tile product.
struct FwdTiles {
  // OpenBLAS packs both operands of every call, so each call repacks Q (once per key tile) and
  // P, K, V: 256 × 256 makes every packed element serve 256 rows or columns of FMAs. Measured
  // against 128 × 64 (v2), 128 × 128/256, 256 × 64/128, 384 × 128 and 512 × 128 (docs/perf/log.md, P-014):
  // best or tied on all four bar shapes (512 rows lose 5-9 % causal: more masked work).
  static constexpr int kBlockM = 256;  // query rows per tile
  static constexpr int kBlockN = 256;  // keys per tile (a multiple of kPadN)
};
struct BwdTiles {
  static constexpr int kBlockM = 64;  // query rows per tile (128 measured 5-14 % slower at d = 128)
  // keys per tile: 128 measured +8 % at d = 64 but -6..-12 % at d = 128 (docs/perf/log.md, P-014)
  static constexpr int kBlockN = 64;
};

// dst[c * ld_dst + j] = src[j * ld_src + c] for j < rows, c < cols; columns rows..pad_n(rows)
// of dst are zeroed so that GEMMs over the padded width read zeros.
inline void transpose_tile(const float* src, int rows, int cols, int64_t ld_src, float* dst,
                           int64_t ld_dst) {
  const int rows_pad = int(pad_n(rows));
  for (int c = 0; c < cols; ++c) {
    float* drow = dst + c * ld_dst;
    for (int j = 0; j < rows; ++j) drow[j] = src[j * ld_src + c];
    for (int j = rows; j < rows_pad; ++j) drow[j] = 0.0f;
  }
}

// Load `rows` rows of head `head` of tensor `t` starting at sequence row `row0` into dst
// (row-major, ld_dst floats), converted to fp32 and multiplied by mult.
inline void load_rows(const detail::Params& p, const TileKernels& tk, const detail::TensorRef& t,
                      const detail::SeqSpan& sp, int64_t seq_start, int64_t head, int64_t row0,
                      int rows, float mult, float* dst, int64_t ld_dst) {
  const size_t esz = dtype_bytes(p.dtype);
  const char* base = static_cast<const char*>(t.data);
  for (int r = 0; r < rows; ++r) {
    const int64_t off = t.offset(sp.batch_index, seq_start + row0 + r, head);
    tk.load(base + off * int64_t(esz), p.dtype, int(p.head_dim), mult, dst + r * ld_dst);
  }
}

// dK and dV rows [k_len, k_rows) of sequence `sp`, KV head hk: the key padding past seqused_k,
// whose gradients are zeros (all-zero bits in f32, f16 and bf16).
inline void zero_key_padding(const detail::Params& p, const detail::SeqSpan& sp, int64_t hk) {
  const size_t esz = dtype_bytes(p.dtype), bytes = size_t(p.head_dim) * esz;
  for (int64_t j = sp.k_start + sp.k_len; j < sp.k_start + sp.k_rows; ++j) {
    std::memset(static_cast<char*>(p.dk.data) + p.dk.offset(sp.batch_index, j, hk) * int64_t(esz), 0, bytes);
    std::memset(static_cast<char*>(p.dv.data) + p.dv.offset(sp.batch_index, j, hk) * int64_t(esz), 0, bytes);
  }
}

// Scores outside each row's visible range [lo, hi) become -inf. Rows entirely inside cost one
// comparison, so interior tiles pay almost nothing.
inline void mask_tile(const KeyRange* range, int mq, int64_t j0, int nk, float* s, int64_t lds) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < mq; ++r) {
    const int64_t lo = std::clamp<int64_t>(range[r].lo - j0, 0, nk);
    const int64_t hi = std::clamp<int64_t>(range[r].hi - j0, 0, nk);
    float* row = s + r * lds;
    if (lo >= hi) {
      std::fill(row, row + nk, ninf);
      continue;
    }
    std::fill(row, row + lo, ninf);
    std::fill(row + hi, row + nk, ninf);
  }
}

}  // namespace flashattn::cpu
