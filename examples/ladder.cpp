// A teaching ladder for one (batch, head): three ways to compute O = softmax(scale·Q Kᵀ) V, each
// checked against the library. Production code lives once, in src/; this file only teaches.
//   1. naive:    materialize the whole N×N score matrix S and probability matrix P
//   2. rows:     per query row, the row max, then the sum, then the output (no N×N buffer, but
//                every key is visited three times)
//   3. online:   one pass over key tiles with the library's SoftmaxState: when a tile raises the
//                row max, the running sum and output are rescaled by exp(m_prev − m_new)
// build/examples/ladder
#include <flashattn/flashattn.hpp>
#include <flashattn/online_softmax.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using Matrix = std::vector<float>;  // row-major

namespace {

constexpr int N = 300, d = 32, kTile = 64;

Matrix naive(const Matrix& q, const Matrix& k, const Matrix& v, float scale) {
  Matrix S(N * N), O(N * d, 0.f);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < N; ++j) {
      float s = 0;
      for (int c = 0; c < d; ++c) s += q[i * d + c] * k[j * d + c];
      S[i * N + j] = scale * s;  // N×N scores: this is the memory traffic flash attention removes
    }
  for (int i = 0; i < N; ++i) {
    float m = -INFINITY, l = 0;
    for (int j = 0; j < N; ++j) m = std::fmax(m, S[i * N + j]);
    for (int j = 0; j < N; ++j) l += std::exp(S[i * N + j] - m);
    for (int j = 0; j < N; ++j) {
      const float p = std::exp(S[i * N + j] - m) / l;  // P, overwriting S
      for (int c = 0; c < d; ++c) O[i * d + c] += p * v[j * d + c];
    }
  }
  return O;
}

Matrix three_pass(const Matrix& q, const Matrix& k, const Matrix& v, float scale) {
  Matrix O(N * d, 0.f);
  auto score = [&](int i, int j) {
    float s = 0;
    for (int c = 0; c < d; ++c) s += q[i * d + c] * k[j * d + c];
    return scale * s;
  };
  for (int i = 0; i < N; ++i) {
    float m = -INFINITY, l = 0;
    for (int j = 0; j < N; ++j) m = std::fmax(m, score(i, j));  // pass 1: max
    for (int j = 0; j < N; ++j) l += std::exp(score(i, j) - m);  // pass 2: sum
    for (int j = 0; j < N; ++j) {                              // pass 3: output
      const float p = std::exp(score(i, j) - m) / l;
      for (int c = 0; c < d; ++c) O[i * d + c] += p * v[j * d + c];
    }
  }
  return O;
}

Matrix online(const Matrix& q, const Matrix& k, const Matrix& v, float scale) {
  Matrix O(N * d);
  std::vector<float> s(kTile), acc(d);
  for (int i = 0; i < N; ++i) {
    flashattn::SoftmaxState<float> state;  // row_max, row_sum
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int j0 = 0; j0 < N; j0 += kTile) {  // one pass over key tiles
      const int n = std::min(kTile, N - j0);
      for (int j = 0; j < n; ++j) {
        float dot = 0;
        for (int c = 0; c < d; ++c) dot += q[i * d + c] * k[(j0 + j) * d + c];
        s[j] = scale * dot;
      }
      state.update(s.data(), n, &v[j0 * d], d, d, acc.data());  // rescale, exp, accumulate
    }
    state.finalize(acc.data(), d, &O[i * d]);  // one division at the end
  }
  return O;
}

float max_diff(const Matrix& a, const Matrix& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::fmax(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  Matrix q(N * d), k(N * d), v(N * d), lib(N * d);
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(rng);
  const float scale = 1.0f / std::sqrt(float(d));
  using namespace flashattn;
  forward(make_tensor(q.data(), DType::f32, {1, N, 1, d}), make_tensor(k.data(), DType::f32, {1, N, 1, d}),
          make_tensor(v.data(), DType::f32, {1, N, 1, d}), make_tensor(lib.data(), DType::f32, {1, N, 1, d}), nullptr);
  const struct {
    const char* name;
    Matrix out;
    const char* memory;
  } rungs[] = {{"1 naive    ", naive(q, k, v, scale), "N×N scores and probabilities"},
               {"2 rows     ", three_pass(q, k, v, scale), "O(1) per row, keys visited three times"},
               {"3 online   ", online(q, k, v, scale), "O(tile) per row, keys read once"}};
  int bad = 0;
  for (const auto& r : rungs) {
    const float diff = max_diff(r.out, lib);
    bad += diff > 1e-5f;
    std::printf("%s max |out - library| = %.1e   extra memory: %s\n", r.name, diff, r.memory);
  }
  return bad;
}
