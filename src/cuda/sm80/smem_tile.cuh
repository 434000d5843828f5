// A (kRows, kCols) tile of 16-bit elements in shared memory, rows padded by one 16-byte chunk:
// row stride = (kCols + 8) elements = 16·(kCols/8 + 1) bytes, an odd number of 16-byte units when
// kCols is a multiple of 16, so ldmatrix's 8 row addresses (same columns, 8 consecutive rows) fall
// in 8 different 16-byte bank groups: no conflicts. Unlike an XOR swizzle the address stays affine
// in (row, col), so every ldmatrix of a fully unrolled loop is one base register plus an immediate
// (the swizzled version spent ~60 registers on precomputed addresses and spilled).
#pragma once

#include <cstdint>

#include "cuda/sm80/ptx.cuh"

namespace flashattn::cuda {

template <int kRows, int kCols>
struct SmemTile {
  static_assert(kCols % 16 == 0, "kernel head dims are multiples of 16 (conflict-free padding)");
  static constexpr int kChunks = kCols / 8;  // 16-byte chunks per row
  static constexpr int kStride = kCols + 8;  // elements per row, padded
  static constexpr int kElems = kRows * kStride;
  static constexpr int kBytes = kElems * 2;

  __device__ __forceinline__ static int offset(int r, int col) { return r * kStride + col; }

  // Cooperative cp.async load of rows [0, kRows) from a global row-major tile whose first row is
  // `gmem` (row stride in elements). Rows >= valid_rows and columns >= valid_cols are zero-filled,
  // so masked keys meet zeros (never NaN garbage) and padded head dims contribute nothing.
  template <int kThreads, class T>
  __device__ __forceinline__ static void load(T* smem, const T* gmem, int64_t row_stride,
                                              int valid_rows, int valid_cols, int tid) {
    constexpr int kTotal = kRows * kChunks;
#pragma unroll
    for (int it = 0; it < (kTotal + kThreads - 1) / kThreads; ++it) {
      const int id = it * kThreads + tid;
      if (kTotal % kThreads == 0 || id < kTotal) {
        const int r = id / kChunks, c = id % kChunks;
        const bool pred = r < valid_rows && c * 8 < valid_cols;
        const T* src = pred ? gmem + int64_t(r) * row_stride + c * 8 : gmem;
        ptx::cp_async_16(smem + offset(r, c * 8), src, pred);
      }
    }
  }
};

// ldmatrix address helpers for one warp. Lane l supplies the row address of matrix l / 8.
// A operand, 16x16 at (r0, c0) of a row-major tile: matrices (r0,c0) (r0+8,c0) (r0,c0+8) (r0+8,c0+8).
template <class Tile, class T>
__device__ __forceinline__ const T* a_frag_addr(const T* s, int r0, int c0, int lane) {
  return s + Tile::offset(r0 + (lane & 15), c0 + ((lane >> 4) << 3));
}
// B operand for two n8 tiles from an (n, k) row-major tile (K for Q·Kᵀ): matrices
// (n0,k0) (n0,k0+8) (n0+8,k0) (n0+8,k0+8) -> {b0,b1} of tile n0 and {b0,b1} of tile n0+8.
template <class Tile, class T>
__device__ __forceinline__ const T* b_frag_addr(const T* s, int n0, int k0, int lane) {
  return s + Tile::offset(n0 + ((lane >> 4) << 3) + (lane & 7), k0 + (((lane >> 3) & 1) << 3));
}
// B operand (with .trans) for two n8 tiles from a (k, n) row-major tile (V for P·V): matrices
// (k0,n0) (k0+8,n0) (k0,n0+8) (k0+8,n0+8).
template <class Tile, class T>
__device__ __forceinline__ const T* bt_frag_addr(const T* s, int k0, int n0, int lane) {
  return s + Tile::offset(k0 + (((lane >> 3) & 1) << 3) + (lane & 7), n0 + ((lane >> 4) << 3));
}

}  // namespace flashattn::cuda
