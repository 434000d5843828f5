// AVX2 + FMA + F16C decode kernels (compiled with -mavx2 -mfma -mf16c).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/decode_kernels.hpp"

namespace flashattn::cpu {
namespace {

struct T {
  using V = __m256;
  static constexpr int kLanes = 8;
  // Scores: 4 rows × 2 keys = 8 accumulators + 2 × 2 key vectors + 1 query = 13 of 16 registers.
  static constexpr int kScoreKeys = 2, kScoreRows = 4;

  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V load_partial(const float* p, int r) {
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_ps(p, m);  // masked-off lanes read as 0 and are not accessed
  }
  // v, forced into a register: without it the compiler folds the load into each FMA that uses v
  // (one load per FMA), and the scores loop becomes bound by loads instead of FMAs.
  static V in_register(V v) {
    __asm__("" : "+x"(v));
    return v;
  }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static float reduce_add(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // out[i] = the sum of a[i]'s lanes, i < N. Eight at once by a transpose of pairwise sums
  // (hadd: [a0+a1, a2+a3, b0+b1, b2+b3] per 128-bit half; three levels, then the halves added).
  template <int N>
  static void reduce_add_n(const V* a, float* out) {
    if constexpr (N == 8) {
      const V t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
      const V t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
      const V u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);  // [sums of a0…a3 per half]
      _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31)));
    } else {
      for (int i = 0; i < N; ++i) out[i] = reduce_add(a[i]);
    }
  }
  static V load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // bf16 is the high half of an fp32: widen to 32 bits and shift left by 16.
  static V load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // p[0 … 16) as 32-bit words: the even elements are the low halves (shifted up), the odd ones the
  // high halves (masked) — already fp32 bit patterns.
  static void load_bf16_pair(const uint16_t* p, V& even, V& odd) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int(0xffff0000u))));
  }
};

#include "cpu/decode_kernels_simd.inl"

}  // namespace

const DecodeKernels kDecodeKernelsAvx2 = {"avx2", 2 * T::kLanes, scores, nullptr, nullptr, accumulate};

}  // namespace flashattn::cpu
