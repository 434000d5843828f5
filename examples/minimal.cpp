// The smallest complete use of the library: attention forward and backward on the CPU.
//   build/examples/minimal
#include <flashattn/flashattn.hpp>

#include <cstdio>
#include <random>
#include <vector>

int main() {
  using namespace flashattn;
  const int64_t B = 1, N = 256, H = 4, d = 64;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> q(B * N * H * d), k(q.size()), v(q.size()), out(q.size()), lse(B * H * N);
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(rng);

  // Tensors are non-owning views: (batch, seqlen, heads, head_dim), last dimension contiguous.
  const Tensor tq = make_tensor(q.data(), DType::f32, {B, N, H, d});
  const Tensor tk = make_tensor(k.data(), DType::f32, {B, N, H, d});
  const Tensor tv = make_tensor(v.data(), DType::f32, {B, N, H, d});
  const Tensor to = make_tensor(out.data(), DType::f32, {B, N, H, d});
  const Tensor tl = make_tensor(lse.data(), DType::f32, {B, H, N, 1});
  Options opt;
  opt.causal = true;
  forward(tq, tk, tv, to, &tl, opt);
  std::printf("out[0][0][0][0..3] = %.4f %.4f %.4f %.4f, lse[0][0][0] = %.4f\n", out[0], out[1], out[2], out[3],
              lse[0]);

  // Gradients of sum(out * dout).
  std::vector<float> dout(q.size(), 1.0f), dq(q.size()), dk(q.size()), dv(q.size());
  backward(tq, tk, tv, to, make_tensor(dout.data(), DType::f32, {B, N, H, d}), tl,
           make_tensor(dq.data(), DType::f32, {B, N, H, d}), make_tensor(dk.data(), DType::f32, {B, N, H, d}),
           make_tensor(dv.data(), DType::f32, {B, N, H, d}), opt);
  std::printf("dv[0][0][0][0] = %.4f (key 0 is seen by every query: the sum of its attention weights)\n", dv[0]);

  // Bad input: a clear error naming the argument, nothing written.
  try {
    forward(tq, make_tensor(k.data(), DType::f32, {B, N, 3, d}), tv, to, &tl, opt);
  } catch (const Error& e) {
    std::printf("error: %s\n", e.what());
  }
  return 0;
}
