// Tile configuration of the Hopper forward kernel, one place, with the arithmetic behind it.
//
// CTA = 3 warpgroups (384 threads): WG0 = producer (one thread issues TMA), WG1/WG2 = consumers,
// each owning 64 query rows of the kBlockM = 128 tile (one m64 wgmma row block each).
//
// Shared memory (16-bit elements, every tile stored as 64-element = 128-byte column chunks with the
// 128B swizzle, see docs/hopper-sm90.md §2):
//   sQ = kBlockM·D·2,  sK = sV = kBlockN·D·2 per stage,  sO = sQ-sized staging for the TMA store.
//   d64 : 128×128, 3 stages: 16 KiB + 3·(16+16) KiB + sO 16 KiB = 128 KiB
//   d128: 128×128, 2 stages: 32 KiB + 2·(32+32) KiB + sO 32 KiB = 192 KiB
//   d192: 128×112, 2 stages: 48 KiB + 2·(42+42) KiB (O staged in sQ) = 216 KiB
//   d256: 128× 80, 2 stages: 64 KiB + 2·(40+40) KiB (O staged in sQ) = 224 KiB   (cap: 227 KiB)
// Registers per consumer thread (setmaxnreg 240; producer 24: 128·24 + 256·240 = 64512 ≤ 65536):
//   acc_o = D/2 fp32, acc_s = kBlockN/2 fp32, P = kBlockN/4 packed 16-bit pairs (live together in
//   the intra-warpgroup-overlapped loop):
//   d64 : 32 + 64 + 32 = 128     d128: 64 + 64 + 32 = 160     d192: 96 + 56 + 28 = 180
//   d256: 128 + 40 + 20 = 188
//   leaving ≥ 64 for softmax state, descriptors, indices.
// FA3 uses 128×176 (d128), 192×128/192 (d64, 3 consumer WGs) and 128×80 (d256); docs/hopper-kernels.md
// says which of those were taken here and why.
#pragma once

namespace flashattn::cuda::sm90 {

// The query tile: 128 rows (2 consumer warpgroups), or at d64 192 rows (3 warpgroups, FA3's choice,
// setmaxnreg 32/160: 128·32 + 384·160 = 65536). At d64 the exponentials cost as many cycles as the
// GEMMs, so a third warpgroup's softmax hides behind two others' GEMMs: measured on the H200
// +11–18 % non-causal, causal +6–12 % at N >= 2048 but −6–9 % at N = 512/1024 (more of a 192-row
// diagonal tile is masked work, and short causal grids have fewer tiles to balance; docs/perf/log.md,
// P-027). With a softcap 128 rows: the 192-row softcap instances (160 registers a
// consumer thread) spill 36–68 bytes.
inline int fwd_block_m(int head_dim, bool causal, long long seqlen_q, long long seqlen_k, bool softcap) {
  if (head_dim != 64 || softcap) return 128;
  return !causal || (seqlen_q >= 2048 && seqlen_k >= 2048) ? 192 : 128;
}

// The key tile: the largest with two stages in 227 KiB — 128 (d64, d128), 112 (d192: 128 would
// need 240 KiB; O staged in sQ), 80 (d256).
// d128 keeps 128 keys at every length: 176 keys (FA3's non-causal choice; O staged in sQ) cannot
// hold the speculative softmax (mainloop.cuh kSpeculative) without spilling, and with it the
// 128-key tiles are faster at N = 8192 / 16384 too (kernel −3.1 / −3.3 % non-causal, −4.4 / −3.3 %
// causal; docs/perf/log.md, P-135).
constexpr int fwd_default_block_n(int head_dim) { return head_dim == 256 ? 80 : head_dim == 192 ? 112 : 128; }

// setmaxnreg moves registers within what the CTA got at launch: with __launch_bounds__(threads, 1)
// that is 65536 / threads rounded down to 8 per thread (168 at 384 threads: 64512, not 65536). A
// split that asks for more makes the consumers' setmaxnreg.inc wait forever (docs/hopper-sm90.md §5).
constexpr bool split_fits(int threads, int producer_regs, int consumer_regs) {
  return 128 * producer_regs + (threads - 128) * consumer_regs <= 65536 / threads / 8 * 8 * threads;
}

template <int kHeadDim, int kBlockM_ = 128>
struct FwdTile {
  static constexpr int kBlockM = kBlockM_;  // 64 rows per consumer WG
  static_assert(kBlockM == 128 || (kBlockM == 192 && kHeadDim == 64), "query tile 128, or 192 at d64");
  static constexpr int kBlockN = fwd_default_block_n(kHeadDim);  // 128 (d64, d128), 112 (d192), 80 (d256)
  static constexpr int kStages = kHeadDim == 64 ? 3 : 2;     // depth of the K/V smem ring
  static constexpr int kChunks = kHeadDim / 64;              // 128-byte column chunks per row
  static constexpr int kConsumerWGs = kBlockM / 64;
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kProducerRegs = kConsumerWGs == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumerWGs == 2 ? 240 : 160;
  static_assert(split_fits(kThreads, kProducerRegs, kConsumerRegs), "setmaxnreg split over the CTA's registers");

  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // one K or one V stage
  // O gets its own staging buffer where it fits (d64, d128), so the next tile's Q can land while
  // this tile's last P·V and epilogue run; d256 stages O in sQ (64 + 128 + 64 KiB would not fit).
  static constexpr bool kSeparateO = 2 * kQBytes + 2 * kStages * kKVBytes + 1024 + 256 <= 232448;
  static constexpr int kOBytes = kSeparateO ? kQBytes : 0;
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVBytes + kOBytes;
  static_assert(kHeadDim % 64 == 0, "head_dim must be a multiple of 64");
  static_assert(kSmemBytes + 1024 + 256 <= 232448, "shared memory over the 227 KiB cap");
};

// Backward (bwd/kernel.cuh): one CTA per (key tile, KV head, batch); 2 consumer warpgroups of 64
// keys each (kBlockN = 128) hold dK and dV in registers and loop over query tiles of kBlockM rows.
//   d128, kBlockM = 64: registers per consumer thread dK + dV = 128, Sᵀ + dPᵀ = 64, P/dS as 16-bit
//   A operands 16 each, dQ 32 (m64n64): 224 at the peak.
//   d64, kBlockM = 128 (FA3's 128 × 128 step): the same GEMM FLOPs per step as d128, so the per-step
//   costs (waits, barriers, LSE/D loads, dQ reduction issue) weigh as little, and dQ is reduced once
//   per 64 × 64 block: dK + dV 64, Sᵀ + dPᵀ 128 (m64n128 each), LSE 32 → 224 at the peak; dSᵀ is
//   formed from the 16-bit Pᵀ (the fp32 copy is dead by then) and dQ is split by query halves. A
//   64-query d64 step (dQ split over keys, warpgroups in ping-pong) measured 6–24 % slower; FA3's
//   step with dQ split over keys (64-register m64n128 accumulator) and fp32 Pᵀ kept for dSᵀ
//   spills.
//   smem: K, V kBlockN·D·2 each; Q, dO kBlockM·D·2 each per stage (2 stages); dSᵀ kBlockN·kBlockM·2
//   double-buffered; the fp32 dQ block of each warpgroup (64×64) double-buffered for the bulk
//   reduce.
//   d64 : 16 + 16 + 2·(16 + 16) + 2·32 + 4·16 KiB = 224 KiB;
//   d128: 32 + 32 + 2·(16 + 16) + 2·16 + 4·16 KiB = 224 KiB (cap 227 KiB).
template <int kHeadDim>
struct BwdTile {
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;  // queries per step
  static constexpr int kBlockN = 128;                        // keys per CTA
  static constexpr int kStages = 2;
  static constexpr int kConsumerWGs = 2;
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(split_fits(kThreads, kProducerRegs, kConsumerRegs), "setmaxnreg split over the CTA's registers");
  static constexpr int kChunks = kHeadDim / 64;           // 128-byte column chunks per row
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;  // one Q or one dO stage
  static constexpr int kDSBytes = kBlockN * kBlockM * 2;  // one dSᵀ buffer
  static constexpr int kDqStageBytes = 64 * 64 * 4;       // one warpgroup's fp32 dQ block, staged for the bulk reduce
  static constexpr int kSmemBytes =
      2 * kKVBytes + 2 * kStages * kQBytes + 2 * kDSBytes + 4 * kDqStageBytes;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "backward head_dim 64 or 128");
  static_assert(kSmemBytes + 1024 + 256 <= 232448, "shared memory over the 227 KiB cap");
};

