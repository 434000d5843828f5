// Unusual but valid input layouts that the kernels must not take for ordinary ones: broadcast
// K and V (row stride 0, the stride a framework gives an expanded tensor). Every key is then the
// same vector, so each row that sees a key outputs exactly v, whatever the scores.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.hpp"
#include "flashattn/flashattn.hpp"
#include "support/test_util.hpp"

using namespace flashattn;

namespace {

struct Broadcast : ::testing::TestWithParam<std::tuple<DType, Algorithm, bool>> {};

TEST_P(Broadcast, KvRowStrideZero) {
  const auto [dtype, alg, causal] = GetParam();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t B = 2, Nq = 300, Nk = 270, H = 4, Hkv = 2, d = 64;
  const size_t e = element_size(dtype);
  std::vector<uint8_t> q(size_t(B * Nq * H * d) * e), kv_row(size_t(2 * B * Hkv * d) * e), out(q.size());
  for (size_t i = 0; i < q.size() / e; ++i) detail::store_from_float(q.data(), int64_t(i), dtype, dist(rng));
  for (size_t i = 0; i < kv_row.size() / e; ++i) detail::store_from_float(kv_row.data(), int64_t(i), dtype, dist(rng));
  std::vector<float> lse(size_t(B * H * Nq));
  Tensor tq = make_tensor(q.data(), dtype, {B, Nq, H, d});
  // K and V: one row per (batch, head), repeated along the sequence by a row stride of 0.
  Tensor tk{kv_row.data(), dtype, Device::cpu, {B, Nk, Hkv, d}, {2 * Hkv * d, 0, d, 1}};
  Tensor tv{kv_row.data() + size_t(Hkv * d) * e, dtype, Device::cpu, {B, Nk, Hkv, d}, {2 * Hkv * d, 0, d, 1}};
  Tensor to = make_tensor(out.data(), dtype, {B, Nq, H, d});
  Tensor tl = make_tensor(lse.data(), DType::f32, {B, H, Nq, 1});
  Options opt;
  opt.algorithm = alg;
  opt.causal = causal;
  std::fill(out.begin(), out.end(), 0xff);  // NaN poison
  forward(tq, tk, tv, to, &tl, opt);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Nq; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const bool sees = !causal || i + Nk - Nq >= 0;
        for (int64_t c = 0; c < d; ++c) {
          const float got = detail::load_as_float(out.data(), ((b * Nq + i) * H + h) * d + c, dtype);
          const float want = sees ? detail::load_as_float(tv.data, b * 2 * Hkv * d + (h / (H / Hkv)) * d + c, dtype) : 0.f;
          // A softmax over identical values returns that value up to the rounding of sum(p)/sum(p).
          ASSERT_NEAR(got, want, std::fabs(want) * (dtype == DType::f32 ? 1e-5 : 1e-2) + 1e-6)
              << "b " << b << " i " << i << " h " << h << " c " << c;
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Broadcast,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16),
                                            ::testing::Values(Algorithm::flash, Algorithm::standard),
                                            ::testing::Bool()));

}  // namespace
