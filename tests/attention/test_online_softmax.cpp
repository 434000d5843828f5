// include/flashattn/online_softmax.hpp: update / merge / finalize against a direct softmax in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "flashattn/online_softmax.hpp"
#include "support/test_util.hpp"

namespace {

using flashattn::SoftmaxState;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kLog2e = 1.4426950408889634074;

// Direct softmax of one row in double: out = Σ softmax(s)_j v_j, lse = log Σ exp(s_j).
struct Direct {
  std::vector<double> out;
  double lse;
};
Direct direct(const std::vector<double>& s, const std::vector<double>& v, int dim) {
  Direct r{std::vector<double>(size_t(dim), 0.0), -kInf};
  double m = -kInf;
  for (double x : s) m = std::max(m, x);
  if (m == -kInf) return r;
  double sum = 0;
  for (size_t j = 0; j < s.size(); ++j) {
    const double p = std::exp(s[j] - m);
    sum += p;
    for (int c = 0; c < dim; ++c) r.out[size_t(c)] += p * v[j * size_t(dim) + size_t(c)];
  }
  for (double& o : r.out) o /= sum;
  r.lse = m + std::log(sum);
  return r;
}

// Folds scores (natural units) tile by tile; for kLog2 the caller's log2(e) is folded in first.
template <bool kLog2>
SoftmaxState<double, kLog2> run_tiles(const std::vector<double>& s, const std::vector<double>& v, int dim, size_t begin,
                                      size_t end, int tile, std::vector<double>& acc) {
  SoftmaxState<double, kLog2> st;
  acc.assign(size_t(dim), 0.0);
  std::vector<double> t;
  for (size_t j0 = begin; j0 < end; j0 += size_t(tile)) {
    const size_t j1 = std::min(end, j0 + size_t(tile));
    t.assign(s.begin() + long(j0), s.begin() + long(j1));
    if (kLog2)
      for (double& x : t) x *= kLog2e;
    st.update(t.data(), int(t.size()), v.data() + j0 * size_t(dim), dim, dim, acc.data());
  }
  return st;
}

bool any_nan(const std::vector<double>& x) {
  return std::any_of(x.begin(), x.end(), [](double y) { return std::isnan(y); });
}

// the worked example of docs/semantics.md: one row, tiles of 2 keys.
TEST(OnlineSoftmax, WorkedExampleFromDesign) {
  const double tiles[3][2] = {{2.0, 1.0}, {3.0, 0.5}, {1.5, 2.5}};
  const double want_sum[3] = {1.368, 1.585, 2.415};  // to 3 decimals, as docs/semantics.md prints them
  const double want_max[3] = {2.0, 3.0, 3.0};
  const double exact_sum[3] = {1 + std::exp(-1.0), (1 + std::exp(-1.0)) * std::exp(-1.0) + 1 + std::exp(-2.5),
                               (1 + std::exp(-1.0)) * std::exp(-1.0) + 1 + std::exp(-2.5) + std::exp(-1.5) + std::exp(-0.5)};
  const double v[2] = {1.0, 1.0};
  SoftmaxState<double> st;
  SoftmaxState<double, true> st2;  // the same in log2 units
  SoftmaxState<float> stf;
  double acc = 0, acc2 = 0;
  float accf = 0;
  for (int t = 0; t < 3; ++t) {
    st.update(tiles[t], 2, v, 1, 1, &acc);
    const double s2[2] = {tiles[t][0] * kLog2e, tiles[t][1] * kLog2e};
    st2.update(s2, 2, v, 1, 1, &acc2);
    const float sf[2] = {float(tiles[t][0]), float(tiles[t][1])};
    const float vf[2] = {1, 1};
    stf.update(sf, 2, vf, 1, 1, &accf);
    EXPECT_EQ(st.row_max, want_max[t]) << "after tile " << t;
    EXPECT_NEAR(st.row_sum, want_sum[t], 5e-4) << "after tile " << t << " (docs/semantics.md's figure)";
    EXPECT_NEAR(st.row_sum, exact_sum[t], 1e-12) << "after tile " << t;
    EXPECT_NEAR(st2.row_max, want_max[t] * kLog2e, 1e-12) << "log2 units, after tile " << t;
    EXPECT_NEAR(st2.row_sum, exact_sum[t], 1e-12) << "log2 units, after tile " << t;
    EXPECT_EQ(stf.row_max, float(want_max[t])) << "float, after tile " << t;
    EXPECT_NEAR(stf.row_sum, exact_sum[t], 1e-6) << "float, after tile " << t;
    EXPECT_NEAR(acc, st.row_sum, 1e-12) << "acc with all values 1 equals row_sum";
  }
  // The slips printed elsewhere for this example (1.88, 3.03) must not be what the state holds.
  EXPECT_GT(std::abs(st.row_sum - 3.03), 0.5);
  EXPECT_NEAR(st.lse(), 3.0 + std::log(exact_sum[2]), 1e-12);
  EXPECT_NEAR(st2.lse(), 3.0 + std::log(exact_sum[2]), 1e-12) << "log2 state returns the LSE in natural units";
  double out = 0;
  EXPECT_NEAR(st.finalize(&acc, 1, &out), 3.0 + std::log(exact_sum[2]), 1e-12);
  EXPECT_NEAR(out, 1.0, 1e-12);
}

// Random rows, random tile sizes and dims, some masked scores: update + finalize vs direct.
template <bool kLog2>
void random_vs_direct() {
  FA_SEED_TRACE();
  std::mt19937_64 rng(fa_test::test_seed());
  std::uniform_int_distribution<int> n_dist(1, 300), tile_dist(1, 64), dim_dist(1, 40);
  std::uniform_real_distribution<double> u(-1, 1), mask_u(0, 1);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = n_dist(rng), tile = tile_dist(rng), dim = dim_dist(rng);
    const double spread = trial % 3 == 0 ? 30.0 : trial % 3 == 1 ? 3.0 : 0.3;  // sharp to flat rows
    const double mask_rate = trial % 4 == 0 ? 0.0 : trial % 4 == 1 ? 0.3 : trial % 4 == 2 ? 0.9 : 1.0;
    std::vector<double> s(static_cast<size_t>(n)), v(size_t(n) * size_t(dim));
    for (double& x : s) x = mask_u(rng) < mask_rate ? -kInf : spread * u(rng);
    for (double& x : v) x = u(rng);
    std::vector<double> acc;
    auto st = run_tiles<kLog2>(s, v, dim, 0, size_t(n), tile, acc);
    std::vector<double> out(static_cast<size_t>(dim));
    const double lse = st.finalize(acc.data(), dim, out.data());
    const Direct d = direct(s, v, dim);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " n " << n << " tile " << tile << " dim " << dim
                                      << " spread " << spread << " mask_rate " << mask_rate);
    ASSERT_FALSE(any_nan(out)) << "NaN in the output";
    if (d.lse == -kInf) {
      EXPECT_EQ(lse, -kInf);
      EXPECT_EQ(st.row_max, -kInf);
      EXPECT_EQ(st.row_sum, 0.0);
      for (double o : out) EXPECT_EQ(o, 0.0);
      continue;
    }
    EXPECT_NEAR(lse, d.lse, 1e-12 * std::max(1.0, std::abs(d.lse)));
    for (int c = 0; c < dim; ++c) EXPECT_NEAR(out[size_t(c)], d.out[size_t(c)], 1e-12) << "column " << c;
  }
}
TEST(OnlineSoftmax, RandomTilesMatchDirectSoftmax) { random_vs_direct<false>(); }
TEST(OnlineSoftmax, RandomTilesMatchDirectSoftmaxLog2Units) { random_vs_direct<true>(); }

