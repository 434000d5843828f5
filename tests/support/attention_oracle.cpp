// The test's own attention: an independent fp64 oracle and the plain same-precision implementation
// that FlashAttention's tolerance rule compares against. Nothing here uses the library's Params,
// mask or reference, so a shared mistake cannot hide in both.
//
// The plain implementation ("what a naive framework computes", as FlashAttention's
// attention_ref(upcast=False) does) works in the tensor's dtype with fp32 accumulation:
//   S  = round(scale · Σ_c q_c k_c)              dot product accumulated in fp32, one rounding
//   S  = round(softcap · tanh(S / softcap))      (softcap > 0), from the rounded S, in fp32
//   P  = round(softmax(S))                       max, exp and sum in fp32 over the rounded S
//   O  = round(Σ_j P_j v_j)                      fp32 accumulation, one rounding
// Backward (autograd of the above, same precision):
//   dP = round(dO · Vᵀ), D = Σ_j P_j dP_j (fp32), dS = round(P ∘ (dP − D)),
//   dS = round(dS ∘ (1 − (S/softcap)²))          (softcap > 0)
//   dQ = round(scale · Σ_j dS_j k_j), dK = round(scale · Σ dS q), dV = round(Σ Pᵀ dO): fp32 sums,
//   over all query rows and all query heads of the KV group, one rounding at the end.
// "round" is round-to-nearest-even into the tensor's dtype (a no-op for f32). With exact = true
// the same code runs in double with no rounding: that is the oracle.
#include <algorithm>
#include <cmath>
#include <limits>

#include "test_util.hpp"