// Backward at head dim 256 (bwd/kernel_wide.cuh): dK and dV of 64 keys × 256 would need 256
// registers per thread in one warpgroup, so the two consumer warpgroups split the head dim instead:
// warpgroup g holds dK and dV columns 128g..128g+127 of all kBlockN = 64 keys (64 + 64 registers).
// Sᵀ and dPᵀ (64 × 64 each, K = 256) are split by GEMM: warpgroup 0 computes Sᵀ and Pᵀ, warpgroup
// 1 computes dPᵀ and then dSᵀ from the Pᵀ that warpgroup 0 left in smem; both then run their halves
// of dV, dK and dQ.
//   registers: dK + dV 128, Sᵀ or dPᵀ 32, P as an A operand 16, dQ half (m64n128) 64 — the Sᵀ/dPᵀ
//   accumulator is dead before dQ is live: peak about 128 + 64 + 16.
//   smem: K, V 32 KiB each; Q 2 stages of 32 KiB; dO 1 stage of 32 KiB (released as soon as both
//   dV GEMMs finish, mid-step); Pᵀ/dSᵀ 8 KiB (dSᵀ overwrites Pᵀ in place) double-buffered; one
//   fp32 64 × 64 dQ staging block per warpgroup (16 KiB; each warpgroup reduces two per step):
//   64 + 64 + 32 + 16 + 32 = 208 KiB. (A second dO stage would leave no room for dQ staging.)
template <>
struct BwdTile<256> {
  static constexpr int kBlockM = 64;   // queries per step
  static constexpr int kBlockN = 64;   // keys per CTA
  static constexpr int kStages = 2;    // Q stages (dO: one)
  static constexpr int kConsumerWGs = 2;
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(split_fits(kThreads, kProducerRegs, kConsumerRegs), "setmaxnreg split over the CTA's registers");
  static constexpr int kChunks = 4;
  static constexpr int kKVBytes = kBlockN * 256 * 2;
  static constexpr int kQBytes = kBlockM * 256 * 2;       // one Q or one dO stage
  static constexpr int kDSBytes = kBlockN * kBlockM * 2;  // one Pᵀ/dSᵀ buffer
  static constexpr int kDqStageBytes = 64 * 64 * 4;
  static constexpr int kSmemBytes = 2 * kKVBytes + (kStages + 1) * kQBytes + 2 * kDSBytes + 2 * kDqStageBytes;
  static_assert(kSmemBytes + 1024 + 256 <= 232448, "shared memory over the 227 KiB cap");
};

}  // namespace flashattn::cuda::sm90
