// The window mask as the kernels see it: one sequence's (q_len, k_len) and the resolved window,
// bottom-right aligned (params.hpp visible_keys): query i sees keys j with
//   lo(i) <= j < hi(i),  lo = i + off - window_left,  hi = i + off + window_right + 1,
//   off = k_len - q_len, each bound absent when its window side is -1, and always 0 <= j < k_len.
// It gives the key-tile range of a query tile (tiles outside are skipped), the query-tile range of
// a key tile (backward), and whether a tile needs per-element masking at all (only boundary
// tiles do). The CPU reference keeps its own, independent mask.
#pragma once

#include <cstdint>

#include "cuda/common/args.hpp"

namespace flashattn::cuda {

// Where sequence b lives in the tensors and how long it is: k_len keys (seqused_k[b] when given)
// out of the k_rows key rows the tensors hold for it (the rest padding, whose dK and dV rows the
// backward writes as zeros).
struct SeqInfo {
  int batch_index;   // tensor batch coordinate (0 with varlen)
  int q_start, k_start;
  int q_len, k_len;
  int k_rows;
};

__device__ __forceinline__ SeqInfo seq_info(const AttnArgs& a, int b) {
  SeqInfo s{b, 0, 0, a.seqlen_q, a.seqlen_k, a.seqlen_k};
  if (a.cu_seqlens_q != nullptr) {
    const int q0 = a.cu_seqlens_q[b], q1 = a.cu_seqlens_q[b + 1];
    const int k0 = a.cu_seqlens_k[b], k1 = a.cu_seqlens_k[b + 1];
    s = {0, q0, k0, q1 - q0, k1 - k0, k1 - k0};
  }
  if (a.seqused_k != nullptr) s.k_len = a.seqused_k[b];
  return s;
}

struct WindowMask {
  int q_len, k_len, off, left, right;

  __device__ __forceinline__ WindowMask(const AttnArgs& a, const SeqInfo& s)
      : q_len(s.q_len), k_len(s.k_len), off(s.k_len - s.q_len), left(a.window_left),
        right(a.window_right) {}
  // One KV-cache sequence: q_len queries over its k_len = cached + new tokens.
  __device__ __forceinline__ WindowMask(int q_len_, int k_len_, int left_, int right_)
      : q_len(q_len_), k_len(k_len_), off(k_len_ - q_len_), left(left_), right(right_) {}

  __device__ __forceinline__ bool visible(int i, int j) const {
    return j < k_len && (left < 0 || j >= i + off - left) && (right < 0 || j <= i + off + right);
  }

  // Keys [*lo, *hi) that some row of [m0, m1) sees (m1 exclusive, already clipped to q_len).
  __device__ __forceinline__ void key_range(int m0, int m1, int* lo, int* hi) const {
    int l = left < 0 ? 0 : m0 + off - left;
    int h = right < 0 ? k_len : (m1 - 1) + off + right + 1;
    *lo = l < 0 ? 0 : l;
    *hi = h > k_len ? k_len : h;
  }

  // Queries [*lo, *hi) that see some key of [n0, n1) (n1 exclusive, clipped to k_len).
  __device__ __forceinline__ void query_range(int n0, int n1, int* lo, int* hi) const {
    int l = right < 0 ? 0 : n0 - off - right;
    int h = left < 0 ? q_len : (n1 - 1) - off + left + 1;
    *lo = l < 0 ? 0 : l;
    *hi = h > q_len ? q_len : h;
  }

  // True when every (i, j) in [m0, m0+bm) x [n0, n0+bn) is visible: no per-element mask needed.
  __device__ __forceinline__ bool tile_all_visible(int m0, int bm, int n0, int bn) const {
    return n0 + bn <= k_len && (left < 0 || n0 >= (m0 + bm - 1) + off - left) &&
           (right < 0 || n0 + bn - 1 <= m0 + off + right);
  }
};

}  // namespace flashattn::cuda
