// The float64 reference (the spec). Materializes each score row, everything in double.
// Visibility is written out here from the definition, not taken from the kernels' helpers.
#include "cpu/reference.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.hpp"

namespace flashattn::cpu {
namespace {

using detail::Params;
using detail::SeqSpan;

double load(const detail::TensorRef& t, DType dtype, int64_t b, int64_t i, int64_t h, int64_t c) {
  return detail::load_as_float(t.data, t.offset(b, i, h) + c, dtype);
}

// Definition (docs/semantics.md): query i of a sequence with q_len queries and k_len keys (its
// seqused_k entry when given: seq_span; the key rows past it are never read) sees key j iff
//   j >= i + k_len - q_len - window_left    (when window_left >= 0)
//   j <= i + k_len - q_len + window_right   (when window_right >= 0)
//   j <= i + k_len - q_len                  (when causal)
bool sees(const Params& p, int64_t i, int64_t j, int64_t q_len, int64_t k_len) {
  const int64_t shift = k_len - q_len;
  if (p.causal && j > i + shift) return false;
  if (p.window_left >= 0 && j < i + shift - p.window_left) return false;
  if (p.window_right >= 0 && j > i + shift + p.window_right) return false;
  return true;
}


// K and V of one (sequence, KV head), converted to double once: [j * d + c].
struct KvSlice {
  std::vector<double> k, v;
  KvSlice(const Params& p, const SeqSpan& sp, int64_t hk) : k(size_t(sp.k_len * p.head_dim)), v(k.size()) {
    for (int64_t j = 0; j < sp.k_len; ++j)
      for (int64_t c = 0; c < p.head_dim; ++c) {
        k[size_t(j * p.head_dim + c)] = load(p.k, p.dtype, sp.batch_index, sp.k_start + j, hk, c);
        v[size_t(j * p.head_dim + c)] = load(p.v, p.dtype, sp.batch_index, sp.k_start + j, hk, c);
      }
  }
};

// One query row: raw scores (scale·q·k), capped scores s, probabilities P and the LSE.
struct Row {
  std::vector<double> q, raw, s, prob;
  std::vector<char> visible;
  double lse = -std::numeric_limits<double>::infinity();
};

void score_row(const Params& p, const SeqSpan& sp, const KvSlice& kv, int64_t i, int64_t h, Row& r) {
  const int64_t d = p.head_dim;
  r.raw.assign(size_t(sp.k_len), 0.0);
  r.s.assign(size_t(sp.k_len), 0.0);
  r.prob.assign(size_t(sp.k_len), 0.0);
  r.visible.assign(size_t(sp.k_len), 0);
  std::vector<double>& q = r.q;
  q.resize(size_t(d));
  for (int64_t c = 0; c < d; ++c) q[size_t(c)] = load(p.q, p.dtype, sp.batch_index, sp.q_start + i, h, c);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < sp.k_len; ++j) {
    if (!sees(p, i, j, sp.q_len, sp.k_len)) continue;
    double dot = 0;
    for (int64_t c = 0; c < d; ++c) dot += q[size_t(c)] * kv.k[size_t(j * d + c)];
    const double raw = double(p.scale) * dot;
    const double s = p.softcap > 0 ? double(p.softcap) * std::tanh(raw / double(p.softcap)) : raw;
    r.raw[size_t(j)] = raw;
    r.s[size_t(j)] = s;
    r.visible[size_t(j)] = 1;
    if (s > m) m = s;
  }
  if (m == -std::numeric_limits<double>::infinity()) {
    r.lse = m;
    return;  // no visible key: P = 0
  }
  double sum = 0;
  for (int64_t j = 0; j < sp.k_len; ++j)
    if (r.visible[size_t(j)]) sum += std::exp(r.s[size_t(j)] - m);
  for (int64_t j = 0; j < sp.k_len; ++j)
    if (r.visible[size_t(j)]) r.prob[size_t(j)] = std::exp(r.s[size_t(j)] - m) / sum;
  r.lse = m + std::log(sum);
}

}  // namespace

void reference_row(const Params& p, int64_t b, int64_t h, int64_t i, double* out, double* lse) {
  const SeqSpan sp = detail::seq_span(p, b);
  const KvSlice kv(p, sp, h / p.group_size());
  Row r;
  score_row(p, sp, kv, i, h, r);
  for (int64_t c = 0; c < p.head_dim; ++c) out[c] = 0;
  for (int64_t j = 0; j < sp.k_len; ++j)
    for (int64_t c = 0; c < p.head_dim && r.prob[size_t(j)] != 0; ++c) out[c] += r.prob[size_t(j)] * kv.v[size_t(j * p.head_dim + c)];
  *lse = r.lse;
}

