// AVX-512 decode kernels (compiled with -mavx512f/bw/vl/dq -mfma; chosen with the AVX-512 tile
// kernels). The decode path is bound by memory, not by the vector width: the gain over AVX2 is the
// masked tails and more registers for the scores block.
// GCC 12's avx512fintrin.h initializes some results from _mm512_undefined_*(), which -Wall reports
// as uninitialized uses inside the header (a known false positive of that header).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/decode_kernels.hpp"

namespace flashattn::cpu {
namespace {

struct T {
  using V = __m512;
  static constexpr int kLanes = 16;
  // Scores: 4 rows × 4 keys = 16 accumulators + 4 × 2 key vectors + 1 query = 25 of 32 registers.
  static constexpr int kScoreKeys = 4, kScoreRows = 4;

  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V load_partial(const float* p, int r) {
    return _mm512_maskz_loadu_ps(r >= 16 ? __mmask16(0xffff) : __mmask16((1u << r) - 1u), p);
  }
  // v, forced into a register: without it the compiler folds the load into each FMA that uses v
  // (one load per FMA), and the scores loop becomes bound by loads instead of FMAs.
  static V in_register(V v) {
    __asm__("" : "+x"(v));
    return v;
  }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
  // out[i] = the sum of a[i]'s lanes, i < N. Sixteen at once by a transpose of pairwise sums:
  // 256-bit halves of pairs, then 128-bit quarters, then lane pairs within quarters, then single
  // lanes (46 shuffles and adds, where sixteen separate reductions take about 150), leaving sum i
  // at lane 4·(i mod 4) + i / 4, put in order by one permute.
  template <int N>
  static void reduce_add_n(const V* a, float* out) {
    if constexpr (N == 16) {
      V s1[8], s2[4], s3[2];
      for (int k = 0; k < 8; ++k)  // [x.q0+x.q2, x.q1+x.q3, y.q0+y.q2, y.q1+y.q3]
        s1[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x44),
                              _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xee));
      for (int k = 0; k < 4; ++k)  // quarter q: a[4k + q]'s four partial lanes
        s2[k] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[2 * k], s1[2 * k + 1], 0x88),
                              _mm512_shuffle_f32x4(s1[2 * k], s1[2 * k + 1], 0xdd));
      for (int k = 0; k < 2; ++k)  // quarter q: a[8k + q], a[8k + 4 + q], two lanes each
        s3[k] = _mm512_add_ps(_mm512_shuffle_ps(s2[2 * k], s2[2 * k + 1], 0x44),
                              _mm512_shuffle_ps(s2[2 * k], s2[2 * k + 1], 0xee));
      const V s = _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], 0x88), _mm512_shuffle_ps(s3[0], s3[1], 0xdd));
      const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
      _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, s));
    } else {
      for (int i = 0; i < N; ++i) out[i] = _mm512_reduce_add_ps(a[i]);
    }
  }
  static V load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // bf16 is the high half of an fp32: widen to 32 bits and shift left by 16.
  static V load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  // p[0 … 32) as 32-bit words: the even elements are the low halves (shifted up), the odd ones the
  // high halves (masked) — already fp32 bit patterns.
  static void load_bf16_pair(const uint16_t* p, V& even, V& odd) {
    const __m512i w = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(int(0xffff0000u))));
  }
};

#include "cpu/decode_kernels_simd.inl"

// ---- scores of a bf16 cache by vdpbf16ps (AVX512_BF16, enabled per function) ---------------------
// R rows × J keys as scores_block, 32 bf16 columns per step: one dot-product instruction per
// (row, key) and step where the fp32 path spends two FMAs and, per key, two conversions.
#define FLASHATTN_BF16_TARGET __attribute__((target("avx512bf16,avx512bw,avx512f")))

template <int R, int J>
FLASHATTN_BF16_TARGET static inline __attribute__((always_inline)) void scores_bf16_block(int d, const uint16_t* q, int64_t ldq,
                                                                          const char* const* k, int64_t kh,
                                                                          float qmult, float* s, int64_t lds) {
  __m512 acc[R * J];
  for (int i = 0; i < R * J; ++i) acc[i] = _mm512_setzero_ps();
  for (int c = 0; c < d; c += 32) {
    // K is read for exactly d elements (the last row of a cache may end its buffer); q has zeros.
    const __mmask32 m = d - c >= 32 ? ~__mmask32(0) : __mmask32((1u << (d - c)) - 1u);
    __m512i kv[J];
    for (int j = 0; j < J; ++j) kv[j] = _mm512_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(k[j] + kh) + c);
    for (int r = 0; r < R; ++r) {
      const __m512i qv = _mm512_loadu_si512(q + r * ldq + c);
      for (int j = 0; j < J; ++j)
        acc[r * J + j] = _mm512_dpbf16_ps(acc[r * J + j], (__m512bh)qv, (__m512bh)kv[j]);
    }
  }
  float sum[R * J];
  T::template reduce_add_n<R * J>(acc, sum);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) s[r * lds + j] = sum[r * J + j] * qmult;
}

