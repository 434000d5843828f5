// Flash backward on mma.sync (sm80 and newer): recompute P per tile from Q, K and the LSE, never
// store it. Three launches, no atomics (so the gradients are bitwise reproducible whatever
// Options::deterministic says):
//   1. dsum:  D_i = rowsum(dO_i ∘ O_i)                                  (batch, heads, seqlen_q)
//   2. dK/dV: a CTA per (key tile, KV head) streams the query tiles of every query head of its
//             GQA group:  Sᵀ = K Qᵀ, Pᵀ = exp2(Sᵀ·c − lse2), dV += Pᵀ dO,
//             dPᵀ = V dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − D), dK += dSᵀ Q
//   3. dQ:    a CTA per (query tile, head) streams key tiles:  S, P, dP = dO Vᵀ, dS, dQ += dS K
// Softcap: the score is cap·tanh(x·scale/cap), so dS is further multiplied by (1 − t²); dQ and dK
// are multiplied by scale at the end. Masked entries get P = 0 after the exponential (so t stays
// finite and 0·(1 − t²) never meets an infinity); rows that saw no key have LSE = -inf, read as
// +inf here so that their P is 0.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/args.hpp"
#include "cuda/sm80/mask.cuh"
#include "cuda/sm80/ptx.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/sm80/smem_tile.cuh"
#include "cuda/sm80/launch.hpp"
#include "cuda/sm80/tile_config.cuh"

namespace flashattn::cuda::sm80 {

constexpr float kLog2e = 1.4426950408889634f;

// LSE in log2 units for the exponent; -inf (a row that sees no key) becomes +inf so P = 0.
__device__ __forceinline__ float lse_log2(float lse) {
  return lse == -INFINITY ? INFINITY : lse * kLog2e;
}

template <class T>
__global__ void flash_bwd_dsum_kernel(const AttnArgs a, int64_t rows_total) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= rows_total) return;
  const int h = int(w % a.heads);
  const int64_t row = (w / a.heads) % a.seqlen_q;
  const int64_t b = w / (int64_t(a.heads) * a.seqlen_q);
  const T* o = static_cast<const T*>(a.out) + b * a.out_st.batch + row * a.out_st.row + h * a.out_st.head;
  const T* d = static_cast<const T*>(a.dout) + b * a.dout_st.batch + row * a.dout_st.row +
               h * a.dout_st.head;
  float s = 0.f;
  for (int c = lane; c < a.head_dim; c += 32) s += ptx::to_float(o[c]) * ptx::to_float(d[c]);
#pragma unroll
  for (int x = 16; x > 0; x >>= 1) s += __shfl_xor_sync(0xffffffffu, s, x);
  if (lane == 0) a.dsum[(b * a.heads + h) * a.seqlen_q + row] = s;
}

