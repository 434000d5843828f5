// The SIMD tile kernels, written once over a small vector-traits class T and included by
// tile_kernels_avx2.cpp and tile_kernels_avx512.cpp (each compiled for its own instruction set).
//
// T provides: V (vector of T::kLanes floats), load/store/loadu_partial/store_partial, set1, zero,
// fmadd, add, sub, mul, max, reduce_add, reduce_max, round_exp2 (2^n for integral-valued n, 0 for
// n <= -150), load_f16/load_bf16/store_f16/store_bf16 (full vectors), and the register blocking
// of the GEMM micro-kernel: kMR rows × kNV vectors of accumulators.
// Tile products: OpenBLAS (gemm_blas.cpp) where it runs a kernel set for this CPU, else the
// micro-kernel below (use_own_gemm()).
//
// Not a header: no include guard, included exactly once per ISA file inside its namespace.

// ---- GEMM fallback ------------------------------------------------------------------------------
// Used when the loaded OpenBLAS picked a generic (pre-AVX) kernel set for this CPU — measured on
// Zen 4 with OPENBLAS_CORETYPE=Prescott at 35 GFLOP/s per thread against 87 with its own core;
// this micro-kernel reaches about 90 % of OpenBLAS's good core (docs/perf/log.md, P-003).
// The micro-kernel keeps an M×(NV·kLanes) block of C in registers and walks the k dimension: per
// step NV vector loads of B, M broadcasts of A and M·NV independent FMAs.
template <int M, int NV>
static inline void micro_kernel(int k, const float* a, int64_t rsa, int64_t csa, const float* b, int64_t ldb,
                                float* c, int64_t ldc, const float* row_scale, bool accumulate) {
  using V = typename T::V;
  constexpr int L = T::kLanes;
  V acc[M][NV];
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = T::zero();
  const float* ap[M];
  for (int i = 0; i < M; ++i) ap[i] = a + i * rsa;
  for (int p = 0; p < k; ++p) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = T::load(b + v * L);
    for (int i = 0; i < M; ++i) {
      const V av = T::set1(ap[i][0]);
      for (int v = 0; v < NV; ++v) acc[i][v] = T::fmadd(av, bv[v], acc[i][v]);
    }
    for (int i = 0; i < M; ++i) ap[i] += csa;
    b += ldb;
  }
  for (int i = 0; i < M; ++i) {
    float* ci = c + i * ldc;
    if (accumulate) {
      if (row_scale) {
        const V s = T::set1(row_scale[i]);
        for (int v = 0; v < NV; ++v) acc[i][v] = T::fmadd(T::load(ci + v * L), s, acc[i][v]);
      } else {
        for (int v = 0; v < NV; ++v) acc[i][v] = T::add(T::load(ci + v * L), acc[i][v]);
      }
    }
    for (int v = 0; v < NV; ++v) T::store(ci + v * L, acc[i][v]);
  }
}

template <int NV>
static inline void gemm_column_block(int m, int k, const float* a, int64_t rsa, int64_t csa, const float* b,
                                     int64_t ldb, float* c, int64_t ldc, const float* row_scale, bool accumulate) {
  constexpr int MR = T::kMR;
  int i0 = 0;
  for (; i0 + MR <= m; i0 += MR)
    micro_kernel<MR, NV>(k, a + i0 * rsa, rsa, csa, b, ldb, c + i0 * ldc, ldc, row_scale ? row_scale + i0 : nullptr,
                         accumulate);
  // The remaining rows (fewer than MR), one at a time.
  for (; i0 < m; ++i0)
    micro_kernel<1, NV>(k, a + i0 * rsa, rsa, csa, b, ldb, c + i0 * ldc, ldc, row_scale ? row_scale + i0 : nullptr,
                        accumulate);
}

static void gemm_own(int m, int n, int k, const float* a, int64_t rsa, int64_t csa, const float* b, int64_t ldb,
                     float* c, int64_t ldc, const float* row_scale, bool accumulate) {
  constexpr int L = T::kLanes, NV = T::kNV;
  if (m <= 0 || n <= 0) return;
  // Column blocks outer: the k×(NV·L) panel of B stays in L1 while every row block uses it.
  int j0 = 0;
  for (; j0 + NV * L <= n; j0 += NV * L)
    gemm_column_block<NV>(m, k, a, rsa, csa, b + j0, ldb, c + j0, ldc, row_scale, accumulate);
  for (; j0 + L <= n; j0 += L)
    gemm_column_block<1>(m, k, a, rsa, csa, b + j0, ldb, c + j0, ldc, row_scale, accumulate);
  for (; j0 < n; ++j0)  // a last partial vector of columns (callers mostly pass padded widths)
    for (int i = 0; i < m; ++i) {
      float sum = 0.0f;
      for (int p = 0; p < k; ++p) sum += a[i * rsa + p * csa] * b[p * ldb + j0];
      float& cij = c[i * ldc + j0];
      cij = accumulate ? (row_scale ? cij * row_scale[i] : cij) + sum : sum;
    }
}

