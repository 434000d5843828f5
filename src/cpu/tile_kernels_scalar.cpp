// Portable tile kernels: plain loops, always built, the baseline the SIMD tables are tested against.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.hpp"
#include "cpu/tile_kernels.hpp"

namespace flashattn::cpu {
namespace {

void gemm(int m, int n, int k, const float* a, int64_t rsa, int64_t csa, const float* b,
          int64_t ldb, float* c, int64_t ldc, const float* row_scale, bool accumulate) {
  for (int i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    if (!accumulate) {
      std::memset(ci, 0, sizeof(float) * size_t(n));
    } else if (row_scale) {
      const float s = row_scale[i];
      for (int j = 0; j < n; ++j) ci[j] *= s;
    }
    for (int p = 0; p < k; ++p) {
      const float aip = a[i * rsa + p * csa];
      const float* bp = b + p * ldb;
      for (int j = 0; j < n; ++j) ci[j] += aip * bp[j];
    }
  }
}

void gemm_nt(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
             int64_t ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float s = 0;
      for (int p = 0; p < k; ++p) s += a[i * lda + p] * b[j * ldb + p];
      c[i * ldc + j] = s;
    }
}

float row_max(const float* x, int n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

float exp2_sum(float* x, int n, float offset) {
  float s = 0;
  for (int j = 0; j < n; ++j) {
    x[j] = std::exp2(x[j] - offset);
    s += x[j];
  }
  return s;
}

void softcap(float* x, int n, float cap, float out_mult, float* t) {
  const float inv = 1.0f / cap, mult = out_mult * cap;
  for (int j = 0; j < n; ++j) {
    const float th = std::tanh(x[j] * inv);
    if (t) t[j] = th;
    x[j] = mult * th;
  }
}

void load(const void* src, DType type, int n, float mult, float* dst) {
  for (int j = 0; j < n; ++j) dst[j] = mult * detail::load_as_float(src, j, type);
}

void store(const float* src, int n, float mult, DType type, void* dst) {
  for (int j = 0; j < n; ++j) detail::store_from_float(dst, j, type, mult * src[j]);
}

float dot(const float* a, const float* b, int n) {
  float s = 0;
  for (int j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

void dsoftmax(const float* p, const float* dp, float d, const float* t, int n, float* ds) {
  for (int j = 0; j < n; ++j) {
    const float g = p[j] * (dp[j] - d);
    ds[j] = t ? g * (1.0f - t[j] * t[j]) : g;
  }
}

}  // namespace

const TileKernels kTileKernelsScalar = {"scalar", gemm,  gemm_nt, row_max, exp2_sum,
                                        softcap,  load,  store,   dot,     dsoftmax};

}  // namespace flashattn::cpu
