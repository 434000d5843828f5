// The standard (materializing) algorithm on the CPU: the measured baseline.
//
//   pass 1  S = scale·Q Kᵀ (+ softcap, mask)   → written to an Nq×Nk buffer
//   pass 2  P = softmax(S)                      → S read back, P written to an Nq×Nk buffer
//   pass 3  O = P V                             → P read back
//
// S and P are stored in the working dtype, as a framework computing in that dtype stores them;
// products accumulate in fp32. The arithmetic uses the same SIMD tile kernels as the flash path
// (src/cpu/tile_kernels.hpp), so that the two algorithms differ only in what they keep on chip and
// what they send to main memory. Extra memory grows as Nq·Nk: that is the point.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/backend.hpp"
#include "core/scratch.hpp"
#include "cpu/flash_common.hpp"
#include "cpu/isa.hpp"

namespace flashattn::cpu {
namespace {

using detail::Params;
using detail::Scratch;
using detail::SeqSpan;

constexpr int kRows = 64;  // query rows per block of a pass
constexpr int kKeys = 64;  // keys per tile of the P·V-like products
constexpr float kLn2 = 0.69314718055994530942f;

// Runs one pass and, when the caller asked for a profile, records its time, FLOPs and the
// main-memory bytes it implies.
template <class Fn>
void stage(const Params& p, const char* name, double flops, double bytes, Fn&& fn) {
  if (!p.profile) return fn();
  const double t0 = omp_get_wtime();
  fn();
  p.profile->add(name, omp_get_wtime() - t0, flops, bytes);
}

// K and V of one (sequence, KV head) in the fp32 layouts the tile GEMMs take. O(Nk·d) memory.
struct KvHead {
  int64_t nk_pad = 0;
  Scratch<float> k, kt, v, vt;  // k, v: (nk, d_pad) rows; kt, vt: (d, nk_pad) transposed, zero-padded

