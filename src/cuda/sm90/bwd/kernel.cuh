// The Hopper backward kernel at d64/d128: dK, dV and (through fp32 bulk reductions) dQ in one
// pass, TMA + wgmma. Its parts by role: the shared memory (smem.cuh), the producer's loads
// (producer.cuh), the dQ writer (dq_writer.cuh), the consumers' step loop (here) and their dK/dV
// store (epilogue.cuh).
//
// Work tile = (key tile of kBlockN = 128 keys, KV head, batch); a CTA loops over the query tiles
// of every query head of the GQA group, so dK and dV stay in registers and need no reduction. The
// grid is one CTA per tile, or persistent (kBwdPersistent: the producer loads the next tile's K/V
// as soon as both consumer warpgroups release them, overlapping the epilogue).
//   warpgroup 0 (producer): setmaxnreg.dec; one thread loads K and V once, then Q and dO of each
//                           query tile into a 2-stage ring (TMA), each step's per-query LSE and D
//                           (fp32, precomputed) prefetched into L2; the consumers read those with
//                           plain loads. Warp 1 is the dQ writer (bwd_write_dq): it adds the
//                           consumers' staged dQ blocks to dQ_accum by bulk reductions.
//   warpgroups 1, 2 (consumers): 64 keys each. Per query tile (kBlockM = 128 queries at d64, 64 at
//                           d128), everything transposed so that the
//                           probabilities come out of the accumulator in the layout the next GEMM
//                           takes as its register A operand (docs/hopper-sm90.md §1.4):
//       Sᵀ  = K·Qᵀ              (SS, both K-major)              64 × kBlockM
//       dPᵀ = V·dOᵀ             (SS, both K-major)
//       Pᵀ  = 2^(Sᵀ·scale·log2e − LSE·log2e)     (LSE, D: per column = per query)
//       dSᵀ = Pᵀ ∘ (dPᵀ − D)
//       dV += Pᵀ·dO             (RS, dO MN-major)                64 × D
//       dK += dSᵀ·Q             (RS, Q MN-major)                 (× scale in the epilogue)
//       dSᵀ → smem (16-bit, 128B-swizzled [key][query] chunks), both warpgroups, named barrier
//       dQ_partial = dS·K       (SS, A and B MN-major)           m64n64 per warpgroup: 64 of the
//                                queries (d64) or 64 of the head-dim columns (d128)
//       dQ_accum += dQ_partial  (staged in smem, double-buffered; the dQ writer's bulk fp32
//                                reduction in L2 per block, unordered across CTAs, or with
//                                kBwdDeterministic in a fixed order of key tiles: dq_turns.cuh)
// Sᵀ and dPᵀ are issued together; Pᵀ is computed while dPᵀ runs and dV is issued before dSᵀ is
// computed, so the tensor cores stay busy through the elementwise work.
// Masks: keys past seqlen_k and (the causal kernels) keys outside a query's window get P = 0;
// query rows past seqlen_q read LSE = +inf (P = 0) from the padded statistics.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/sm90/args.hpp"
#include "cuda/sm90/bwd/dq_writer.cuh"
#include "cuda/sm90/bwd/epilogue.cuh"
#include "cuda/sm90/bwd/producer.cuh"
#include "cuda/sm90/bwd/smem.cuh"
#include "cuda/sm90/bwd/tile.cuh"
#include "cuda/sm90/primitives/fragment.cuh"
#include "cuda/sm90/primitives/gemm.cuh"
#include "cuda/sm90/primitives/ptx.cuh"
#include "cuda/sm90/primitives/wgmma.cuh"
#include "cuda/sm90/seq.cuh"
#include "cuda/sm90/tile_size.hpp"

