// Epilogue of the Hopper forward kernel: O = acc_o / row_sum through shared memory and a TMA
// store, LSE (natural log) straight from registers.
//
// Each consumer warpgroup writes its 64 normalized rows, in the 128B-swizzled chunk layout that
// TMA uses (16-byte slot j of row i at slot j ^ (i % 8), §2), into its own rows of sO (= sQ for
// d256, whose last Q·Kᵀ has completed), then one thread stores them with D/64 boxes of
// (64 rows × 64 columns). The
// TMA store skips rows past seqlen_q, so partial tiles need no checks here. With varlen the rows
// past a sequence are the next sequence's: a warpgroup whose rows end inside its sequence copies
// them from sO with plain 16-byte stores instead, clipped at the sequence's end.
#pragma once

#include "cuda/sm90/fwd/mainloop.cuh"

namespace flashattn::cuda::sm90 {

template <class Tile, bool kF16, bool kCausal, int kHeadDim, bool kVarlen, bool kSoftcap>
__device__ __forceinline__ void epilogue(const FwdArgs& a, Smem<Tile>& sm,
                                         Consumer<Tile, kF16, kCausal, kHeadDim, kSoftcap>& c, int wg, int m_block,
                                         int head, const SeqRows& s) {
  const int t = threadIdx.x % 128, lane = t % 32;
  c.softmax.finalize();
  const float inv[2] = {c.softmax.state[0].inv_sum(), c.softmax.state[1].inv_sum()};  // 0 for empty rows

  uint8_t* s_rows = sm.o + wg * 64 * 128;  // this warpgroup's rows in every chunk
  // Shared-space (32-bit) addresses: a generic pointer made every store a 64-bit address sum.
  const uint32_t s_base = ptx::smem_addr(s_rows);
  // stmatrix .x4 per two 8-column blocks j, j + 1 of the warp's 16 rows: matrices (rows 0–7, j),
  // (rows 8–15, j), (rows 0–7, j + 1), (rows 8–15, j + 1). Lane l addresses row i = l % 8 (+ 8 for
  // odd l / 8) of block j + l / 16; j is even and a chunk holds 8 blocks, so the row's swizzled
  // slot is (j % 8) ^ (l / 16) ^ i and its chunk j / 8.
  const int mrow = lane % 8;
  const uint32_t lane_row = s_base + (16 * (t / 32) + mrow + 8 * ((lane / 8) & 1)) * 128;
  const int lane_xor = (lane / 16) ^ mrow;
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; j += 2) {
    const float* o = c.acc_o + 4 * j;  // blocks j, j + 1: registers 4j … 4j + 7
    ptx::stmatrix_x4(lane_row + (j / 8) * Tile::kBlockM * 128 + (((j % 8) ^ lane_xor) * 16),
                     pack2<kF16>(o[0] * inv[0], o[1] * inv[0]), pack2<kF16>(o[2] * inv[1], o[3] * inv[1]),
                     pack2<kF16>(o[4] * inv[0], o[5] * inv[0]), pack2<kF16>(o[6] * inv[1], o[7] * inv[1]));
  }
  ptx::fence_proxy_async();             // generic smem writes -> TMA (async proxy) reads
  ptx::named_bar_sync(1 + wg, 128);     // this warpgroup only
  const int row_start = m_block * Tile::kBlockM + 64 * wg;  // in the sequence
  // TMA store: without varlen, or rows that all lie inside the sequence.
  const bool tma = !kVarlen || row_start + 64 <= s.q_len;
  if (t == 0 && row_start < s.q_len && tma) {
    const int row = s.q_start + row_start;
#pragma unroll
    for (int chunk = 0; chunk < Tile::kChunks; ++chunk)
      if (kHeadDim == 128 && a.x_chunks)  // head_dim 96: the columns past 96 are not stored
        ptx::tma_store_5d(&a.tm_o, s_rows + chunk * Tile::kBlockM * 128, 64 * chunk, row, 0, head, s.batch);
      else
        ptx::tma_store_5d(&a.tm_o, s_rows + chunk * Tile::kBlockM * 128, 0, row, chunk, head, s.batch);
    ptx::tma_store_commit();
  }
  // Varlen, the sequence's last rows: 16-byte slots from sO. sO is next written by this warpgroup
  // after the next tile's first turn barrier (or the no-key tile's barrier), which every thread
  // reaches after these reads; where O is staged in sQ the kernel syncs the warpgroup before
  // releasing sQ (fwd/kernel.cuh). (A barrier here, conditional, made the d64/192-row and d256
  // consumers spill.)
  if (kVarlen && !tma && row_start < s.q_len) {
    constexpr int kSlots = kHeadDim / 8;  // per row
    const int cols = a.x_chunks ? 96 : kHeadDim;
    uint16_t* o = static_cast<uint16_t*>(a.o) + (s.q_start + row_start) * a.o_row_stride + head * a.o_head_stride;
#pragma unroll
    for (int k = 0; k < 64 * kSlots / 128; ++k) {
      const int i = t + 128 * k, row = i / kSlots, slot = i % kSlots, chunk = slot / 8;
      if (row_start + row < s.q_len && 8 * slot < cols) {
        const uint4 v = ptx::ld_shared_v4(s_base + chunk * Tile::kBlockM * 128 + row * 128 + ((slot % 8) ^ (row % 8)) * 16);
        *reinterpret_cast<uint4*>(o + row * a.o_row_stride + 8 * slot) = v;
      }
    }
  }