  void load(const Params& p, const TileKernels& tk, const SeqSpan& sp, int64_t hk, bool transposed_v) {
    const int64_t d = p.head_dim, d_pad = pad_n(d), nk = sp.k_len;
    nk_pad = pad_n(std::max<int64_t>(nk, 1));
    k.allocate(size_t(std::max<int64_t>(nk, 1) * d_pad));
    v.allocate(k.size());
    std::fill(k.data(), k.data() + k.size(), 0.0f);
    std::fill(v.data(), v.data() + v.size(), 0.0f);
    load_rows(p, tk, p.k, sp, sp.k_start, hk, 0, int(nk), 1.0f, k.data(), d_pad);
    load_rows(p, tk, p.v, sp, sp.k_start, hk, 0, int(nk), 1.0f, v.data(), d_pad);
    kt.allocate(size_t(d * nk_pad));
    transpose_tile(k.data(), int(nk), int(d), d_pad, kt.data(), nk_pad);
    if (transposed_v) {
      vt.allocate(size_t(d * nk_pad));
      transpose_tile(v.data(), int(nk), int(d), d_pad, vt.data(), nk_pad);
    }
  }
};

// One materialized Nq×Nk matrix in the working dtype, row-major with leading dimension nk.
struct Matrix {
  Scratch<char> bytes;
  int64_t nk = 0;
  size_t esz = 4;
  void allocate(int64_t nq, int64_t nk_, DType t) {
    nk = nk_;
    esz = dtype_bytes(t);
    bytes.allocate(size_t(std::max<int64_t>(nq * nk, 1)) * esz);
  }
  char* row(int64_t i) { return bytes.data() + size_t(i * nk) * esz; }
};

// Pass 1: S rows of one head, scale·q·k (capped, masked to -inf), rounded to the dtype as stored.
void pass_scores(const Params& p, const TileKernels& tk, const SeqSpan& sp, int64_t h, const KvHead& kv, Matrix& S) {
  const int64_t d = p.head_dim, d_pad = pad_n(d), nq = sp.q_len, nk = sp.k_len;
  const bool capped = p.softcap > 0;
#pragma omp parallel
  {
    Scratch<float> q(size_t(kRows * d_pad)), s(size_t(kRows * kv.nk_pad));
    KeyRange range[kRows];
#pragma omp for schedule(static)
    for (int64_t i0 = 0; i0 < nq; i0 += kRows) {
      const int mq = int(std::min<int64_t>(kRows, nq - i0));
      load_rows(p, tk, p.q, sp, sp.q_start, h, i0, mq, p.scale, q.data(), d_pad);
      tk.gemm(mq, int(kv.nk_pad), int(d), q.data(), d_pad, 1, kv.kt.data(), kv.nk_pad, s.data(), kv.nk_pad, nullptr,
              false);
      for (int r = 0; r < mq; ++r) {
        range[r] = detail::visible_keys(p, i0 + r, nq, nk);
        if (capped) tk.softcap(s.data() + r * kv.nk_pad, int(nk), p.softcap, 1.0f, nullptr);
      }
      mask_tile(range, mq, 0, int(nk), s.data(), kv.nk_pad);
      for (int r = 0; r < mq; ++r) tk.store(s.data() + r * kv.nk_pad, int(nk), 1.0f, p.dtype, S.row(i0 + r));
    }
  }
}

// Pass 2: P = softmax(S) row by row (S read back, P written); lse[i] in natural log, -inf for rows
// that see no key (their P row is 0). Exponentials as exp2 of S·log2(e), taken while reading S.
void pass_softmax(const Params& p, const TileKernels& tk, int64_t nq, Matrix& S, Matrix& P, float* lse) {
  const int nk = int(S.nk);
#pragma omp parallel
  {
    Scratch<float> row(size_t(std::max(nk, 1)));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < nq; ++i) {
      tk.load(S.row(i), p.dtype, nk, kLog2e, row.data());
      const float m = tk.row_max(row.data(), nk);
      if (m == -std::numeric_limits<float>::infinity()) {
        std::fill(row.data(), row.data() + nk, 0.0f);
        tk.store(row.data(), nk, 1.0f, p.dtype, P.row(i));
        lse[i] = m;
        continue;
      }
      const float sum = tk.exp2_sum(row.data(), nk, m);
      tk.store(row.data(), nk, 1.0f / sum, p.dtype, P.row(i));
      lse[i] = (m + std::log2(sum)) * kLn2;
    }
  }
}

// C rows [i0, i0+mq) = A rows · B, where A is a materialized Nq×Nk matrix (read back tile by tile)
// and B is (nk, d_pad) fp32 rows: the P·V, dS·K pass. Result multiplied by mult and stored to `dst`.
void pass_rows_times(const Params& p, const TileKernels& tk, const SeqSpan& sp, int64_t h, Matrix& A, const float* B,
                     float mult, const detail::TensorRef& dst) {
  const int64_t d = p.head_dim, d_pad = pad_n(d), nq = sp.q_len, nk = sp.k_len;
  char* base = static_cast<char*>(dst.data);
  const size_t esz = dtype_bytes(p.dtype);
#pragma omp parallel
  {
    Scratch<float> a(size_t(kRows * kKeys)), acc(size_t(kRows * d_pad));
#pragma omp for schedule(static)
    for (int64_t i0 = 0; i0 < nq; i0 += kRows) {
      const int mq = int(std::min<int64_t>(kRows, nq - i0));
      std::fill(acc.data(), acc.data() + mq * d_pad, 0.0f);
      for (int64_t j0 = 0; j0 < nk; j0 += kKeys) {
        const int nt = int(std::min<int64_t>(kKeys, nk - j0));
        for (int r = 0; r < mq; ++r) tk.load(A.row(i0 + r) + size_t(j0) * A.esz, p.dtype, nt, 1.0f, a.data() + r * kKeys);
        tk.gemm(mq, int(d_pad), nt, a.data(), kKeys, 1, B + j0 * d_pad, d_pad, acc.data(), d_pad, nullptr, true);
      }
      for (int r = 0; r < mq; ++r)
        tk.store(acc.data() + r * d_pad, int(d), mult, p.dtype,
                 base + dst.offset(sp.batch_index, sp.q_start + i0 + r, h) * int64_t(esz));
    }
  }
}

}  // namespace