namespace flashattn::cuda::sm90 {
namespace bwd {

template <int kHeadDim, bool kF16, bool kCausal, bool kSoftcap>
__global__ void __launch_bounds__(BwdTile<kHeadDim>::kThreads, 1) bwd_kernel(const __grid_constant__ BwdArgs a) {
  using Tile = BwdTile<kHeadDim>;
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  extern __shared__ uint8_t smem_raw[];
  Smem<Tile> sm = Smem<Tile>::carve(smem_raw);
  const int wg = threadIdx.x / 128;
  const int tiles = a.n_blocks * a.heads_kv * a.batch;

  bwd_prologue(a, sm);

  if (wg == 0) {
    ptx::setmaxnreg_dec<Tile::kProducerRegs>();
    if (threadIdx.x == 0)
      bwd_produce<Tile, kCausal, true>(a, sm, [&](int it, int head, int row, int batch) {
        const int stage = it % Tile::kStages;
        ptx::mbar_wait(sm.empty + stage, ((it / Tile::kStages) & 1) ^ 1);
        ptx::mbar_arrive_expect_tx(sm.full + stage, 2 * Tile::kQBytes);
        ptx::tma_load_tile<Tile::kChunks, kBlockM>(a.x_chunks, sm.q + stage * Tile::kQBytes, &a.tm_q, sm.full + stage, row, head, batch);
        ptx::tma_load_tile<Tile::kChunks, kBlockM>(a.x_chunks, sm.dO + stage * Tile::kQBytes, &a.tm_do, sm.full + stage, row, head, batch);
      });
    else if (threadIdx.x / 32 == 1)
      bwd_write_dq<Tile, kCausal>(a, sm, threadIdx.x % 32);
    return;
  }

  ptx::setmaxnreg_inc<Tile::kConsumerRegs>();
  // The consumer warpgroup: keys 64g .. 64g + 63 of the tile. Through a warp reduction (REDUX: a
  // uniform register) ptxas forms the wgmma descriptors that depend on it in uniform registers:
  // computed per thread they sat in vector registers, moved over by R2UR before every wgmma (57
  // R2UR in the d128 step's loop, 5 now; the loop 968 -> 828 instructions). Not with a softcap:
  // that instance (already 8 bytes of spill) spilled 18–38 bytes with it.
  const int g = kSoftcap ? wg - 1 : int(__reduce_max_sync(0xffffffffu, unsigned(wg - 1)));
  const int t = threadIdx.x % 128, lane = t % 32;
  constexpr int kSRegs = kBlockM / 2;   // Sᵀ, dPᵀ accumulators (64 × kBlockM)
  constexpr int kDRegs = kHeadDim / 2;  // dK, dV accumulators (64 × D)
  constexpr int kMSteps = kBlockM / 16;  // k16 slices of dV/dK (over queries)
  const uint32_t k_base = ptx::smem_addr(sm.k), v_base = ptx::smem_addr(sm.v);
  const uint32_t q_base = ptx::smem_addr(sm.q), do_base = ptx::smem_addr(sm.dO), ds_base = ptx::smem_addr(sm.ds);
  // dQ = dS·K, one m64n64 accumulator per warpgroup: at d64 each warpgroup takes 64 of the 128
  // queries (kSplitQueries), at d128 64 of the head-dim columns, both over all 128 keys — so each
  // reads the other warpgroup's dSᵀ rows too, and the two meet at a barrier every step. (Splitting
  // over keys instead lets the warpgroups run independently and ping-pong, but needs two bulk
  // reductions per dQ block, and at d128 a 64-register m64n128 accumulator that made ptxas
  // serialize the wgmmas; a 64-query d64 step ran 6–24 % slower: docs/perf/log.md, P-040.)
  constexpr bool kSplitQueries = kHeadDim == 64;
  // Softcap, s = cap·tanh(x·scale/cap) of the raw score x: P from the capped score, and dS scaled
  // by ds/dx / scale = 1 − tanh² (the scale itself is applied to dK and dQ at the end, as without
  // a softcap). The d128 kernel only: tanh stays in the Sᵀ registers and P goes straight to its
  // 16-bit A operand, so no register is added (at d64, 128-query steps, the consumer has none).
  // Its own instantiation (launch_bwd), so the kernel without a softcap carries none of its code
  // (as a run-time branch it would). The bf16 instance spills 8 bytes (2 registers, stored and
  // reloaded once per query step).
  static_assert(!kSoftcap || kHeadDim == 128, "softcap: the d128 kernel only");
  int it = 0, kv_loads = 0;  // as on the producer side
  for (long long idx = blockIdx.x; idx < tiles; idx += gridDim.x) {
    const BwdTileCoord tc = bwd_tile<Tile, kCausal, true>(a, int(idx));
    const int n_block = tc.n_block, head_kv = tc.head_kv, batch = tc.batch;
    const int m_begin = tc.m_begin, m_count = tc.m_count, steps = tc.steps;
    float acc_dv[kDRegs], acc_dk[kDRegs];
#pragma unroll
    for (int r = 0; r < kDRegs; ++r) acc_dv[r] = acc_dk[r] = 0.f;
    const int key_row0 = n_block * kBlockN + 64 * g + 16 * (t / 32) + lane / 4;  // this thread's half-0 key

    if (steps > 0) ptx::mbar_wait(sm.full_kv, kv_loads++ & 1);
    for (int st = 0; st < steps; ++st, ++it) {
      const int head = head_kv * a.group + st / m_count;
      const int m = m_begin + st % m_count;
      const int stage = it % Tile::kStages;
      ptx::mbar_wait(sm.full + stage, (it / Tile::kStages) & 1);
      const uint32_t q_st = q_base + stage * Tile::kQBytes, do_st = do_base + stage * Tile::kQBytes;

      // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, one commit group each.
      float acc_s[kSRegs], acc_dp[kSRegs];
      ptx::fence_operand(acc_s);
      ptx::fence_operand(acc_dp);
      ptx::wgmma_fence();
      // acc = (this warpgroup's 64 rows of a [key][d] tile) · (a [query][d] stage)ᵀ, both K-major.
      auto issue_keys_x_queries = [&](float(&acc)[kSRegs], uint32_t keys, uint32_t queries) {
        gemm_kk<kBlockM, kF16, kHeadDim>(acc, keys + g * 64 * 128, kBlockN * 128, queries, kBlockM * 128);
        ptx::wgmma_commit();
      };
      issue_keys_x_queries(acc_s, k_base, q_st);
      issue_keys_x_queries(acc_dp, v_base, do_st);

      // LSE and D of this thread's query columns, from global memory (L2) while the GEMMs run: the
      // consumers read them with plain loads, so they never travel through the TMA-written stages.
      const long long srow = stat_row<Tile>(a, batch, head, m);
      float2 lse2[kBlockM / 8], dsum2[kBlockM / 8];
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j)
        lse2[j] = __ldg(reinterpret_cast<const float2*>(a.lse_log2 + srow + 8 * j + 2 * (lane % 4)));

      // Pᵀ while dPᵀ runs. Register r: key row half (r>>1)&1, query column 8(r>>2) + 2(l%4) + (r&1).
      ptx::wgmma_wait<1>();
      ptx::fence_operand(acc_s);
      const int q0 = m * kBlockM;
      // The sequence's lengths, loaded per step (varlen; else constants): held across the steps,
      // the d128 causal consumer spilled.
      const SeqRows seq = seq_rows<true>(a, batch);
      const bool need_mask = step_needs_mask<Tile, kCausal>(a, seq, n_block, q0);
      uint32_t p_a[kMSteps][4];
      if constexpr (kSoftcap) {
        // acc_s becomes tanh(x·scale/cap) (for dS below), hidden keys 2 (tanh never is: P = 0
        // there, and dS = 0 whatever 1 − tanh² reads); P goes pairwise into p_a (registers r, r + 1:
        // one row half, two neighbouring queries; fragment.cuh acc_to_a). The mask as a pass: inside
        // the loop the causal instances spilled.
#pragma unroll
        for (int r = 0; r < kSRegs; ++r) {
          const float e = ptx::ex2(acc_s[r] * (a.softcap_scale * 2.8853900817779268f));  // 2^(2u·log2 e)
          acc_s[r] = 1.f - __fdividef(2.f, e + 1.f);  // tanh u, as the forward (softmax.cuh)
        }
        if (need_mask) step_mask<kCausal>(a, seq, key_row0, q0 + 2 * (lane % 4)).apply(acc_s, 2.f);
#pragma unroll
        for (int r = 0; r < kSRegs; r += 2) {
          const float2 l2 = lse2[r / 4];
          float p[2];
#pragma unroll
          for (int i = 0; i < 2; ++i)
            p[i] = acc_s[r + i] > 1.5f ? 0.f : ptx::ex2(fmaf(acc_s[r + i], a.scale_log2, -(i ? l2.y : l2.x)));
          p_a[r / 8][(r % 8) / 2] = pack2<kF16>(p[0], p[1]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kBlockM / 8; ++j) {
          const float2 l2 = lse2[j];
#pragma unroll
          for (int r = 4 * j; r < 4 * j + 4; ++r) {
            const float row_lse = (r & 1) ? l2.y : l2.x;
            acc_s[r] = ptx::ex2(fmaf(acc_s[r], a.scale_log2, -row_lse));
          }
        }
        if (need_mask) step_mask<kCausal>(a, seq, key_row0, q0 + 2 * (lane % 4)).apply(acc_s);
      }
      // D is loaded once the LSE registers are free (fewer live registers across the Sᵀ wait).
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j)
        dsum2[j] = __ldg(reinterpret_cast<const float2*>(a.dsum + srow + 8 * j + 2 * (lane % 4)));
      if constexpr (!kSoftcap) acc_to_a<kF16>(acc_s, p_a);

      // dV += Pᵀ·dO (dO MN-major: LBO = distance between 64-column chunks, SBO = 8 rows, +16 rows per
      // step), issued right away to run while dSᵀ is computed.
      ptx::fence_operand(acc_dv);
      ptx::wgmma_fence();
      gemm_rs_mn<kHeadDim, kF16, kMSteps>(acc_dv, p_a, do_st, kBlockM * 128);
      ptx::wgmma_commit();

      // dSᵀ = Pᵀ ∘ (dPᵀ − D) once dPᵀ has landed (dV may still run). At d64 (128-query steps) Pᵀ is
      // taken from its 16-bit copy, so the fp32 one (64 registers) is dead before dPᵀ is read.
      ptx::wgmma_wait<1>();
      ptx::fence_operand(acc_dp);
#pragma unroll
      for (int j = 0; j < kBlockM / 8; ++j) {
        const float2 d2 = dsum2[j];
#pragma unroll
        for (int r = 4 * j; r < 4 * j + 4; ++r) {
          float p = acc_s[r];
          if constexpr (kSplitQueries || kSoftcap) {  // P from its 16-bit copy (with softcap acc_s holds tanh)
            const float2 p2 = unpack2<kF16>(p_a[r / 8][(r % 8) / 2]);
            p = (r & 1) ? p2.y : p2.x;
          }
          float ds = p * (acc_dp[r] - ((r & 1) ? d2.y : d2.x));
          if constexpr (kSoftcap) ds *= 1.f - acc_s[r] * acc_s[r];
          acc_dp[r] = ds;
        }
      }
      uint32_t ds_a[kMSteps][4];
      uint8_t* ds_buf = sm.ds + (it & 1) * Tile::kDSBytes;
#pragma unroll
      for (int s = 0; s < kMSteps; ++s)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          ds_a[s][j] = pack2<kF16>(acc_dp[8 * s + 2 * j], acc_dp[8 * s + 2 * j + 1]);
          // dSᵀ[key][query] in 64-query chunks of 128-byte rows, 16-byte slot c of row i at c ^ (i % 8).
          const int r = 8 * s + 2 * j;
          const int key = 64 * g + acc_row(t, r), query = acc_col(t, r);
          const int slot = ((query % 64) / 8) ^ (key % 8);
          *reinterpret_cast<uint32_t*>(ds_buf + (query / 64) * kBlockN * 128 + key * 128 + slot * 16 + (query % 8) * 2) =
              ds_a[s][j];
        }

      // dK += dSᵀ·Q (unscaled; × scale in the epilogue), then dQ = dS·K: A = dS (queries × keys) is
      // the staged dSᵀ read MN-major, B = K ([key][d]) MN-major.
      ptx::fence_proxy_async();
      ptx::fence_operand(acc_dk);
      ptx::wgmma_fence();
      gemm_rs_mn<kHeadDim, kF16, kMSteps>(acc_dk, ds_a, q_st, kBlockM * 128);
      ptx::wgmma_commit();
      ptx::named_bar_sync(3, 256);  // both warpgroups' dSᵀ rows are in smem
      float acc_dq[32];
      {
        ptx::fence_operand(acc_dq);
        ptx::wgmma_fence();
        // A = the dS rows (queries) of this warpgroup: query chunk g of the staged dSᵀ (d64) or all
        // of it (d128); B = K, or K's head-dim chunk g (d128).
        const uint32_t ds_st = ds_base + (it & 1) * Tile::kDSBytes + (kSplitQueries ? g * kBlockN * 128 : 0);
        const uint32_t kq_st = k_base + (kSplitQueries ? 0 : g * kBlockN * 128);
        gemm_mn_mn<64, kF16, kBlockN / 16>(acc_dq, ds_st, kBlockN * 128, kq_st, kBlockN * 128);
      }
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
      ptx::fence_operand(acc_dq);
      ptx::fence_operand(acc_dv);
      ptx::fence_operand(acc_dk);
      ptx::fence_operand(p_a);
      ptx::fence_operand(ds_a);
      // Every GEMM of this warpgroup that read the stage has completed: release it to the producer.
      if (t == 0) ptx::mbar_arrive(sm.empty + stage);

      // dQ_accum's 64 × 64 block (64-row block of this query tile, head-dim chunk: dq_block) += acc_dq.
      // Staged in smem (double-buffered per warpgroup) for the dQ writer's bulk reduction: the
      // buffer written now was last read by its reduction of step it - 2.
      const int buf = 2 * g + (it & 1);
      if (it >= 2) ptx::named_bar_sync(kDqFreeBar + g, 160);  // the writer has read this buffer's step it - 2
      stage_block64(sm.dq_stage + buf * 4096, acc_dq, t);
      if (t == 0) sm.dq_job[buf] = DqJob{m, head, batch, n_block | (st == steps - 1 ? DqJob::kLastStep : 0)};
      ptx::fence_proxy_async();  // generic smem writes -> the bulk copy's (async proxy) reads
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(sm.dq_full + buf);
    }
    // Every GEMM of this warpgroup that read K and V has completed (the last step ended with
    // wgmma_wait<0>): the producer may load the next tile's K and V while this epilogue runs.
    if (steps > 0 && t == 0) ptx::mbar_arrive(sm.empty_kv);

    store_dk_dv<kF16, kHeadDim == 128>(a, seq_rows<true>(a, batch), head_kv, 0, key_row0, acc_dk, acc_dv, t);
  }  // tiles
  // No more steps: a job with batch −1 in the next buffer ends the dQ writer's loop.
  const int buf = 2 * g + (it & 1);
  if (it >= 2) ptx::named_bar_sync(kDqFreeBar + g, 160);
  if (t == 0) sm.dq_job[buf] = DqJob{0, 0, -1, 0};
  __syncwarp();
  if (lane == 0) ptx::mbar_arrive(sm.dq_full + buf);
}

}  // namespace bwd
}  // namespace flashattn::cuda::sm90
