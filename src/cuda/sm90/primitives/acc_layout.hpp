// Where the Hopper kernels' fp32 accumulator elements live, host and device: in a wgmma fragment
// (docs/hopper-sm90.md §1.3, §1.4) and in the backward's 64 × 64 dQ blocks. tests/kernels/test_smem_layout.cpp
// checks on the CPU that the dQ blocks stay a permutation of each row, keep 8-column groups whole
// (dq_convert reads them so) and take a warp's fragment stores without bank conflicts.
#pragma once

#include "cuda/sm90/primitives/hd.hpp"

namespace flashattn::cuda::sm90 {

// Thread t of the warpgroup, register r of an m64nN accumulator:
//   row(t, r) = 16·(t/32) + (t%32)/4 + 8·((r>>1)&1),   col(t, r) = 8·(r>>2) + 2·(t%4) + (r&1).
FLASHATTN_HD int acc_row(int t, int r) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((r >> 1) & 1); }
FLASHATTN_HD int acc_col(int t, int r) { return 8 * (r >> 2) + 2 * (t % 4) + (r & 1); }

// The backward's 64 × 64 fp32 dQ blocks (the staging buffer and the accumulator in global memory,
// which one bulk reduction adds it to, and dq_convert reads): row-major, each row's 8-column groups
// permuted by the row, column c of row i at c ^ 8·(i mod 4). A warp's float2 stores of an
// accumulator fragment then hit distinct banks: each half warp writes 8 columns of 4 rows, and in
// a plain row-major block those 4 rows, 256 bytes apart, share their banks (8 wavefronts per
// store instead of 2, as ncu measures; docs/perf/log.md, P-137).
FLASHATTN_HD int dq_block_offset(int row, int col) { return row * 64 + (col ^ ((row & 3) << 3)); }

}  // namespace flashattn::cuda::sm90