template <class T, int kHeadDim, DkDvMode kMode>
__global__ void __launch_bounds__(BwdDkDvConfig<kHeadDim>::kThreads, 1)
    flash_bwd_dkdv_kernel(const AttnArgs a) {
  using C = BwdDkDvConfig<kHeadDim>;
  using KVTile = typename C::KVTile;
  using QTile = typename C::QTile;
  constexpr int kBM = C::kBlockM, kBN = C::kBlockN;
  constexpr int kNT = kBM / 8;       // n8 tiles of a score band (columns = queries)
  constexpr int kDT = kHeadDim / 8;  // n8 tiles of a gradient band
  constexpr bool kDV = kMode != DkDvMode::dk_only;
  constexpr bool kDK = kMode != DkDvMode::dv_only;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);  // (kBlockN, kHeadDim)
  T* sV = sK + KVTile::kElems;             // (kBlockN, kHeadDim)
  T* sQ = sV + KVTile::kElems;             // 2 stages of (kBlockM, kHeadDim)
  T* sdO = sQ + 2 * QTile::kElems;         // 2 stages of (kBlockM, kHeadDim)
  float* sLse = reinterpret_cast<float*>(sdO + 2 * QTile::kElems);  // 2 stages of (kBlockM)
  float* sD = sLse + 2 * kBM;                                        // 2 stages of (kBlockM)

  const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const SeqInfo seq = seq_info(a, b);
  const int n0 = n_block * kBN;
  if (n0 >= seq.k_rows) return;
  // Key rows past k_len (seqused_k's padding) get zero gradients: a tile of them only stores zeros.
  const int n1 = max(n0, min(n0 + kBN, seq.k_len));
  const WindowMask mask(a, seq);
  int q_lo = 0, q_hi = 0;
  if (n1 > n0) mask.query_range(n0, n1, &q_lo, &q_hi);
  const int m_begin = q_lo / kBM;
  const int m_count = q_hi > q_lo ? (q_hi + kBM - 1) / kBM - m_begin : 0;
  const int iters = m_count * a.group;  // (query head of the group, query tile)

  const int64_t bi = seq.batch_index;
  const T* gK = static_cast<const T*>(a.k) + bi * a.k_st.batch + int64_t(seq.k_start + n0) * a.k_st.row +
                int64_t(hk) * a.k_st.head;
  const T* gV = static_cast<const T*>(a.v) + bi * a.v_st.batch + int64_t(seq.k_start + n0) * a.v_st.row +
                int64_t(hk) * a.v_st.head;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int band0 = warp * 16;

  auto load_q = [&](int it, int stage) {
    const int h = hk * a.group + it / m_count;
    const int mq0 = (m_begin + it % m_count) * kBM;
    const T* gQ = static_cast<const T*>(a.q) + bi * a.q_st.batch +
                  int64_t(seq.q_start + mq0) * a.q_st.row + int64_t(h) * a.q_st.head;
    const T* gdO = static_cast<const T*>(a.dout) + bi * a.dout_st.batch +
                   int64_t(seq.q_start + mq0) * a.dout_st.row + int64_t(h) * a.dout_st.head;
    QTile::template load<C::kThreads>(sQ + stage * QTile::kElems, gQ, a.q_st.row, seq.q_len - mq0,
                                      a.head_dim, tid);
    QTile::template load<C::kThreads>(sdO + stage * QTile::kElems, gdO, a.dout_st.row,
                                      seq.q_len - mq0, a.head_dim, tid);
    if (tid < kBM) {
      const int i = mq0 + tid;
      float l2 = INFINITY, dd = 0.f;
      if (i < seq.q_len) {
        const int64_t r = seq.q_start + i;
        l2 = lse_log2(a.lse[bi * a.lse_batch + int64_t(h) * a.lse_head + r * a.lse_row]);
        dd = a.dsum[(bi * a.heads + h) * a.seqlen_q + r];
      }
      sLse[stage * kBM + tid] = l2;
      sD[stage * kBM + tid] = dd;
    }
  };

  KVTile::template load<C::kThreads>(sK, gK, a.k_st.row, n1 - n0, a.head_dim, tid);
  KVTile::template load<C::kThreads>(sV, gV, a.v_st.row, n1 - n0, a.head_dim, tid);
  if (iters > 0) load_q(0, 0);
  ptx::cp_async_commit();

  float acc_dv[kDV ? kDT : 1][4];  // (16, kHeadDim) per warp
  float acc_dk[kDK ? kDT : 1][4];
