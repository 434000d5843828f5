// Online softmax over a wgmma accumulator fragment (docs/hopper-sm90.md §1.3).
//
// A consumer thread (t = 0..127 of its warpgroup, w = t/32, l = t%32) owns two query rows of its
// 64-row block, 16w + l/4 (half 0) and that + 8 (half 1); register r of an m64nN accumulator holds
// row half (r>>1)&1 and column 8(r>>2) + 2(l%4) + (r&1). A full row lives in the 4 lanes of a quad,
// so a row reduction is thread-local plus two xor-shuffles.
//
// Each half is one flashattn::SoftmaxState<float, /*kLog2=*/true> (include/flashattn/online_softmax.hpp):
// scores are kept raw in the accumulator and scaled by scale·log2(e) (folded on the host) inside
// the exponent, p = 2^(s·scale_log2 − row_max) = one FFMA + MUFU.EX2. row_sum holds this thread's
// partial sum (its 1/4 of the row's columns) until finalize() reduces it over the quad; every lane
// of a quad applies the same rescale, so the partial sums stay consistent.
#pragma once

#include "cuda/common/quad_reduce.cuh"
#include "cuda/sm90/fwd/key_tiles.hpp"
#include "cuda/sm90/primitives/fragment.cuh"
#include "cuda/sm90/primitives/ptx.cuh"
#include "flashattn/online_softmax.hpp"

namespace flashattn::cuda::sm90 {


template <int kBlockN, int kChains = 1, bool kLazy = false>
struct FragmentSoftmax {
  static constexpr int kRegs = kBlockN / 2;  // acc_s registers per thread
  using State = SoftmaxState<float, true>;
  State state[2];                             // rows 16w + l/4 and 16w + l/4 + 8

  // Masks scores of keys the row cannot see: key >= k_len and, in the causal kernels (which serve
  // every window; the others none), key > row + diag + wr (wr >= 0: sm90.hpp) or key < row + diag
  // − wl (wl < 0: no bound), diag = k_len − q_len.
  // key0 = first key of the tile, row0 = this thread's half-0 query row; both sequence-local.
  // The right bounds fold into one last visible column per row half, relative to this thread's
  // first column, so without a left window each score costs one compare against a constant and
  // one select; a left window adds one compare.
  template <bool kCausal>
  __device__ __forceinline__ static void mask(float (&acc_s)[kRegs], int key0, int row0, int k_len,
                                              int q_len, int wl, int wr) {
    const int first = key0 + 2 * (threadIdx.x % 4);  // this thread's key in column 0 of the tile
    mask_scores<kCausal>(acc_s, first, row0, k_len, q_len, wl, wr);  // fwd/key_tiles.hpp
  }

  // Softcap (FwdArgs::softcap_scale > 0): s -> cap·tanh(s·scale / cap), applied to the raw scores
  // before masking; the host then folds cap·log2(e) into scale_log2. tanh as 1 − 2 / (2^(2x·log2 e)
  // + 1) (two MUFU ops; exact to a few ulp in the exponent, where tanh.approx's 2^-11 relative
  // error would move p by up to cap·2^-11). ±inf → ±1.
  __device__ __forceinline__ static void softcap(float (&acc_s)[kRegs], float softcap_scale) {
#pragma unroll
    for (int r = 0; r < kRegs; ++r) {
      const float e = ptx::ex2(acc_s[r] * (softcap_scale * 2.8853900817779268f));  // 2^(2x·log2 e)
      acc_s[r] = 1.f - __fdividef(2.f, e + 1.f);
    }
  }

  // A row half's maximum over its kChains accumulators and the quad (raw scores).
  __device__ __forceinline__ static float row_max(const float (&mx)[kChains]) {
    float m = mx[0];
#pragma unroll
    for (int c = 1; c < kChains; ++c) m = fmaxf(m, mx[c]);
    return quad_max(m);
  }
  // Adds each row half's tile sum, its kChains accumulators in order, to the state.
  __device__ __forceinline__ void add_chain_sums(const float (&sum)[2][kChains]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float total = sum[h][0];
#pragma unroll
      for (int c = 1; c < kChains; ++c) total += sum[h][c];
      state[h].add_sum(total);
    }
  }

