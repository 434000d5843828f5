// The float64 reference of forward_kvcache (the spec the tests use). It reads the cache as it is
// before the call (the first cache_seqlens[b] tokens of each sequence) and takes the new tokens
// from k_new / v_new, rotating the keys in double and rounding them to the cache's dtype (as the
// cache stores them) and rotating q in double; it writes nothing but its own outputs.
// Visibility is written out from the definition, not taken from KVParams's helpers.
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.hpp"
#include "cpu/reference.hpp"

namespace flashattn::cpu {
namespace {

using detail::KVParams;

double load(const detail::TensorRef& t, DType dt, int64_t b, int64_t i, int64_t h, int64_t c) {
  return detail::load_as_float(t.data, t.offset(b, i, h) + c, dt);
}

// x rotated at position pos: pairs (2i, 2i + 1) interleaved, else (i, i + rotary_dim / 2).
void rotate(const KVParams& p, int64_t pos, std::vector<double>& x) {
  const int64_t half = p.rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double c = detail::load_as_float(p.rotary_cos, pos * p.rotary_stride + i, p.rotary_dtype);
    const double s = detail::load_as_float(p.rotary_sin, pos * p.rotary_stride + i, p.rotary_dtype);
    const size_t a = size_t(p.rotary_interleaved ? 2 * i : i), b = size_t(p.rotary_interleaved ? 2 * i + 1 : i + half);
    const double x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
}

}  // namespace

void reference_kvcache(const KVParams& p, double* out, double* lse) {
  const int64_t d = p.head_dim, G = p.heads / p.heads_kv;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t old = p.seqlens[b], total = old + p.seqlen_new;
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      // The sequence's keys and values as the call sees them: the cache's first `old` tokens, then
      // the new ones (keys rotated at their positions).
      std::vector<double> k(size_t(total * d)), v(k.size()), row(static_cast<size_t>(d));
      for (int64_t t = 0; t < total; ++t) {
        if (t < old) {
          int64_t cb, r;
          if (p.paged) {
            cb = p.block_table[b * p.block_table_stride + t / p.cache_rows];
            r = t % p.cache_rows;
          } else {
            cb = p.batch_idx ? p.batch_idx[b] : b;
            r = t;
          }
          for (int64_t c = 0; c < d; ++c) {
            k[size_t(t * d + c)] = load(p.k_cache, p.dtype, cb, r, hk, c);
            v[size_t(t * d + c)] = load(p.v_cache, p.dtype, cb, r, hk, c);
          }
        } else {
          for (int64_t c = 0; c < d; ++c) row[size_t(c)] = load(p.k_new, p.dtype, b, t - old, hk, c);
          if (p.rotary_dim > 0) rotate(p, t, row);
          for (int64_t c = 0; c < d; ++c) {  // attention reads the keys as the cache stores them
            k[size_t(t * d + c)] = detail::round_to(float(row[size_t(c)]), p.dtype);
            v[size_t(t * d + c)] = load(p.v_new, p.dtype, b, t - old, hk, c);
          }
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = hk * G + g;
        for (int64_t i = 0; i < p.seqlen_q; ++i) {
          std::vector<double> q(static_cast<size_t>(d));
          for (int64_t c = 0; c < d; ++c) q[size_t(c)] = load(p.q, p.dtype, b, i, h, c);
          const bool by_token = p.causal || p.window_left >= 0 || p.window_right >= 0;
          if (p.rotary_dim > 0) rotate(p, old + (by_token ? i : 0), q);
          // Query i sees key j iff j <= i + total - Sq (causal), within the window's bounds.
          const int64_t shift = total - p.seqlen_q;
          std::vector<double> s(size_t(total), -std::numeric_limits<double>::infinity());
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < total; ++j) {
            if (p.causal && j > i + shift) continue;
            if (p.window_left >= 0 && j < i + shift - p.window_left) continue;
            if (p.window_right >= 0 && j > i + shift + p.window_right) continue;
            double dot = 0;
            for (int64_t c = 0; c < d; ++c) dot += q[size_t(c)] * k[size_t(j * d + c)];
            double x = double(p.scale) * dot;
            if (p.softcap > 0) x = double(p.softcap) * std::tanh(x / double(p.softcap));
            s[size_t(j)] = x;
            m = std::max(m, x);
          }
          double* o = out + ((b * p.seqlen_q + i) * p.heads + h) * d;
          for (int64_t c = 0; c < d; ++c) o[c] = 0;
          double* l = lse + (b * p.heads + h) * p.seqlen_q + i;
          if (m == -std::numeric_limits<double>::infinity()) {
            *l = m;
            continue;
          }
          double sum = 0;
          for (int64_t j = 0; j < total; ++j) {
            if (s[size_t(j)] == -std::numeric_limits<double>::infinity()) continue;
            const double e = std::exp(s[size_t(j)] - m);
            sum += e;
            for (int64_t c = 0; c < d; ++c) o[c] += e * v[size_t(j * d + c)];
          }
          for (int64_t c = 0; c < d; ++c) o[c] /= sum;
          *l = m + std::log(sum);
        }
      }
    }
  }
}

}  // namespace flashattn::cpu
