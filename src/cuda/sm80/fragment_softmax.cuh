// The online-softmax state (include/flashattn/online_softmax.hpp) on mma accumulator fragments.
// A thread holds two rows per 16-row band (g and g+8); a row's columns are spread over the 4
// threads of a quad. The row maximum is reduced over the quad before begin_tile, so all 4
// threads hold the same row_max; row_sum stays a per-thread partial sum (every rescale is applied
// to all partials alike) and is reduced over the quad once, at finalize. Units are log2
// (kLog2 = true): scale·log2(e) is folded on the host.
#pragma once

#include "cuda/sm80/ptx.cuh"
#include "cuda/common/quad_reduce.cuh"
#include "flashattn/online_softmax.hpp"

namespace flashattn::cuda {

using RowState = SoftmaxState<float, true>;


// Fold one tile of raw scores into the states of a band's two rows and turn the scores into
// probabilities in place. acc_s[nt][4] holds the band's C fragments (masked entries = -inf);
// log2 score = x * score_scale. Returns the two rescale factors for the caller's acc rows.
template <int kNT>
__device__ __forceinline__ void softmax_tile(float (&acc_s)[kNT][4], RowState (&st)[2],
                                             float score_scale, float (&rescale)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
      mx = fmaxf(mx, fmaxf(acc_s[nt][2 * half], acc_s[nt][2 * half + 1]));
    mx = quad_max(mx);
    rescale[half] = st[half].begin_tile(mx * score_scale);
    // exp2(x * score_scale - offset) as one FFMA + ex2; offset is 0 while the row is empty so
    // that masked (-inf) scores give 0, never NaN.
    const float neg_off = -st[half].exp_offset();
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = acc_s[nt][2 * half + e];
        x = ptx::exp2_approx(fmaf(x, score_scale, neg_off));
        sum += x;
      }
    st[half].add_sum(sum);
  }
}

}  // namespace flashattn::cuda