  // Folds one tile of raw scores in: updates row_max/row_sum, turns acc_s into probabilities
  // (in place, fp32) and returns the factor acc_o must be multiplied by, per row half.
  // kChains > 1 splits each row's maximum and sum over that many independent accumulators
  // (register column group r/4 mod kChains), combined at the end: while the other warpgroup's GEMMs
  // run, one warp has each SM sub-partition to itself, so a single 32-long chain of dependent FMNMX
  // is paid in full on every tile. Measured (docs/perf/log.md, P-051): +4–9 % at d128 and
  // +2–4 % at d64 causal, but −5 % at d64 non-causal (three consumer warpgroups at 160 registers)
  // and −4 % at d256 causal even with the two halves merely reordered, so kChains = 1 keeps the
  // one-half-at-a-time order there (Consumer picks it, mainloop.cuh).
  //
  // kSkip (the causal kernels' first, diagonal key tile): column blocks j >= live (8 columns each,
  // registers 4j … 4j + 3; live is warp-uniform) are masked for every row of the warp, so their
  // exponentials (2^-inf = 0) are not computed: set to 0. Same results, fewer MUFU.EX2.
  template <bool kSkip = false>
  __device__ __forceinline__ void step(float (&acc_s)[kRegs], float scale_log2, float (&rescale)[2], int live = kRegs / 4) {
    if constexpr (kChains == 1) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int r = 0; r < kRegs; ++r)
          if (((r >> 1) & 1) == h) mx = fmaxf(mx, acc_s[r]);
        mx = quad_max(mx);
        rescale[h] = begin_tile(state[h], mx * scale_log2);  // -inf stays -inf: masked tile, no change
        // exp_offset() is 0 while the row has seen no key, so 2^(-inf - 0) = 0, never NaN.
        const float offset = state[h].exp_offset();
        float sum = 0.f;
#pragma unroll
        for (int g = 0; g < (kRegs + 15) / 16; ++g) {  // as below: a branch per 4 column blocks
          if (kSkip && 4 * g >= live) {
#pragma unroll
            for (int r = 16 * g; r < 16 * g + 16 && r < kRegs; ++r)
              if (((r >> 1) & 1) == h) acc_s[r] = 0.f;
            continue;
          }
#pragma unroll
          for (int r = 16 * g; r < 16 * g + 16 && r < kRegs; ++r)
            if (((r >> 1) & 1) == h) {
              if (kSkip && (r >> 2) >= live) {
                acc_s[r] = 0.f;
                continue;
              }
              acc_s[r] = ptx::ex2(fmaf(acc_s[r], scale_log2, -offset));
              sum += acc_s[r];
            }
        }
        state[h].add_sum(sum);
      }
    } else {
      float mx[2][kChains];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int c = 0; c < kChains; ++c) mx[h][c] = -INFINITY;
#pragma unroll
      for (int r = 0; r < kRegs; ++r) {
        float& m = mx[(r >> 1) & 1][(r >> 2) % kChains];
        m = fmaxf(m, acc_s[r]);
      }
      float offset[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        rescale[h] = begin_tile(state[h], row_max(mx[h]) * scale_log2);
        offset[h] = state[h].exp_offset();
      }
      float sum[2][kChains] = {};
