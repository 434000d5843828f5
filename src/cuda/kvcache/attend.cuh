// Attention over a KV cache on mma.sync (sm80 and newer), contiguous or paged, with key splits.
// One CTA (4 warps): kBlockM packed query rows of one (sequence, KV head) over one split's share of
// the key tiles the rows see.
//   load Q rows (rotated in fp32 when rotary tables are given)        -> sQ (kBlockM, kHeadDim)
//   for each key tile of the split (kStages-deep cp.async ring; pages from a shared-memory window
//   of the block table):
//     warp (wm, wn): rows [16·wm, +16) against keys [wn·kKeysPerWarp, +kKeysPerWarp) of the tile
//     S = Q Kᵀ, scale (and softcap) applied before the row maximum, mask, online softmax,
//     acc = acc·rescale + P V                                          (fp32, registers)
//   epilogue: the warps' (acc, state) go to shared memory and are merged in warp order
//   (SoftmaxState::merge_scales); one split: out = acc / row_sum and the LSE; several: the
//   unnormalized acc and state go to the split scratch for kv_combine_kernel.
// Two shapes (kWarpsM): decode, kWarpsM = 1 — 16 packed rows (Sq · group <= 16: one query token of
// a GQA group, speculative steps), the 4 warps splitting each 64-key tile so every warp streams its
// own keys; prefill, kWarpsM = 4 — 64 packed rows, each warp a 16-row band over the whole tile.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/common/dependent_launch.cuh"
#include "cuda/common/quad_reduce.cuh"
#include "cuda/kvcache/kv_args.hpp"
#include "cuda/sm80/fragment_softmax.cuh"
#include "cuda/sm80/mask.cuh"
#include "cuda/sm80/ptx.cuh"
#include "cuda/sm80/smem_tile.cuh"