TEST(OnlineSoftmax, AllMaskedTiles) {
  const double masked[3] = {-kInf, -kInf, -kInf};
  const double v[6] = {1, 2, 3, 4, 5, 6};
  SoftmaxState<double> st;
  double acc[2] = {0, 0};
  // Leading all-masked tiles change nothing and report rescale 1.
  EXPECT_EQ(st.update(masked, 3, v, 2, 2, acc), 1.0);
  EXPECT_EQ(st.begin_tile(-kInf), 1.0);
  EXPECT_EQ(st.row_max, -kInf);
  EXPECT_EQ(st.row_sum, 0.0);
  EXPECT_EQ(acc[0], 0.0);
  EXPECT_EQ(acc[1], 0.0);
  EXPECT_EQ(st.prob(-kInf), 0.0) << "exp(-inf - offset) must be 0, not NaN, on an empty row";
  // A row that never sees a key: output 0, LSE -inf, no NaN.
  double out[2] = {7, 7};
  EXPECT_EQ(st.finalize(acc, 2, out), -kInf);
  EXPECT_EQ(out[0], 0.0);
  EXPECT_EQ(out[1], 0.0);
  EXPECT_EQ(st.inv_sum(), 0.0);
  // Then a real tile, then another all-masked tile: equals the direct softmax of the real keys.
  const double real[3] = {0.5, -kInf, 2.0};
  st.update(real, 3, v, 2, 2, acc);
  const double m = st.row_max;
  EXPECT_EQ(st.update(masked, 3, v, 2, 2, acc), 1.0) << "a masked tile after real ones must not rescale";
  EXPECT_EQ(st.row_max, m);
  const Direct d = direct({0.5, -kInf, 2.0}, {1, 2, 3, 4, 5, 6}, 2);
  EXPECT_NEAR(st.finalize(acc, 2, out), d.lse, 1e-12);
  EXPECT_NEAR(out[0], d.out[0], 1e-12);
  EXPECT_NEAR(out[1], d.out[1], 1e-12);
  // Float, all masked: no NaN either.
  SoftmaxState<float, true> sf;
  const float mf[2] = {-std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  const float vf[2] = {1, 1};
  float accf = 0, outf = 5;
  sf.update(mf, 2, vf, 1, 1, &accf);
  EXPECT_EQ(sf.finalize(&accf, 1, &outf), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(outf, 0.0f);
}

// Two halves folded separately and merged equal one pass over all keys (split-KV, ring attention).
TEST(OnlineSoftmax, MergeOfTwoHalvesEqualsOnePass) {
  FA_SEED_TRACE();
  std::mt19937_64 rng(fa_test::test_seed());
  std::uniform_int_distribution<int> n_dist(2, 200), tile_dist(1, 32), dim_dist(1, 24);
  std::uniform_real_distribution<double> u(-1, 1), r01(0, 1);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = n_dist(rng), dim = dim_dist(rng);
    const size_t split = size_t(std::uniform_int_distribution<int>(0, n)(rng));
    const double spread = trial % 2 ? 20.0 : 1.0;
    std::vector<double> s(static_cast<size_t>(n)), v(size_t(n) * size_t(dim));
    for (double& x : s) x = r01(rng) < 0.2 ? -kInf : spread * u(rng);
    for (double& x : v) x = u(rng);
    std::vector<double> acc_all, acc_a, acc_b;
    const int tile = tile_dist(rng);
    auto all = run_tiles<false>(s, v, dim, 0, size_t(n), tile, acc_all);
    auto a = run_tiles<false>(s, v, dim, 0, split, tile_dist(rng), acc_a);
    auto b = run_tiles<false>(s, v, dim, split, size_t(n), tile_dist(rng), acc_b);
    // Merging in either order gives the same union.
    auto ab = a;
    std::vector<double> acc_ab = acc_a;
    ab.merge(b, acc_b.data(), dim, acc_ab.data());
    auto ba = b;
    std::vector<double> acc_ba = acc_b;
    ba.merge(a, acc_a.data(), dim, acc_ba.data());
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " n " << n << " split " << split << " dim " << dim);
    for (const auto* m : {&ab, &ba}) {
      const auto& acc = m == &ab ? acc_ab : acc_ba;
      EXPECT_EQ(m->row_max, all.row_max);
      EXPECT_NEAR(m->row_sum, all.row_sum, 1e-12 * std::max(1.0, all.row_sum));
      for (int c = 0; c < dim; ++c)
        EXPECT_NEAR(acc[size_t(c)], acc_all[size_t(c)], 1e-12 * std::max(1.0, all.row_sum)) << "column " << c;
      EXPECT_FALSE(any_nan(acc));
      if (all.row_max == -kInf)
        EXPECT_EQ(m->lse(), -kInf);
      else
        EXPECT_NEAR(m->lse(), all.lse(), 1e-12 * std::max(1.0, std::abs(all.lse())));
    }
  }
}

