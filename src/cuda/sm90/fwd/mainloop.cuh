// Producer (TMA) and consumer (wgmma + online softmax) loops of the Hopper forward kernel.
//
// Shared memory, every tile as 64-column (128-byte) chunks, each chunk 1024-byte aligned and
// written by TMA with the 128B swizzle:
//   sQ  (kBlockM, D)                 chunk c at + c·kBlockM·128; consumer WG g reads rows 64g..64g+63
//   sK[s], sV[s]  (kBlockN, D)       chunk c at + c·kBlockN·128
//   sO  (kBlockM, D)                 like sQ (Tile::kSeparateO), else sO = sQ
// Barriers (docs/hopper-sm90.md §4): full_q/empty_q; per stage full_k/empty_k, full_v/empty_v. K and V
// have separate barriers so S = Q·Kᵀ of a tile can start before its V has landed.
// A CTA may process several tiles (persistent grid, scheduler.cuh): the K/V ring position `kv_it`
// and the count of Q loads continue across tiles on both sides, so the producer prefetches the
// next tile's K/V while the consumers finish the current one. The next Q load waits on empty_q:
// released right after the last Q·Kᵀ where O has its own staging buffer sO (d64, d128), after the
// epilogue's TMA store has read sQ where O is staged in sQ (d256).
// Key tiles are visited from the last (n_blocks-1) to the first, so the masked tiles (causal
// diagonal, partial last tile) come first and the rest run without per-element checks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sm90/primitives/fragment.cuh"
#include "cuda/sm90/primitives/gemm.cuh"
#include "cuda/sm90/args.hpp"
#include "cuda/sm90/primitives/ptx.cuh"
#include "cuda/sm90/fwd/key_tiles.hpp"
#include "cuda/sm90/fwd/pipe.hpp"
#include "cuda/sm90/fwd/scheduler.cuh"
#include "cuda/sm90/seq.cuh"
#include "cuda/sm90/fwd/softmax.cuh"
#include "cuda/sm90/tile_size.hpp"
#include "cuda/sm90/primitives/wgmma.cuh"

namespace flashattn::cuda::sm90 {

template <class Tile>
struct Smem {
  uint8_t* q;
  uint8_t* o;  // O staging for the TMA store: its own buffer (Tile::kSeparateO) or sQ
  uint8_t* k;  // stage s at + s·kKVBytes
  uint8_t* v;
  uint64_t* full_q;
  uint64_t* empty_q;  // sQ free again: both consumer WGs are past their last Q·Kᵀ of the tile
                     // (kSeparateO) or past the epilogue that staged O in sQ
  uint64_t* full_k;  // [kStages]
  uint64_t* empty_k;
  uint64_t* full_v;
  uint64_t* empty_v;

  __device__ static Smem carve(uint8_t* raw) {
    uint8_t* base = ptx::align_1024(raw);
    Smem s;
    s.q = base;
    s.k = base + Tile::kQBytes;
    s.v = s.k + Tile::kStages * Tile::kKVBytes;
    s.o = Tile::kSeparateO ? s.v + Tile::kStages * Tile::kKVBytes : s.q;
    uint64_t* bars = reinterpret_cast<uint64_t*>(s.v + Tile::kStages * Tile::kKVBytes + Tile::kOBytes);
    s.full_q = bars;
    s.empty_q = bars + 1;
    s.full_k = bars + 2;
    s.empty_k = s.full_k + Tile::kStages;
    s.full_v = s.empty_k + Tile::kStages;
    s.empty_v = s.full_v + Tile::kStages;
    return s;
  }
  static constexpr int kBytes = 1024 + Tile::kSmemBytes + 8 * (2 + 4 * Tile::kStages);