void standard_forward(const Params& p) {
  const TileKernels& tk = tile_kernels();
  const int64_t G = p.group_size();
  Matrix S, P;
  Scratch<float> lse(size_t(std::max<int64_t>(p.max_seqlen_q, 1)));
  KvHead kv;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SeqSpan sp = detail::seq_span(p, b);
    if (sp.q_len == 0) continue;
    S.allocate(sp.q_len, sp.k_len, p.dtype);
    P.allocate(sp.q_len, sp.k_len, p.dtype);
    for (int64_t h = 0; h < p.heads; ++h) {
      const double e = double(dtype_bytes(p.dtype)), nn = double(sp.q_len) * double(sp.k_len);
      const double qd = double(sp.q_len * p.head_dim), kd = double(sp.k_len * p.head_dim);
      if (h % G == 0) kv.load(p, tk, sp, h / G, false);
      stage(p, "S = scale·QKᵀ  (write S)", 2 * nn * double(p.head_dim), e * (qd + kd + nn),
            [&] { pass_scores(p, tk, sp, h, kv, S); });
      stage(p, "P = softmax(S) (read S, write P)", 0, 2 * e * nn,
            [&] { pass_softmax(p, tk, sp.q_len, S, P, lse.data()); });
      stage(p, "O = P·V        (read P)", 2 * nn * double(p.head_dim), e * (nn + kd + qd),
            [&] { pass_rows_times(p, tk, sp, h, P, kv.v.data(), 1.0f, p.out); });
      if (p.lse.data)
        for (int64_t i = 0; i < sp.q_len; ++i) p.lse.data[p.lse.offset(sp.batch_index, h, sp.q_start + i)] = lse[size_t(i)];
    }
  }
}

