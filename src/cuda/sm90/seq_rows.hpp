// SeqRows (seq.cuh loads it) on its own, without the device loads: for the headers that the CPU
// tests include too (fwd/key_tiles.hpp, bwd/query_tiles.hpp).
#pragma once

namespace flashattn::cuda::sm90 {

// Sequence b: its first query and key row in the tensors, its lengths, and the batch coordinate of
// the TMA maps. Without varlen the whole tensors of batch entry b; with varlen (cu_seqlens_q set)
// rows of the packed tensors, whose maps have batch extent 1 (batch coordinate 0).
struct SeqRows {
  int q_start, k_start, q_len, k_len, batch;
};

}  // namespace flashattn::cuda::sm90
