// Calls flashattn::forward through the installed package on a tiny input and checks the result
// against a direct softmax computed here. Exit code 0 on success.
#include <flashattn/flashattn.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  // B 1, Nq 2, Nk 3, H 1, d 2, f32, causal (bottom-right: row 0 sees keys 0..1, row 1 keys 0..2).
  std::vector<float> q = {0.5f, -1.0f, 1.5f, 0.25f};
  std::vector<float> k = {1.0f, 0.0f, -0.5f, 2.0f, 0.75f, -1.25f};
  std::vector<float> v = {1.0f, 2.0f, -3.0f, 0.5f, 4.0f, -1.0f};
  std::vector<float> out(4, NAN), lse(2, NAN);
  using flashattn::DType;
  flashattn::Options opt;
  opt.causal = true;
  const flashattn::Tensor lse_t = flashattn::make_tensor(lse.data(), DType::f32, {1, 1, 2, 1});
  try {
    flashattn::forward(flashattn::make_tensor(q.data(), DType::f32, {1, 2, 1, 2}),
                       flashattn::make_tensor(k.data(), DType::f32, {1, 3, 1, 2}),
                       flashattn::make_tensor(v.data(), DType::f32, {1, 3, 1, 2}),
                       flashattn::make_tensor(out.data(), DType::f32, {1, 2, 1, 2}), &lse_t, opt);
  } catch (const flashattn::Error& e) {
    std::fprintf(stderr, "flashattn::Error: %s\n", e.what());
    return 1;
  }
  const double scale = 1.0 / std::sqrt(2.0);
  int bad = 0;
  for (int i = 0; i < 2; ++i) {
    const int visible = i + 2;  // i + Nk - Nq + 1
    double m = -INFINITY, sum = 0, o[2] = {0, 0};
    std::vector<double> s(visible);
    for (int j = 0; j < visible; ++j) {
      s[j] = scale * (double(q[i * 2]) * k[j * 2] + double(q[i * 2 + 1]) * k[j * 2 + 1]);
      m = std::fmax(m, s[j]);
    }
    for (int j = 0; j < visible; ++j) {
      const double p = std::exp(s[j] - m);
      sum += p;
      o[0] += p * v[j * 2];
      o[1] += p * v[j * 2 + 1];
    }
    for (int c = 0; c < 2; ++c)
      if (!(std::fabs(out[i * 2 + c] - o[c] / sum) < 1e-5)) {
        std::fprintf(stderr, "out[%d][%d] = %g, expected %g\n", i, c, out[i * 2 + c], o[c] / sum);
        ++bad;
      }
    if (!(std::fabs(lse[i] - (m + std::log(sum))) < 1e-5)) {
      std::fprintf(stderr, "lse[%d] = %g, expected %g\n", i, lse[i], m + std::log(sum));
      ++bad;
    }
  }
  std::printf("%s; consumer %s\n", flashattn::build_info().c_str(), bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}
