// The Hopper backward kernel for head dim 256 (and 192). It shares the work tiles, masks, producer
// and epilogue of the d64/d128 kernel (tile.cuh, producer.cuh, epilogue.cuh; kernel.cuh is the
// kernel this one follows).
//
// At d256 one warpgroup cannot hold dK and dV of 64 keys (2 · 64·256 fp32 = 256 registers per
// thread), so the warpgroups split the head dim of the gradients and the GEMMs of the scores:
// work tile = (64 keys, KV head, batch); per query tile of 64 rows (BwdTile<256>):
//   warpgroup 0:  Sᵀ = K·Qᵀ (SS, K = 256)          warpgroup 1:  dPᵀ = V·dOᵀ (SS, K = 256)
//                 Pᵀ = 2^(Sᵀ·c − LSE)                            wait for Pᵀ (named barrier 3)
//                 Pᵀ → smem (16-bit, swizzled)                    Pᵀ from smem, as the A operand
//                 dV[:, 0:128] += Pᵀ·dO (RS)                      dV[:, 128:256] += Pᵀ·dO (RS)
//                                                                 dSᵀ = Pᵀ ∘ (dPᵀ − D) → smem, in
//                                                                 place of Pᵀ (named barrier 4)
//   both:         dK[:, half] += dSᵀ·Q   (SS: A = dSᵀ K-major from smem, B = Q MN-major)
//                 dQ[:, half]  = dS·K    (SS: A = dSᵀ read MN-major, B = K MN-major), m64n128
//                 dQ_accum += dQ[:, half]: two 64 × 64 fp32 blocks, each staged in smem and added
//                 by one bulk reduction (as bwd/kernel.cuh; in a fixed order of key tiles
//                 with kBwdDeterministic)
// Every GEMM is m64 over 64 keys or 64 queries, each warpgroup issues the same FLOPs per step.
// The hand-offs alternate strictly: warpgroup 0 arrives on barrier 3 at step i only after it passed
// barrier 4 of step i − 1, which warpgroup 1 arrives on after it passed barrier 3 of step i − 1;
// so no barrier ever sees two arrivals of one warpgroup before the other's wait. The Pᵀ/dSᵀ buffer
// is double-buffered: warpgroup 0 rewrites buffer i & 1 at step i + 2, after barrier 4 of step
// i + 1, by which time both warpgroups' GEMMs of step i (the only readers) have completed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/sm90/args.hpp"
#include "cuda/sm90/bwd/dq_turns.cuh"
#include "cuda/sm90/bwd/epilogue.cuh"
#include "cuda/sm90/bwd/producer.cuh"
#include "cuda/sm90/bwd/tile.cuh"
#include "cuda/sm90/primitives/fragment.cuh"
#include "cuda/sm90/primitives/gemm.cuh"
#include "cuda/sm90/primitives/ptx.cuh"
#include "cuda/sm90/primitives/wgmma.cuh"
#include "cuda/sm90/seq.cuh"
#include "cuda/sm90/tile_size.hpp"

namespace flashattn::cuda::sm90 {
namespace bwd {

struct WideSmem {
  using Tile = BwdTile<256>;
  uint8_t* k;
  uint8_t* v;
  uint8_t* q;   // stage s at + s·kQBytes
  uint8_t* dO;  // one stage
  uint8_t* ds;  // Pᵀ, then dSᵀ, of step i in buffer i & 1
  float* dq_stage;  // warpgroup g at + g·64·64
  uint64_t* full_kv;
  uint64_t* empty_kv;
  uint64_t* full_q;  // [kStages]
  uint64_t* empty_q;
  uint64_t* full_do;
  uint64_t* empty_do;
  DqTurns<2>* turns;  // [kConsumerWGs], Options::deterministic (dq_turns.cuh)