namespace flashattn::cuda::kv {

constexpr int kMaxSplits = 128;  // key splits per (sequence, KV head, row block)

// A (kRows, kCols) key or value tile of 16-bit elements in shared memory: unpadded rows of
// kCols·2 bytes, the 16-byte chunk c of row r at chunk position c ^ (r mod 8). A loader copy then
// fills whole 128-byte lines of shared memory with whole 128-byte lines of the cache, and
// ldmatrix's 8 row addresses (one chunk of 8 consecutive rows) fall in 8 different bank groups.
// With SmemTile's one-chunk row padding (272-byte rows for d 128) the copies land across line
// boundaries, and the L2 served half as many sectors again as the cache holds (P-161).
// The ldmatrix helpers need the tile at a shared-memory address aligned to kAlign: a warp's rows
// start at multiples of 8, so lane l's row is l mod 8 within its 8×8 matrix and the chunk pair of
// 16-column step k lies at byte (k·32) ^ (((l's half) ^ l mod 8)·16) of its row: the address of
// step k is that of step 0 XOR k·32 (one LOP3, no multiply).
template <int kRows, int kCols>
struct SwizzledTile {
  static_assert(kCols % 64 == 0, "rows of whole 128-byte lines");
  static constexpr int kElems = kRows * kCols;
  static constexpr int kBytes = kElems * 2;
  static constexpr int kRowBytes = kCols * 2;
  static constexpr int kAlign = 1024;  // at least one row (d 256: 512 bytes)
  __device__ __forceinline__ static int offset(int r, int col) {
    return r * kCols + (((col >> 3) ^ (r & 7)) << 3) + (col & 7);
  }
  // K for Q·Kᵀ (B operand from an (n, k) tile): matrices (n0, k) (n0, k+8) (n0+8, k) (n0+8, k+8).
  __device__ __forceinline__ static uint32_t b_frag(uint32_t tile, int n0, int lane) {
    const int r = n0 + ((lane >> 4) << 3) + (lane & 7);
    return tile + uint32_t(r * kRowBytes + ((((lane >> 3) & 1) ^ (lane & 7)) << 4));
  }
  // V for P·V (B operand with .trans from a (k, n) tile): matrices (k0, n) (k0+8, n) (k0, n+8) (k0+8, n+8).
  __device__ __forceinline__ static uint32_t bt_frag(uint32_t tile, int k0, int lane) {
    const int r = k0 + (((lane >> 3) & 1) << 3) + (lane & 7);
    return tile + uint32_t(r * kRowBytes + (((lane >> 4) ^ (lane & 7)) << 4));
  }
  static constexpr uint32_t step(int k) { return uint32_t(k) << 5; }  // XOR for 16-column step k
};

template <int kHeadDim, int kWarpsM>
struct KvConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWarpsN = kWarps / kWarpsM;
  static constexpr int kBlockM = 16 * kWarpsM;  // packed query rows per CTA
  static constexpr int kBlockN = kWarpsM == 1 || kHeadDim <= 128 ? 64 : 32;  // keys per tile
  static constexpr int kKeysPerWarp = kBlockN / kWarpsN;
  static constexpr int kStages = kWarpsM == 1 && kHeadDim <= 128 ? 3 : 2;
  static constexpr bool kQInRegisters = kHeadDim <= 128;  // 32 registers of A fragments
  using QTile = SmemTile<kBlockM, kHeadDim>;
  using KVTile = SwizzledTile<kBlockN, kHeadDim>;
  static constexpr int kEpiStride = kHeadDim + 4;  // floats per row of the epilogue's staging
  static constexpr int kKvOffsetMax = QTile::kBytes + KVTile::kAlign;  // K's ring, aligned past sQ
  static constexpr int kMainBytes = kKvOffsetMax + 2 * kStages * KVTile::kBytes;
  static constexpr int kEpiBytes = kWarps * 16 * (kEpiStride * 4 + 8) + kBlockM * (kWarpsN + 1) * 8;
  static constexpr int kSmemBytes = kMainBytes > kEpiBytes ? kMainBytes : kEpiBytes;
  static_assert(kKeysPerWarp % 16 == 0, "P·V steps over 16 keys");
  static_assert(kThreads % (kHeadDim / 8) == 0 && kBlockN % (kThreads / (kHeadDim / 8)) == 0,
                "the tile loader's passes cover whole rows");
};

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float load_float(const void* p, int64_t i, DType t) {
  if (t == DType::f16) return __half2float(static_cast<const __half*>(p)[i]);
  if (t == DType::bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// Feature c of the head vector x after the rotary embedding at position pos (features past
// rotary_dim pass through). Interleaved pairs (2i, 2i+1), else (i, i + rotary_dim/2):
// x_a' = x_a·cos − x_b·sin, x_b' = x_a·sin + x_b·cos.
template <class T>
__device__ __forceinline__ float rotated(const KvArgs& a, const T* x, int c, int64_t pos) {
  const float xc = ptx::to_float<T>(x[c]);
  if (c >= a.rotary_dim) return xc;
  const int half = a.rotary_dim / 2;
  const bool first = a.rot_interleaved ? (c & 1) == 0 : c < half;
  const int i = a.rot_interleaved ? c >> 1 : (first ? c : c - half);
  const int partner = a.rot_interleaved ? c ^ 1 : (first ? c + half : c - half);
  const float co = load_float(a.rot_cos, pos * a.rot_stride + i, a.rot_dtype);
  const float si = load_float(a.rot_sin, pos * a.rot_stride + i, a.rot_dtype);
  const float xp = ptx::to_float<T>(x[partner]);
  return first ? xc * co - xp * si : xp * si + xc * co;
}

// Where token t of sequence b starts in a cache with the given (batch or page, row) strides.
struct CacheRow {
  int64_t slot, row;  // page (paged) or cache batch row, and the row inside it
};
__device__ __forceinline__ CacheRow locate(const KvArgs& a, int b, int cache_b, int t) {
  if (a.page_size > 0) return {a.block_table[int64_t(b) * a.bt_stride + t / a.page_size], t % a.page_size};
  return {cache_b, t};
}
__device__ __forceinline__ int64_t offset(const CacheRow& r, const Strides& st) {
  return r.slot * st.batch + r.row * st.row;
}

// Whether entry (b, i) of the call's range checks fails: block-table entry i of sequence b
// (paged) or its cache row (i = 0, the one entry of a contiguous cache's sequence); the
// length and rotary checks are made once per sequence, at i = 0. Every load is made whatever the
// values (their addresses are in range by the shapes), so a thread's loads of several entries
// overlap. The host's checks of the same values are in src/core/check_kvcache.cpp.
__device__ __forceinline__ bool entry_invalid(const KvArgs& a, int b, int64_t i) {
  const bool paged = a.page_size > 0;
  const int64_t len = a.seqlens[b];
  const int64_t slot = paged ? a.block_table[int64_t(b) * a.bt_stride + i] : a.batch_idx != nullptr ? a.batch_idx[b] : b;
  const int64_t total = len + a.seqlen_new;
  bool bad = len < 0 || total > a.capacity;
  // An entry the sequence uses: block-table entry i holds tokens [i·page_size, +page_size), so it
  // is used when i·page_size < total (a product in place of a 64-bit division).
  if (paged ? i * a.page_size < total : i == 0) bad |= slot < 0 || slot >= a.slots;
  if (i == 0 && a.rotary_dim > 0) {
    int64_t last = len + (a.rot_by_token ? a.seqlen_q - 1 : 0);
    if (a.seqlen_new > 0 && total - 1 > last) last = total - 1;
    bad |= last >= a.rotary_len;
  }
  return bad;
}

__device__ __forceinline__ bool rejected(const KvArgs& a) { return a.invalid != nullptr && *a.invalid != 0; }

// Whether this call writes nothing, from the first thing every kernel does after its
// wait_for_prior_grid (all threads of the CTA, which must all reach it). validate_first: this is
// the call's first kernel and the CTA checks every entry itself (kv_validate_kernel's work, where
// there are few: at most 8 a thread, one round trip to memory, mostly the L2's), CTA 0 writing
// the flag for the later kernels.
__device__ __forceinline__ bool call_rejected(const KvArgs& a) {
  if (!a.validate_first) return rejected(a);
  // No short cut and 32-bit index arithmetic (64-bit divisions cost 2.3 k instructions a warp at
  // 2048 entries): the loads of a thread's entries overlap.
  bool any = false;
  const int n = a.batch * int(a.entries_per_seq), eps = int(a.entries_per_seq);  // <= kValidateInKernel
#pragma unroll 8
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    const int b = e / eps;
    any |= entry_invalid(a, b, e - b * eps);
  }
  const bool bad = __syncthreads_or(any) != 0;
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.invalid = bad;
  return bad;
}

template <class T, int kHeadDim, int kWarpsM>
__global__ void __launch_bounds__(KvConfig<kHeadDim, kWarpsM>::kThreads)
    kv_attend_kernel(const KvArgs a) {
  using C = KvConfig<kHeadDim, kWarpsM>;
  using QTile = typename C::QTile;
  using KVTile = typename C::KVTile;
  constexpr int kBM = C::kBlockM, kBN = C::kBlockN, kKW = C::kKeysPerWarp, kStages = C::kStages;
  constexpr int kNT = kKW / 8;       // n8 tiles of a warp's score band
  constexpr int kDT = kHeadDim / 8;  // n8 tiles of an output band
  wait_for_prior_grid();  // the validation's flag, the appended rows
  allow_dependent_launch();
  if (call_rejected(a)) return;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  // kStages × (kBlockN, kHeadDim) of K, then of V, from the first KVTile::kAlign boundary past sQ.
  const uint32_t smem_base = ptx::smem_addr(smem_raw);
  const uint32_t sK_addr = (smem_base + QTile::kBytes + KVTile::kAlign - 1) & ~uint32_t(KVTile::kAlign - 1);
  T* sK = reinterpret_cast<T*>(smem_raw + (sK_addr - smem_base));
  T* sV = sK + kStages * KVTile::kElems;
  constexpr uint32_t kStageBytes = KVTile::kBytes, kVOffset = kStages * KVTile::kBytes;

  // blockIdx.x = ((b · heads_kv + hkv) · row_blocks + row block) · splits + split
  const int row_blocks = (a.rows + kBM - 1) / kBM;
  int idx = int(blockIdx.x);
  const int split = idx % a.splits;
  idx /= a.splits;
  const int rb = idx % row_blocks;
  idx /= row_blocks;
  const int hkv = idx % a.heads_kv, b = idx / a.heads_kv;
  const int total = a.seqlens[b] + a.seqlen_new;
  const int cache_b = a.page_size > 0 ? 0 : (a.batch_idx != nullptr ? a.batch_idx[b] : b);
  const int r0 = rb * kBM, r_end = min(r0 + kBM, a.rows);
  const int i_first = r0 / a.group, i_last = (r_end - 1) / a.group;  // query tokens of the block
  const WindowMask mask(a.seqlen_q, total, a.window_left, a.window_right);
  int key_lo, key_hi;
  mask.key_range(i_first, i_last + 1, &key_lo, &key_hi);
  const int t_lo = key_lo / kBN, t_hi = key_hi > key_lo ? (key_hi + kBN - 1) / kBN : t_lo;
  // Split s takes tiles [t_lo + count·s / splits, t_lo + count·(s + 1) / splits): in 32 bits
  // while count·splits fits them (a 64-bit division is a subroutine call).
  const unsigned count = unsigned(t_hi - t_lo);
  auto split_start = [&](int s) {
    return t_lo + int(count < (1u << 24) ? count * unsigned(s) / unsigned(a.splits)
                                         : unsigned(uint64_t(count) * unsigned(s) / unsigned(a.splits)));
  };
  const int n_begin = split_start(split), n_end = split_start(split + 1);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;
  const int band0 = wm * 16, key0 = wn * kKW;

  // Q rows, rotated and stored in the working precision; rows past `rows` and columns past
  // head_dim are zero. Without rotary and with 16-byte aligned rows, by 16-byte cp.async copies
  // that join the ring's first commit group: Q's memory latency overlaps the first key tile's
  // instead of preceding it.
  {
    const T* gq = static_cast<const T*>(a.q);
    auto q_row = [&](int r) {
      const int i = r / a.group, h = hkv * a.group + r % a.group;
      return gq + int64_t(b) * a.q_st.batch + int64_t(i) * a.q_st.row + int64_t(h) * a.q_st.head;
    };
    if (a.rotary_dim == 0 && a.q_vec16) {
      constexpr int kQChunks = kHeadDim / 8;
      for (int e = tid; e < kBM * kQChunks; e += C::kThreads) {
        const int row = e / kQChunks, c = e % kQChunks * 8, r = r0 + row;
        const bool ok = r < a.rows && c < a.head_dim;
        ptx::cp_async_16(sQ + QTile::offset(row, c), ok ? q_row(r) + c : gq, ok);
      }
    } else {
      for (int e = tid; e < kBM * kHeadDim; e += C::kThreads) {
        const int row = e / kHeadDim, c = e % kHeadDim, r = r0 + row;
        float x = 0.f;
        if (r < a.rows && c < a.head_dim) {
          const T* qrow = q_row(r);
          x = a.rotary_dim > 0 ? rotated(a, qrow, c, int64_t(a.seqlens[b]) + (a.rot_by_token ? r / a.group : 0))
                               : ptx::to_float<T>(qrow[c]);
        }
        sQ[QTile::offset(row, c)] = from_float<T>(x);
      }
    }
  }

  // Key tile nb into ring stage `stage`. Thread (group grp, chunk) copies 16-byte column chunk
  // `chunk` of the tile's rows [grp·kPasses, +kPasses): one row located per tile, then the row
  // stride added per row, while the group's rows lie in one page (a contiguous cache, or a
  // power-of-two page of at least kPasses rows); with smaller or other page sizes the walk moves
  // to the next page's block-table entry where a page ends (no division per row).
  // The copies' shared-memory addresses are the group's first row plus immediates (SmemTile is
  // affine in the row). Tokens past the block's visible range and columns past head_dim are
  // zero-filled. A paged cache's pages come from a window of the sequence's block-table row in
  // shared memory (s_pages: entries [win0, win0 + kTablePages)), refilled by the whole CTA when the
  // next tile to load passes its end: one global-memory latency per refill instead of a dependent
  // block-table load before every tile's copies.
  constexpr int kChunks = kHeadDim / 8, kGroups = C::kThreads / kChunks, kPasses = kBN / kGroups;
  constexpr int kTablePages = 256;
  static_assert(kBN + 1 <= kTablePages, "a tile's pages fit the window");
  __shared__ int s_pages[kTablePages];
  const bool paged = a.page_size > 0;
  const int32_t* bt = paged ? a.block_table + int64_t(b) * a.bt_stride : nullptr;
  const int last_page = paged && key_hi > 0 ? (key_hi - 1) / a.page_size : 0;
  int win0 = 0;
  auto fill_window = [&](int first) {  // every thread, then __syncthreads before a read
    win0 = first;
    for (int i = tid; i < kTablePages; i += C::kThreads) s_pages[i] = first + i <= last_page ? bt[first + i] : 0;
  };
  // Whether tile nb's last visible token lies past the window (uniform over the CTA).
  auto past_window = [&](int nb) {
    const int t_last = min((nb + 1) * kBN, key_hi) - 1;
    return paged && t_last / a.page_size >= win0 + kTablePages;
  };
  const T* gK = static_cast<const T*>(a.k_cache) + int64_t(hkv) * a.k_st.head;
  const T* gV = static_cast<const T*>(a.v_cache) + int64_t(hkv) * a.v_st.head;
  const int grp = tid / kChunks, chunk = tid % kChunks;
  const bool col_ok = chunk * 8 < a.head_dim;
  const bool one_page = !paged || (a.page_shift >= 0 && a.page_size >= kPasses);
  auto cache_row = [&](int t) {  // token t of the sequence, visible (paged: its page in the window)
    if (!paged) return CacheRow{cache_b, t};
    const int pg = a.page_shift >= 0 ? t >> a.page_shift : t / a.page_size;
    return CacheRow{s_pages[pg - win0], t - pg * a.page_size};
  };
  auto load_tile = [&](int nb, int stage) {
    const int t0 = nb * kBN + grp * kPasses;
    const int n_ok = col_ok ? min(key_hi - t0, kPasses) : 0;  // rows of the group to copy
    T* dK = sK + stage * KVTile::kElems;
    T* dV = sV + stage * KVTile::kElems;
    auto dst = [&](int pass) { return KVTile::offset(grp * kPasses + pass, chunk * 8); };
    if (one_page) {
      const T* ks = gK;
      const T* vs = gV;
      if (n_ok > 0) {
        const CacheRow cr = cache_row(t0);
        ks += offset(cr, a.k_st) + chunk * 8;
        vs += offset(cr, a.v_st) + chunk * 8;
      }
      if (n_ok == kPasses) {  // every row visible: no predicates
#pragma unroll
        for (int pass = 0; pass < kPasses; ++pass) ptx::cp_async_16(dK + dst(pass), ks + pass * a.k_st.row, true);
#pragma unroll
        for (int pass = 0; pass < kPasses; ++pass) ptx::cp_async_16(dV + dst(pass), vs + pass * a.v_st.row, true);
      } else {
#pragma unroll
        for (int pass = 0; pass < kPasses; ++pass) {
          ptx::cp_async_16(dK + dst(pass), ks, pass < n_ok);
          ptx::cp_async_16(dV + dst(pass), vs, pass < n_ok);
          if (pass + 1 < n_ok) {  // the pointers stay on a row the cache holds
            ks += a.k_st.row;
            vs += a.v_st.row;
          }
        }
      }
    } else {  // the first row located once, then walked row by row into the next pages
      const T* ks = gK;
      const T* vs = gV;
      int pg = 0, in_page = 0;
      auto at_page = [&] {
        const CacheRow cr{s_pages[pg - win0], in_page};
        ks = gK + offset(cr, a.k_st) + chunk * 8;
        vs = gV + offset(cr, a.v_st) + chunk * 8;
      };
      if (n_ok > 0) {
        pg = a.page_shift >= 0 ? t0 >> a.page_shift : t0 / a.page_size;
        in_page = t0 - pg * a.page_size;
        at_page();
      }
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        ptx::cp_async_16(dK + dst(pass), ks, pass < n_ok);
        ptx::cp_async_16(dV + dst(pass), vs, pass < n_ok);
        if (pass + 1 < n_ok) {
          if (++in_page == a.page_size) {
            in_page = 0;
            ++pg;
            at_page();
          } else {
            ks += a.k_st.row;
            vs += a.v_st.row;
          }
        }
      }
    }
  };

  if (paged && n_begin < n_end) {
    fill_window(n_begin * kBN / a.page_size);
    __syncthreads();
  }

  // This thread's two rows (g and g + 8 of the warp's band): query token and validity.
  int row_i[2];
  bool row_ok[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + band0 + g + 8 * half;
    row_ok[half] = r < a.rows;
    row_i[half] = r / a.group;
  }

  float acc_o[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[dt][e] = 0.f;
  RowState st[2];

  // The warp's Q fragments: in registers for head dims up to 128 (32 registers), loaded at the
  // first tile; else read from shared memory per tile.
  constexpr int kQFrags = C::kQInRegisters ? kHeadDim / 16 : 1;
  uint32_t qf[kQFrags][4];

  // One loop fills the ring and runs it: step nb loads tile nb + kStages - 1 and, from n_begin on,
  // attends to tile nb, so the loader's code exists once (a decode call with few tiles per CTA
  // spends much of its time fetching instructions it has not run before).
  int read_stage = 0, write_stage = 0;  // the ring stages of tiles nb and nb + kStages - 1
  for (int nb = n_begin - (kStages - 1); nb < n_end; ++nb) {
    const bool attend = nb >= n_begin;
    if (attend) {
      ptx::cp_async_wait<kStages - 2>();
      __syncthreads();  // tile nb (and at the first, Q) has landed for every thread; the stage of tile nb - 1 is free
    }
    const int nl = nb + kStages - 1;
    if (nl < n_end) {
      if (past_window(nl)) {  // no thread reads s_pages between the barriers
        if (!attend) __syncthreads();  // (only with more pages per tile than kTablePages / kStages)
        fill_window(nl * kBN / a.page_size);
        __syncthreads();
      }
      load_tile(nl, write_stage);
    }
    ptx::cp_async_commit();
    write_stage = write_stage + 1 == kStages ? 0 : write_stage + 1;
    if (!attend) continue;
    if constexpr (C::kQInRegisters) {
      if (nb == n_begin) {
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk)
          ptx::ldmatrix_x4(qf[kk], a_frag_addr<QTile>(sQ, band0, kk * 16, lane));
      }
    }
    const uint32_t cK = sK_addr + read_stage * kStageBytes, cV = cK + kVOffset;
    read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;

    // S = Q Kᵀ over this warp's keys                                   // (16, kKeysPerWarp)
    float acc_s[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t af_smem[4];
      if constexpr (!C::kQInRegisters) ptx::ldmatrix_x4(af_smem, a_frag_addr<QTile>(sQ, band0, kk * 16, lane));
      const uint32_t(&af)[4] = C::kQInRegisters ? qf[kk % kQFrags] : af_smem;
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t bf[4];
        ptx::ldmatrix_x4(bf, KVTile::b_frag(cK, key0 + np * 16, lane) ^ KVTile::step(kk));
        ptx::mma_16816<T>(acc_s[2 * np], af, bf[0], bf[1]);
        ptx::mma_16816<T>(acc_s[2 * np + 1], af, bf[2], bf[3]);
      }
    }

    // log2-unit scores, then the mask where the tile is not wholly visible to the block's rows.
    if (a.cap_in != 0.f) {  // one branch per tile, not per score
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[nt][e] = tanhf(acc_s[nt][e] * a.cap_in) * a.score_scale;
    } else {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[nt][e] *= a.score_scale;
    }
    const int n0 = nb * kBN;
    if (!mask.tile_all_visible(i_first, i_last - i_first + 1, n0, kBN)) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = e >> 1, j = n0 + key0 + nt * 8 + 2 * t4 + (e & 1);
          if (!row_ok[half] || !mask.visible(row_i[half], j)) acc_s[nt][e] = -INFINITY;
        }
    }

    float rescale[2];
    softmax_tile(acc_s, st, 1.f, rescale);
    // Once the rows' maxima settle (most tiles of a long cache) every rescale is exactly 1: the
    // warp skips the multiplies, which changes no bit.
    if (__any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) {
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        acc_o[dt][0] *= rescale[0];
        acc_o[dt][1] *= rescale[0];
        acc_o[dt][2] *= rescale[1];
        acc_o[dt][3] *= rescale[1];
      }
    }

    // acc += P V                                                        // (16, kHeadDim)