// C = A·Bᵀ: B (n×k, rows) transposed into a per-thread panel first (O(n·k) beside O(m·n·k)).
static void gemm_nt_own(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                        int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  thread_local std::vector<float> bt;
  bt.resize(size_t(k) * size_t(n));
  // Blocked by 16 rows of B read side by side, so each bt row gets 16 consecutive floats at once:
  // the plain j-outer loop wrote one float per cache line and cost ~10 % of the forward
  // (FLASHATTN_CPU_GEMM=own, docs/perf/log.md, P-038).
  constexpr int kTB = 16;
  int j0 = 0;
  for (; j0 + kTB <= n; j0 += kTB) {
    const float* src[kTB];
    for (int jj = 0; jj < kTB; ++jj) src[jj] = b + int64_t(j0 + jj) * ldb;
    for (int p = 0; p < k; ++p) {
      float* dst = bt.data() + size_t(p) * n + j0;
      for (int jj = 0; jj < kTB; ++jj) dst[jj] = src[jj][p];
    }
  }
  for (; j0 < n; ++j0)
    for (int p = 0; p < k; ++p) bt[size_t(p) * n + j0] = b[j0 * ldb + p];
  gemm_own(m, n, k, a, lda, 1, bt.data(), n, c, ldc, nullptr, false);
}

static void gemm_auto(int m, int n, int k, const float* a, int64_t rsa, int64_t csa, const float* b, int64_t ldb,
                      float* c, int64_t ldc, const float* row_scale, bool accumulate) {
  if (use_own_gemm()) gemm_own(m, n, k, a, rsa, csa, b, ldb, c, ldc, row_scale, accumulate);
  else gemm_blas(m, n, k, a, rsa, csa, b, ldb, c, ldc, row_scale, accumulate);
}

static void gemm_nt_auto(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                         int64_t ldc) {
  if (use_own_gemm()) gemm_nt_own(m, n, k, a, lda, b, ldb, c, ldc);
  else gemm_nt_blas(m, n, k, a, lda, b, ldb, c, ldc);
}

// ---- row operations ---------------------------------------------------------------------------
static float row_max(const float* x, int n) {
  using V = typename T::V;
  constexpr int L = T::kLanes;
  const float ninf = -std::numeric_limits<float>::infinity();
  V m0 = T::set1(ninf), m1 = m0;
  int j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {
    m0 = T::max(m0, T::load(x + j));
    m1 = T::max(m1, T::load(x + j + L));
  }
  for (; j < n; j += L) m0 = T::max(m0, T::load_partial(x + j, n - j, ninf));
  return T::reduce_max(T::max(m0, m1));
}

// 2^x for x <= ~127: x = n + f with n = round(x), f in [-0.5, 0.5]; 2^f by the degree-6
// polynomial of Cephes exp2f (relative error ~2e-7); 2^n by T::round_exp2. x is clamped below
// at -150 so that -inf (masked scores) gives exactly 0 and no NaN.
static inline typename T::V vexp2(typename T::V x) {
  using V = typename T::V;
  x = T::max(x, T::set1(-150.0f));
  const V n = T::round(x);
  const V f = T::sub(x, n);
  V p = T::set1(1.535336188319500e-4f);
  p = T::fmadd(p, f, T::set1(1.339887440266574e-3f));
  p = T::fmadd(p, f, T::set1(9.618437357674640e-3f));
  p = T::fmadd(p, f, T::set1(5.550332471162809e-2f));
  p = T::fmadd(p, f, T::set1(2.402264791363012e-1f));
  p = T::fmadd(p, f, T::set1(6.931472028550421e-1f));
  p = T::fmadd(p, f, T::set1(1.0f));
  return T::scale_by_exp2(p, n);
}

static float exp2_sum(float* x, int n, float offset) {
  using V = typename T::V;
  constexpr int L = T::kLanes;
  const V off = T::set1(offset);
  V s0 = T::zero(), s1 = T::zero();
  int j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {
    const V e0 = vexp2(T::sub(T::load(x + j), off));
    const V e1 = vexp2(T::sub(T::load(x + j + L), off));
    T::store(x + j, e0);
    T::store(x + j + L, e1);
    s0 = T::add(s0, e0);
    s1 = T::add(s1, e1);
  }
  for (; j < n; j += L) {
    const int r = n - j;
    const V e = vexp2(T::sub(T::load_partial(x + j, r, 0.0f), off));
    const V em = T::blend_first(e, r);  // zero the lanes past n
    T::store_partial(x + j, r, em);
    s0 = T::add(s0, em);
  }
  return T::reduce_add(T::add(s0, s1));
}

