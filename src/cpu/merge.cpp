// merge_partial on the CPU: per (batch, head, row), the two partials as online-softmax states
// (row_max = the partial's LSE, row_sum = 1 for a row that saw keys, 0 for one that saw none) and
// SoftmaxState::merge over their normalized outputs; the union's output is acc / row_sum.
#include <cmath>
#include <cstdint>

#include "core/backend.hpp"
#include "core/dtype.hpp"
#include "flashattn/online_softmax.hpp"

namespace flashattn::cpu {

namespace {
using State = SoftmaxState<float>;

State partial_state(float lse) {
  State s;
  s.row_max = lse;
  s.row_sum = lse == -INFINITY ? 0.f : 1.f;
  return s;
}
}  // namespace

void merge_partial(const detail::MergeParams& p) {
  const int64_t rows = p.batch * p.heads * p.seqlen, d = p.head_dim;
  float* out = static_cast<float*>(p.out.data);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / (p.heads * p.seqlen), h = (r / p.seqlen) % p.heads, i = r % p.seqlen;
    float* lse = p.lse.data + p.lse.offset(b, h, i);
    State s = partial_state(*lse);
    float a = 0, w = 0;
    if (!s.merge_scales(partial_state(p.lse_part.data[p.lse_part.offset(b, h, i)]), a, w))
      a = w = 0;  // empty on both sides: out 0, LSE −inf
    // A side of weight 0 (LSE −inf, or far below the other) is not read: an accumulator may start
    // as LSE −inf over any values.
    const float inv = s.inv_sum();
    float* o = out + p.out.offset(b, i, h);
    const int64_t po = p.part.offset(b, i, h);
    for (int64_t c = 0; c < d; ++c) {
      float x = a != 0.f ? a * o[c] : 0.f;
      if (w != 0.f) x += w * detail::load_as_float(p.part.data, po + c, p.part_dtype);
      o[c] = x * inv;
    }
    *lse = s.lse();
  }
}

}  // namespace flashattn::cpu
