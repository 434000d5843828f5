// Portable decode kernels: plain loops, always built, the baseline the SIMD tables are tested against.
#include "core/dtype.hpp"
#include "cpu/decode_kernels.hpp"

namespace flashattn::cpu {
namespace {

void scores(int nh, int nr, int n, int d, const float* q, int64_t q_head, int64_t ldq, const char* const* k,
            int64_t k_head, DType type, float* s, int64_t s_head, int64_t lds, const RowPrefetch&) {
  for (int j = 0; j < n; ++j)
    for (int h = 0; h < nh; ++h) {
      const char* kj = k[j] + h * k_head;
      for (int r = 0; r < nr; ++r) {
        const float* qr = q + h * q_head + r * ldq;
        float sum = 0;
        for (int c = 0; c < d; ++c) sum += qr[c] * detail::load_as_float(kj, c, type);
        s[h * s_head + r * lds + j] = sum;
      }
    }
}

void accumulate(int nh, int nr, int n, int d, const float* p, int64_t p_head, int64_t ldp, const char* const* v,
                int64_t v_head, DType type, const float* row_scale, float* acc, int64_t acc_head, int64_t ldacc,
                const RowPrefetch&) {
  for (int h = 0; h < nh; ++h)
    for (int r = 0; r < nr; ++r) {
      float* a = acc + h * acc_head + r * ldacc;
      for (int c = 0; c < d; ++c) a[c] *= row_scale[h * nr + r];
    }
  for (int j = 0; j < n; ++j)
    for (int h = 0; h < nh; ++h) {
      const char* vj = v[j] + h * v_head;
      for (int r = 0; r < nr; ++r) {
        float* a = acc + h * acc_head + r * ldacc;
        const float pj = p[h * p_head + r * ldp + j];
        for (int c = 0; c < d; ++c) a[c] += pj * detail::load_as_float(vj, c, type);
      }
    }
}

}  // namespace

const DecodeKernels kDecodeKernelsScalar = {"scalar", 0, scores, nullptr, nullptr, accumulate};

}  // namespace flashattn::cpu