  __device__ void init_barriers() {
    ptx::mbar_init_ring(full_q, empty_q, 1, Tile::kConsumerWGs);
    ptx::mbar_init_ring(full_k, empty_k, Tile::kStages, Tile::kConsumerWGs);
    ptx::mbar_init_ring(full_v, empty_v, Tile::kStages, Tile::kConsumerWGs);
    ptx::fence_barrier_init();
  }
};

// A tile's sequence: seq_rows<kVarlen> (seq.cuh), kVarlen the kernel's varlen instance
// (fwd/kernel.cuh, launch_fwd_tile; the other instance has no trace of varlen). The consumers load
// it before the main loop and again in the epilogue.

// Whether a scheduled tile has query rows: not a virtual one (scheduler.cuh: paired modes, odd
// heads·batch; m_block = m_blocks) nor, with varlen, one past its sequence's rows. Its key tiles:
// none without rows.
template <class Tile, bool kVarlen>
__device__ __forceinline__ bool tile_has_rows(const FwdArgs& a, const TileCoord& tc, const SeqRows& s) {
  return kVarlen ? tc.m_block * Tile::kBlockM < s.q_len : tc.m_block < a.m_blocks;
}
template <class Tile, bool kCausal, bool kVarlen>
__device__ __forceinline__ KeyTiles tile_keys(const FwdArgs& a, const TileCoord& tc, const SeqRows& s) {
  return tile_has_rows<Tile, kVarlen>(a, tc, s) ? key_range<Tile, kCausal>(a, s, tc.m_block) : KeyTiles{0, 0};
}

// ---- producer: one thread of warpgroup 0 ---------------------------------------------------------

// kEmptyTiles: the kernel may schedule tiles without keys (fwd/kernel.cuh); else none occurs.
template <class Tile, bool kEmptyTiles>
__device__ __forceinline__ void producer_tile(const FwdArgs& a, Smem<Tile>& sm, PipeState& ps, int m_block,
                                              int head, const SeqRows& s, KeyTiles keys) {
  const int n_blocks = keys.count();
  const int head_kv = head / a.group;
  const bool first_tile = ps.tiles == 0;
  const uint32_t q_free_parity = ring_phase<1>(ps.tiles++) ^ 1;
  if (n_blocks == 0) {
    // Nothing to load, but the consumers still hand sQ back after the tile (they may stage O in
    // it): wait for the previous tile's release, then let them go on with an arrival on full_q
    // (no bytes). Without that arrival they could release this tile too before this wait, and the
    // wait would find empty_q two phases on, its parity unchanged: blocked for good (rare hangs on
    // the H200; tests/kernels/test_mbarrier_protocols.cpp).
    ptx::mbar_wait(sm.empty_q, q_free_parity);
    if (kEmptyTiles) {
      ++ps.q_loads;
      ptx::mbar_arrive(sm.full_q);
    }
    return;
  }
  // Out-of-bounds rows of a box are zero-filled and still counted in the transaction bytes. With
  // varlen a box's rows past the sequence are the next sequence's: keys masked (needs_mask), query
  // rows not stored.
  const int q_row = s.q_start + m_block * Tile::kBlockM, batch = s.batch;
  for (int it = 0; it < n_blocks; ++it) {
    const int n = keys.end - 1 - it;
    const int g = ps.kv_it + it;
    const int stage = ring_stage<Tile::kStages>(g);
    const uint32_t phase = ring_phase<Tile::kStages>(g);
    // Later tiles: the first K load goes out before waiting for sQ, so it overlaps the previous
    // tile's tail. The first tile loads Q first (nothing to overlap, Q is needed first).
    if (it == 0 && first_tile) {
      ptx::mbar_arrive_expect_tx(sm.full_q, Tile::kQBytes);
      ptx::tma_load_tile<Tile::kChunks, Tile::kBlockM>(a.x_chunks, sm.q, &a.tm_q, sm.full_q, q_row, head, batch);
    }
    ptx::mbar_wait(sm.empty_k + stage, phase ^ 1);  // fresh barrier: parity 1 passes at once
    ptx::mbar_arrive_expect_tx(sm.full_k + stage, Tile::kKVBytes);
    ptx::tma_load_tile<Tile::kChunks, Tile::kBlockN>(a.x_chunks, sm.k + stage * Tile::kKVBytes, &a.tm_k, sm.full_k + stage, s.k_start + n * Tile::kBlockN,
                                   head_kv, batch);
    if (it == 0) {
      ++ps.q_loads;
      // Later tiles: wait until the previous tile is done with sQ. The first has no previous tile
      // and its Q went out above: with one key block its consumers may release sQ before this
      // point, and a wait here would then find empty_q a phase on and block (the fresh barrier's
      // parity-1 pass is gone; tests/kernels/test_mbarrier_protocols.cpp).
      if (!first_tile) {
        ptx::mbar_wait(sm.empty_q, q_free_parity);
        ptx::mbar_arrive_expect_tx(sm.full_q, Tile::kQBytes);
        ptx::tma_load_tile<Tile::kChunks, Tile::kBlockM>(a.x_chunks, sm.q, &a.tm_q, sm.full_q, q_row, head, batch);
      }
    }
    ptx::mbar_wait(sm.empty_v + stage, phase ^ 1);
    ptx::mbar_arrive_expect_tx(sm.full_v + stage, Tile::kKVBytes);
    ptx::tma_load_tile<Tile::kChunks, Tile::kBlockN>(a.x_chunks, sm.v + stage * Tile::kKVBytes, &a.tm_v, sm.full_v + stage, s.k_start + n * Tile::kBlockN,
                                   head_kv, batch);
  }
  ps.kv_it += n_blocks;
}

// ---- consumer: one warpgroup, 64 query rows --------------------------------------------------------
// kSoftcap: the kernel's softcap instance (fwd/kernel.cuh, launch_fwd_tile).
template <class Tile, bool kF16, bool kCausal, int kHeadDim, bool kSoftcap>
struct Consumer {
  static constexpr int kBlockN = Tile::kBlockN;
  static constexpr int kSRegs = kBlockN / 2;
  static constexpr int kORegs = kHeadDim / 2;
  static constexpr int kPSteps = kBlockN / 16;  // k16 slices of P·V