#pragma unroll
  for (int dt = 0; dt < (kDV ? kDT : 1); ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dv[dt][e] = 0.f;
#pragma unroll
  for (int dt = 0; dt < (kDK ? kDT : 1); ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[dt][e] = 0.f;

  for (int it = 0; it < iters; ++it) {
    const int stage = it & 1;
    if (it + 1 < iters) {
      load_q(it + 1, stage ^ 1);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    const T* cQ = sQ + stage * QTile::kElems;
    const T* cdO = sdO + stage * QTile::kElems;
    const float* cLse = sLse + stage * kBM;
    const float* cD = sD + stage * kBM;
    const int mq0 = (m_begin + it % m_count) * kBM;

    // acc_s = K Qᵀ                                                      // (16, kBlockM)
    float acc_s[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t af[4];
      ptx::ldmatrix_x4(af, a_frag_addr<KVTile>(sK, band0, kk * 16, lane));
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t bf[4];
        ptx::ldmatrix_x4(bf, b_frag_addr<QTile>(cQ, np * 16, kk * 16, lane));
        ptx::mma_16816<T>(acc_s[2 * np], af, bf[0], bf[1]);
        ptx::mma_16816<T>(acc_s[2 * np + 1], af, bf[2], bf[3]);
      }
    }
    const bool softcap = a.cap_in != 0.f;
    if (softcap) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[nt][e] = tanhf(acc_s[nt][e] * a.cap_in);
    }
    // Pᵀ, masked after the exponential.
    const bool need_mask = !mask.tile_all_visible(mq0, kBM, n0, kBN);
    float p[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ci = nt * 8 + 2 * t + (e & 1);  // query column inside the tile
        float x = ptx::exp2_approx(fmaf(acc_s[nt][e], a.score_scale, -cLse[ci]));
        if (need_mask && !mask.visible(mq0 + ci, n0 + band0 + g + (e >> 1) * 8)) x = 0.f;
        p[nt][e] = x;
      }

    if constexpr (kDV) {  // dV += Pᵀ dO                                  // (16, kHeadDim)
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        uint32_t pf[4];
        pf[0] = ptx::pack2<T>(p[2 * kk][0], p[2 * kk][1]);
        pf[1] = ptx::pack2<T>(p[2 * kk][2], p[2 * kk][3]);
        pf[2] = ptx::pack2<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        pf[3] = ptx::pack2<T>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < kHeadDim / 16; ++dp) {
          uint32_t bf[4];
          ptx::ldmatrix_x4_trans(bf, bt_frag_addr<QTile>(cdO, kk * 16, dp * 16, lane));
          ptx::mma_16816<T>(acc_dv[2 * dp], pf, bf[0], bf[1]);
          ptx::mma_16816<T>(acc_dv[2 * dp + 1], pf, bf[2], bf[3]);
        }
      }
    }

    if constexpr (kDK) {
      // acc_dp = V dOᵀ                                                   // (16, kBlockM)
      float acc_dp[kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dp[nt][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t af[4];
        ptx::ldmatrix_x4(af, a_frag_addr<KVTile>(sV, band0, kk * 16, lane));
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t bf[4];
          ptx::ldmatrix_x4(bf, b_frag_addr<QTile>(cdO, np * 16, kk * 16, lane));
          ptx::mma_16816<T>(acc_dp[2 * np], af, bf[0], bf[1]);
          ptx::mma_16816<T>(acc_dp[2 * np + 1], af, bf[2], bf[3]);
        }
      }
      // dSᵀ = Pᵀ ∘ (dPᵀ − D) [∘ (1 − t²)], in place in acc_dp.
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ci = nt * 8 + 2 * t + (e & 1);
          float ds = p[nt][e] * (acc_dp[nt][e] - cD[ci]);
          if (softcap) ds *= 1.f - acc_s[nt][e] * acc_s[nt][e];
          acc_dp[nt][e] = ds;
        }
      // dK += dSᵀ Q                                                     // (16, kHeadDim)
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        uint32_t pf[4];
        pf[0] = ptx::pack2<T>(acc_dp[2 * kk][0], acc_dp[2 * kk][1]);
        pf[1] = ptx::pack2<T>(acc_dp[2 * kk][2], acc_dp[2 * kk][3]);
        pf[2] = ptx::pack2<T>(acc_dp[2 * kk + 1][0], acc_dp[2 * kk + 1][1]);
        pf[3] = ptx::pack2<T>(acc_dp[2 * kk + 1][2], acc_dp[2 * kk + 1][3]);
