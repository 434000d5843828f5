// The backward's dQ block layout (src/cuda/sm90/primitives/acc_layout.hpp), on the CPU: each row a permutation
// of its 64 columns, 8-column groups kept whole and in place (dq_convert reads 8 columns from an
// 8-aligned one as one run), and a warp's float2 stores of an accumulator fragment conflict-free
// in shared memory — the property whose loss costs the backward 7.7–14.1 % of its kernel time
// (docs/perf/log.md, P-138).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <set>

#include "cuda/sm90/primitives/acc_layout.hpp"

using flashattn::cuda::sm90::acc_col;
using flashattn::cuda::sm90::acc_row;
using flashattn::cuda::sm90::dq_block_offset;

namespace {

// Shared-memory wavefronts of one warp's 8-byte stores (byte addresses, one per lane): 32 banks of
// 4 bytes; an 8-byte access is served per half warp (16 lanes, 128 bytes), and a half warp takes
// as many wavefronts as the most distinct words any one bank holds among its addresses.
int wavefronts_8byte(const std::array<int, 32>& addr) {
  int total = 0;
  for (int half = 0; half < 2; ++half) {
    std::array<std::set<int>, 32> words;
    for (int lane = 16 * half; lane < 16 * half + 16; ++lane)
      for (int w = 0; w < 2; ++w) {
        const int word = addr[lane] / 4 + w;
        words[word % 32].insert(word);
      }
    size_t most = 0;
    for (const auto& b : words) most = std::max(most, b.size());
    total += int(most);
  }
  return total;
}

TEST(SmemLayout, DqBlockRowsArePermutationsWithWholeGroups) {
  for (int row = 0; row < 64; ++row) {
    std::set<int> seen;
    for (int col = 0; col < 64; ++col) {
      const int off = dq_block_offset(row, col);
      ASSERT_EQ(off / 64, row) << "column " << col << " left its row";
      seen.insert(off);
      if (col % 8) {
        EXPECT_EQ(off, dq_block_offset(row, col - col % 8) + col % 8) << "row " << row << " column " << col;
      }
    }
    EXPECT_EQ(seen.size(), 64u) << "row " << row;
  }
}

TEST(SmemLayout, DqBlockFragmentStoresAreConflictFree) {
  // stage_block64 (fragment.cuh): thread t stores registers (r, r + 1) of its m64n64 accumulator as
  // one float2 at dq_block_offset(row, col), for r = 0, 2, …, 30, in each of the 4 warps.
  for (int warp = 0; warp < 4; ++warp)
    for (int r = 0; r < 32; r += 2) {
      std::array<int, 32> addr{};
      for (int lane = 0; lane < 32; ++lane) {
        const int t = 32 * warp + lane;
        addr[lane] = 4 * dq_block_offset(acc_row(t, r), acc_col(t, r));
      }
      EXPECT_EQ(wavefronts_8byte(addr), 2) << "warp " << warp << " register " << r;
    }
}

TEST(SmemLayout, PlainRowMajorBlockWouldConflict) {
  // The model against what Nsight Compute measures for the plain row-major block (8 wavefronts
  // per store, 2 ideal; docs/perf/log.md, P-137), so the test above can fail.
  std::array<int, 32> addr{};
  for (int lane = 0; lane < 32; ++lane) addr[lane] = 4 * (acc_row(lane, 0) * 64 + acc_col(lane, 0));
  EXPECT_EQ(wavefronts_8byte(addr), 8);
}

}  // namespace
