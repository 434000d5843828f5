// The SIMD decode kernels, written once over a small vector-traits class T and included by
// decode_kernels_avx2.cpp and decode_kernels_avx512.cpp (each compiled for its own instruction set).
//
// T provides: V (vector of T::kLanes floats), load/store (full vectors), load_partial (the first r
// lanes, zeros after), set1, zero, fmadd, mul, reduce_add_n, in_register, load_f16/load_bf16 (full
// vectors), load_bf16_pair (2·kLanes bf16 as their even and their odd elements), and kScoreRows ×
// kScoreKeys, the query rows × keys of the scores kernel's register block (see scores_block).
//
// Not a header: no include guard, included exactly once per ISA file inside its namespace.

// ---- element loaders: d-slices of a K or V row of one dtype as fp32 vectors ---------------------
// full(row, c): elements c … c + kLanes − 1; part(row, c, r): elements c … c + r − 1, zeros after
// (never reads past the row: the last row of a cache may end at the end of its buffer);
// pair(row, c, a, b): the 2·kLanes elements from c, a and b in the block order of
// DecodeKernels::bf16_block — natural (a = c …, b = c + kLanes …) for f32 and f16, the even
// elements in a and the odd ones in b for bf16 (two bit operations on the raw words, no shuffle).
struct LoadF32 {
  static constexpr int kBytes = 4;
  static typename T::V full(const char* row, int c) { return T::load(reinterpret_cast<const float*>(row) + c); }
  static void pair(const char* row, int c, typename T::V& a, typename T::V& b) {
    a = full(row, c);
    b = full(row, c + T::kLanes);
  }
  static typename T::V part(const char* row, int c, int r) {
    return T::load_partial(reinterpret_cast<const float*>(row) + c, r);
  }
};
struct LoadF16 {
  static constexpr int kBytes = 2;
  static typename T::V full(const char* row, int c) { return T::load_f16(reinterpret_cast<const uint16_t*>(row) + c); }
  static void pair(const char* row, int c, typename T::V& a, typename T::V& b) {
    a = full(row, c);
    b = full(row, c + T::kLanes);
  }
  static typename T::V part(const char* row, int c, int r) {
    uint16_t tmp[T::kLanes] = {};  // f16 zero
    std::memcpy(tmp, reinterpret_cast<const uint16_t*>(row) + c, size_t(r) * 2);
    return T::load_f16(tmp);
  }
};
struct LoadBf16 {
  static constexpr int kBytes = 2;
  static typename T::V full(const char* row, int c) { return T::load_bf16(reinterpret_cast<const uint16_t*>(row) + c); }
  static void pair(const char* row, int c, typename T::V& a, typename T::V& b) {
    T::load_bf16_pair(reinterpret_cast<const uint16_t*>(row) + c, a, b);
  }
  static typename T::V part(const char* row, int c, int r) {
    uint16_t tmp[T::kLanes] = {};  // bf16 zero
    std::memcpy(tmp, reinterpret_cast<const uint16_t*>(row) + c, size_t(r) * 2);
    return T::load_bf16(tmp);
  }
};

// Every cache line of bytes [0, bytes) of p.
static inline void prefetch_span(const char* p, int64_t bytes) {
  const uintptr_t last = reinterpret_cast<uintptr_t>(p + bytes - 1) & ~uintptr_t(63);
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63); a <= last; a += 64)
    _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0);
}
// Row j of pf, all its heads (one span when the heads lie back to back, as in a packed cache).
static inline void prefetch_row(const RowPrefetch& pf, int j) {
  if (j >= pf.count) return;
  const char* row = pf.rows[j];
  if (pf.head_stride == pf.bytes) return prefetch_span(row, pf.bytes * pf.heads);
  for (int h = 0; h < pf.heads; ++h) prefetch_span(row + h * pf.head_stride, pf.bytes);
}

// Rows [0, count) of a key block, every head, read once in memory order (one vector per 64-byte
// line, the values unused) before the kernels read them head by head: over a packed cache (a
// token's heads back to back) the head-by-head order read at 8.5–11 GB/s on one Zen 4 core where
// the same bytes in memory order streamed at 17–19 (P-167); read in order first, the block's lines
// are in L1 when the head-by-head reads come. Only where the heads lie back to back, and for the
// 16-bit dtypes: f32 decodes measured no gain (19.5/16.6/19.3 against 19.6/23.2/17.5 GB/s at 32K).
static inline void touch_block(const char* const* rows, int count, int64_t head_stride, int64_t bytes, int heads) {
  constexpr int64_t kVec = sizeof(typename T::V);
  const int64_t span = bytes * heads;
  if (head_stride != bytes || span < kVec) return;
  for (int i = 0; i < count; ++i)
    for (int64_t off = 0; off < span; off += 64) {
      const typename T::V x = T::load(reinterpret_cast<const float*>(rows[i] + (off < span - kVec ? off : span - kVec)));
      __asm__ volatile("" : : "x"(x));
    }
}

