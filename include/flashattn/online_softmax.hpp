// The online-softmax state: the one piece of arithmetic every flash backend shares.
//
// For one query row, keys arrive tile by tile. The state keeps
//   row_max (m) — the largest score seen so far,
//   row_sum (l) — sum of exp(score - row_max) over the keys seen so far,
// and the caller keeps acc (O) — sum of exp(score - row_max) · value over the same keys.
// When a tile raises the maximum from m_prev to m_new, everything accumulated so far was summed
// relative to the old maximum and must be multiplied by rescale = exp(m_prev - m_new): row_sum here,
// acc by the caller. That coupling is the whole trick (docs/semantics.md, "Online softmax").
//
// Units. With kLog2 = false scores are natural-log units and exponentials are exp(). With
// kLog2 = true the caller has folded log2(e) into the scale once, scores are log2 units and the
// exponentials are exp2() (cheaper on every target); finalize() returns the LSE in natural units
// either way.
//
// Edge policy (identical everywhere): a row that has seen no unmasked key keeps row_max = -inf and
// row_sum = 0; finalize() then gives output 0 and LSE -inf, and no NaN appears on the way.
//
// Host and device: this header is plain C++ and compiles under nvcc for device code as well.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FLASHATTN_HD __host__ __device__ __forceinline__
#else
#define FLASHATTN_HD inline
#endif

namespace flashattn {

namespace softmax_math {
FLASHATTN_HD float exp_base(float x, bool base2) { return base2 ? exp2f(x) : expf(x); }
FLASHATTN_HD double exp_base(double x, bool base2) { return base2 ? exp2(x) : exp(x); }
#if defined(__CUDA_ARCH__)
// On the GPU the log of a row sum (>= 1 once a row has seen a key, at most its key count times
// 2^8 with lazy rescaling) and its reciprocal come from the SFU (MUFU.LG2, MUFU.RCP; relative
// error about 2^-22) instead of the accurate library calls (a ~30-instruction polynomial, a
// Newton-corrected division), once per row per tile of the Hopper forward's epilogue.
FLASHATTN_HD float log_base(float x, bool base2) { return base2 ? __log2f(x) : __logf(x); }
FLASHATTN_HD float recip(float x) { return __fdividef(1.f, x); }
#else
FLASHATTN_HD float log_base(float x, bool base2) { return base2 ? log2f(x) : logf(x); }
FLASHATTN_HD float recip(float x) { return 1.f / x; }
#endif
FLASHATTN_HD double log_base(double x, bool base2) { return base2 ? log2(x) : log(x); }
FLASHATTN_HD double recip(double x) { return 1.0 / x; }
// -inf without std::numeric_limits, whose members are host-only functions under nvcc.
template <class Acc>
FLASHATTN_HD Acc neg_inf() { return Acc(-HUGE_VAL); }
}  // namespace softmax_math

template <class Acc, bool kLog2 = false>
struct SoftmaxState {
  Acc row_max = softmax_math::neg_inf<Acc>();  // m: running maximum of the (masked) scores
  Acc row_sum = 0;                             // l: running sum of exp(score - row_max)

  // The value exponentials are taken against: row_max, or 0 while the row is still empty so that
  // exp(-inf - 0) = 0 instead of exp(-inf - (-inf)) = NaN.
  FLASHATTN_HD Acc exp_offset() const { return row_max == softmax_math::neg_inf<Acc>() ? Acc(0) : row_max; }

  // exp(score - row_max) in this state's units.
  FLASHATTN_HD Acc prob(Acc score) const { return softmax_math::exp_base(score - exp_offset(), kLog2); }

  // Step 1 of folding in a tile: the tile's maximum score arrives. Updates row_max, rescales row_sum
  // and returns rescale = exp(m_prev - m_new), by which the caller multiplies its acc.
  // A tile whose scores are all masked (tile_max = -inf) changes nothing and returns 1.
  FLASHATTN_HD Acc begin_tile(Acc tile_max) {
    const Acc m_new = tile_max > row_max ? tile_max : row_max;
    if (m_new == softmax_math::neg_inf<Acc>()) return Acc(1);
    const Acc rescale = softmax_math::exp_base(row_max - m_new, kLog2);  // exp(-inf) = 0 when empty
    row_sum *= rescale;
    row_max = m_new;
    return rescale;
  }

