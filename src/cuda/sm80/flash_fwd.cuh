// Flash forward on mma.sync (sm80 and newer). One CTA: kBlockM query rows of one head.
//   load Q (cp.async)              -> sQ                         // (kBlockM, kHeadDim)
//   for each key tile j in the window's range:
//     cp.async K_{j+1}, V_{j+1} into the other stage             // (kBlockN, kHeadDim) each
//     acc_s = Q K_jᵀ               (ldmatrix A from sQ, B from sK)
//     softcap, boundary-tile mask, online softmax (exp2, scale·log2e folded on the host)
//     acc_o = acc_o * rescale + P V_j  (P straight from registers, V via ldmatrix.trans)
//   O = acc_o / row_sum, LSE = row_max + log(row_sum): written once.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/args.hpp"
#include "cuda/sm80/fragment_softmax.cuh"
#include "cuda/sm80/mask.cuh"
#include "cuda/sm80/ptx.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/sm80/smem_tile.cuh"
#include "cuda/sm80/launch.hpp"
#include "cuda/sm80/tile_config.cuh"

namespace flashattn::cuda::sm80 {

template <class T, int kHeadDim>
__global__ void __launch_bounds__(FwdConfig<kHeadDim>::kThreads, 1)
    flash_fwd_kernel(const AttnArgs a) {
  using C = FwdConfig<kHeadDim>;
  using QTile = typename C::QTile;
  using KVTile = typename C::KVTile;
  constexpr int kBM = C::kBlockM, kBN = C::kBlockN, kBands = C::kBands;
  constexpr int kNT = kBN / 8;       // n8 tiles of a score band
  constexpr int kDT = kHeadDim / 8;  // n8 tiles of an output band

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // (kBlockM, kHeadDim)
  T* sK = sQ + QTile::kElems;              // 2 stages of (kBlockN, kHeadDim)
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
  const T* gK = static_cast<const T*>(a.k) + bi * a.k_st.batch + int64_t(seq.k_start) * a.k_st.row +
                int64_t(hk) * a.k_st.head;
  const T* gV = static_cast<const T*>(a.v) + bi * a.v_st.batch + int64_t(seq.k_start) * a.v_st.row +
                int64_t(hk) * a.v_st.head;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int band0 = warp * 16 * kBands;  // first row of this warp inside the tile

  auto load_kv = [&](int nb, int stage) {
    const int n0 = nb * kBN;
    KVTile::template load<C::kThreads>(sK + stage * KVTile::kElems, gK + int64_t(n0) * a.k_st.row,
                                       a.k_st.row, seq.k_len - n0, a.head_dim, tid);
    KVTile::template load<C::kThreads>(sV + stage * KVTile::kElems, gV + int64_t(n0) * a.v_st.row,
                                       a.v_st.row, seq.k_len - n0, a.head_dim, tid);
  };

  QTile::template load<C::kThreads>(sQ, gQ, a.q_st.row, m1 - m0, a.head_dim, tid);
  if (n_begin < n_end) load_kv(n_begin, 0);
  ptx::cp_async_commit();

  float acc_o[kBands][kDT][4];  // (16 * kBands, kHeadDim) per warp
#pragma unroll
  for (int bi_ = 0; bi_ < kBands; ++bi_)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[bi_][dt][e] = 0.f;
  RowState st[kBands][2];

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

    // acc_s = Q Kᵀ                                                  // (16 * kBands, kBlockN)
    float acc_s[kBands][kNT][4];
#pragma unroll
    for (int bi_ = 0; bi_ < kBands; ++bi_)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[bi_][nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t af[kBands][4];
#pragma unroll
      for (int bi_ = 0; bi_ < kBands; ++bi_)
        ptx::ldmatrix_x4(af[bi_], a_frag_addr<QTile>(sQ, band0 + bi_ * 16, kk * 16, lane));
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t bf[4];
        ptx::ldmatrix_x4(bf, b_frag_addr<KVTile>(cK, np * 16, kk * 16, lane));
#pragma unroll
        for (int bi_ = 0; bi_ < kBands; ++bi_) {
          ptx::mma_16816<T>(acc_s[bi_][2 * np], af[bi_], bf[0], bf[1]);
          ptx::mma_16816<T>(acc_s[bi_][2 * np + 1], af[bi_], bf[2], bf[3]);
        }
      }
    }