void standard_backward(const Params& p) {
  const TileKernels& tk = tile_kernels();
  const int64_t G = p.group_size(), d = p.head_dim, d_pad = pad_n(d);
  const size_t esz = dtype_bytes(p.dtype);
  const float ninf = -std::numeric_limits<float>::infinity();
  Matrix S, P, dP;
  Scratch<float> lse(size_t(std::max<int64_t>(p.max_seqlen_q, 1)));
  KvHead kv;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SeqSpan sp = detail::seq_span(p, b);
    const int64_t nq = sp.q_len, nk = sp.k_len;
    S.allocate(nq, nk, p.dtype);
    P.allocate(nq, nk, p.dtype);
    dP.allocate(nq, nk, p.dtype);
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      kv.load(p, tk, sp, hk, true);
      Scratch<float> dk(size_t(std::max<int64_t>(nk, 1) * d_pad)), dv(dk.size());
      std::fill(dk.data(), dk.data() + dk.size(), 0.0f);
      std::fill(dv.data(), dv.data() + dv.size(), 0.0f);
      for (int64_t h = hk * G; h < (hk + 1) * G && nq > 0; ++h) {
        const double e = double(esz), nn = double(nq) * double(nk), qd = double(nq * d), kd = double(nk * d);
        // Recompute S and P (materialized again).
        stage(p, "S = scale·QKᵀ  (write S)", 2 * nn * double(d), e * (qd + kd + nn), [&] { pass_scores(p, tk, sp, h, kv, S); });
        stage(p, "P = softmax(S) (read S, write P)", 0, 2 * e * nn, [&] { pass_softmax(p, tk, nq, S, P, lse.data()); });
        stage(p, "dP = dO·Vᵀ     (write dP)", 2 * nn * double(d), e * (qd + kd + nn), [&] {
#pragma omp parallel
          {
            Scratch<float> g{size_t(kRows * d_pad)}, s{size_t(kRows * kv.nk_pad)};
#pragma omp for schedule(static)
            for (int64_t i0 = 0; i0 < nq; i0 += kRows) {
              const int mq = int(std::min<int64_t>(kRows, nq - i0));
              load_rows(p, tk, p.dout, sp, sp.q_start, h, i0, mq, 1.0f, g.data(), d_pad);
              tk.gemm(mq, int(kv.nk_pad), int(d), g.data(), d_pad, 1, kv.vt.data(), kv.nk_pad, s.data(), kv.nk_pad,
                      nullptr, false);
              for (int r = 0; r < mq; ++r) tk.store(s.data() + r * kv.nk_pad, int(nk), 1.0f, p.dtype, dP.row(i0 + r));
            }
          }
        });
        // dS = P ∘ (dP − D) with D = rowsum(P ∘ dP) from the stored P and dP, as a framework's softmax
        // backward computes it (through softcap's tanh: t = capped score / cap); written over dP.
        stage(p, "dS = P∘(dP−D)  (read P, dP; write dS)", 0, (p.softcap > 0 ? 4 : 3) * e * nn, [&] {
#pragma omp parallel
          {
            Scratch<float> prow{size_t(kv.nk_pad)}, trow{size_t(kv.nk_pad)}, s{size_t(kv.nk_pad)};
#pragma omp for schedule(static)
            for (int64_t i = 0; i < nq; ++i) {
              tk.load(P.row(i), p.dtype, int(nk), 1.0f, prow.data());
              tk.load(dP.row(i), p.dtype, int(nk), 1.0f, s.data());
              const float* t = nullptr;
              if (p.softcap > 0) {
                tk.load(S.row(i), p.dtype, int(nk), 1.0f / p.softcap, trow.data());
                for (int64_t j = 0; j < nk; ++j)
                  if (trow[size_t(j)] == ninf) trow[size_t(j)] = 0.0f;  // masked: P = 0 there anyway
                t = trow.data();
              }
              tk.dsoftmax(prow.data(), s.data(), tk.dot(prow.data(), s.data(), int(nk)), t, int(nk), s.data());
              tk.store(s.data(), int(nk), 1.0f, p.dtype, dP.row(i));
            }
          }
        });
        // dK += dSᵀ Q, dV += Pᵀ dO: per key tile over all query tiles (each thread owns its key rows)
        stage(p, "dK += dSᵀ·Q, dV += Pᵀ·dO (read dS, P)", 4 * nn * double(d), e * (2 * nn + 2 * qd + 2 * kd), [&] {
#pragma omp parallel
          {
            Scratch<float> g{size_t(kRows * d_pad)}, q_tile{size_t(kRows * d_pad)};
            Scratch<float> ds_tile{size_t(kRows * kKeys)}, p_tile{size_t(kRows * kKeys)};
#pragma omp for schedule(static)
            for (int64_t j0 = 0; j0 < nk; j0 += kKeys) {
              const int nt = int(std::min<int64_t>(kKeys, nk - j0));
              for (int64_t i0 = 0; i0 < nq; i0 += kRows) {
                const int mq = int(std::min<int64_t>(kRows, nq - i0));
                for (int r = 0; r < mq; ++r) {
                  tk.load(dP.row(i0 + r) + size_t(j0) * esz, p.dtype, nt, 1.0f, ds_tile.data() + r * kKeys);
                  tk.load(P.row(i0 + r) + size_t(j0) * esz, p.dtype, nt, 1.0f, p_tile.data() + r * kKeys);
                }
                load_rows(p, tk, p.q, sp, sp.q_start, h, i0, mq, 1.0f, q_tile.data(), d_pad);
                load_rows(p, tk, p.dout, sp, sp.q_start, h, i0, mq, 1.0f, g.data(), d_pad);
                tk.gemm(nt, int(d_pad), mq, ds_tile.data(), 1, kKeys, q_tile.data(), d_pad, dk.data() + j0 * d_pad,
                        d_pad, nullptr, true);
                tk.gemm(nt, int(d_pad), mq, p_tile.data(), 1, kKeys, g.data(), d_pad, dv.data() + j0 * d_pad, d_pad,
                        nullptr, true);
              }
            }
          }
        });
        // dQ = scale·dS K (dS read back once more)
        stage(p, "dQ = scale·dS·K (read dS)", 2 * nn * double(d), e * (nn + kd + qd),
              [&] { pass_rows_times(p, tk, sp, h, dP, kv.k.data(), p.scale, p.dq); });
      }
      if (nq == 0)  // no query: dq has no rows; dk, dv are 0
        std::fill(dk.data(), dk.data() + dk.size(), 0.0f);
      char* dk_base = static_cast<char*>(p.dk.data);
      char* dv_base = static_cast<char*>(p.dv.data);
      for (int64_t j = 0; j < nk; ++j) {
        tk.store(dk.data() + j * d_pad, int(d), p.scale, p.dtype, dk_base + p.dk.offset(sp.batch_index, sp.k_start + j, hk) * int64_t(esz));
        tk.store(dv.data() + j * d_pad, int(d), 1.0f, p.dtype, dv_base + p.dv.offset(sp.batch_index, sp.k_start + j, hk) * int64_t(esz));
      }
      zero_key_padding(p, sp, hk);  // rows past seqused_k
    }
  }
}

}  // namespace flashattn::cpu