// The inner blocks below are forced inline into their loops: called once per slice or key pair,
// they would otherwise spill their accumulators across every call.
#define FLASHATTN_DECODE_INLINE inline __attribute__((always_inline))

// ---- scores -------------------------------------------------------------------------------------
// R query rows × J keys: R·J accumulators walk d together, so each K vector is converted once and
// used by R rows, each q vector (from L1) by J keys; R·J ≥ 8 independent FMA chains cover the FMA
// latency (4 cycles × 2 pipes on Zen 4). Registers: R·J accumulators + 2·J key vectors (a block
// of 2·kLanes columns) + 1 query.
template <class Ld, int R, int J>
static FLASHATTN_DECODE_INLINE void scores_block(int d, const float* q, int64_t ldq, const char* const* k,
                                                 int64_t kh, float* s, int64_t lds) {
  using V = typename T::V;
  constexpr int L = T::kLanes;
  V acc[R * J];
  for (int i = 0; i < R * J; ++i) acc[i] = T::zero();
  int c = 0;
  for (; c + 2 * L <= d; c += 2 * L) {  // blocks of 2·kLanes in bf16_block order (q is stored so)
    V ka[J], kb[J];
    for (int j = 0; j < J; ++j) Ld::pair(k[j] + kh, c, ka[j], kb[j]);
    for (int r = 0; r < R; ++r) {
      const V qa = T::in_register(T::load(q + r * ldq + c));
      for (int j = 0; j < J; ++j) acc[r * J + j] = T::fmadd(qa, ka[j], acc[r * J + j]);
      const V qb = T::in_register(T::load(q + r * ldq + c + L));
      for (int j = 0; j < J; ++j) acc[r * J + j] = T::fmadd(qb, kb[j], acc[r * J + j]);
    }
  }
  for (; c + L <= d; c += L) {
    V kv[J];
    for (int j = 0; j < J; ++j) kv[j] = Ld::full(k[j] + kh, c);
    for (int r = 0; r < R; ++r) {
      const V qv = T::in_register(T::load(q + r * ldq + c));
      for (int j = 0; j < J; ++j) acc[r * J + j] = T::fmadd(qv, kv[j], acc[r * J + j]);
    }
  }
  if (c < d) {  // q has zeros past d; K is read only up to d
    V kv[J];
    for (int j = 0; j < J; ++j) kv[j] = Ld::part(k[j] + kh, c, d - c);
    for (int r = 0; r < R; ++r) {
      const V qv = T::load(q + r * ldq + c);
      for (int j = 0; j < J; ++j) acc[r * J + j] = T::fmadd(qv, kv[j], acc[r * J + j]);
    }
  }
  float sum[R * J];
  T::template reduce_add_n<R * J>(acc, sum);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) s[r * lds + j] = sum[r * J + j];
}

// J keys of one head against its nr rows, four rows at a time (the J K rows stay in L1 across
// the row groups).
template <class Ld, int J>
static void scores_head(int nr, int d, const float* q, int64_t ldq, const char* const* k, int64_t kh, float* s,
                        int64_t lds) {
  constexpr int RG = T::kScoreRows;
  int r = 0;
  for (; r + RG <= nr; r += RG) scores_block<Ld, RG, J>(d, q + r * ldq, ldq, k, kh, s + r * lds, lds);
  switch (nr - r) {
    case 3: if constexpr (RG > 3) scores_block<Ld, 3, J>(d, q + r * ldq, ldq, k, kh, s + r * lds, lds); break;
    case 2: if constexpr (RG > 2) scores_block<Ld, 2, J>(d, q + r * ldq, ldq, k, kh, s + r * lds, lds); break;
    case 1: scores_block<Ld, 1, J>(d, q + r * ldq, ldq, k, kh, s + r * lds, lds); break;
    default: break;
  }
}