#pragma unroll
    for (int kk = 0; kk < kKW / 16; ++kk) {
      uint32_t pf[4];
      pf[0] = ptx::pack2<T>(acc_s[2 * kk][0], acc_s[2 * kk][1]);
      pf[1] = ptx::pack2<T>(acc_s[2 * kk][2], acc_s[2 * kk][3]);
      pf[2] = ptx::pack2<T>(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]);
      pf[3] = ptx::pack2<T>(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t bf[4];
        ptx::ldmatrix_x4_trans(bf, KVTile::bt_frag(cV, key0 + kk * 16, lane) ^ KVTile::step(dp));
        ptx::mma_16816<T>(acc_o[2 * dp], pf, bf[0], bf[1]);
        ptx::mma_16816<T>(acc_o[2 * dp + 1], pf, bf[2], bf[3]);
      }
    }
  }
  ptx::cp_async_wait<0>();
  __syncthreads();  // the ring is drained; its memory becomes the epilogue's staging

  // Epilogue. Staging: per warp, 16 rows of acc (kEpiStride floats) and 16 states; then per row
  // the warps' merge scales (SoftmaxState::merge_scales, in warp order) and the merged state, once
  // per row; then 4 columns per thread of the rows the block holds.
  float* e_acc = reinterpret_cast<float*>(smem_raw);
  float2* e_st = reinterpret_cast<float2*>(e_acc + C::kWarps * 16 * C::kEpiStride);
  float2* e_scale = e_st + C::kWarps * 16;    // (kBM, kWarpsN): (old, other) of merging warp k
  float2* e_state = e_scale + kBM * C::kWarpsN;  // (kBM): the merged (row_max, row_sum)
  {
    float* mine = e_acc + warp * 16 * C::kEpiStride;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<float2*>(mine + (g + 8 * half) * C::kEpiStride + dt * 8 + 2 * t4) =
            make_float2(acc_o[dt][2 * half], acc_o[dt][2 * half + 1]);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = quad_sum(st[half].row_sum);
      if (t4 == 0) e_st[warp * 16 + g + 8 * half] = make_float2(st[half].row_max, sum);
    }
  }
  __syncthreads();
  const int rows_here = min(kBM, a.rows - r0);
  for (int row = tid; row < rows_here; row += C::kThreads) {
    const int w0 = (row / 16) * C::kWarpsN, rr = row % 16;
    RowState s;
    s.row_max = e_st[w0 * 16 + rr].x;
    s.row_sum = e_st[w0 * 16 + rr].y;
#pragma unroll
    for (int k = 1; k < C::kWarpsN; ++k) {
      RowState o;
      o.row_max = e_st[(w0 + k) * 16 + rr].x;
      o.row_sum = e_st[(w0 + k) * 16 + rr].y;
      float sa = 1.f, sb = 0.f;
      if (!s.merge_scales(o, sa, sb)) sa = 1.f, sb = 0.f;  // both empty: the accumulator stays
      e_scale[row * C::kWarpsN + k] = make_float2(sa, sb);
    }
    e_state[row] = make_float2(s.row_max, s.row_sum);
  }
  __syncthreads();

  T* gO = static_cast<T*>(a.out);
  const int64_t grow0 = (int64_t(b) * a.heads_kv + hkv) * a.rows;  // packed row index base
  constexpr int kVec = 4, kVecs = kHeadDim / kVec;
  for (int e = tid; e < rows_here * kVecs; e += C::kThreads) {
    const int row = e / kVecs, c = e % kVecs * kVec, r = r0 + row;
    if (c >= a.head_dim) continue;  // head_dim is a multiple of 8
    const int w0 = (row / 16) * C::kWarpsN, rr = row % 16;
    float4 acc = *reinterpret_cast<const float4*>(e_acc + (w0 * 16 + rr) * C::kEpiStride + c);
#pragma unroll
    for (int k = 1; k < C::kWarpsN; ++k) {
      const float2 f = e_scale[row * C::kWarpsN + k];
      const float4 x = *reinterpret_cast<const float4*>(e_acc + ((w0 + k) * 16 + rr) * C::kEpiStride + c);
      acc.x = acc.x * f.x + x.x * f.y;
      acc.y = acc.y * f.x + x.y * f.y;
      acc.z = acc.z * f.x + x.z * f.y;
      acc.w = acc.w * f.x + x.w * f.y;
    }
    RowState s;
    s.row_max = e_state[row].x;
    s.row_sum = e_state[row].y;
    if (a.splits == 1) {
      const int i = r / a.group, h = hkv * a.group + r % a.group;
      T* o = gO + int64_t(b) * a.out_st.batch + int64_t(i) * a.out_st.row + int64_t(h) * a.out_st.head + c;
      const float inv = s.inv_sum();
      o[0] = from_float<T>(acc.x * inv);
      o[1] = from_float<T>(acc.y * inv);
      o[2] = from_float<T>(acc.z * inv);
      o[3] = from_float<T>(acc.w * inv);
      if (c == 0 && a.lse != nullptr) a.lse[int64_t(b) * a.lse_batch + int64_t(h) * a.lse_head + int64_t(i) * a.lse_row] = s.lse();
    } else {
      const int64_t slot = (grow0 + r) * a.splits + split;
      *reinterpret_cast<float4*>(a.part + slot * a.head_dim + c) = acc;
      if (c == 0) a.part_state[slot] = make_float2(s.row_max, s.row_sum);
    }
  }
}

