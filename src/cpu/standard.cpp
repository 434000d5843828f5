// The standard (materializing) algorithm on the CPU: the measured baseline.
//   S = scale·Q Kᵀ  → written to an Nq×Nk buffer (BLAS GEMM)
//   P = softmax(S)   → read S, write an Nq×Nk buffer
//   O = P V          → read P (BLAS GEMM)
// S and P are rounded to the working dtype as a framework computing in that dtype would store
// them; products accumulate in fp32. Extra memory grows as Nq·Nk: that is the point.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/backend.hpp"
#include "core/dtype.hpp"
#include "core/scratch.hpp"

namespace flashattn::cpu {
namespace {

using detail::Params;
using detail::Scratch;
using detail::SeqSpan;
using detail::TensorRef;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A rows×d fp32 view of a tensor slice: the tensor itself when it is f32, else a converted copy.
struct F32Rows {
  const float* data = nullptr;
  int64_t ld = 0;
  Scratch<float> copy;
};
void view_rows(const Params& p, const TensorRef& t, int64_t b, int64_t row0, int64_t rows, int64_t h, F32Rows& out) {
  const int64_t d = p.head_dim;
  if (p.dtype == DType::f32) {
    out.data = static_cast<const float*>(t.data) + t.offset(b, row0, h);
    out.ld = t.row_stride;
    return;
  }
  if (out.copy.size() < size_t(std::max<int64_t>(rows * d, 1))) out.copy.allocate(size_t(std::max<int64_t>(rows * d, 1)));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < d; ++c)
      out.copy[size_t(i * d + c)] = detail::load_as_float(t.data, t.offset(b, row0 + i, h) + c, p.dtype);
  out.data = out.copy.data();
  out.ld = d;
}

void store_rows(const Params& p, const TensorRef& t, int64_t b, int64_t row0, int64_t rows, int64_t h,
                const float* src, int64_t ld) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < p.head_dim; ++c)
      detail::store_from_float(t.data, t.offset(b, row0 + i, h) + c, p.dtype, src[i * ld + c]);
}

// The scores of one (sequence, head) after scale, softcap, rounding and masking, as the standard
// path stores them; masked entries are -inf. raw_out (optional) keeps scale·q·k for softcap's backward.
void scores(const Params& p, const SeqSpan& sp, const F32Rows& q, const F32Rows& k, float* S, float* raw_out) {
  const int64_t nq = sp.q_len, nk = sp.k_len, d = p.head_dim;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(nq), int(nk), int(d), p.scale, q.data, int(q.ld),
              k.data, int(k.ld), 0.0f, S, int(nk));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < nq; ++i) {
    const detail::KeyRange r = detail::visible_keys(p, i, nq, nk);
    float* s = S + i * nk;
    for (int64_t j = 0; j < nk; ++j) {
      float x = s[j];
      if (raw_out) raw_out[i * nk + j] = x;
      if (p.softcap > 0) x = p.softcap * std::tanh(x / p.softcap);
      s[j] = (j >= r.lo && j < r.hi) ? detail::round_to(x, p.dtype) : kNegInf;
    }
  }
}

// P = softmax(S) row by row into P (rounded to dtype); lse per row (-inf for empty rows).
void softmax_rows(const Params& p, int64_t nq, int64_t nk, const float* S, float* P, float* lse) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < nq; ++i) {
    const float* s = S + i * nk;
    float* pr = P + i * nk;
    float m = kNegInf;
    for (int64_t j = 0; j < nk; ++j) m = std::max(m, s[j]);
    if (m == kNegInf) {
      std::fill(pr, pr + nk, 0.0f);
      lse[i] = kNegInf;
      continue;
    }
    float sum = 0;
    for (int64_t j = 0; j < nk; ++j) {
      pr[j] = std::exp(s[j] - m);
      sum += pr[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < nk; ++j) pr[j] = detail::round_to(pr[j] * inv, p.dtype);
    lse[i] = m + std::log(sum);
  }
}

}  // namespace

void standard_forward(const Params& p) {
  const int64_t d = p.head_dim, G = p.group_size();
  Scratch<float> S(size_t(std::max<int64_t>(p.max_seqlen_q * p.max_seqlen_k, 1)));
  Scratch<float> P(S.size());
  Scratch<float> O(size_t(std::max<int64_t>(p.max_seqlen_q * d, 1)));
  Scratch<float> lse(size_t(std::max<int64_t>(p.max_seqlen_q, 1)));
  F32Rows q, k, v;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SeqSpan sp = detail::seq_span(p, b);
    const int64_t nq = sp.q_len, nk = sp.k_len;
    if (nq == 0) continue;
    for (int64_t h = 0; h < p.heads; ++h) {
      if (h % G == 0) {
        view_rows(p, p.k, sp.batch_index, sp.k_start, nk, h / G, k);
        view_rows(p, p.v, sp.batch_index, sp.k_start, nk, h / G, v);
      }
      view_rows(p, p.q, sp.batch_index, sp.q_start, nq, h, q);
      if (nk > 0) {
        scores(p, sp, q, k, S.data(), nullptr);
        softmax_rows(p, nq, nk, S.data(), P.data(), lse.data());
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(nq), int(d), int(nk), 1.0f, P.data(), int(nk),
                    v.data, int(v.ld), 0.0f, O.data(), int(d));
      } else {
        std::fill(O.data(), O.data() + nq * d, 0.0f);
        std::fill(lse.data(), lse.data() + nq, kNegInf);
      }
      store_rows(p, p.out, sp.batch_index, sp.q_start, nq, h, O.data(), d);
      if (p.lse.data)
        for (int64_t i = 0; i < nq; ++i) p.lse.data[p.lse.offset(sp.batch_index, h, sp.q_start + i)] = lse[size_t(i)];
    }
  }
}