template <class Ld>
static void scores_t(int nh, int nr, int n, int d, const float* q, int64_t q_head, int64_t ldq,
                     const char* const* k, int64_t k_head, float* s, int64_t s_head, int64_t lds,
                     const RowPrefetch& also) {
  constexpr int J = T::kScoreKeys;
  int j = 0;
  for (; j + J <= n; j += J) {
    for (int i = 0; i < J; ++i) prefetch_row(also, j + i);
    if (Ld::kBytes == 2) touch_block(k + j, J, k_head, int64_t(d) * Ld::kBytes, nh);
    for (int h = 0; h < nh; ++h)
      scores_head<Ld, J>(nr, d, q + h * q_head, ldq, k + j, h * k_head, s + h * s_head + j, lds);
  }
  for (; j < n; ++j) {
    prefetch_row(also, j);
    if (Ld::kBytes == 2) touch_block(k + j, 1, k_head, int64_t(d) * Ld::kBytes, nh);
    for (int h = 0; h < nh; ++h)
      scores_head<Ld, 1>(nr, d, q + h * q_head, ldq, k + j, h * k_head, s + h * s_head + j, lds);
  }
  for (; j < also.count; ++j) prefetch_row(also, j);
}

static void scores(int nh, int nr, int n, int d, const float* q, int64_t q_head, int64_t ldq,
                   const char* const* k, int64_t k_head, DType type, float* s, int64_t s_head, int64_t lds,
                   const RowPrefetch& also) {
  switch (type) {
    case DType::f32: return scores_t<LoadF32>(nh, nr, n, d, q, q_head, ldq, k, k_head, s, s_head, lds, also);
    case DType::f16: return scores_t<LoadF16>(nh, nr, n, d, q, q_head, ldq, k, k_head, s, s_head, lds, also);
    case DType::bf16: return scores_t<LoadBf16>(nh, nr, n, d, q, q_head, ldq, k, k_head, s, s_head, lds, also);
  }
}

// ---- accumulate ---------------------------------------------------------------------------------
// Keys outermost: KB = 8 keys of every head, then the next 8, through a register block of R rows ×
// NV vectors of acc columns [c, c + NV·kLanes) (per key: NV conversions, R broadcasts of p, R·NV
// FMAs; registers R·NV accumulators + NV values + 1 broadcast), loaded from acc and stored back
// once per 8 keys. The value rows are read in cache order, which the hardware prefetcher follows.
// Head by head instead (one head's block in registers across the chunk's keys), a head's rows
// (Hkv · d elements apart in a packed cache) were read 2 KiB apart: in f32 all of them fell into
// one L1 set and the decode ran at 45 % of the read bandwidth instead of 74 %; in bf16 and f16 the
// loads of those rows stalled and the step took 1.1–1.4× as long (docs/perf/log.md, P-143).
// kFull = false marks the last, partial slice (NV = 1, w valid columns), and full vectors are
// stored up to the next multiple of kLanes ≤ pad_n(d) (those lanes hold 0·scale + 0).