template <int J>
FLASHATTN_BF16_TARGET static void scores_bf16_head(int nr, int d, const uint16_t* q, int64_t ldq,
                                                   const char* const* k, int64_t kh, float qmult, float* s,
                                                   int64_t lds) {
  int r = 0;
  for (; r + 4 <= nr; r += 4) scores_bf16_block<4, J>(d, q + r * ldq, ldq, k, kh, qmult, s + r * lds, lds);
  switch (nr - r) {
    case 3: scores_bf16_block<3, J>(d, q + r * ldq, ldq, k, kh, qmult, s + r * lds, lds); break;
    case 2: scores_bf16_block<2, J>(d, q + r * ldq, ldq, k, kh, qmult, s + r * lds, lds); break;
    case 1: scores_bf16_block<1, J>(d, q + r * ldq, ldq, k, kh, qmult, s + r * lds, lds); break;
    default: break;
  }
}

FLASHATTN_BF16_TARGET static void scores_bf16(int nh, int nr, int n, int d, const uint16_t* q, int64_t q_head,
                                              int64_t ldq, const char* const* k, int64_t k_head, float qmult,
                                              float* s, int64_t s_head, int64_t lds, const RowPrefetch& also) {
  constexpr int J = 4;
  int j = 0;
  for (; j + J <= n; j += J) {
    for (int i = 0; i < J; ++i) prefetch_row(also, j + i);
    touch_block(k + j, J, k_head, int64_t(d) * 2, nh);
    for (int h = 0; h < nh; ++h)
      scores_bf16_head<J>(nr, d, q + h * q_head, ldq, k + j, h * k_head, qmult, s + h * s_head + j, lds);
  }
  for (; j < n; ++j) {
    prefetch_row(also, j);
    touch_block(k + j, 1, k_head, int64_t(d) * 2, nh);
    for (int h = 0; h < nh; ++h)
      scores_bf16_head<1>(nr, d, q + h * q_head, ldq, k + j, h * k_head, qmult, s + h * s_head + j, lds);
  }
  for (; j < also.count; ++j) prefetch_row(also, j);
}