void standard_backward(const Params& p) {
  const int64_t d = p.head_dim, G = p.group_size();
  const size_t nn = size_t(std::max<int64_t>(p.max_seqlen_q * p.max_seqlen_k, 1));
  Scratch<float> S(nn), P(nn), dP(nn), raw(p.softcap > 0 ? nn : 0), lse(size_t(std::max<int64_t>(p.max_seqlen_q, 1)));
  Scratch<float> D(size_t(std::max<int64_t>(p.max_seqlen_q, 1)));
  Scratch<float> dQ(size_t(std::max<int64_t>(p.max_seqlen_q * d, 1)));
  Scratch<float> dK(size_t(std::max<int64_t>(p.max_seqlen_k * d, 1))), dV(dK.size());
  F32Rows q, k, v, o, dout;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SeqSpan sp = detail::seq_span(p, b);
    const int64_t nq = sp.q_len, nk = sp.k_len;
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      std::fill(dK.data(), dK.data() + nk * d, 0.0f);
      std::fill(dV.data(), dV.data() + nk * d, 0.0f);
      view_rows(p, p.k, sp.batch_index, sp.k_start, nk, hk, k);
      view_rows(p, p.v, sp.batch_index, sp.k_start, nk, hk, v);
      for (int64_t h = hk * G; h < (hk + 1) * G && nq > 0; ++h) {
        std::fill(dQ.data(), dQ.data() + nq * d, 0.0f);
        if (nk > 0) {
          view_rows(p, p.q, sp.batch_index, sp.q_start, nq, h, q);
          view_rows(p, p.out, sp.batch_index, sp.q_start, nq, h, o);
          view_rows(p, p.dout, sp.batch_index, sp.q_start, nq, h, dout);
          // Recompute S and P (the standard path materializes them again).
          scores(p, sp, q, k, S.data(), p.softcap > 0 ? raw.data() : nullptr);
          softmax_rows(p, nq, nk, S.data(), P.data(), lse.data());
          for (int64_t i = 0; i < nq; ++i) {  // D = rowsum(dO ∘ O)
            double acc = 0;
            for (int64_t c = 0; c < d; ++c) acc += double(dout.data[i * dout.ld + c]) * o.data[i * o.ld + c];
            D[size_t(i)] = float(acc);
          }
          // dV += Pᵀ dO ; dP = dO Vᵀ
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(nk), int(d), int(nq), 1.0f, P.data(), int(nk),
                      dout.data, int(dout.ld), 1.0f, dV.data(), int(d));
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(nq), int(nk), int(d), 1.0f, dout.data,
                      int(dout.ld), v.data, int(v.ld), 0.0f, dP.data(), int(nk));
          // dS = P ∘ (dP − D), through softcap's tanh, rounded as stored; written over dP.
#pragma omp parallel for schedule(static)
          for (int64_t i = 0; i < nq; ++i)
            for (int64_t j = 0; j < nk; ++j) {
              const size_t ij = size_t(i * nk + j);
              float ds = P[ij] * (dP[ij] - D[size_t(i)]);
              if (p.softcap > 0) {
                const float t = std::tanh(raw[ij] / p.softcap);
                ds *= 1 - t * t;
              }
              dP[ij] = detail::round_to(ds, p.dtype);
            }
          // dQ = scale·dS K ; dK += scale·dSᵀ Q
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(nq), int(d), int(nk), p.scale, dP.data(),
                      int(nk), k.data, int(k.ld), 0.0f, dQ.data(), int(d));
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(nk), int(d), int(nq), p.scale, dP.data(),
                      int(nk), q.data, int(q.ld), 1.0f, dK.data(), int(d));
        }
        store_rows(p, p.dq, sp.batch_index, sp.q_start, nq, h, dQ.data(), d);
      }
      store_rows(p, p.dk, sp.batch_index, sp.k_start, nk, hk, dK.data(), d);
      store_rows(p, p.dv, sp.batch_index, sp.k_start, nk, hk, dV.data(), d);
    }
  }
}

}  // namespace flashattn::cpu
