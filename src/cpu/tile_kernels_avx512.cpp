// AVX-512 tile kernels (compiled with -mavx512f/bw/vl/dq -mfma; chosen by isa.cpp when the CPU
// has AVX-512F/BW/VL/DQ). Zen 4 executes a 512-bit FMA on both 256-bit pipes, so the peak equals
// AVX2's; the gain is half the instructions and masked tails. Tile products: OpenBLAS, or the
// micro-kernel of tile_kernels_simd.inl when OpenBLAS runs a generic core (gemm_blas.cpp).
// GCC 12's avx512fintrin.h initializes some results from _mm512_undefined_*(), which -Wall reports
// as uninitialized uses inside the header (a known false positive of that header).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.hpp"
#include "cpu/tile_kernels.hpp"

namespace flashattn::cpu {
namespace {

struct T {
  using V = __m512;
  static constexpr int kLanes = 16;
  // Own GEMM micro-kernel (used when OpenBLAS runs a generic core): 12 rows × 2 vectors = 24
  // accumulators + 2 B vectors + 1 broadcast = 27 of 32 registers.
  static constexpr int kMR = 12, kNV = 2;

  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void storeu(float* p, V v) { _mm512_storeu_ps(p, v); }
  static __mmask16 first(int r) { return r >= 16 ? __mmask16(0xffff) : __mmask16((1u << r) - 1u); }
  static V load_partial(const float* p, int r, float fill) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), first(r), p);
  }
  static void store_partial(float* p, int r, V v) { _mm512_mask_storeu_ps(p, first(r), v); }
  static V blend_first(V v, int r) { return _mm512_maskz_mov_ps(first(r), v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V abs(V a) { return _mm512_abs_ps(a); }
  static V copysign(V mag, V sign) {
    // bitwise select: sign bit from `sign`, the rest from `mag` (0xca = A ? B : C)
    const __m512i m = _mm512_set1_epi32(int(0x80000000u));
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(m, _mm512_castps_si512(sign),
                                                         _mm512_castps_si512(mag), 0xca));
  }
  // a < b ? x : y, lane by lane
  static V select_less(V a, V b, V x, V y) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x); }
  static V round(V x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // p · 2^n; scalef flushes 2^-150 to 0 exactly.
  static V scale_by_exp2(V p, V n) { return _mm512_scalef_ps(p, n); }
  static float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
  static float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
  static V load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static V load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static void store_f16(uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // Round to nearest even (u + 0x7fff + lsb, then the high half); NaN → quiet NaN (high half | 0x40),
  // bit-identical to detail::float_to_bf16.
  static void store_bf16(uint16_t* p, V v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i bias = _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                              _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
};

#include "cpu/tile_kernels_simd.inl"

}  // namespace

const TileKernels kTileKernelsAvx512 = {"avx512", gemm_auto, gemm_nt_auto, row_max, exp2_sum, softcap,
                                        load,     store,     dot,     dsoftmax};

}  // namespace flashattn::cpu
