// The Hopper backward's query tiles per key tile and the masks of its steps, host and device: the
// backward kernels call these (tile.cuh's bwd_tile and both kernels; StepMask the d64/d128 kernel,
// kernel.cuh), and tests/kernels/test_key_tiles.cpp checks them on the CPU against the visibility
// rule of include/flashattn.
#pragma once

#include "cuda/sm90/args.hpp"
#include "cuda/sm90/primitives/hd.hpp"
#include "cuda/sm90/seq_rows.hpp"

namespace flashattn::cuda::sm90 {
namespace bwd {

// The query tiles [m_begin, m_end) that see any key of key tile n. Bottom-right alignment: in the
// causal kernels query i sees key j iff i + diag − window_left <= j <= i + diag + window_right,
// diag = k_len − q_len per sequence (window_right >= 0, 0 = causal; window_left −1 = none;
// sm90.hpp). tests/kernels/test_key_tiles.cpp checks the ranges and masks against that rule.
template <class Tile, bool kCausal, bool kVarlen>
FLASHATTN_HD void query_range(const BwdArgs& a, const SeqRows& s, int n_block, int& m_begin, int& m_end) {
  m_begin = 0;
  m_end = a.m_blocks;
  if (kVarlen && a.cu_seqlens_q != nullptr) {  // the sequence's query tiles; none past its keys
    m_end = (s.q_len + Tile::kBlockM - 1) / Tile::kBlockM;
    if (n_block * Tile::kBlockN >= s.k_len) m_end = 0;
  }
  if (!kCausal) return;
  const int diag = s.k_len - s.q_len;
  const int first_query = n_block * Tile::kBlockN - diag - a.window_right;  // of the tile's first key
  m_begin = first_query <= 0 ? 0 : first_query / Tile::kBlockM;
  if (a.window_left >= 0) {
    const int last_query = (n_block + 1) * Tile::kBlockN - 1 - diag + a.window_left;  // of its last key
    m_end = last_query < 0 ? 0 : min(m_end, last_query / Tile::kBlockM + 1);
  }
}

// Options::deterministic (kBwdDeterministic): the key tiles that see query tile m add to its dQ
// blocks one at a time, in a fixed order, so the fp32 sums come out the same on every call. Without
// causal every key tile of the sequence sees every query tile and they add in ascending order; with
// it, in descending order, and the work tiles are taken in descending key-tile order too
// (bwd_tile_key), so a tile's predecessors started no later than it did and, walking the query
// tiles upwards from higher first ones, reached tile m earlier (a CTA waits for them, never the
// reverse: no deadlock with one CTA per tile). The key tiles that see m are a contiguous range
// (query_range's bounds rise with the key tile) ending at the last one whose first query row falls
// in tile m or before: n·kBlockN − diag − window_right < (m + 1)·kBlockM.
template <bool kCausal>
FLASHATTN_HD int bwd_tile_key(const BwdArgs& a, int idx) {
  const int n = idx % a.n_blocks;
  return kCausal && (a.flags & kBwdDeterministic) ? a.n_blocks - 1 - n : n;
}
// The turn of key tile n at query tile m: how many key tiles add to m's dQ blocks before it.
template <class Tile, bool kCausal>
FLASHATTN_HD int dq_turn(const BwdArgs& a, const SeqRows& s, int n_block, int m) {
  if (!kCausal) return n_block;
  const int key_tiles = (s.k_len + Tile::kBlockN - 1) / Tile::kBlockN;  // those holding the sequence's keys
  const long long bound = static_cast<long long>(m + 1) * Tile::kBlockM + (s.k_len - s.q_len) + a.window_right;
  const long long last = (bound - 1) / Tile::kBlockN;  // bound > n_block·kBlockN >= 0 where n sees m
  return int(last < key_tiles - 1 ? last : key_tiles - 1) - n_block;
}

// Does step (key tile n, query tile from row q0) need the element mask: keys past seqlen_k, or a
// key outside some row's window.
template <class Tile, bool kCausal>
FLASHATTN_HD bool step_needs_mask(const BwdArgs& a, const SeqRows& s, int n_block, int q0) {
  const int diag = s.k_len - s.q_len;
  return (n_block + 1) * Tile::kBlockN > s.k_len ||
         (kCausal && ((n_block + 1) * Tile::kBlockN - 1 > q0 + diag + a.window_right ||
                      (a.window_left >= 0 && n_block * Tile::kBlockN < q0 + Tile::kBlockM - 1 + diag - a.window_left)));
}
// The element mask of one step (used where step_needs_mask): register r of a thread holds key row
// key_row0 + 8((r >> 1) & 1) and query column first_query + 8(r >> 2) + (r & 1), first_query =
// q0 + 2(lane % 4) (fragment.cuh acc_col). The bounds fold once per step into the visible columns
// [lo, hi] of each key-row half, relative to first_query, so an element costs two compares against
// constants and a select, in a pass after the exponentials (inside their loop the d64 instance
// spilled). Keys past seqlen_k: lo past every column; no left window: hi past every column;
// non-causal: lo = 0. The d256 kernel (bwd/kernel_wide.cuh) takes causal only: with this mask,
// as a pass or inside its loop, its backward takes 6-9 % longer on the H200 (docs/perf/log.md,
// P-085).
struct StepMask {
  int lo[2], hi[2];
  FLASHATTN_HD bool hides(int r) const {
    const int c = 8 * (r >> 2) + (r & 1), h = (r >> 1) & 1;
    return (c < lo[h]) | (c > hi[h]);
  }
  template <int kRegs>
  FLASHATTN_HD void apply(float (&p)[kRegs], float hidden = 0.f) const {
#pragma unroll
    for (int r = 0; r < kRegs; ++r)
      if (hides(r)) p[r] = hidden;
  }
};
template <bool kCausal>
FLASHATTN_HD StepMask step_mask(const BwdArgs& a, const SeqRows& s, int key_row0, int first_query) {
  const int diag = s.k_len - s.q_len;
  constexpr int kPast = 1 << 30;
  StepMask m;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key_row0 + 8 * h;  // query i sees it iff key − diag − wr <= i (<= key − diag + wl)
    m.lo[h] = key >= s.k_len ? kPast : kCausal ? key - diag - a.window_right - first_query : 0;
    m.hi[h] = kCausal && a.window_left >= 0 ? key - diag + a.window_left - first_query : kPast;
  }
  return m;
}

}  // namespace bwd
}  // namespace flashattn::cuda::sm90