TEST(OnlineSoftmax, MergeWithEmptyState) {
  const double s[3] = {0.25, 1.5, -0.75};
  const double v[6] = {1, -2, 3, 0.5, -1, 2};
  SoftmaxState<double> full;
  double acc_full[2] = {0, 0};
  full.update(s, 3, v, 2, 2, acc_full);

  // full ∪ empty = full, bitwise.
  {
    SoftmaxState<double> st = full, empty;
    double acc[2] = {acc_full[0], acc_full[1]};
    const double acc_empty[2] = {0, 0};
    st.merge(empty, acc_empty, 2, acc);
    EXPECT_EQ(st.row_max, full.row_max);
    EXPECT_EQ(st.row_sum, full.row_sum);
    EXPECT_EQ(acc[0], acc_full[0]);
    EXPECT_EQ(acc[1], acc_full[1]);
  }
  // empty ∪ full = full.
  {
    SoftmaxState<double> st;
    double acc[2] = {0, 0};
    st.merge(full, acc_full, 2, acc);
    EXPECT_EQ(st.row_max, full.row_max);
    EXPECT_EQ(st.row_sum, full.row_sum);
    EXPECT_EQ(acc[0], acc_full[0]);
    EXPECT_EQ(acc[1], acc_full[1]);
  }
  // empty ∪ empty stays empty and finalizes to 0 / -inf without NaN.
  {
    SoftmaxState<float> st, other;
    float acc[2] = {0, 0};
    const float acc_o[2] = {0, 0};
    st.merge(other, acc_o, 2, acc);
    EXPECT_EQ(st.row_max, -std::numeric_limits<float>::infinity());
    EXPECT_EQ(st.row_sum, 0.0f);
    float out[2] = {9, 9};
    EXPECT_EQ(st.finalize(acc, 2, out), -std::numeric_limits<float>::infinity());
    EXPECT_EQ(out[0], 0.0f);
    EXPECT_EQ(out[1], 0.0f);
  }
}

