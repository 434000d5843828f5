// The Hopper backward's work tiles (key tile, KV head, batch), the query tiles each one visits,
// and the element masks of its steps: shared by both backward kernels (kernel.cuh, kernel_wide.cuh).
#pragma once

#include "cuda/sm90/args.hpp"
#include "cuda/sm90/bwd/query_tiles.hpp"
#include "cuda/sm90/primitives/fragment.cuh"
#include "cuda/sm90/seq.cuh"

namespace flashattn::cuda::sm90 {
namespace bwd {

// The sequence of a work tile: seq_rows (seq.cuh), varlen in the d64/d128 kernel only (kVarlen).
// The statistics and the dQ accumulator stay per sequence, (batch, heads, m_pad). The consumers
// load it at the tile's start, per step and again for the dK/dV store, so only the lengths stay
// in registers across the steps (holding the rest, the d128 causal consumer spilled).

// Index of query tile m's first row (kBlockM rows) of (batch, head) in the per-row statistics
// (LSE·log2e, D), laid out (batch, heads, m_pad).
template <class Tile>
__device__ __forceinline__ long long stat_row(const BwdArgs& a, int batch, int head, int m) {
  return (static_cast<long long>(batch) * a.heads + head) * a.m_pad + m * Tile::kBlockM;
}

// Work tiles: (key tile, KV head, batch), key tile fastest, so concurrent CTAs share a head's Q
// and dO in L2 and, for causal, the heaviest key tiles (n = 0 sees every query tile) come first
// (with kBwdDeterministic the lightest: bwd_tile_key).
// A CTA takes tiles blockIdx.x, blockIdx.x + gridDim.x, …: one tile per CTA when the grid covers
// them all, persistent otherwise (BwdArgs::grid chosen on the host, kBwdPersistent).
struct BwdTileCoord {
  int n_block, head_kv, batch;
  int m_begin, m_count, steps;  // query tiles of the tile; steps = m_count · group
  SeqRows seq;
};
template <class Tile, bool kCausal, bool kVarlen>
__device__ __forceinline__ BwdTileCoord bwd_tile(const BwdArgs& a, int idx) {
  BwdTileCoord c;
  c.n_block = bwd_tile_key<kCausal>(a, idx);
  c.head_kv = (idx / a.n_blocks) % a.heads_kv;
  c.batch = idx / (a.n_blocks * a.heads_kv);
  c.seq = seq_rows<kVarlen>(a, c.batch);
  int m_end;
  query_range<Tile, kCausal, kVarlen>(a, c.seq, c.n_block, c.m_begin, m_end);
  c.m_count = m_end > c.m_begin ? m_end - c.m_begin : 0;
  c.steps = c.m_count * a.group;  // (head of the group, query tile) pairs, head-major
  return c;
}

}  // namespace bwd
}  // namespace flashattn::cuda::sm90