  float acc_o[kORegs];  // (64, D) fp32, fragment layout §1.3
  // Row max/sum over 4 independent chains where measured faster (softmax.cuh).
  static constexpr int kSoftmaxChains = kHeadDim == 128 || (kHeadDim == 64 && kCausal) ? 4 : 1;
  static constexpr bool kLazyRescale = kHeadDim >= 128 || kCausal;  // FragmentSoftmax::kLazy
  using Softmax = FragmentSoftmax<kBlockN, kSoftmaxChains, kLazyRescale>;
  // The main loop's exponentials against the running maximum, the tile maximum beside them
  // (FragmentSoftmax::step_speculative). Its probabilities need a second A fragment (32 registers
  // at 128 keys) beside the one the in-flight P·V reads: d128 and d64 with 128-row tiles (causal
  // below 2048) have them. With it d128's 176-key tiles (since removed, tile_size.hpp) spilled
  // 264–296 bytes, d192 96–120, d256 32–56; d64's 192-row tiles run three consumer warpgroups at
  // 160 registers.
  static constexpr bool kSpeculative =
      kLazyRescale && (kHeadDim == 128 || (kHeadDim == 64 && Tile::kBlockM == 128));
  // Causal: skip the key blocks right of this warpgroup's rows (run()). At d64 with 192-row tiles
  // and d256 (80-key blocks: the first warpgroup of a 128-row tile often needs one block less).
  // Not d128 nor d64 with 128-row tiles (with 128-key blocks a 64-row warpgroup's bound falls on a
  // block edge: nothing to skip but where the diagonal is not aligned, and its reduction, a REDUX
  // per tile, is 1 % of the stall samples at d64 causal N = 512), nor d192 (its varlen consumer
  // spills 12 bytes with it).
  static constexpr bool kSkipMasked = kCausal && ((kHeadDim == 64 && Tile::kBlockM == 192) || kHeadDim == 256);
  Softmax softmax;