// The two-step form (begin_tile + prob + add_sum) used by vectorized kernels equals update().
TEST(OnlineSoftmax, StepwiseEqualsUpdate) {
  FA_SEED_TRACE();
  std::mt19937_64 rng(fa_test::test_seed());
  std::uniform_real_distribution<double> u(-4, 4);
  SoftmaxState<double> a, b;
  double acc_a = 0, acc_b = 0;
  for (int t = 0; t < 20; ++t) {
    double s[8], v[8];
    for (int j = 0; j < 8; ++j) {
      s[j] = (t + j) % 5 == 0 ? -kInf : u(rng) + 0.3 * t;
      v[j] = u(rng);
    }
    a.update(s, 8, v, 1, 1, &acc_a);
    double tmax = -kInf;
    for (double x : s) tmax = std::max(tmax, x);
    acc_b *= b.begin_tile(tmax);
    double sum = 0;
    for (int j = 0; j < 8; ++j) {
      const double p = b.prob(s[j]);
      sum += p;
      acc_b += p * v[j];
    }
    b.add_sum(sum);
    EXPECT_EQ(a.row_max, b.row_max) << "tile " << t;
    EXPECT_NEAR(a.row_sum, b.row_sum, 1e-12 * a.row_sum) << "tile " << t;
    EXPECT_NEAR(acc_a, acc_b, 1e-12 * a.row_sum) << "tile " << t;
  }
}

// The lazy maximum (begin_tile_lazy, the Hopper forward's): the same output and LSE as the direct
// softmax, with rescales skipped while a tile's maximum stays within `slack` of the running one and
// probabilities bounded by exp(slack); masked tiles and an empty start behave as in begin_tile.
TEST(OnlineSoftmax, LazyMaximumMatchesDirect) {
  FA_SEED_TRACE();
  std::mt19937_64 rng(fa_test::test_seed());
  std::uniform_real_distribution<double> u(-1, 1), mask_u(0, 1);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial % 97, tile = 1 + trial % 13, dim = 1 + trial % 5;
    const double spread = trial % 3 == 0 ? 30.0 : trial % 3 == 1 ? 3.0 : 0.3;
    const double drift = trial % 2 ? 0.5 : 0.0;  // rising scores: the maximum keeps moving
    std::vector<double> s(static_cast<size_t>(n)), v(size_t(n) * size_t(dim));
    for (int j = 0; j < n; ++j) s[size_t(j)] = mask_u(rng) < 0.2 ? -kInf : spread * u(rng) + drift * j;
    for (double& x : v) x = u(rng);
    const double slack = trial % 4 == 0 ? 0.0 : 4.0;
    SoftmaxState<double> st;
    std::vector<double> acc(size_t(dim), 0.0);
    int skipped = 0;
    for (int j0 = 0; j0 < n; j0 += tile) {
      const int j1 = std::min(n, j0 + tile);
      double tmax = -kInf;
      for (int j = j0; j < j1; ++j) tmax = std::max(tmax, s[size_t(j)]);
      const double rescale = st.begin_tile_lazy(tmax, slack);
      if (rescale == 1.0) ++skipped;
      for (double& a : acc) a *= rescale;
      double sum = 0;
      for (int j = j0; j < j1; ++j) {
        const double p = st.prob(s[size_t(j)]);
        ASSERT_LE(p, std::exp(slack) * (1 + 1e-12)) << "probabilities stay below exp(slack)";
        sum += p;
        for (int c = 0; c < dim; ++c) acc[size_t(c)] += p * v[size_t(j) * size_t(dim) + size_t(c)];
      }
      st.add_sum(sum);
    }
    std::vector<double> out(static_cast<size_t>(dim));
    const double lse = st.finalize(acc.data(), dim, out.data());
    const Direct d = direct(s, v, dim);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " slack " << slack << " skipped " << skipped);
    if (d.lse == -kInf) {
      EXPECT_EQ(lse, -kInf);
      for (double o : out) EXPECT_EQ(o, 0.0);
      continue;
    }
    EXPECT_NEAR(lse, d.lse, 1e-12 * std::max(1.0, std::abs(d.lse)));
    for (int c = 0; c < dim; ++c) EXPECT_NEAR(out[size_t(c)], d.out[size_t(c)], 1e-12) << "column " << c;
  }
}

}  // namespace