  // Step 1 with a lazy maximum (FA4's conditional rescaling): a tile whose maximum exceeds row_max
  // by at most `slack` (in this state's units) leaves row_max stale and returns 1, so the caller
  // can skip rescaling acc; its probabilities are then up to exp(slack) instead of at most 1, and
  // row_sum, acc and the final LSE all use the same stale maximum, so the result is unchanged up to
  // rounding. A larger jump, or the row's first keys, update as begin_tile does.
  FLASHATTN_HD Acc begin_tile_lazy(Acc tile_max, Acc slack) {
    if (row_max != softmax_math::neg_inf<Acc>() && !(tile_max > row_max + slack)) return Acc(1);
    return begin_tile(tile_max);
  }

  // Step 2: the tile's probabilities prob(score) have been summed by the caller.
  FLASHATTN_HD void add_sum(Acc tile_sum) { row_sum += tile_sum; }

  // Fold in a whole tile in one call (the scalar form of steps 1 and 2 plus the acc update):
  // scores[n] (masked scores are -inf), values as n rows of `dim` with row stride `ldv`, acc[dim].
  // Returns the rescale factor that was applied to acc.
  template <class S, class V, class A>
  FLASHATTN_HD Acc update(const S* scores, int n, const V* values, int64_t ldv, int dim, A* acc) {
    Acc tile_max = softmax_math::neg_inf<Acc>();
    for (int j = 0; j < n; ++j) tile_max = Acc(scores[j]) > tile_max ? Acc(scores[j]) : tile_max;
    const Acc rescale = begin_tile(tile_max);
    if (rescale != Acc(1))
      for (int c = 0; c < dim; ++c) acc[c] = A(Acc(acc[c]) * rescale);
    if (row_max == softmax_math::neg_inf<Acc>()) return rescale;
    Acc tile_sum = 0;
    for (int j = 0; j < n; ++j) {
      const Acc p = prob(Acc(scores[j]));
      tile_sum += p;
      if (p != Acc(0))
        for (int c = 0; c < dim; ++c) acc[c] = A(Acc(acc[c]) + p * Acc(values[j * ldv + c]));
    }
    add_sum(tile_sum);
    return rescale;
  }

  // Combine with another partial state over a disjoint set of keys (split-KV decoding, ring
  // attention): this.acc and other_acc are both unnormalized; on return this state and acc cover
  // the union.
  template <class A, class B>
  FLASHATTN_HD void merge(const SoftmaxState& other, const B* other_acc, int dim, A* acc) {
    Acc a, b;
    if (!merge_scales(other, a, b)) return;  // both empty
    for (int c = 0; c < dim; ++c) acc[c] = A(Acc(acc[c]) * a + Acc(other_acc[c]) * b);
  }
  // The state half of merge, for callers whose acc is laid out otherwise (the Hopper forward's
  // register fragments): this state becomes the union's, and acc must become acc·a + other_acc·b.
  // Returns false (nothing changed, a and b unset) when both are empty.
  FLASHATTN_HD bool merge_scales(const SoftmaxState& other, Acc& a, Acc& b) {
    const Acc m_new = other.row_max > row_max ? other.row_max : row_max;
    if (m_new == softmax_math::neg_inf<Acc>()) return false;
    a = softmax_math::exp_base(row_max - m_new, kLog2);
    b = softmax_math::exp_base(other.row_max - m_new, kLog2);
    row_sum = row_sum * a + other.row_sum * b;
    row_max = m_new;
    return true;
  }

  // 1 / row_sum, or 0 for a row that saw no key (its acc is 0, so the output becomes 0).
  FLASHATTN_HD Acc inv_sum() const { return row_sum > Acc(0) ? softmax_math::recip(row_sum) : Acc(0); }

  // Log-sum-exp of the row's scores in natural-log units; -inf for a row that saw no key.
  FLASHATTN_HD Acc lse() const {
    if (!(row_sum > Acc(0))) return softmax_math::neg_inf<Acc>();
    const Acc l = row_max + softmax_math::log_base(row_sum, kLog2);
    return kLog2 ? l * Acc(0.69314718055994530942) : l;
  }

  // out[c] = acc[c] / row_sum; returns the LSE. out may alias acc.
  template <class A, class O>
  FLASHATTN_HD Acc finalize(const A* acc, int dim, O* out) const {
    const Acc inv = inv_sum();
    for (int c = 0; c < dim; ++c) out[c] = O(Acc(acc[c]) * inv);
    return lse();
  }
};

}  // namespace flashattn