  if (a.lse != nullptr && lane % 4 == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row_start + 16 * (t / 32) + lane / 4 + 8 * h;
      if (row < s.q_len)
        a.lse[s.batch * a.lse_batch_stride + head * a.lse_head_stride + (s.q_start + row) * a.lse_row_stride] =
            c.softmax.state[h].lse();
    }
  }
  if (t == 0 && row_start < s.q_len && tma) ptx::tma_store_wait_read();  // smem must outlive the reads
}

// Stream-K tail (scheduler.cuh, StreamKTail): this warpgroup ran one of the two parts of a cut
// tile. The first part in leaves its state in split slot `slot` — acc_o (unnormalized) and each
// row half's running max and per-thread sum, register-major so each store instruction covers 512
// consecutive bytes — and returns false; the second merges it (SoftmaxState::merge_scales) and
// returns true: it stores the tile. The second waits only for a part that is already running (it
// took the counter first), so no CTA waits for another to be scheduled.
template <class Tile, class C>
__device__ __forceinline__ bool stream_k_meet(const FwdArgs& a, C& c, int wg, int slot) {
  constexpr int kORegs = C::kORegs, kFloats = kORegs + 4;
  const int t = threadIdx.x % 128;
  const int id = slot * Tile::kConsumerWGs + wg;
  // The addresses are formed here, from opaque copies of the parameters: hoisted out of the tile
  // loop (as ptxas did), they stayed live across the main loop and the (since removed) 176-key,
  // d256 and d64 consumers spilled.
  int* sync = ptx::opaque(a.sk_sync);
  float* part = ptx::opaque(a.sk_part) + size_t(id) * kFloats * 128 + t;
  int* count = sync + id;
  int* ready = sync + int(gridDim.x) * Tile::kConsumerWGs + id;
  // Through a warp reduction: ptxas then knows the branch is warp-uniform (a per-thread branch
  // here moved the main loops' descriptor math out of the uniform registers: R2UR 0 → 32).
  const bool first = __reduce_or_sync(0xffffffffu, unsigned(ptx::named_bar_or(1 + wg, 128, t == 0 && atomicAdd(count, 1) == 0)));
  if (first) {
#pragma unroll
    for (int r = 0; r < kORegs; ++r) __stcg(part + r * 128, c.acc_o[r]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      __stcg(part + (kORegs + 2 * h) * 128, c.softmax.state[h].row_max);
      __stcg(part + (kORegs + 2 * h + 1) * 128, c.softmax.state[h].row_sum);
    }
    ptx::named_bar_sync(1 + wg, 128);  // every thread's stores, then the flag
    if (t == 0) {
      __threadfence();
      ptx::st_release_gpu(ready, 1);
    }
    return false;
  }
  if (t == 0)
    while (ptx::ld_acquire_gpu(ready) == 0) {
    }
  ptx::named_bar_sync(1 + wg, 128);
  float sa[2], sb[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    typename C::Softmax::State other;
    other.row_max = __ldcg(part + (kORegs + 2 * h) * 128);
    other.row_sum = __ldcg(part + (kORegs + 2 * h + 1) * 128);
    if (!c.softmax.state[h].merge_scales(other, sa[h], sb[h])) sa[h] = 1.f, sb[h] = 0.f;
  }
  // In groups of 8 loads (all at once, the d256 and the since removed 176-key consumers spilled).
#pragma unroll
  for (int r0 = 0; r0 < kORegs; r0 += 8) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __ldcg(part + (r0 + i) * 128);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int h = ((r0 + i) >> 1) & 1;
      c.acc_o[r0 + i] = c.acc_o[r0 + i] * sa[h] + v[i] * sb[h];
    }
    asm volatile("" ::: "memory");
  }
  return true;
}

}  // namespace flashattn::cuda::sm90