namespace fa_test {

Problem make_problem(int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Hkv, int64_t d, const Options& o,
                     const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k,
                     const std::vector<int32_t>& seqused_k) {
  Problem p;
  p.B = B;
  p.Nq = Nq;
  p.Nk = Nk;
  p.H = H;
  p.Hkv = Hkv;
  p.d = d;
  // The library resolves the scale in float: 0 -> float(1/sqrt(d)).
  p.scale = o.scale != 0 ? double(o.scale) : double(float(1.0 / std::sqrt(double(d))));
  p.softcap = o.softcap;
  p.wl = o.window_left;
  p.wr = o.causal ? 0 : o.window_right;
  if (!cu_q.empty()) {
    for (size_t b = 0; b + 1 < cu_q.size(); ++b)
      p.seqs.push_back({0, cu_q[b], cu_q[b + 1] - cu_q[b], cu_k[b], cu_k[b + 1] - cu_k[b], cu_k[b + 1] - cu_k[b]});
  } else {
    for (int64_t b = 0; b < B; ++b) p.seqs.push_back({b, 0, Nq, 0, Nk, Nk});
  }
  // seqused_k: sequence b's keys are its first seqused_k[b] rows; its masks align to that count.
  for (size_t b = 0; b < seqused_k.size() && b < p.seqs.size(); ++b) p.seqs[b].k_len = seqused_k[b];
  return p;
}

int64_t Problem::work() const {
  int64_t w = 0;
  for (const Seq& s : seqs) w += s.q_len * s.k_len * H * d;
  return w;
}

namespace {

constexpr double kU32 = 1.0 / 16777216.0;  // unit roundoff of fp32, 2^-24
double gamma32(double n) { return n * kU32 / (1 - n * kU32); }

// One query row's scores and probabilities, shared by forward and backward so that both see the
// same rounded values.
template <class Acc>
struct RowSoftmax {
  std::vector<Acc> s;  // scores after scale, softcap and rounding; -inf where masked
  std::vector<Acc> P;  // probabilities (rounded); 0 where masked
  Acc m = -std::numeric_limits<Acc>::infinity();
  Acc sum = 0;
  double score_max = 0;  // running max |scale·q·k| (kept across rows)
};

template <class Acc, class Round>
void row_softmax(const Problem& p, const Seq& sq, int64_t h, int64_t i, const std::vector<double>& q,
                 const std::vector<double>& k, const Round& rnd, RowSoftmax<Acc>& r) {
  const int64_t hk = h / (p.H / p.Hkv);
  const Acc scale = Acc(p.scale), cap = Acc(p.softcap);
  const Acc ninf = -std::numeric_limits<Acc>::infinity();
  r.s.assign(size_t(sq.k_len), ninf);
  r.P.assign(size_t(sq.k_len), Acc(0));
  r.m = ninf;
  r.sum = 0;
  const double* qr = &q[size_t(p.qi(sq.b, sq.q0 + i, h))];
  for (int64_t j = 0; j < sq.k_len; ++j) {
    if (!p.visible(i, j, sq.q_len, sq.k_len)) continue;
    const double* kr = &k[size_t(p.ki(sq.b, sq.k0 + j, hk))];
    Acc dot = 0;
    for (int64_t c = 0; c < p.d; ++c) dot += Acc(qr[c]) * Acc(kr[c]);
    Acc x = rnd(dot * scale);
    r.score_max = std::max(r.score_max, double(std::abs(x)));
    if (cap > 0) x = rnd(cap * std::tanh(x / cap));
    r.s[size_t(j)] = x;
    r.m = std::max(r.m, x);
  }
  if (r.m == ninf) return;
  std::vector<Acc> e(size_t(sq.k_len), Acc(0));
  for (int64_t j = 0; j < sq.k_len; ++j)
    if (r.s[size_t(j)] != ninf) {
      e[size_t(j)] = std::exp(r.s[size_t(j)] - r.m);
      r.sum += e[size_t(j)];
    }
  for (int64_t j = 0; j < sq.k_len; ++j) r.P[size_t(j)] = rnd(e[size_t(j)] / r.sum);
}

template <class Acc>
struct Rounder {
  DType dtype;
  bool exact;
  Acc operator()(Acc x) const { return exact ? x : Acc(round_to_dtype(double(x), dtype)); }
};

template <class Acc>
FwdResult forward_impl(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, DType dtype, bool exact) {
  const Rounder<Acc> rnd{dtype, exact};
  FwdResult r;
  r.out.assign(size_t(p.B * p.Nq * p.H * p.d), 0.0);
  r.lse.assign(size_t(p.B * p.H * p.Nq), -std::numeric_limits<double>::infinity());
  r.lse_tol.assign(r.lse.size(), 0.0);
  r.row_score_max.assign(r.lse.size(), 0.0);
  RowSoftmax<Acc> row;
  std::vector<Acc> acc(static_cast<size_t>(p.d));
  for (const Seq& sq : p.seqs)
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t hk = h / (p.H / p.Hkv);
      double kmax = 0;  // largest key norm of this head and sequence (for the LSE bound)
      for (int64_t j = 0; j < sq.k_len; ++j) {
        double n2 = 0;
        for (int64_t c = 0; c < p.d; ++c) n2 += k[size_t(p.ki(sq.b, sq.k0 + j, hk, c))] * k[size_t(p.ki(sq.b, sq.k0 + j, hk, c))];
        kmax = std::max(kmax, std::sqrt(n2));
      }
      for (int64_t i = 0; i < sq.q_len; ++i) {
        row_softmax<Acc>(p, sq, h, i, q, k, rnd, row);
        r.score_max = row.score_max;
        if (row.m == -std::numeric_limits<Acc>::infinity()) continue;  // no visible key: out 0, LSE -inf
        std::fill(acc.begin(), acc.end(), Acc(0));
        for (int64_t j = 0; j < sq.k_len; ++j) {
          const Acc pj = row.P[size_t(j)];
          if (pj == 0) continue;
          const double* vr = &v[size_t(p.ki(sq.b, sq.k0 + j, hk))];
          for (int64_t c = 0; c < p.d; ++c) acc[size_t(c)] += pj * Acc(vr[c]);
        }
        const int64_t o = p.qi(sq.b, sq.q0 + i, h);
        for (int64_t c = 0; c < p.d; ++c) r.out[size_t(o + c)] = double(rnd(acc[size_t(c)]));
        const int64_t l = p.li(sq.b, h, sq.q0 + i);
        r.lse[size_t(l)] = double(row.m) + std::log(double(row.sum));
        for (int64_t j = 0; j < sq.k_len; ++j)
          if (row.s[size_t(j)] != -std::numeric_limits<Acc>::infinity())
            r.row_score_max[size_t(l)] = std::max(r.row_score_max[size_t(l)], std::abs(double(row.s[size_t(j)])));
        // LSE bound for an fp32 implementation (lse_within): the scores are fp32 dot products of d
        // terms, each off by at most γ_d·scale·Σ_c|q_c k_c| ≤ γ_d·scale·‖q‖·max‖k‖ (Cauchy–Schwarz);
        // LSE is a smooth maximum (weights summing to 1), so it moves by at most that much; the fp32
        // sum of ≤ k_len positive exponentials is off by a relative γ_{k_len}, i.e. γ_{k_len} in the
        // log; log/exp/the final add contribute a few units of roundoff of |LSE| (8u allowed).
        double qn2 = 0;
        for (int64_t c = 0; c < p.d; ++c) qn2 += q[size_t(o + c)] * q[size_t(o + c)];
        r.lse_tol[size_t(l)] = gamma32(double(p.d)) * std::abs(p.scale) * std::sqrt(qn2) * kmax +
                               gamma32(double(sq.k_len)) + 8 * kU32 * std::max(1.0, std::abs(r.lse[size_t(l)]));
      }
    }
  return r;
}

template <class Acc>
BwdResult backward_impl(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                        const std::vector<double>& v, const std::vector<double>& dout, DType dtype, bool exact) {
  const Rounder<Acc> rnd{dtype, exact};
  const size_t nq = size_t(p.B * p.Nq * p.H * p.d), nk = size_t(p.B * p.Nk * p.Hkv * p.d);
  BwdResult r;
  r.dq.assign(nq, 0.0);
  std::vector<Acc> dk_acc(nk, Acc(0)), dv_acc(nk, Acc(0));
  const Acc cap = Acc(p.softcap), scale = Acc(p.scale);
  RowSoftmax<Acc> row;
  std::vector<Acc> dS, acc(static_cast<size_t>(p.d));
  for (const Seq& sq : p.seqs)
    for (int64_t h = 0; h < p.H; ++h) {
      const int64_t hk = h / (p.H / p.Hkv);
      for (int64_t i = 0; i < sq.q_len; ++i) {
        row_softmax<Acc>(p, sq, h, i, q, k, rnd, row);
        if (row.m == -std::numeric_limits<Acc>::infinity()) continue;  // no visible key: gradients 0
        const int64_t o = p.qi(sq.b, sq.q0 + i, h);
        const double* dor = &dout[size_t(o)];
        const double* qr = &q[size_t(o)];
        dS.assign(size_t(sq.k_len), Acc(0));
        Acc D = 0;
        for (int64_t j = 0; j < sq.k_len; ++j) {
          if (row.s[size_t(j)] == -std::numeric_limits<Acc>::infinity()) continue;
          const double* vr = &v[size_t(p.ki(sq.b, sq.k0 + j, hk))];
          Acc dp = 0;
          for (int64_t c = 0; c < p.d; ++c) dp += Acc(dor[c]) * Acc(vr[c]);
          dS[size_t(j)] = rnd(dp);  // dP for now
          D += row.P[size_t(j)] * dS[size_t(j)];
        }
        std::fill(acc.begin(), acc.end(), Acc(0));
        for (int64_t j = 0; j < sq.k_len; ++j) {
          if (row.s[size_t(j)] == -std::numeric_limits<Acc>::infinity()) continue;
          const Acc pj = row.P[size_t(j)];
          Acc ds = rnd(pj * (dS[size_t(j)] - D));
          if (cap > 0) {
            const Acc t = row.s[size_t(j)] / cap;
            ds = rnd(ds * (Acc(1) - t * t));
          }
          const int64_t kj = p.ki(sq.b, sq.k0 + j, hk);
          const double* kr = &k[size_t(kj)];
          for (int64_t c = 0; c < p.d; ++c) {
            acc[size_t(c)] += ds * Acc(kr[c]);
            dk_acc[size_t(kj + c)] += ds * Acc(qr[c]);
            dv_acc[size_t(kj + c)] += pj * Acc(dor[c]);
          }
        }
        for (int64_t c = 0; c < p.d; ++c) r.dq[size_t(o + c)] = double(rnd(scale * acc[size_t(c)]));
      }
    }
  r.dk.resize(nk);
  r.dv.resize(nk);
  for (size_t x = 0; x < nk; ++x) {
    r.dk[x] = double(rnd(scale * dk_acc[x]));
    r.dv[x] = double(rnd(dv_acc[x]));
  }
  return r;
}

}  // namespace