  // S = Q·Kᵀ (SS, both K-major; gemm.cuh).
  __device__ __forceinline__ static void issue_qk(float (&acc_s)[kSRegs], uint32_t q_base, uint32_t k_base) {
    ptx::fence_operand(acc_s);
    ptx::wgmma_fence();
    gemm_kk<kBlockN, kF16, kHeadDim, true>(acc_s, q_base, Tile::kBlockM * 128, k_base, kBlockN * 128);
    ptx::wgmma_commit();
  }
  // O += P·V (RS; V MN-major, its 64-column chunks kBlockN·128 B apart).
  __device__ __forceinline__ void issue_pv(const uint32_t (&p)[kPSteps][4], uint32_t v_base) {
    ptx::fence_operand(acc_o);
    ptx::wgmma_fence();
    gemm_rs_mn<kHeadDim, kF16, kPSteps, true>(acc_o, p, v_base, kBlockN * 128);
    ptx::wgmma_commit();
  }
  // P (A operand of P·V) straight from the score accumulator (§1.4): no shuffles.
  __device__ __forceinline__ static void convert_p(const float (&acc_s)[kSRegs], uint32_t (&p)[kPSteps][4]) {
    acc_to_a<kF16>(acc_s, p);
  }

  // Ping-pong between the consumer warpgroups (FA3 warp scheduler barriers, §4): a warpgroup
  // issues its GEMMs only on its turn, so one warpgroup's softmax overlaps the others' GEMMs. Turns
  // rotate 0 → 1 → … → kConsumerWGs − 1 → 0 over the CTA's whole life: warpgroup 0 takes the very
  // first turn and the last warpgroup of the rotation skips only its very last hand-off.
  // (Restarting the rotation at every tile would let warpgroup 0 arrive twice on warpgroup 1's
  // barrier — its last turn of one tile and its first of the next — before warpgroup 1 waits
  // there, and the two would deadlock.) Barrier ids: 1 … kConsumerWGs are the per-warpgroup
  // epilogue barriers, the turn barriers follow.
  using Turns = TurnBarriers<Tile::kConsumerWGs>;  // the barrier ids (fwd/pipe.hpp)
  __device__ __forceinline__ static void turn_begin(int wg) { ptx::named_bar_sync(Turns::own(wg), 256); }
  __device__ __forceinline__ static void turn_end(int wg, bool last) {
    if (!(last && wg == Tile::kConsumerWGs - 1))  // keep arrivals balanced
      ptx::named_bar_arrive(Turns::next(wg), 256);
  }