  __device__ static WideSmem carve(uint8_t* raw) {
    uint8_t* base = ptx::align_1024(raw);
    WideSmem s;
    s.k = base;
    s.v = s.k + Tile::kKVBytes;
    s.q = s.v + Tile::kKVBytes;
    s.dO = s.q + Tile::kStages * Tile::kQBytes;
    s.ds = s.dO + Tile::kQBytes;
    s.dq_stage = reinterpret_cast<float*>(s.ds + 2 * Tile::kDSBytes);
    uint64_t* bars = reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(s.dq_stage) + 2 * Tile::kDqStageBytes);
    s.full_kv = bars;
    s.empty_kv = bars + 1;
    s.full_q = bars + 2;
    s.empty_q = s.full_q + Tile::kStages;
    s.full_do = s.empty_q + Tile::kStages;
    s.empty_do = s.full_do + 1;
    s.turns = reinterpret_cast<DqTurns<2>*>(s.empty_do + 1);
    return s;
  }
  static constexpr int kBytes = 1024 + Tile::kSmemBytes + 8 * (4 + 2 * Tile::kStages) +
                                Tile::kConsumerWGs * int(sizeof(DqTurns<2>));

  __device__ void init_barriers() {
    ptx::mbar_init_ring(full_kv, empty_kv, 1, Tile::kConsumerWGs);
    ptx::mbar_init_ring(full_q, empty_q, Tile::kStages, Tile::kConsumerWGs);
    ptx::mbar_init_ring(full_do, empty_do, 1, Tile::kConsumerWGs);
    ptx::fence_barrier_init();
  }
};

// kCols: the tensors' head dim, 256, or 192 — then the maps' boxes hold 3 column chunks, every
// tile's fourth chunk is zeroed once at the start and never loaded, so it adds nothing to the
// GEMMs and gives dK, dV, dQ zero columns 192–255, which are not stored.
template <bool kF16, bool kCausal, int kCols = 256>
__global__ void __launch_bounds__(BwdTile<256>::kThreads, 1) bwd_wide_kernel(const __grid_constant__ BwdArgs a) {
  using Tile = BwdTile<256>;
  static_assert(kCols == 256 || kCols == 192, "the d256 kernel runs head dims 256 and 192");
  constexpr int kHeadDim = 256, kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  constexpr int kQTxBytes = Tile::kQBytes / 256 * kCols;  // one Q or dO tile as loaded
  extern __shared__ uint8_t smem_raw[];
  WideSmem sm = WideSmem::carve(smem_raw);
  const int wg = threadIdx.x / 128;
  const int tiles = a.n_blocks * a.heads_kv * a.batch;

  if constexpr (kCols < 256) {  // zero the fourth chunk of K, V, the Q stages and dO (64 rows each)
    constexpr int kChunkBytes = 64 * 128, kChunk = 3 * kChunkBytes;
    uint8_t* const bufs[] = {sm.k + kChunk, sm.v + kChunk, sm.q + kChunk, sm.q + Tile::kQBytes + kChunk, sm.dO + kChunk};
    static_assert(Tile::kBlockN == 64 && Tile::kBlockM == 64 && Tile::kStages == 2, "chunk layout of BwdTile<256>");
#pragma unroll
    for (int b = 0; b < 5; ++b)
      for (int i = threadIdx.x * 16; i < kChunkBytes; i += Tile::kThreads * 16)
        *reinterpret_cast<uint4*>(bufs[b] + i) = make_uint4(0, 0, 0, 0);
    ptx::fence_proxy_async();  // generic writes -> the wgmma (async proxy) reads; ordered by bwd_prologue's barrier
  }
  bwd_prologue(a, sm);

  if (wg == 0) {
    ptx::setmaxnreg_dec<Tile::kProducerRegs>();
    if (threadIdx.x == 0)
      bwd_produce<Tile, kCausal, false, 2 * Tile::kKVBytes / 256 * kCols>(a, sm, [&](int it, int head, int row, int batch) {
        const int stage = it % Tile::kStages;
        ptx::mbar_wait(sm.empty_q + stage, ((it / Tile::kStages) & 1) ^ 1);
        ptx::mbar_arrive_expect_tx(sm.full_q + stage, kQTxBytes);
        ptx::tma_load_5d(sm.q + stage * Tile::kQBytes, &a.tm_q, sm.full_q + stage, 0, row, 0, head, batch);
        ptx::mbar_wait(sm.empty_do, (it & 1) ^ 1);  // released mid-step, after both dV GEMMs
        ptx::mbar_arrive_expect_tx(sm.full_do, kQTxBytes);
        ptx::tma_load_5d(sm.dO, &a.tm_do, sm.full_do, 0, row, 0, head, batch);
      });
    return;
  }

  ptx::setmaxnreg_inc<Tile::kConsumerRegs>();
  // 0: Sᵀ and Pᵀ; 1: dPᵀ and dSᵀ; head-dim half g of dK, dV, dQ. Through a warp reduction (REDUX: a
  // uniform register): its branches and descriptors stay in the uniform datapath (bwd/kernel.cuh).
  const int g = int(__reduce_max_sync(0xffffffffu, unsigned(wg - 1)));
  const int t = threadIdx.x % 128, lane = t % 32;
  constexpr int kSteps = kBlockM / 16;  // k16 slices over queries (dV, dK) or keys (dQ)
  const uint32_t k_base = ptx::smem_addr(sm.k), v_base = ptx::smem_addr(sm.v);
  const uint32_t q_base = ptx::smem_addr(sm.q), do_base = ptx::smem_addr(sm.dO), ds_base = ptx::smem_addr(sm.ds);
  // Byte offset of the 16-bit pair (key row(t, r), query col(t, r) .. +1) in a Pᵀ/dSᵀ buffer:
  // [key][query] rows of 128 B, 16-byte slot c of row i at c ^ (i % 8) (the 128B swizzle).
  auto ds_offset = [&](int r) {
    const int key = acc_row(t, r), query = acc_col(t, r);
    return key * 128 + ((((query % 64) / 8) ^ (key % 8)) * 16) + (query % 8) * 2;
  };

  int it = 0, kv_loads = 0;
  DqTurns<2>& turns = sm.turns[g];  // thread 0's, with kBwdDeterministic
  if (t == 0) turns.reset();
  for (long long idx = blockIdx.x; idx < tiles; idx += gridDim.x) {
    const BwdTileCoord tc = bwd_tile<Tile, kCausal, false>(a, int(idx));
    const int n_block = tc.n_block, head_kv = tc.head_kv, batch = tc.batch;
    float acc_dv[64], acc_dk[64];  // columns 128g .. 128g + 127
#pragma unroll
    for (int r = 0; r < 64; ++r) acc_dv[r] = acc_dk[r] = 0.f;
    const int key_row0 = n_block * kBlockN + 16 * (t / 32) + lane / 4;  // this thread's half-0 key

    if (tc.steps > 0) ptx::mbar_wait(sm.full_kv, kv_loads++ & 1);
    for (int st = 0; st < tc.steps; ++st, ++it) {
      const int head = head_kv * a.group + st / tc.m_count;
      const int m = tc.m_begin + st % tc.m_count;
      const int stage = it % Tile::kStages;
      ptx::mbar_wait(sm.full_q + stage, (it / Tile::kStages) & 1);
      ptx::mbar_wait(sm.full_do, it & 1);
      const uint32_t q_st = q_base + stage * Tile::kQBytes;
      uint8_t* ds_buf = sm.ds + (it & 1) * Tile::kDSBytes;
      const uint32_t ds_st = ds_base + (it & 1) * Tile::kDSBytes;
      const long long srow = stat_row<Tile>(a, batch, head, m);

      // Sᵀ = K·Qᵀ (warpgroup 0) or dPᵀ = V·dOᵀ (warpgroup 1): 64 keys × 64 queries, K = 256 in
      // 4 chunks of 4 k16 steps (+32 B inside a 128-byte row).
      float acc[32];
      ptx::fence_operand(acc);
      ptx::wgmma_fence();
      gemm_kk<kBlockM, kF16, kHeadDim>(acc, g == 0 ? k_base : v_base, kBlockN * 128, g == 0 ? q_st : do_base,
                                       kBlockM * 128);
      ptx::wgmma_commit();
      // Per-query statistics while the GEMM runs: LSE (warpgroup 0) or D (warpgroup 1) of this
      // thread's query columns 8j + 2(lane % 4) + {0, 1}.
      float2 stat[kBlockM / 8];
      const float* stat_src = (g == 0 ? a.lse_log2 : a.dsum) + srow + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j) stat[j] = __ldg(reinterpret_cast<const float2*>(stat_src + 8 * j));
      ptx::wgmma_wait<0>();
      ptx::fence_operand(acc);

      uint32_t p_a[kSteps][4];  // Pᵀ as the A operand of dV
      const uint32_t do_half = do_base + 2 * g * kBlockM * 128;  // dO columns 128g.. (chunks 2g, 2g+1)
      auto issue_dv = [&] {
        ptx::fence_operand(acc_dv);
        ptx::wgmma_fence();
        gemm_rs_mn<128, kF16, kSteps>(acc_dv, p_a, do_half, kBlockM * 128);
        ptx::wgmma_commit();
      };
      if (g == 0) {
        const int q0 = m * kBlockM;
        const bool need_mask = step_needs_mask<Tile, kCausal>(a, tc.seq, n_block, q0);
#pragma unroll
        for (int r = 0; r < 32; ++r) {
          const float lse = (r & 1) ? stat[r >> 2].y : stat[r >> 2].x;
          float p = ptx::ex2(fmaf(acc[r], a.scale_log2, -lse));
          if (need_mask) {  // causal only (supports_backward: no other window at d256)
            const int key = key_row0 + 8 * ((r >> 1) & 1), query = q0 + acc_col(t, r);
            if (key >= a.seqlen_k || (kCausal && key > query + a.seqlen_k - a.seqlen_q)) p = 0.f;
          }
          acc[r] = p;
        }
        acc_to_a<kF16>(acc, p_a);
#pragma unroll
        for (int s = 0; s < kSteps; ++s)
#pragma unroll
          for (int j = 0; j < 4; ++j) *reinterpret_cast<uint32_t*>(ds_buf + ds_offset(8 * s + 2 * j)) = p_a[s][j];
        __threadfence_block();
        ptx::named_bar_arrive(3, 256);  // Pᵀ is in smem (plain stores, read by plain loads)
        issue_dv();
        ptx::named_bar_sync(4, 256);  // dSᵀ is in smem (warpgroup 1 fenced it for the async proxy)
        ptx::wgmma_wait<0>();         // this warpgroup's dV has read dO and Pᵀ
        ptx::fence_operand(acc_dv);
        ptx::fence_operand(p_a);
        if (t == 0) ptx::mbar_arrive(sm.empty_do);
      } else {
        ptx::named_bar_sync(3, 256);
#pragma unroll
        for (int s = 0; s < kSteps; ++s)
#pragma unroll
          for (int j = 0; j < 4; ++j) p_a[s][j] = *reinterpret_cast<const uint32_t*>(ds_buf + ds_offset(8 * s + 2 * j));
        issue_dv();
        // dSᵀ = Pᵀ ∘ (dPᵀ − D), written over Pᵀ (each thread over the very pairs it read).
#pragma unroll
        for (int s = 0; s < kSteps; ++s)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int r = 8 * s + 2 * j;
            const float2 p = unpack2<kF16>(p_a[s][j]);
            const float2 d2 = stat[r >> 2];
            *reinterpret_cast<uint32_t*>(ds_buf + ds_offset(r)) =
                pack2<kF16>(p.x * (acc[r] - d2.x), p.y * (acc[r + 1] - d2.y));
          }
        ptx::fence_proxy_async();  // generic smem writes -> the wgmma (async proxy) reads below
        ptx::wgmma_wait<0>();
        ptx::fence_operand(acc_dv);
        ptx::fence_operand(p_a);
        if (t == 0) ptx::mbar_arrive(sm.empty_do);
        __threadfence_block();
        ptx::named_bar_arrive(4, 256);
      }

      // dK[:, half] += dSᵀ·Q: A = dSᵀ [key][query] K-major, B = Q columns 128g.. MN-major.
      ptx::fence_operand(acc_dk);
      ptx::wgmma_fence();
      const uint32_t q_half = q_st + 2 * g * kBlockM * 128;
#pragma unroll
      for (int s = 0; s < kSteps; ++s)
        Wgmma<128, kF16, 1>::ss(acc_dk, ptx::smem_desc_sw128(ds_st + s * 32, 16, 1024),
                                ptx::smem_desc_sw128(q_half + s * 2048, kBlockM * 128, 1024), 1);
      ptx::wgmma_commit();
      // dQ[:, half] = dS·K: A = dS (queries × keys), the dSᵀ buffer read MN-major; B = K columns
      // 128g.. ([key][d]) MN-major.
      float acc_dq[64];
      ptx::fence_operand(acc_dq);
      ptx::wgmma_fence();
      const uint32_t k_half = k_base + 2 * g * kBlockN * 128;
      gemm_mn_mn<128, kF16, kBlockN / 16>(acc_dq, ds_st, kBlockN * 128, k_half, kBlockN * 128);
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
      ptx::fence_operand(acc_dq);
      ptx::fence_operand(acc_dk);
      if (t == 0) ptx::mbar_arrive(sm.empty_q + stage);  // dK was the last reader of the Q stage

      // dQ_accum blocks 2g and 2g + 1 of this (query tile, head) += acc_dq, one 64 × 64 block at a
      // time through this warpgroup's staging buffer (registers 0..31: block 2g, 32..63: 2g + 1).
      float* dq_block = a.dq_accum + ((static_cast<long long>(batch) * a.heads + head) * (a.m_pad / 64) + m) * 4 * 4096;
      float* stage_dq = sm.dq_stage + g * 4096;
      float* const blocks[2] = {dq_block + 2 * g * 4096, dq_block + (2 * g + 1) * 4096};
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        if (t == 0) ptx::bulk_wait_read<0>();  // the previous reduction has read the buffer
        ptx::named_bar_sync(1 + g, 128);
        stage_block64(stage_dq, acc_dq, t, 32 * c);
        ptx::fence_proxy_async();
        ptx::named_bar_sync(1 + g, 128);
        if (t == 0) {
          const bool deterministic = a.flags & kBwdDeterministic;
          const int turn = deterministic ? dq_turn<Tile, kCausal>(a, tc.seq, n_block, m) : 0;
          if (deterministic) turns.wait(a, blocks[c], turn);  // each block's own counter
          ptx::bulk_reduce_add_f32(blocks[c], stage_dq, Tile::kDqStageBytes);
          ptx::tma_store_commit();
          if (deterministic && c == 1) turns.added(a, blocks, turn);
        }
      }
    }
    if (tc.steps > 0 && t == 0) ptx::mbar_arrive(sm.empty_kv);
    if ((a.flags & kBwdDeterministic) && t == 0) turns.flush();

    // Epilogue: dV and scale·dK, columns 128g.., straight from the accumulators.
    store_dk_dv<kF16, (kCols < 256)>(a, tc.seq, head_kv, 128 * g, key_row0, acc_dk, acc_dv, t);
  }  // tiles
  if (t == 0) ptx::bulk_wait_all();
}

}  // namespace bwd
}  // namespace flashattn::cuda::sm90