#pragma unroll
        for (int dp = 0; dp < kHeadDim / 16; ++dp) {
          uint32_t bf[4];
          ptx::ldmatrix_x4_trans(bf, bt_frag_addr<QTile>(cQ, kk * 16, dp * 16, lane));
          ptx::mma_16816<T>(acc_dk[2 * dp], pf, bf[0], bf[1]);
          ptx::mma_16816<T>(acc_dk[2 * dp + 1], pf, bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // the next iteration's prefetch overwrites this stage
  }
  ptx::cp_async_wait<0>();

  // Epilogue: rows past k_rows and head-dim padding are not stored; rows in [k_len, k_rows) hold
  // exact zeros (their keys are masked, so P and dS are 0 there, and their K, V rows were zero-filled).
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int j = n0 + band0 + g + half * 8;
    if (j >= seq.k_rows) continue;
    const int64_t r = seq.k_start + j;
    if constexpr (kDV) {
      T* row = static_cast<T*>(a.dv) + bi * a.dv_st.batch + r * a.dv_st.row + int64_t(hk) * a.dv_st.head;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        const int col = dt * 8 + 2 * t;
        if (col < a.head_dim)
          *reinterpret_cast<uint32_t*>(row + col) =
              ptx::pack2<T>(acc_dv[dt][2 * half], acc_dv[dt][2 * half + 1]);
      }
    }
    if constexpr (kDK) {
      T* row = static_cast<T*>(a.dk) + bi * a.dk_st.batch + r * a.dk_st.row + int64_t(hk) * a.dk_st.head;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        const int col = dt * 8 + 2 * t;
        if (col < a.head_dim)
          *reinterpret_cast<uint32_t*>(row + col) =
              ptx::pack2<T>(acc_dk[dt][2 * half] * a.scale, acc_dk[dt][2 * half + 1] * a.scale);
      }
    }
  }
}