// tanh(y), relative error a few 1e-7 everywhere: the score is cap·tanh(raw/cap), so an absolute
// error of tanh is multiplied by cap (30 or 50 in models) and a small score would lose its digits.
//   |y| < 0.625: y + y·z·P(z), z = y², the degree-4 minimax P of Cephes tanhf;
//   else:        sign(y) · (1 − 2 / (2^(2·log2(e)·|y|) + 1)), tanh ≥ 0.55 there, so its absolute
//                error ~1e-7 is relative too; no overflow (2^large = inf gives 1).
static void softcap(float* x, int n, float cap, float out_mult, float* t) {
  using V = typename T::V;
  constexpr int L = T::kLanes;
  const V inv = T::set1(1.0f / cap), k2 = T::set1(2.0f * 1.4426950408889634f), one = T::set1(1.0f),
          two = T::set1(2.0f), mult = T::set1(out_mult * cap), small = T::set1(0.625f);
  for (int j = 0; j < n; j += L) {
    const int r = n - j < L ? n - j : L;
    const V y = T::mul(T::load_partial(x + j, r, 0.0f), inv), ay = T::abs(y);
    const V e = vexp2(T::mul(ay, k2));
    const V big = T::copysign(T::sub(one, T::div(two, T::add(e, one))), y);
    const V z = T::mul(y, y);
    V p = T::set1(-5.70498872745e-3f);
    p = T::fmadd(p, z, T::set1(2.06390887954e-2f));
    p = T::fmadd(p, z, T::set1(-5.37397155531e-2f));
    p = T::fmadd(p, z, T::set1(1.33314422036e-1f));
    p = T::fmadd(p, z, T::set1(-3.33332819422e-1f));
    const V poly = T::fmadd(T::mul(p, z), y, y);
    const V th = T::select_less(ay, small, poly, big);
    if (t) T::store_partial(t + j, r, th);
    T::store_partial(x + j, r, T::mul(th, mult));
  }
}

static void load(const void* src, DType type, int n, float mult, float* dst) {
  using V = typename T::V;
  constexpr int L = T::kLanes;
  const V mv = T::set1(mult);
  int j = 0;
  switch (type) {
    case DType::f32: {
      const float* s = static_cast<const float*>(src);
      for (; j + L <= n; j += L) T::store(dst + j, T::mul(T::load(s + j), mv));
      break;
    }
    case DType::f16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (; j + L <= n; j += L) T::store(dst + j, T::mul(T::load_f16(s + j), mv));
      break;
    }
    case DType::bf16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (; j + L <= n; j += L) T::store(dst + j, T::mul(T::load_bf16(s + j), mv));
      break;
    }
  }
  for (; j < n; ++j) dst[j] = mult * detail::load_as_float(src, j, type);
}

static void store(const float* src, int n, float mult, DType type, void* dst) {
  using V = typename T::V;
  constexpr int L = T::kLanes;
  const V mv = T::set1(mult);
  int j = 0;
  switch (type) {
    case DType::f32: {
      float* d = static_cast<float*>(dst);
      for (; j + L <= n; j += L) T::storeu(d + j, T::mul(T::load(src + j), mv));
      break;
    }
    case DType::f16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (; j + L <= n; j += L) T::store_f16(d + j, T::mul(T::load(src + j), mv));
      break;
    }
    case DType::bf16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (; j + L <= n; j += L) T::store_bf16(d + j, T::mul(T::load(src + j), mv));
      break;
    }
  }
  for (; j < n; ++j) detail::store_from_float(dst, j, type, mult * src[j]);
}

static float dot(const float* a, const float* b, int n) {
  using V = typename T::V;
  constexpr int L = T::kLanes;
  V s0 = T::zero(), s1 = T::zero();
  int j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {
    s0 = T::fmadd(T::load(a + j), T::load(b + j), s0);
    s1 = T::fmadd(T::load(a + j + L), T::load(b + j + L), s1);
  }
  for (; j < n; j += L)
    s0 = T::fmadd(T::load_partial(a + j, n - j, 0.0f), T::load_partial(b + j, n - j, 0.0f), s0);
  return T::reduce_add(T::add(s0, s1));
}

static void dsoftmax(const float* p, const float* dp, float d, const float* t, int n, float* ds) {
  using V = typename T::V;
  constexpr int L = T::kLanes;
  const V dv = T::set1(d), one = T::set1(1.0f);
  for (int j = 0; j < n; j += L) {
    const int r = n - j < L ? n - j : L;
    V g = T::mul(T::load_partial(p + j, r, 0.0f), T::sub(T::load_partial(dp + j, r, 0.0f), dv));
    if (t) {
      const V tv = T::load_partial(t + j, r, 0.0f);
      g = T::mul(g, T::sub(one, T::mul(tv, tv)));
    }
    T::store_partial(ds + j, r, g);
  }
}
