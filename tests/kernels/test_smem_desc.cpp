// The Hopper forward's stepped wgmma descriptors (src/cuda/sm90/primitives/smem_desc.hpp): the tile's
// descriptor plus each k16 step's offset must equal the descriptor formed from the step's address,
// for every tile address the kernels can have and every step offset they add. Runs on the CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/sm90/primitives/smem_desc.hpp"

using flashattn::cuda::sm90::ptx::smem_desc_sw128;
using flashattn::cuda::sm90::ptx::SmemDescSw128;

namespace {

// Shared addresses of a CTA lie below its 227 KiB of dynamic shared memory plus the 1 KiB the
// kernels align to; the start address field holds 14 bits of 16-byte units (256 KiB).
constexpr uint32_t kSmemLimit = 228 * 1024;

// One operand as the issue loops step through it (gemm.cuh): its leading byte offset and the
// byte offset of each k16 step.
struct Operand {
  const char* what;
  uint32_t lbo;
  std::vector<uint32_t> steps;
};

std::vector<Operand> operands() {
  std::vector<Operand> ops;
  // gemm_kk, K-major A (Q: kBlockM 128 or 192 rows) and B (K: kBlockN 80, 112 or 128 rows),
  // head_dim 64 … 256: step s at chunk s/4 (rows·128 bytes apart) + 32 bytes per step inside it.
  for (uint32_t rows : {80u, 112u, 128u, 192u})
    for (uint32_t d : {64u, 128u, 192u, 256u}) {
      Operand op{"gemm_kk", 16, {}};
      for (uint32_t s = 0; s < d / 16; ++s) op.steps.push_back((s / 4) * rows * 128 + (s % 4) * 32);
      ops.push_back(op);
    }
  // gemm_rs_mn, MN-major V: LBO = the key tile's chunk (kBlockN·128), step s at 2048·s.
  for (uint32_t keys : {80u, 112u, 128u}) {
    Operand op{"gemm_rs_mn", keys * 128, {}};
    for (uint32_t s = 0; s < keys / 16; ++s) op.steps.push_back(2048 * s);
    ops.push_back(op);
  }
  return ops;
}

TEST(SmemDesc, SteppedEqualsDirect) {
  for (const Operand& op : operands())
    for (uint32_t tile = 0; tile < kSmemLimit; tile += 16) {
      const SmemDescSw128 stepped(tile, op.lbo, 1024);
      for (uint32_t off : op.steps) {
        if (tile + off >= kSmemLimit) break;  // past the CTA's shared memory
        ASSERT_EQ(stepped.at(off), smem_desc_sw128(tile + off, op.lbo, 1024))
            << op.what << " lbo " << op.lbo << " tile " << tile << " step offset " << off;
      }
    }
}

TEST(SmemDesc, Fields) {
  // 16-byte units: start 0x1230 -> 0x123, LBO 16 -> 1 (bits 16+), SBO 1024 -> 64 (bits 32+), 128B
  // swizzle at bit 62.
  EXPECT_EQ(smem_desc_sw128(0x1230, 16, 1024), 0x123ull | (1ull << 16) | (64ull << 32) | (1ull << 62));
  EXPECT_EQ(SmemDescSw128(0x1230, 16, 1024).at(0x40), smem_desc_sw128(0x1270, 16, 1024));
}

TEST(SmemDesc, StartFieldOverflowsAt256KiB) {
  // Where the stepped form stops being exact: the 14-bit start field carries into the reserved
  // bits instead of wrapping as the direct form's mask does. The kernels stay far below.
  const uint32_t tile = 256 * 1024 - 16;
  EXPECT_NE(SmemDescSw128(tile, 16, 1024).at(16), smem_desc_sw128(tile + 16, 16, 1024));
}

}  // namespace