template <class T, int kHeadDim>
__global__ void __launch_bounds__(BwdDqConfig<kHeadDim>::kThreads, 1)
    flash_bwd_dq_kernel(const AttnArgs a) {
  using C = BwdDqConfig<kHeadDim>;
  using QTile = typename C::QTile;
  using KVTile = typename C::KVTile;
  constexpr int kBM = C::kBlockM, kBN = C::kBlockN;
  constexpr int kNT = kBN / 8;
  constexpr int kDT = kHeadDim / 8;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // (kBlockM, kHeadDim)
  T* sdO = sQ + QTile::kElems;             // (kBlockM, kHeadDim)
  T* sK = sdO + QTile::kElems;             // 2 stages of (kBlockN, kHeadDim)
  T* sV = sK + 2 * KVTile::kElems;         // 2 stages of (kBlockN, kHeadDim)

  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqInfo seq = seq_info(a, b);
  const int m0 = m_block * kBM;
  if (m0 >= seq.q_len) return;
  const int m1 = min(m0 + kBM, seq.q_len);
  const int hk = h / a.group;
  const WindowMask mask(a, seq);
  int key_lo, key_hi;
  mask.key_range(m0, m1, &key_lo, &key_hi);
  const int n_begin = key_lo / kBN;
  const int n_end = key_hi > key_lo ? (key_hi + kBN - 1) / kBN : n_begin;

  const int64_t bi = seq.batch_index;
  const T* gQ = static_cast<const T*>(a.q) + bi * a.q_st.batch + int64_t(seq.q_start + m0) * a.q_st.row +
                int64_t(h) * a.q_st.head;
  const T* gdO = static_cast<const T*>(a.dout) + bi * a.dout_st.batch +
                 int64_t(seq.q_start + m0) * a.dout_st.row + int64_t(h) * a.dout_st.head;
  const T* gK = static_cast<const T*>(a.k) + bi * a.k_st.batch + int64_t(seq.k_start) * a.k_st.row +
                int64_t(hk) * a.k_st.head;
  const T* gV = static_cast<const T*>(a.v) + bi * a.v_st.batch + int64_t(seq.k_start) * a.v_st.row +
                int64_t(hk) * a.v_st.head;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int band0 = warp * 16;

  auto load_kv = [&](int nb, int stage) {
    const int n0 = nb * kBN;
    KVTile::template load<C::kThreads>(sK + stage * KVTile::kElems, gK + int64_t(n0) * a.k_st.row,
                                       a.k_st.row, seq.k_len - n0, a.head_dim, tid);
    KVTile::template load<C::kThreads>(sV + stage * KVTile::kElems, gV + int64_t(n0) * a.v_st.row,
                                       a.v_st.row, seq.k_len - n0, a.head_dim, tid);
  };
  QTile::template load<C::kThreads>(sQ, gQ, a.q_st.row, m1 - m0, a.head_dim, tid);
  QTile::template load<C::kThreads>(sdO, gdO, a.dout_st.row, m1 - m0, a.head_dim, tid);
  if (n_begin < n_end) load_kv(n_begin, 0);
  ptx::cp_async_commit();

  float row_lse2[2], row_d[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = m0 + band0 + g + half * 8;
    row_lse2[half] = INFINITY;
    row_d[half] = 0.f;
    if (i < seq.q_len) {
      const int64_t r = seq.q_start + i;
      row_lse2[half] = lse_log2(a.lse[bi * a.lse_batch + int64_t(h) * a.lse_head + r * a.lse_row]);
      row_d[half] = a.dsum[(bi * a.heads + h) * a.seqlen_q + r];
    }
  }

  float acc_dq[kDT][4];  // (16, kHeadDim) per warp
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dq[dt][e] = 0.f;
  const bool softcap = a.cap_in != 0.f;

  for (int nb = n_begin; nb < n_end; ++nb) {
    const int stage = (nb - n_begin) & 1;
    if (nb + 1 < n_end) {
      load_kv(nb + 1, stage ^ 1);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncthreads();
    const T* cK = sK + stage * KVTile::kElems;
    const T* cV = sV + stage * KVTile::kElems;

    float acc_s[kNT][4], acc_dp[kNT][4];  // S = Q Kᵀ, dP = dO Vᵀ      // (16, kBlockN)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[nt][e] = acc_dp[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t aq[4], ad[4];
      ptx::ldmatrix_x4(aq, a_frag_addr<QTile>(sQ, band0, kk * 16, lane));
      ptx::ldmatrix_x4(ad, a_frag_addr<QTile>(sdO, band0, kk * 16, lane));
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t bk[4], bv[4];
        ptx::ldmatrix_x4(bk, b_frag_addr<KVTile>(cK, np * 16, kk * 16, lane));
        ptx::ldmatrix_x4(bv, b_frag_addr<KVTile>(cV, np * 16, kk * 16, lane));
        ptx::mma_16816<T>(acc_s[2 * np], aq, bk[0], bk[1]);
        ptx::mma_16816<T>(acc_s[2 * np + 1], aq, bk[2], bk[3]);
        ptx::mma_16816<T>(acc_dp[2 * np], ad, bv[0], bv[1]);
        ptx::mma_16816<T>(acc_dp[2 * np + 1], ad, bv[2], bv[3]);
      }
    }
    const int n0 = nb * kBN;
    const bool need_mask = !mask.tile_all_visible(m0, kBM, n0, kBN);
    // dS = P ∘ (dP − D) [∘ (1 − t²)], in place in acc_dp.
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e >> 1;
        float x = acc_s[nt][e];
        if (softcap) x = tanhf(x * a.cap_in);
        float pv = ptx::exp2_approx(fmaf(x, a.score_scale, -row_lse2[half]));
        if (need_mask && !mask.visible(m0 + band0 + g + half * 8, n0 + nt * 8 + 2 * t + (e & 1)))
          pv = 0.f;
        float ds = pv * (acc_dp[nt][e] - row_d[half]);
        if (softcap) ds *= 1.f - x * x;
        acc_dp[nt][e] = ds;
      }
    // dQ += dS K                                                        // (16, kHeadDim)
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t pf[4];
      pf[0] = ptx::pack2<T>(acc_dp[2 * kk][0], acc_dp[2 * kk][1]);
      pf[1] = ptx::pack2<T>(acc_dp[2 * kk][2], acc_dp[2 * kk][3]);
      pf[2] = ptx::pack2<T>(acc_dp[2 * kk + 1][0], acc_dp[2 * kk + 1][1]);
      pf[3] = ptx::pack2<T>(acc_dp[2 * kk + 1][2], acc_dp[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t bf[4];
        ptx::ldmatrix_x4_trans(bf, bt_frag_addr<KVTile>(cK, kk * 16, dp * 16, lane));
        ptx::mma_16816<T>(acc_dq[2 * dp], pf, bf[0], bf[1]);
        ptx::mma_16816<T>(acc_dq[2 * dp + 1], pf, bf[2], bf[3]);
      }
    }
    __syncthreads();
  }
  ptx::cp_async_wait<0>();

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = m0 + band0 + g + half * 8;
    if (i >= seq.q_len) continue;
    T* row = static_cast<T*>(a.dq) + bi * a.dq_st.batch + int64_t(seq.q_start + i) * a.dq_st.row +
             int64_t(h) * a.dq_st.head;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      const int col = dt * 8 + 2 * t;
      if (col < a.head_dim)
        *reinterpret_cast<uint32_t*>(row + col) =
            ptx::pack2<T>(acc_dq[dt][2 * half] * a.scale, acc_dq[dt][2 * half + 1] * a.scale);
    }
  }
}