FwdResult plain_forward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                        const std::vector<double>& v, DType dtype, bool exact) {
  return exact ? forward_impl<double>(p, q, k, v, dtype, true) : forward_impl<float>(p, q, k, v, dtype, false);
}

BwdResult plain_backward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                         const std::vector<double>& v, const std::vector<double>& dout, DType dtype, bool exact) {
  return exact ? backward_impl<double>(p, q, k, v, dout, dtype, true)
               : backward_impl<float>(p, q, k, v, dout, dtype, false);
}

std::vector<char> masked_query_rows(const Problem& p) {
  std::vector<char> m(size_t(p.B * p.Nq * p.H), 0);
  for (const Seq& sq : p.seqs)
    for (int64_t i = 0; i < sq.q_len; ++i) {
      bool any = false;
      for (int64_t j = 0; j < sq.k_len && !any; ++j) any = p.visible(i, j, sq.q_len, sq.k_len);
      if (!any)
        for (int64_t h = 0; h < p.H; ++h) m[size_t((sq.b * p.Nq + sq.q0 + i) * p.H + h)] = 1;
    }
  return m;
}

std::vector<char> unseen_keys(const Problem& p) {
  std::vector<char> m(size_t(p.B * p.Nk * p.Hkv), 0);
  for (const Seq& sq : p.seqs)
    for (int64_t j = 0; j < std::max(sq.k_len, sq.k_rows); ++j) {
      bool seen = false;  // padding rows (j >= k_len) are no key: never seen
      for (int64_t i = 0; i < sq.q_len && !seen && j < sq.k_len; ++i) seen = p.visible(i, j, sq.q_len, sq.k_len);
      if (!seen)
        for (int64_t h = 0; h < p.Hkv; ++h) m[size_t((sq.b * p.Nk + sq.k0 + j) * p.Hkv + h)] = 1;
    }
  return m;
}

}  // namespace fa_test