// Merges the splits of one packed row per CTA and writes out and the LSE. Warp w takes the splits
// w, w + 4, w + 8, … in groups of eight: every lane loads the eight states and its columns
// (4·lane + 128·q) of the eight accumulators together, so a group costs one memory round trip
// whatever the split count (a split-by-split merge waited one round trip per split); each lane
// folds the states in the same order, so all lanes agree. The four warps' results are then folded
// in warp order through shared memory.
constexpr int kCombineWarps = 4;

// Folds a partial result (state st = (row_max, row_sum), accumulator columns x) into (s, o):
// SoftmaxState::merge_scales on the states, o·a + x·b on the columns.
template <int kVecs>
__device__ __forceinline__ void fold_partial(RowState& s, float4 (&o)[kVecs], float2 st, const float4 (&x)[kVecs]) {
  RowState other;
  other.row_max = st.x;
  other.row_sum = st.y;
  float a, b;
  if (!s.merge_scales(other, a, b)) return;  // both empty
#pragma unroll
  for (int q = 0; q < kVecs; ++q) {
    o[q].x = o[q].x * a + x[q].x * b;
    o[q].y = o[q].y * a + x[q].y * b;
    o[q].z = o[q].z * a + x[q].z * b;
    o[q].w = o[q].w * a + x[q].w * b;
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kCombineWarps) kv_combine_kernel(const KvArgs a) {
  constexpr int kVecs = 256 / (4 * 32);  // float4 column groups per lane
  constexpr int kGroup = 8;              // splits loaded together
  __shared__ float4 w_acc[kCombineWarps][kVecs * 32];
  __shared__ float2 w_st[kCombineWarps];
  wait_for_prior_grid();
  if (rejected(a)) return;
  const int64_t grow = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = int(grow % a.rows), hkv = int((grow / a.rows) % a.heads_kv), b = int(grow / (int64_t(a.rows) * a.heads_kv));
  const float2* st = a.part_state + grow * a.splits;
  const float* acc = a.part + grow * a.splits * a.head_dim;
  // Past head_dim a lane re-reads the last columns (never stored), past the last split the last
  // split at weight 0: the loads need no predicate.
  int col[kVecs];
#pragma unroll
  for (int q = 0; q < kVecs; ++q) col[q] = min(4 * lane + 128 * q, a.head_dim - 4);

  RowState s;
  float4 o[kVecs] = {};
  for (int first = warp; first < a.splits; first += kGroup * kCombineWarps) {
    float2 gs[kGroup];
    float4 v[kGroup][kVecs];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const int sp = min(first + u * kCombineWarps, a.splits - 1);
      gs[u] = st[sp];
      if (first + u * kCombineWarps >= a.splits) gs[u] = make_float2(-HUGE_VALF, 0.f);
#pragma unroll
      for (int q = 0; q < kVecs; ++q) v[u][q] = __ldcg(reinterpret_cast<const float4*>(acc + int64_t(sp) * a.head_dim + col[q]));
    }
#pragma unroll
    for (int u = 0; u < kGroup; ++u) fold_partial(s, o, gs[u], v[u]);
  }
#pragma unroll
  for (int q = 0; q < kVecs; ++q) w_acc[warp][q * 32 + lane] = o[q];
  if (lane == 0) w_st[warp] = make_float2(s.row_max, s.row_sum);
  __syncthreads();
  if (warp != 0) return;
  s = RowState();
#pragma unroll
  for (int q = 0; q < kVecs; ++q) o[q] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int w = 0; w < kCombineWarps; ++w) {
    float4 x[kVecs];
#pragma unroll
    for (int q = 0; q < kVecs; ++q) x[q] = w_acc[w][q * 32 + lane];
    fold_partial(s, o, w_st[w], x);
  }
  const int i = r / a.group, h = hkv * a.group + r % a.group;
  T* gO = static_cast<T*>(a.out) + int64_t(b) * a.out_st.batch + int64_t(i) * a.out_st.row + int64_t(h) * a.out_st.head;
  const float inv = s.inv_sum();