template <class T, int kHeadDim, DkDvMode kMode>
void launch_dkdv(const AttnArgs& a, cudaStream_t stream) {
  using C = BwdDkDvConfig<kHeadDim>;
  const dim3 grid((a.max_seqlen_k + C::kBlockN - 1) / C::kBlockN, a.heads_kv, a.batch);
  auto kernel = flash_bwd_dkdv_kernel<T, kHeadDim, kMode>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes),
             "cudaFuncSetAttribute(flash_bwd_dkdv_kernel)");
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(a);
  check_launch("flash_bwd_dkdv_kernel");
}

template <class T, int kHeadDim>
void run_flash_bwd(const AttnArgs& a, cudaStream_t stream) {
  if (a.batch == 0 || a.heads == 0) return;
  const int64_t tensor_batch = a.cu_seqlens_q ? 1 : a.batch;
  const int64_t rows = tensor_batch * a.seqlen_q * a.heads;
  if (rows > 0) {
    const int64_t blocks = (rows * 32 + 255) / 256;
    flash_bwd_dsum_kernel<T><<<dim3(unsigned(blocks)), 256, 0, stream>>>(a, rows);
    check_launch("flash_bwd_dsum_kernel");
  }
  if (a.max_seqlen_k > 0) {
    if constexpr (kHeadDim <= 128) {
      launch_dkdv<T, kHeadDim, DkDvMode::both>(a, stream);
    } else {
      launch_dkdv<T, kHeadDim, DkDvMode::dv_only>(a, stream);
      launch_dkdv<T, kHeadDim, DkDvMode::dk_only>(a, stream);
    }
  }
  if (a.max_seqlen_q > 0) {
    using C = BwdDqConfig<kHeadDim>;
    const dim3 grid((a.max_seqlen_q + C::kBlockM - 1) / C::kBlockM, a.heads, a.batch);
    auto kernel = flash_bwd_dq_kernel<T, kHeadDim>;
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes),
               "cudaFuncSetAttribute(flash_bwd_dq_kernel)");
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(a);
    check_launch("flash_bwd_dq_kernel");
  }
}

}  // namespace flashattn::cuda::sm80