// KB keys into the block (times row_scale first when kScale: the chunk's first keys).
template <class Ld, int R, int NV, int KB, bool kScale, bool kFull>
static FLASHATTN_DECODE_INLINE void accumulate_block(int c, int w, const float* p, int64_t ldp, const char* const* v,
                                                     int64_t vh, const float* row_scale, float* acc, int64_t ldacc) {
  using V = typename T::V;
  constexpr int L = T::kLanes;
  V a[R * NV];
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < NV; ++x) {
      a[r * NV + x] = T::load(acc + r * ldacc + c + x * L);
      if (kScale) a[r * NV + x] = T::mul(a[r * NV + x], T::set1(row_scale[r]));
    }
  for (int j = 0; j < KB; ++j) {
    const char* row = v[j] + vh;
    V x[NV];
    if constexpr (NV == 2) Ld::pair(row, c, x[0], x[1]);  // bf16_block order, as acc holds it
    else x[0] = kFull ? Ld::full(row, c) : Ld::part(row, c, w);
    for (int r = 0; r < R; ++r) {
      const V pr = T::set1(p[r * ldp + j]);
      for (int y = 0; y < NV; ++y) a[r * NV + y] = T::fmadd(pr, x[y], a[r * NV + y]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < NV; ++x) T::store(acc + r * ldacc + c + x * L, a[r * NV + x]);
}

// KB keys into all columns of R rows: slices of 2 vectors (the blocks of bf16_block), then of 1,
// then the partial one.
template <class Ld, int R, int KB, bool kScale>
static void accumulate_block_rows(int d, const float* p, int64_t ldp, const char* const* v, int64_t vh,
                                  const float* row_scale, float* acc, int64_t ldacc) {
  constexpr int L = T::kLanes;
  int c = 0;
  for (; c + 2 * L <= d; c += 2 * L)
    accumulate_block<Ld, R, 2, KB, kScale, true>(c, 2 * L, p, ldp, v, vh, row_scale, acc, ldacc);
  for (; c + L <= d; c += L) accumulate_block<Ld, R, 1, KB, kScale, true>(c, L, p, ldp, v, vh, row_scale, acc, ldacc);
  if (c < d) accumulate_block<Ld, R, 1, KB, kScale, false>(c, d - c, p, ldp, v, vh, row_scale, acc, ldacc);
}

// KB keys of every head into that head's nr rows, four rows at a time.
template <class Ld, int KB, bool kScale>
static void accumulate_block_heads(int nh, int nr, int d, const float* p, int64_t p_head, int64_t ldp,
                                   const char* const* v, int64_t v_head, const float* row_scale, float* acc,
                                   int64_t acc_head, int64_t ldacc) {
  for (int h = 0; h < nh; ++h) {
    const float* ph = p + h * p_head;
    const int64_t vh = h * v_head;
    const float* sh = row_scale + h * nr;
    float* ah = acc + h * acc_head;
    int r = 0;
    for (; r + 4 <= nr; r += 4)
      accumulate_block_rows<Ld, 4, KB, kScale>(d, ph + r * ldp, ldp, v, vh, sh + r, ah + r * ldacc, ldacc);
    switch (nr - r) {
      case 3: accumulate_block_rows<Ld, 3, KB, kScale>(d, ph + r * ldp, ldp, v, vh, sh + r, ah + r * ldacc, ldacc); break;
      case 2: accumulate_block_rows<Ld, 2, KB, kScale>(d, ph + r * ldp, ldp, v, vh, sh + r, ah + r * ldacc, ldacc); break;
      case 1: accumulate_block_rows<Ld, 1, KB, kScale>(d, ph + r * ldp, ldp, v, vh, sh + r, ah + r * ldacc, ldacc); break;
      default: break;
    }
  }
}

// Keys outermost: blocks of KB keys (single keys at the end), the also-rows requested block by block.
template <class Ld, int KB>
static void accumulate_by_keys(int nh, int nr, int n, int d, const float* p, int64_t p_head, int64_t ldp,
                               const char* const* v, int64_t v_head, const float* row_scale, float* acc,
                               int64_t acc_head, int64_t ldacc, const RowPrefetch& also) {
  int j = n >= KB ? KB : 1;  // the first keys apply row_scale
  for (int i = 0; i < j; ++i) prefetch_row(also, i);
  if (Ld::kBytes == 2) touch_block(v, j, v_head, int64_t(d) * Ld::kBytes, nh);
  if (j == KB) accumulate_block_heads<Ld, KB, true>(nh, nr, d, p, p_head, ldp, v, v_head, row_scale, acc, acc_head, ldacc);
  else accumulate_block_heads<Ld, 1, true>(nh, nr, d, p, p_head, ldp, v, v_head, row_scale, acc, acc_head, ldacc);
  for (; j + KB <= n; j += KB) {
    for (int i = 0; i < KB; ++i) prefetch_row(also, j + i);
    if (Ld::kBytes == 2) touch_block(v + j, KB, v_head, int64_t(d) * Ld::kBytes, nh);
    accumulate_block_heads<Ld, KB, false>(nh, nr, d, p + j, p_head, ldp, v + j, v_head, row_scale, acc, acc_head,
                                          ldacc);
  }
  for (; j < n; ++j) {
    prefetch_row(also, j);
    if (Ld::kBytes == 2) touch_block(v + j, 1, v_head, int64_t(d) * Ld::kBytes, nh);
    accumulate_block_heads<Ld, 1, false>(nh, nr, d, p + j, p_head, ldp, v + j, v_head, row_scale, acc, acc_head,
                                         ldacc);
  }
  for (; j < also.count; ++j) prefetch_row(also, j);
}

static void accumulate(int nh, int nr, int n, int d, const float* p, int64_t p_head, int64_t ldp,
                       const char* const* v, int64_t v_head, DType type, const float* row_scale, float* acc,
                       int64_t acc_head, int64_t ldacc, const RowPrefetch& also) {
  switch (type) {
    case DType::f32:
      return accumulate_by_keys<LoadF32, 8>(nh, nr, n, d, p, p_head, ldp, v, v_head, row_scale, acc, acc_head, ldacc, also);
    case DType::f16:
      return accumulate_by_keys<LoadF16, 8>(nh, nr, n, d, p, p_head, ldp, v, v_head, row_scale, acc, acc_head, ldacc, also);
    case DType::bf16:
      return accumulate_by_keys<LoadBf16, 8>(nh, nr, n, d, p, p_head, ldp, v, v_head, row_scale, acc, acc_head, ldacc, also);
  }
}

#undef FLASHATTN_DECODE_INLINE
