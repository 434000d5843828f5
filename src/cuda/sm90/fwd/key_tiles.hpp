// The Hopper forward's key tiles per query block and the masks of their scores, host and device:
// the kernels call these (mainloop.cuh, softmax.cuh), and tests/kernels/test_key_tiles.cpp checks
// them on the CPU against the visibility rule of include/flashattn.
#pragma once

#include <cmath>

#include "cuda/sm90/args.hpp"
#include "cuda/sm90/primitives/hd.hpp"
#include "cuda/sm90/seq_rows.hpp"

namespace flashattn::cuda::sm90 {

// The key tiles [begin, end) the query block m_block needs (empty: every row fully masked). Row i
// sees keys j < k_len with, in the causal kernels, i + diag − window_left <= j <= i + diag +
// window_right, diag = k_len − q_len (bottom-right aligned per sequence; window_left −1:
// unbounded; window_right >= 0, clamped on the host: causal is window_right 0).
struct KeyTiles {
  int begin, end;  // end >= begin (key_range)
  FLASHATTN_HOST_DEVICE int count() const { return end - begin; }
};
template <class Tile, bool kCausal>
FLASHATTN_HD KeyTiles key_range(const FwdArgs& a, const SeqRows& s, int m_block) {
  const int diag = s.k_len - s.q_len;
  int end = s.k_len, begin = 0;
  if (kCausal) {  // the window's right bound (0: causal) and an optional left one (tests/kernels/test_key_tiles.cpp)
    end = min(end, (m_block + 1) * Tile::kBlockM + diag + a.window_right);  // the last row's bound + 1
    if (a.window_left >= 0) begin = max(0, m_block * Tile::kBlockM + diag - a.window_left);
  }
  const int first = begin / Tile::kBlockN;
  return {first, end <= 0 ? first : max(first, (end + Tile::kBlockN - 1) / Tile::kBlockN)};
}

// Consumer::run's needs_mask(n): whether key tile n takes the element mask (FragmentSoftmax::mask),
// for a query block whose first row's diagonal key is diag_row_min (m_block·kBlockM + k_len −
// q_len). A function object that holds its inputs by reference, as the lambda it replaced did (a
// function of the values made different code of the kernels).
template <class Tile, bool kCausal>
struct KeyTileNeedsMask {
  const int& diag_row_min;
  const int& k_len;
  const int& wl;
  const int& wr;
  FLASHATTN_HOST_DEVICE bool operator()(int n) const {
    const int key_end = (n + 1) * Tile::kBlockN;
    return key_end > k_len ||
           (kCausal && (key_end - 1 > diag_row_min + wr ||
                        (wl >= 0 && n * Tile::kBlockN < diag_row_min + Tile::kBlockM - 1 - wl)));
  }
};

// The causal consumers' first key tile n (Consumer::run's prologue): the 8-column blocks of the warp
// whose first row is warp_row0 (m_block·kBlockM + 64·wg + 16·warp) that hold a key left of its last
// row's right bound; the rest are masked for all 16 of its rows (FragmentSoftmax::step<true> skips
// their exponentials).
template <class Tile>
FLASHATTN_HD int live_column_blocks(int warp_row0, int n, int k_len, int q_len, int wr) {
  const int warp_last_row = warp_row0 + 15;
  const int last_key = min(k_len - 1, warp_last_row + k_len - q_len + wr);
  const int live_cols = last_key - n * Tile::kBlockN + 1;
  return live_cols <= 0 ? 0 : min(Tile::kBlockN / 8, (live_cols + 7) / 8);
}

// The causal consumers' skipped key blocks (Consumer::run, kSkipMasked): how many of the last key
// tiles of `keys` lie right of every row of the warpgroup whose first row is wg_row0
// (m_block·kBlockM + 64·wg); all of them when its rows start at or past q_len.
template <class Tile>
FLASHATTN_HD int masked_key_blocks(KeyTiles keys, int wg_row0, int q_len, int k_len, int wr) {
  const int wg_keys_end = wg_row0 >= q_len ? 0 : min(k_len, min(q_len, wg_row0 + 64) + k_len - q_len + wr);
  return keys.end - min(keys.end, max(keys.begin, (wg_keys_end + Tile::kBlockN - 1) / Tile::kBlockN));
}

// FragmentSoftmax::mask for the thread whose key in column 0 of the tile is `first` (key0 + 2·(lane
// mod 4)): scores of keys the row cannot see become −inf. acc_s is an m64nN accumulator fragment,
// row0 this thread's half-0 query row (sequence-local, as first).
template <bool kCausal, int kRegs>
FLASHATTN_HD void mask_scores(float (&acc_s)[kRegs], int first, int row0, int k_len, int q_len, int wl, int wr) {
  int last[2], lo[2];  // visible columns [lo, last] − first, per row half
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int diag = (k_len - q_len) + row0 + 8 * h;
    int bound = k_len - 1;
    if (kCausal) bound = min(bound, diag + wr);
    last[h] = bound - first;
    lo[h] = diag - wl - first;
  }
  if (!kCausal || wl < 0) {
#pragma unroll
    for (int r = 0; r < kRegs; ++r)
      if (8 * (r >> 2) + (r & 1) > last[(r >> 1) & 1]) acc_s[r] = -INFINITY;
  } else {
#pragma unroll
    for (int r = 0; r < kRegs; ++r) {
      const int c = 8 * (r >> 2) + (r & 1), h = (r >> 1) & 1;
      if (c > last[h] || c < lo[h]) acc_s[r] = -INFINITY;
    }
  }
}

}  // namespace flashattn::cuda::sm90
