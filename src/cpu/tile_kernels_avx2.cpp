// AVX2 + FMA + F16C tile kernels: the x86-64 baseline (compiled with -mavx2 -mfma -mf16c).
// Tile products: OpenBLAS, or the micro-kernel of tile_kernels_simd.inl when OpenBLAS runs a generic
// core (gemm_blas.cpp).
#include <immintrin.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.hpp"
#include "cpu/tile_kernels.hpp"

namespace flashattn::cpu {
namespace {

struct T {
  using V = __m256;
  static constexpr int kLanes = 8;
  // Own GEMM micro-kernel (used when OpenBLAS runs a generic core): 6 rows × 2 vectors = 12
  // accumulators + 2 B vectors + 1 broadcast = 15 of 16 registers.
  static constexpr int kMR = 6, kNV = 2;

  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void storeu(float* p, V v) { _mm256_storeu_ps(p, v); }
  static __m256i first(int r) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), idx);
  }
  static V load_partial(const float* p, int r, float fill) {
    if (r >= 8) return _mm256_loadu_ps(p);
    const __m256i m = first(r);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  static void store_partial(float* p, int r, V v) {
    if (r >= 8) return _mm256_storeu_ps(p, v);
    _mm256_maskstore_ps(p, first(r), v);
  }
  static V blend_first(V v, int r) {
    if (r >= 8) return v;
    return _mm256_and_ps(v, _mm256_castsi256_ps(first(r)));
  }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V abs(V a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static V copysign(V mag, V sign) {
    const V m = _mm256_set1_ps(-0.0f);
    return _mm256_or_ps(_mm256_andnot_ps(m, mag), _mm256_and_ps(m, sign));
  }
  // a < b ? x : y, lane by lane
  static V select_less(V a, V b, V x, V y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
  static V round(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // p · 2^n for integral n >= -150: the exponent field built directly for n >= -126, 0 below
  // (the results there are < 2^-126 and only ever summed with terms >= 1).
  static V scale_by_exp2(V p, V n) {
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const V r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_and_ps(r, _mm256_cmp_ps(n, _mm256_set1_ps(-126.0f), _CMP_GE_OQ));
  }
  static float reduce_add(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static V load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static V load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void store_f16(uint16_t* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // Round to nearest even (u + 0x7fff + lsb, then the high half); NaN → quiet NaN (high half | 0x40),
  // bit-identical to detail::float_to_bf16.
  static void store_bf16(uint16_t* p, V v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i bias = _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    // 8 × u32 (each < 2^16) → 8 × u16: packus within 128-bit lanes, then gather qwords 0 and 2.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
};

#include "cpu/tile_kernels_simd.inl"

}  // namespace

const TileKernels kTileKernelsAvx2 = {"avx2", gemm_auto, gemm_nt_auto, row_max, exp2_sum, softcap,
                                      load,   store,     dot,     dsoftmax};

}  // namespace flashattn::cpu