    if (a.cap_in != 0.f) {  // softcap: t = tanh(x·scale/cap); log2 score = t·cap·log2e
#pragma unroll
      for (int bi_ = 0; bi_ < kBands; ++bi_)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[bi_][nt][e] = tanhf(acc_s[bi_][nt][e] * a.cap_in);
    }

    const int n0 = nb * kBN;
    if (!mask.tile_all_visible(m0, kBM, n0, kBN)) {  // boundary tile: per-element mask
#pragma unroll
      for (int bi_ = 0; bi_ < kBands; ++bi_)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = m0 + band0 + bi_ * 16 + g + (e >> 1) * 8;
            const int j = n0 + nt * 8 + 2 * t + (e & 1);
            if (!mask.visible(i, j)) acc_s[bi_][nt][e] = -INFINITY;
          }
    }

#pragma unroll
    for (int bi_ = 0; bi_ < kBands; ++bi_) {
      float rescale[2];
      softmax_tile(acc_s[bi_], st[bi_], a.score_scale, rescale);
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        acc_o[bi_][dt][0] *= rescale[0];
        acc_o[bi_][dt][1] *= rescale[0];
        acc_o[bi_][dt][2] *= rescale[1];
        acc_o[bi_][dt][3] *= rescale[1];
      }
    }

    // acc_o += P V                                                  // (16 * kBands, kHeadDim)
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t pf[kBands][4];
#pragma unroll
      for (int bi_ = 0; bi_ < kBands; ++bi_) {
        pf[bi_][0] = ptx::pack2<T>(acc_s[bi_][2 * kk][0], acc_s[bi_][2 * kk][1]);
        pf[bi_][1] = ptx::pack2<T>(acc_s[bi_][2 * kk][2], acc_s[bi_][2 * kk][3]);
        pf[bi_][2] = ptx::pack2<T>(acc_s[bi_][2 * kk + 1][0], acc_s[bi_][2 * kk + 1][1]);
        pf[bi_][3] = ptx::pack2<T>(acc_s[bi_][2 * kk + 1][2], acc_s[bi_][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kHeadDim / 16; ++dp) {
        uint32_t bf[4];
        ptx::ldmatrix_x4_trans(bf, bt_frag_addr<KVTile>(cV, kk * 16, dp * 16, lane));
#pragma unroll
        for (int bi_ = 0; bi_ < kBands; ++bi_) {
          ptx::mma_16816<T>(acc_o[bi_][2 * dp], pf[bi_], bf[0], bf[1]);
          ptx::mma_16816<T>(acc_o[bi_][2 * dp + 1], pf[bi_], bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // the next iteration's prefetch overwrites this stage
  }
  ptx::cp_async_wait<0>();

  // Epilogue: O = acc_o / row_sum, LSE; rows past q_len and head-dim padding are not stored.
  T* gO = static_cast<T*>(a.out) + bi * a.out_st.batch + int64_t(seq.q_start) * a.out_st.row +
          int64_t(h) * a.out_st.head;
#pragma unroll
  for (int bi_ = 0; bi_ < kBands; ++bi_)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      RowState& s = st[bi_][half];
      s.row_sum = quad_sum(s.row_sum);
      const float inv = s.inv_sum();
      const int i = m0 + band0 + bi_ * 16 + g + half * 8;
      if (i < seq.q_len) {
        T* row = gO + int64_t(i) * a.out_st.row;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          const int col = dt * 8 + 2 * t;
          if (col < a.head_dim)
            *reinterpret_cast<uint32_t*>(row + col) =
                ptx::pack2<T>(acc_o[bi_][dt][2 * half] * inv, acc_o[bi_][dt][2 * half + 1] * inv);
        }
        if (t == 0 && a.lse != nullptr)
          a.lse[bi * a.lse_batch + int64_t(h) * a.lse_head + int64_t(seq.q_start + i) * a.lse_row] =
              s.lse();
      }
    }
}

template <class T, int kHeadDim>
void run_flash_fwd(const AttnArgs& a, cudaStream_t stream) {
  using C = FwdConfig<kHeadDim>;
  const dim3 grid((a.max_seqlen_q + C::kBlockM - 1) / C::kBlockM, a.heads, a.batch);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  auto kernel = flash_fwd_kernel<T, kHeadDim>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes),
             "cudaFuncSetAttribute(flash_fwd_kernel)");
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(a);
  check_launch("flash_fwd_kernel");
}

}  // namespace flashattn::cuda::sm80