#pragma unroll
      for (int g = 0; g < (kRegs + 15) / 16; ++g) {  // groups of 4 column blocks (16 registers)
        if (kSkip && 4 * g >= live) {  // warp-uniform: a branch over the group, not predicated MUFUs
#pragma unroll
          for (int r = 16 * g; r < 16 * g + 16 && r < kRegs; ++r) acc_s[r] = 0.f;
          continue;
        }
#pragma unroll
        for (int r = 16 * g; r < 16 * g + 16 && r < kRegs; ++r) {
          const int h = (r >> 1) & 1;
          if (kSkip && (r >> 2) >= live) {
            acc_s[r] = 0.f;
            continue;
          }
          acc_s[r] = ptx::ex2(fmaf(acc_s[r], scale_log2, -offset[h]));
          sum[h][(r >> 2) % kChains] += acc_s[r];
        }
      }
      add_chain_sums(sum);
    }
  }

  // kLazy (FA4's conditional rescaling): the running maximum moves only when a tile's maximum
  // exceeds it by more than 2^8 (log2 units, SoftmaxState::begin_tile_lazy), so probabilities stay
  // below 256 (fp16 and bf16 hold them with the same relative rounding) and, past a row's first key
  // blocks, O needs no rescaling at all: the consumer skips rescale_o when no row of the warp moved
  // (needs_rescale). Measured (docs/perf/log.md, P-064): +4–13 % at d256,
  // +0–5 % at d128 causal, +1–3 % at d64 causal, neutral at d128 non-causal (+0–1 % back to back,
  // neutral at a locked clock: it saves power, not cycles; P-129), −2–5 %
  // at d64 non-causal (Consumer picks it).
  static constexpr float kRescaleSlack = 8.f;
  __device__ __forceinline__ static float begin_tile(SoftmaxState<float, true>& st, float tile_max) {
    if constexpr (kLazy) return st.begin_tile_lazy(tile_max, kRescaleSlack);
    return st.begin_tile(tile_max);
  }
  // The main loop's step with kLazy, the exponentials taken speculatively against the running
  // maximum: the tile maximum (FMNMX, the ALU pipe) is reduced beside the exponentials (MUFU.EX2)
  // instead of before them, so it leaves the critical path (a probe without the maximum ran d128
  // N = 4096 11 % faster at a fixed clock, docs/perf/log.md, P-131). When the tile maximum
  // stays within the slack of every row's running maximum of the warp — begin_tile_lazy would
  // change nothing — the speculative values are the step's own: the same FFMA, MUFU and summation
  // order, so bitwise the same results. Otherwise (a row's first keys, a jump above the slack,
  // warp-uniform) the tile is redone as step() does. acc_s keeps the raw scores (the redo needs
  // them); the probabilities go straight into pn, the A fragment of the next P·V (acc_to_a's layout).
  // p = 2^(s·scale_log2 − offset) of each score, summed per row half and chain (column group mod
  // kChains, in register order: step()'s order) and packed in pairs into an A fragment; kMax: the
  // raw scores' maximum per row half and chain in the same pass (one loop: measured so).
  template <bool kF16, bool kMax, int kSteps>
  __device__ __forceinline__ static void exp_pairs(const float (&acc_s)[kRegs], float scale_log2, const float (&offset)[2],
                                                   float (&sum)[2][kChains], uint32_t (&pn)[kSteps][4],
                                                   float (&mx)[2][kChains]) {
#pragma unroll
    for (int r = 0; r < kRegs; r += 2) {  // a pair: one row half, one chain, one packed register
      const int h = (r >> 1) & 1, c = (r >> 2) % kChains;
      if (kMax) mx[h][c] = fmaxf(fmaxf(mx[h][c], acc_s[r]), acc_s[r + 1]);
      const float e0 = ptx::ex2(fmaf(acc_s[r], scale_log2, -offset[h]));
      const float e1 = ptx::ex2(fmaf(acc_s[r + 1], scale_log2, -offset[h]));
      sum[h][c] += e0;
      sum[h][c] += e1;
      pn[r / 8][(r % 8) / 2] = pack2<kF16>(e0, e1);
    }
  }
  template <bool kF16, int kSteps>
  __device__ __forceinline__ void step_speculative(const float (&acc_s)[kRegs], float scale_log2, float (&rescale)[2],
                                                   uint32_t (&pn)[kSteps][4]) {
    static_assert(kLazy && 8 * kSteps == kRegs, "the speculative step needs kLazy and a whole A fragment");
    float offset[2] = {state[0].exp_offset(), state[1].exp_offset()};
    float mx[2][kChains], sum[2][kChains];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int c = 0; c < kChains; ++c) mx[h][c] = -INFINITY, sum[h][c] = 0.f;
    exp_pairs<kF16, true>(acc_s, scale_log2, offset, sum, pn, mx);
    float tile_max[2];
    bool redo = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = row_max(mx[h]) * scale_log2;
      // begin_tile_lazy's test: it would move the maximum (or the row is still empty)
      redo |= state[h].row_max == -INFINITY || tile_max[h] > state[h].row_max + kRescaleSlack;
    }
    if (__any_sync(0xffffffffu, redo)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        rescale[h] = begin_tile(state[h], tile_max[h]);
        offset[h] = state[h].exp_offset();
#pragma unroll
        for (int c = 0; c < kChains; ++c) sum[h][c] = 0.f;
      }
      exp_pairs<kF16, false>(acc_s, scale_log2, offset, sum, pn, mx);
    } else {
      rescale[0] = rescale[1] = 1.f;
    }
    add_chain_sums(sum);
  }

  // Whether acc_o must be rescaled: always unless kLazy, else when any row of the warp moved
  // (warp-uniform, so skipping does not diverge).
  __device__ __forceinline__ static bool needs_rescale(const float (&rescale)[2]) {
    if constexpr (!kLazy) return true;
    return __any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f);
  }

  // acc_o (m64 × D fragment, same row halves) *= rescale.
  template <int kORegs>
  __device__ __forceinline__ static void rescale_o(float (&acc_o)[kORegs], const float (&rescale)[2]) {
#pragma unroll
    for (int r = 0; r < kORegs; ++r) acc_o[r] *= rescale[(r >> 1) & 1];
  }

  // Reduces row_sum over the quad; afterwards inv_sum()/lse() of each state are the row's values.
  __device__ __forceinline__ void finalize() {
#pragma unroll
    for (int h = 0; h < 2; ++h) state[h].row_sum = quad_sum(state[h].row_sum);
  }
};

}  // namespace flashattn::cuda::sm90