#pragma unroll
  for (int q = 0; q < kVecs; ++q) {
    const int c = 4 * lane + 128 * q;
    if (c < a.head_dim) {  // head_dim is a multiple of 8
      gO[c] = from_float<T>(o[q].x * inv);
      gO[c + 1] = from_float<T>(o[q].y * inv);
      gO[c + 2] = from_float<T>(o[q].z * inv);
      gO[c + 3] = from_float<T>(o[q].w * inv);
    }
  }
  if (lane == 0 && a.lse != nullptr) a.lse[int64_t(b) * a.lse_batch + int64_t(h) * a.lse_head + int64_t(i) * a.lse_row] = s.lse();
}

// The new tokens into the cache, one warp per (sequence, token, KV head): keys rotated in fp32 at
// their absolute positions and rounded once, values copied.
template <class T>
__global__ void __launch_bounds__(128) kv_append_kernel(const KvArgs a) {
  wait_for_prior_grid();  // the validation's flag
  allow_dependent_launch();
  if (call_rejected(a)) return;
  const int64_t item = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;  // (b · seqlen_new + j) · heads_kv + h
  const int lane = threadIdx.x % 32;
  if (item >= int64_t(a.batch) * a.seqlen_new * a.heads_kv) return;
  const int h = int(item % a.heads_kv), j = int((item / a.heads_kv) % a.seqlen_new);
  const int b = int(item / (int64_t(a.heads_kv) * a.seqlen_new));
  const int t = a.seqlens[b] + j;
  const CacheRow cr = locate(a, b, a.batch_idx != nullptr ? a.batch_idx[b] : b, t);
  const T* kn = static_cast<const T*>(a.k_new) + int64_t(b) * a.kn_st.batch + int64_t(j) * a.kn_st.row + int64_t(h) * a.kn_st.head;
  const T* vn = static_cast<const T*>(a.v_new) + int64_t(b) * a.vn_st.batch + int64_t(j) * a.vn_st.row + int64_t(h) * a.vn_st.head;
  T* kd = static_cast<T*>(a.k_cache) + offset(cr, a.k_st) + int64_t(h) * a.k_st.head;
  T* vd = static_cast<T*>(a.v_cache) + offset(cr, a.v_st) + int64_t(h) * a.v_st.head;
  for (int c = lane; c < a.head_dim; c += 32) {
    kd[c] = a.rotary_dim > 0 ? from_float<T>(rotated(a, kn, c, t)) : kn[c];
    vd[c] = vn[c];
  }
}

}  // namespace flashattn::cuda::kv