void reference_forward(const Params& p, double* out, double* lse) {
  const int64_t d = p.head_dim;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SeqSpan sp = detail::seq_span(p, b);
#pragma omp parallel for schedule(dynamic)
    for (int64_t h = 0; h < p.heads; ++h) {
      const KvSlice kv(p, sp, h / p.group_size());
      Row r;
      for (int64_t i = 0; i < sp.q_len; ++i) {
        score_row(p, sp, kv, i, h, r);
        const int64_t row = sp.batch_index * p.seqlen_q + sp.q_start + i;
        double* o = out + (row * p.heads + h) * d;
        for (int64_t c = 0; c < d; ++c) o[c] = 0;
        for (int64_t j = 0; j < sp.k_len; ++j) {
          const double pj = r.prob[size_t(j)];
          if (pj == 0) continue;
          for (int64_t c = 0; c < d; ++c) o[c] += pj * kv.v[size_t(j * d + c)];
        }
        if (lse) lse[(sp.batch_index * p.heads + h) * p.seqlen_q + sp.q_start + i] = r.lse;
      }
    }
  }
}

void reference_backward(const Params& p, double* dq, double* dk, double* dv) {
  const int64_t d = p.head_dim, G = p.group_size();
  const int64_t tensor_batch = p.varlen() ? 1 : p.batch;
  for (int64_t i = 0; i < tensor_batch * p.seqlen_q * p.heads * d; ++i) dq[i] = 0;
  for (int64_t i = 0; i < tensor_batch * p.seqlen_k * p.heads_kv * d; ++i) dk[i] = dv[i] = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SeqSpan sp = detail::seq_span(p, b);
    // Parallel over KV heads: every write to dk/dv of KV head hk comes from this iteration only.
#pragma omp parallel for schedule(dynamic)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      const KvSlice kv(p, sp, hk);
      Row r;
      std::vector<double> dout(static_cast<size_t>(d)), dprob;
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        for (int64_t i = 0; i < sp.q_len; ++i) {
          score_row(p, sp, kv, i, h, r);
          if (r.lse == -std::numeric_limits<double>::infinity()) continue;  // sees nothing: zero gradient
          const int64_t qrow = sp.batch_index * p.seqlen_q + sp.q_start + i;
          for (int64_t c = 0; c < d; ++c) dout[size_t(c)] = load(p.dout, p.dtype, sp.batch_index, sp.q_start + i, h, c);
          // dP_j = dO · v_j ;  D = sum_j P_j dP_j (= dO · O)
          dprob.assign(size_t(sp.k_len), 0.0);
          double D = 0;
          for (int64_t j = 0; j < sp.k_len; ++j) {
            if (!r.visible[size_t(j)]) continue;
            double acc = 0;
            for (int64_t c = 0; c < d; ++c)
              acc += dout[size_t(c)] * kv.v[size_t(j * d + c)];
            dprob[size_t(j)] = acc;
            D += r.prob[size_t(j)] * acc;
          }
          double* dq_row = dq + (qrow * p.heads + h) * d;
          for (int64_t j = 0; j < sp.k_len; ++j) {
            if (!r.visible[size_t(j)]) continue;
            const double pj = r.prob[size_t(j)];
            double ds = pj * (dprob[size_t(j)] - D);  // d loss / d s_j
            if (p.softcap > 0) {                       // s = cap·tanh(raw/cap): ds/draw = 1 - tanh²
              const double t = std::tanh(r.raw[size_t(j)] / double(p.softcap));
              ds *= 1 - t * t;
            }
            const double g = ds * double(p.scale);    // d loss / d (q·k)
            const int64_t krow = sp.batch_index * p.seqlen_k + sp.k_start + j;
            double* dk_row = dk + (krow * p.heads_kv + hk) * d;
            double* dv_row = dv + (krow * p.heads_kv + hk) * d;
            for (int64_t c = 0; c < d; ++c) {
              dq_row[c] += g * kv.k[size_t(j * d + c)];
              dk_row[c] += g * r.q[size_t(c)];
              dv_row[c] += pj * dout[size_t(c)];
            }
          }
        }
      }
    }
  }
}

}  // namespace flashattn::cpu
