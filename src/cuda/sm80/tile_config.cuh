// Tile sizes of the sm80 (mma.sync) kernels, one place. Arithmetic in docs/cuda-kernels.md.
// Every warp owns whole 16-row bands of the output tile, so no cross-warp reduction is needed.
#pragma once

#include "cuda/sm80/smem_tile.cuh"

namespace flashattn::cuda::sm80 {

// Forward: a CTA owns kBlockM query rows and streams kBlockN-key tiles of K and V through
// two shared-memory stages (cp.async of tile j+1 overlaps the math of tile j).
template <int kHeadDim>
struct FwdConfig {
  // Two bands per warp would halve the K/V fragment loads but spills (acc_o + acc_s > 200 regs).
  static constexpr int kWarps = 8;
  static constexpr int kBands = 1;  // 16-row bands per warp
  static constexpr int kBlockM = kWarps * 16 * kBands;   // 128
  static constexpr int kBlockN = kHeadDim <= 128 ? 64 : 32;
  static constexpr int kThreads = kWarps * 32;
  using QTile = SmemTile<kBlockM, kHeadDim>;
  using KVTile = SmemTile<kBlockN, kHeadDim>;
  static constexpr int kSmemBytes = QTile::kBytes + 4 * KVTile::kBytes;  // Q + 2 stages of K, V
};

// Backward dK/dV: a CTA owns kBlockN keys of one KV head (each warp one 16-key band) and streams
// kBlockM-query tiles of Q and dO (+ LSE, D) of every query head of its group, two stages.
// For head_dim > 128 the dK and dV accumulators do not both fit in registers: the kernel runs
// twice, once accumulating dV, once dK (kMode).
enum class DkDvMode { both, dv_only, dk_only };
template <int kHeadDim>
struct BwdDkDvConfig {
  static constexpr int kWarps = 8;
  static constexpr int kBlockN = kWarps * 16;  // 128
  static constexpr int kBlockM = kHeadDim <= 64 ? 64 : 32;
  static constexpr int kThreads = kWarps * 32;
  using KVTile = SmemTile<kBlockN, kHeadDim>;
  using QTile = SmemTile<kBlockM, kHeadDim>;
  static constexpr int kSmemBytes =
      2 * KVTile::kBytes + 2 * (2 * QTile::kBytes + 2 * kBlockM * int(sizeof(float)));
};

// Backward dQ: like the forward, a CTA owns kBlockM query rows and streams K and V; it recomputes
// P and dS and accumulates dQ in registers. No atomics, so gradients are bitwise reproducible.
template <int kHeadDim>
struct BwdDqConfig {
  static constexpr int kWarps = 4;
  static constexpr int kBlockM = kWarps * 16;  // 64
  static constexpr int kBlockN = 32;
  static constexpr int kThreads = kWarps * 32;
  using QTile = SmemTile<kBlockM, kHeadDim>;
  using KVTile = SmemTile<kBlockN, kHeadDim>;
  static constexpr int kSmemBytes = 2 * QTile::kBytes + 4 * KVTile::kBytes;
};

}  // namespace flashattn::cuda::sm80