  // The main loop with intra-warpgroup overlap (FA3 IntraWGOverlap): S of tile it is issued
  // together with P·V of tile it-1; the softmax of tile it runs while that P·V is in flight.
  // first_of_cta / last_of_cta: this is the CTA's first / last tile that has any key block.
  // q_len, k_len: the tile's sequence (SeqRows).
  __device__ __forceinline__ void run(const FwdArgs& a, Smem<Tile>& sm, PipeState& ps, int wg, int m_block,
                                      KeyTiles keys, bool first_of_cta, bool last_of_cta, int q_len, int k_len) {
    const int n_blocks = keys.count();
#pragma unroll
    for (int r = 0; r < kORegs; ++r) acc_o[r] = 0.f;
    if (n_blocks == 0) return;
    const int it0 = ps.kv_it;
    ps.kv_it += n_blocks;
    const uint32_t q_phase = ring_phase<1>(ps.q_loads++);
    const int t = threadIdx.x % 128;
    const int row0 = m_block * Tile::kBlockM + 64 * wg + 16 * (t / 32) + (t % 32) / 4;  // half-0 row
    const int diag_row_min = m_block * Tile::kBlockM + k_len - q_len;  // the first row's diagonal key
    // Windows: the causal kernels take every window (causal is window_right 0; an unbounded right
    // side comes clamped to seqlen_q); the non-causal ones none (with the window checks in its
    // main loop the d256 non-causal consumer spilled). FragmentSoftmax::mask ignores them there.
    const int wl = a.window_left, wr = a.window_right;
    // The warpgroup's Q rows, its index through a warp reduction (REDUX: a uniform register), so
    // the Q·Kᵀ descriptors are formed in uniform registers (computed from the per-thread index
    // they sat in 2 vector registers per k16 step, moved over by R2UR before every wgmma).
    const uint32_t q_base = ptx::smem_addr(sm.q) + __reduce_max_sync(0xffffffffu, unsigned(wg)) * 64 * 128;
    const uint32_t k_base = ptx::smem_addr(sm.k), v_base = ptx::smem_addr(sm.v);
    const KeyTileNeedsMask<Tile, kCausal> needs_mask{diag_row_min, k_len, wl, wr};  // needs_mask(n): fwd/key_tiles.hpp

    // Causal: the tile's last key blocks can lie right of this warpgroup's last row's bound (the
    // first rows of a 192-row tile; 80- or 112-key blocks; rows past q_len), fully masked for all
    // its rows. It skips them: no GEMMs, no softmax. It still takes their turns (the rotation
    // counts n_blocks + 1 turns per tile) and releases their stages once they are loaded (a release
    // before the load can complete a fresh barrier's first phase before the producer's first
    // wait, which then blocks: tests/kernels/test_mbarrier_protocols.cpp).
    // The skip and the branches on it go through warp reductions (REDUX: uniform registers).
    // Computed per thread, they make ptxas move the main loop's stage and descriptor arithmetic
    // out of the uniform datapath (R2UR 8 → 32 in the loop), and every d64 causal row is 3–8 %
    // slower (a never-taken branch on a per-thread value alone costs 2–4 %; docs/perf/log.md,
    // P-109).
    int skip = 0;
    if (kSkipMasked) {
      skip = __reduce_max_sync(0xffffffffu, unsigned(masked_key_blocks<Tile>(keys, m_block * Tile::kBlockM + 64 * wg, q_len, k_len, wr)));
    }

    float acc_s[kSRegs];
    uint32_t p[kPSteps][4];
    uint32_t pn[kPSteps][4];  // kSpeculative: the next P·V's fragment, written while p is read
    float rescale[2];

    if (wg == 0 && first_of_cta) ptx::named_bar_arrive(Turns::own(0), 256);  // warpgroup 0 goes first
    ptx::mbar_wait(sm.full_q, q_phase);

    for (int it = 0; it < skip; ++it) {
      const int g = it0 + it, stage = ring_stage<Tile::kStages>(g);
      const uint32_t phase = ring_phase<Tile::kStages>(g);
      turn_begin(wg);
      turn_end(wg, false);
      ptx::mbar_wait(sm.full_k + stage, phase);
      if (t == 0) ptx::mbar_arrive(sm.empty_k + stage);
      ptx::mbar_wait(sm.full_v + stage, phase);
      if (t == 0) ptx::mbar_arrive(sm.empty_v + stage);
    }
    // Every row masked or past q_len: acc_o 0, the state as new.
    if (kSkipMasked && __reduce_or_sync(0xffffffffu, unsigned(skip == n_blocks))) {
      if (Tile::kSeparateO && t == 0) ptx::mbar_arrive(sm.empty_q);
      turn_begin(wg);  // the turn of the last P·V (turn_end's test, as a reduction)
      if (!__reduce_or_sync(0xffffffffu, unsigned(last_of_cta && wg == Tile::kConsumerWGs - 1)))
        ptx::named_bar_arrive(Turns::next(wg), 256);
      return;
    }

    // Prologue: tile 0 (the last key tile this warpgroup needs, n = keys.end - 1 - skip).
    const int g0 = it0 + skip, stage0 = ring_stage<Tile::kStages>(g0);
    ptx::mbar_wait(sm.full_k + stage0, ring_phase<Tile::kStages>(g0));
    turn_begin(wg);
    issue_qk(acc_s, q_base, k_base + stage0 * Tile::kKVBytes);
    turn_end(wg, false);
    ptx::wgmma_wait<0>();
    ptx::fence_operand(acc_s);
    if (t == 0) ptx::mbar_arrive(sm.empty_k + stage0);
    {
      const int n = keys.end - 1 - skip;
      if (kSoftcap) Softmax::softcap(acc_s, a.softcap_scale);
      if (needs_mask(n)) FragmentSoftmax<kBlockN>::template mask<kCausal>(acc_s, n * kBlockN, row0, k_len, q_len, wl, wr);
      if (kCausal) {
        // The diagonal tile: the column blocks right of this warp's last row's last key are
        // masked for all its rows (warp 0 of warpgroup 0 sees 16 of the 128 keys of an aligned
        // diagonal tile); their exponentials are skipped (FragmentSoftmax::step<true>).
        const int live = live_column_blocks<Tile>(m_block * Tile::kBlockM + 64 * wg + 16 * (t / 32), n, k_len, q_len, wr);
        softmax.template step<true>(acc_s, a.scale_log2, rescale, live);  // acc_o is 0: no rescale
      } else {
        softmax.step(acc_s, a.scale_log2, rescale);  // acc_o is 0: no rescale needed
      }
      convert_p(acc_s, p);
    }

    for (int it = skip + 1; it < n_blocks; ++it) {
      const int n = keys.end - 1 - it;
      const int g = it0 + it;
      const int stage = ring_stage<Tile::kStages>(g), prev = ring_stage<Tile::kStages>(g - 1);
      const uint32_t phase = ring_phase<Tile::kStages>(g), prev_phase = ring_phase<Tile::kStages>(g - 1);
      ptx::mbar_wait(sm.full_k + stage, phase);
      ptx::mbar_wait(sm.full_v + prev, prev_phase);
      turn_begin(wg);
      issue_qk(acc_s, q_base, k_base + stage * Tile::kKVBytes);
      issue_pv(p, v_base + prev * Tile::kKVBytes);
      turn_end(wg, false);
      ptx::wgmma_wait<1>();  // S ready; P·V of the previous tile may still run
      ptx::fence_operand(acc_s);
      if (t == 0) ptx::mbar_arrive(sm.empty_k + stage);
      if (kSoftcap) Softmax::softcap(acc_s, a.softcap_scale);
      if (needs_mask(n)) FragmentSoftmax<kBlockN>::template mask<kCausal>(acc_s, n * kBlockN, row0, k_len, q_len, wl, wr);
      if (a.serial_softmax) ptx::wgmma_wait<0>();
      if constexpr (kSpeculative)
        softmax.template step_speculative<kF16>(acc_s, a.scale_log2, rescale, pn);
      else
        softmax.step(acc_s, a.scale_log2, rescale);
      // P·V done: p and V[prev] are free, acc_o may be touched. A plain wait here is hoisted by
      // ptxas above the whole softmax (it has no operands), which then runs after this warpgroup's
      // P·V instead of beside it (SASS: WARPGROUP.DEPBAR.LE gsb0, 0x0 ahead of every MUFU.EX2). The
      // first wait is predicated on the row sums (never negative, so always taken) and cannot move
      // above them; the second, plain one lets ptxas see every path wait before acc_o is read.
      ptx::wgmma_wait_after<0>(!(softmax.state[0].row_sum + softmax.state[1].row_sum < 0.f));
      ptx::wgmma_wait<0>();
      ptx::fence_operand(acc_o);
      ptx::fence_operand(p);  // keeps p's registers untouched until the RS wgmma has read them
      if (t == 0) ptx::mbar_arrive(sm.empty_v + prev);
      if (Softmax::needs_rescale(rescale)) Softmax::rescale_o(acc_o, rescale);
      if constexpr (kSpeculative) {
        // A plain copy vanishes (SSA): pn's conversions then define the next P·V's operands in
        // the registers the in-flight P·V reads, and ptxas serialized every wgmma (C7513). A
        // predicated move (its predicate always true, opaque) keeps p live up to here.
        const uint32_t keep = !(softmax.state[0].row_sum + softmax.state[1].row_sum < 0.f);
#pragma unroll
        for (int s = 0; s < kPSteps; ++s) ptx::mov_if(p[s], pn[s], keep);
      } else {
        convert_p(acc_s, p);
      }
    }

    // Every Q·Kᵀ of this tile has completed: with a separate O buffer, sQ may take the next Q now.
    if (Tile::kSeparateO && t == 0) ptx::mbar_arrive(sm.empty_q);
    // Epilogue of the loop: P·V of the last tile.
    const int last = ring_stage<Tile::kStages>(it0 + n_blocks - 1);
    ptx::mbar_wait(sm.full_v + last, ring_phase<Tile::kStages>(it0 + n_blocks - 1));
    turn_begin(wg);
    issue_pv(p, v_base + last * Tile::kKVBytes);
    turn_end(wg, last_of_cta);
    ptx::wgmma_wait<0>();
    ptx::fence_operand(acc_o);
    if (t == 0) ptx::mbar_arrive(sm.empty_v + last);
  }
};

}  // namespace flashattn::cuda::sm90