// ---- accumulate of a bf16 cache by vdpbf16ps ------------------------------------------------------
// Keys in pairs: the two V rows interleaved 16 bits at a time (unpacklo/hi per 128-bit lane) meet
// the pair's two bf16 probabilities broadcast as one 32-bit word, so one instruction adds both
// keys into 16 columns. Blocks as accumulate's: KB keys of every head, R rows × NB 32-column
// blocks of acc (2 vectors each) loaded and stored once per KB keys; an odd last key is paired
// with zeros.
template <int R, int NB, int KB, bool kScale>
FLASHATTN_BF16_TARGET static inline __attribute__((always_inline)) void accumulate_bf16_block(
    int c, int nk, const uint16_t* pb, int64_t ldpb, const char* const* v, int64_t vh, const float* row_scale,
    float* acc, int64_t ldacc) {
  __m512 a[R * 2 * NB];
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < 2 * NB; ++x) {
      a[r * 2 * NB + x] = _mm512_loadu_ps(acc + r * ldacc + c + x * 16);
      if (kScale) a[r * 2 * NB + x] = _mm512_mul_ps(a[r * 2 * NB + x], _mm512_set1_ps(row_scale[r]));
    }
  for (int j = 0; j < KB; j += 2) {
    if (j >= nk) break;
    __m512i lo[NB], hi[NB];
    for (int x = 0; x < NB; ++x) {
      const __m512i v0 = _mm512_loadu_si512(reinterpret_cast<const uint16_t*>(v[j] + vh) + c + 32 * x);
      const __m512i v1 = j + 1 < nk ? _mm512_loadu_si512(reinterpret_cast<const uint16_t*>(v[j + 1] + vh) + c + 32 * x)
                                    : _mm512_setzero_si512();
      lo[x] = _mm512_unpacklo_epi16(v0, v1);
      hi[x] = _mm512_unpackhi_epi16(v0, v1);
    }
    for (int r = 0; r < R; ++r) {
      uint32_t pair;
      std::memcpy(&pair, pb + r * ldpb + j, 4);
      const __m512i pp = _mm512_set1_epi32(int(pair));
      for (int x = 0; x < NB; ++x) {
        a[r * 2 * NB + 2 * x] = _mm512_dpbf16_ps(a[r * 2 * NB + 2 * x], (__m512bh)pp, (__m512bh)lo[x]);
        a[r * 2 * NB + 2 * x + 1] = _mm512_dpbf16_ps(a[r * 2 * NB + 2 * x + 1], (__m512bh)pp, (__m512bh)hi[x]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < 2 * NB; ++x) _mm512_storeu_ps(acc + r * ldacc + c + x * 16, a[r * 2 * NB + x]);
}

template <int R, int KB, bool kScale>
FLASHATTN_BF16_TARGET static void accumulate_bf16_rows(int d, int nk, const uint16_t* pb, int64_t ldpb,
                                                       const char* const* v, int64_t vh, const float* row_scale,
                                                       float* acc, int64_t ldacc) {
  int c = 0;
  for (; c + 64 <= d; c += 64) accumulate_bf16_block<R, 2, KB, kScale>(c, nk, pb, ldpb, v, vh, row_scale, acc, ldacc);
  if (c < d) accumulate_bf16_block<R, 1, KB, kScale>(c, nk, pb, ldpb, v, vh, row_scale, acc, ldacc);  // d % 32 == 0
}

template <int KB, bool kScale>
FLASHATTN_BF16_TARGET static void accumulate_bf16_heads(int nh, int nr, int d, int nk, const uint16_t* pb,
                                                        int64_t pb_head, int64_t ldpb, const char* const* v,
                                                        int64_t v_head, const float* row_scale, float* acc,
                                                        int64_t acc_head, int64_t ldacc) {
  for (int h = 0; h < nh; ++h) {
    const uint16_t* ph = pb + h * pb_head;
    const int64_t vh = h * v_head;
    const float* sh = row_scale + h * nr;
    float* ah = acc + h * acc_head;
    int r = 0;
    for (; r + 4 <= nr; r += 4)
      accumulate_bf16_rows<4, KB, kScale>(d, nk, ph + r * ldpb, ldpb, v, vh, sh + r, ah + r * ldacc, ldacc);
    switch (nr - r) {
      case 3: accumulate_bf16_rows<3, KB, kScale>(d, nk, ph + r * ldpb, ldpb, v, vh, sh + r, ah + r * ldacc, ldacc); break;
      case 2: accumulate_bf16_rows<2, KB, kScale>(d, nk, ph + r * ldpb, ldpb, v, vh, sh + r, ah + r * ldacc, ldacc); break;
      case 1: accumulate_bf16_rows<1, KB, kScale>(d, nk, ph + r * ldpb, ldpb, v, vh, sh + r, ah + r * ldacc, ldacc); break;
      default: break;
    }
  }
}

FLASHATTN_BF16_TARGET static void accumulate_bf16(int nh, int nr, int n, int d, const uint16_t* pb, int64_t pb_head,
                                                  int64_t ldpb, const char* const* v, int64_t v_head,
                                                  const float* row_scale, float* acc, int64_t acc_head,
                                                  int64_t ldacc, const RowPrefetch& also) {
  constexpr int KB = 8;  // keys per block, an even number
  for (int i = 0; i < KB && i < n; ++i) prefetch_row(also, i);
  touch_block(v, n < KB ? n : KB, v_head, int64_t(d) * 2, nh);
  accumulate_bf16_heads<KB, true>(nh, nr, d, n < KB ? n : KB, pb, pb_head, ldpb, v, v_head, row_scale, acc,
                                  acc_head, ldacc);  // the first keys apply row_scale
  for (int j = KB; j < n; j += KB) {
    for (int i = 0; i < KB; ++i) prefetch_row(also, j + i);
    touch_block(v + j, n - j < KB ? n - j : KB, v_head, int64_t(d) * 2, nh);
    accumulate_bf16_heads<KB, false>(nh, nr, d, n - j < KB ? n - j : KB, pb + j, pb_head, ldpb, v + j, v_head,
                                     row_scale, acc, acc_head, ldacc);
  }
  for (int j = (n + KB - 1) / KB * KB; j < also.count; ++j) prefetch_row(also, j);
}
#undef FLASHATTN_BF16_TARGET

}  // namespace

const DecodeKernels kDecodeKernelsAvx512 = {"avx512", 2 * T::kLanes, scores, nullptr, nullptr, accumulate};
const DecodeKernels kDecodeKernelsAvx512Bf16 = {"avx512", 2 * T::kLanes, scores, scores_bf16, accumulate_bf16,
                                                accumulate};

}  // namespace flashattn::cpu
