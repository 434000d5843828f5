// merge_partial (include/flashattn/flashattn.hpp): the union of two partial attention results over
// disjoint keys. Checked against the formula in float64 (rows empty on either or both sides, an
// empty accumulator holding NaN that must not be read, every part dtype, strided layouts), against
// attention over all keys (forward on two key ranges, merged, vs forward on all of them and an fp64
// softmax), and for bad arguments (Error naming the argument, nothing written). CUDA cases skip
// without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/attention_case.hpp"

namespace fa_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct MergeCase {
  Device device;
  DType part_dtype;
  Layout layout;
};

std::string merge_case_name(const MergeCase& m) {
  return std::string(flashattn::to_string(m.device)) + "_" + dtype_name(m.part_dtype) + "_" + layout_name(m.layout);
}
std::string merge_name(const ::testing::TestParamInfo<MergeCase>& info) { return merge_case_name(info.param); }
void PrintTo(const MergeCase& m, std::ostream* os) { *os << merge_case_name(m); }

class MergeFormula : public ::testing::TestWithParam<MergeCase> {};

// Rows by (b·H + h)·S + i; row kinds cycle: both sides seen keys, the accumulator empty (its output
// NaN), the part empty, both empty.
TEST_P(MergeFormula, MatchesFloat64) {
  FA_SEED_TRACE();
  const MergeCase mc = GetParam();
  if (skip_without_device(mc.device)) GTEST_SKIP() << "no usable CUDA device";
  const int64_t B = 2, S = 19, H = 3, d = 40;
  std::mt19937_64 rng(test_seed());
  HostTensor acc = make_tensor(DType::f32, {B, S, H, d}, mc.layout);
  HostTensor part = make_tensor(mc.part_dtype, {B, S, H, d}, mc.layout);
  HostTensor lse_acc = make_lse({B, H, S}, mc.layout != Layout::dense);
  HostTensor lse_part = make_lse({B, H, S}, false);
  fill_uniform(acc, rng, 2.0);
  fill_uniform(part, rng, 2.0);
  fill_uniform(lse_acc, rng, 6.0);
  fill_uniform(lse_part, rng, 6.0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i) {
        const int kind = int((b * H + h) * S + i) % 4;
        if (kind == 1 || kind == 3) {
          lse_acc.set(lse_acc.index(b, h, i, 0), -kInf);
          for (int64_t c = 0; c < d; ++c) acc.set(acc.index(b, i, h, c), nan);  // never read
        }
        if (kind == 2 || kind == 3) lse_part.set(lse_part.index(b, h, i, 0), -kInf);
      }
  // The float64 formula on the inputs as stored.
  std::vector<double> want_out(size_t(B * S * H * d)), want_lse(size_t(B * H * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i) {
        const double la = lse_acc.get(lse_acc.index(b, h, i, 0)), lb = lse_part.get(lse_part.index(b, h, i, 0));
        const double m = std::max(la, lb);
        const double wa = la == -kInf ? 0 : std::exp(la - m), wb = lb == -kInf ? 0 : std::exp(lb - m);
        want_lse[size_t((b * H + h) * S + i)] = m == -kInf ? -kInf : m + std::log(wa + wb);
        for (int64_t c = 0; c < d; ++c) {
          const double oa = wa > 0 ? acc.get(acc.index(b, i, h, c)) : 0, ob = wb > 0 ? part.get(part.index(b, i, h, c)) : 0;
          want_out[size_t(((b * S + i) * H + h) * d + c)] = m == -kInf ? 0 : (wa * oa + wb * ob) / (wa + wb);
        }
      }
  const std::vector<uint64_t> part_before = snapshot(part), lse_part_before = snapshot(lse_part);
  Placement pl(mc.device);
  flashattn::merge_partial(pl.put(acc), pl.put(lse_acc), pl.put(part), pl.put(lse_part));
  pl.fetch(acc);
  pl.fetch(lse_acc);
  pl.fetch(part);
  pl.fetch(lse_part);
  EXPECT_TRUE(snapshot(part) == part_before && snapshot(lse_part) == lse_part_before) << "an input was written";
  // fp32 arithmetic: a few units of 2^-24 relative, and the LSE's log (2^-22 on CUDA).
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i) {
        const double wl = want_lse[size_t((b * H + h) * S + i)], gl = lse_acc.get(lse_acc.index(b, h, i, 0));
        if (wl == -kInf) {
          ASSERT_EQ(gl, -kInf) << "row " << b << "," << h << "," << i;
        } else {
          ASSERT_NEAR(gl, wl, 1e-6 * (1 + std::fabs(wl))) << "lse row " << b << "," << h << "," << i;
        }
        for (int64_t c = 0; c < d; ++c) {
          const double w = want_out[size_t(((b * S + i) * H + h) * d + c)], g = acc.get(acc.index(b, i, h, c));
          ASSERT_NEAR(g, w, 2e-6 * (1 + std::fabs(w))) << "out row " << b << "," << h << "," << i << " col " << c;
        }
      }
}

std::vector<MergeCase> merge_cases() {
  std::vector<MergeCase> v;
  for (Device dev : all_devices())
    for (DType t : all_dtypes()) v.push_back({dev, t, Layout::dense});
  for (Device dev : all_devices()) v.push_back({dev, DType::bf16, Layout::heads_first});
  for (Device dev : all_devices()) v.push_back({dev, DType::f32, Layout::row_padded});
  return v;
}
INSTANTIATE_TEST_SUITE_P(Merge, MergeFormula, ::testing::ValuesIn(merge_cases()), merge_name);

// Float64 attention of q over keys [0, Nk) (GQA), bottom-right causal: out (B, Nq, H, d) dense.
std::vector<double> reference_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v, bool causal,
                                        double scale) {
  const int64_t B = q.shape[0], Nq = q.shape[1], H = q.shape[2], d = q.shape[3], Nk = k.shape[1], G = H / k.shape[2];
  std::vector<double> out(size_t(B * Nq * H * d), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Nq; ++i) {
        const int64_t hi = causal ? std::min(Nk, i + Nk - Nq + 1) : Nk;
        std::vector<double> s(size_t(std::max<int64_t>(hi, 0)));
        double m = -kInf, l = 0;
        for (int64_t j = 0; j < hi; ++j) {
          double x = 0;
          for (int64_t c = 0; c < d; ++c) x += q.get(q.index(b, i, h, c)) * k.get(k.index(b, j, h / G, c));
          s[size_t(j)] = x * scale;
          m = std::max(m, s[size_t(j)]);
        }
        for (int64_t j = 0; j < hi; ++j) l += std::exp(s[size_t(j)] - m);
        for (int64_t j = 0; j < hi; ++j)
          for (int64_t c = 0; c < d; ++c)
            out[size_t(((b * Nq + i) * H + h) * d + c)] += std::exp(s[size_t(j)] - m) / l * v.get(v.index(b, j, h / G, c));
      }
  return out;
}

// Keys [0, split) and [split, Nk) through forward (each with its LSE), merged into an fp32
// accumulator, against forward over all keys: both within FlashAttention's rule of the fp64
// softmax (the merged error at most twice the direct call's, plus fp32 noise). Causal: the second
// range (17 keys for 37 queries) gives its first 20 rows no key (LSE −inf there).
TEST(MergePartial, TwoKeyRangesEqualOneCall) {
  FA_SEED_TRACE();
  for (Device dev : all_devices()) {
    if (skip_without_device(dev)) continue;
    for (DType t : {DType::f32, DType::bf16})
      for (bool causal : {false, true}) {
        if (dev == Device::cuda && t == DType::f32) continue;  // the CUDA flash kernels are 16-bit only
        SCOPED_TRACE(std::string(flashattn::to_string(dev)) + " " + dtype_name(t) + (causal ? " causal" : ""));
        const int64_t B = 2, Nq = 37, Nk = 300, split = 283, H = 4, Hkv = 2, d = 64;
        std::mt19937_64 rng(test_seed());
        HostTensor q = make_tensor(t, {B, Nq, H, d}), k = make_tensor(t, {B, Nk, Hkv, d}), v = make_tensor(t, {B, Nk, Hkv, d});
        for (HostTensor* x : {&q, &k, &v}) fill_uniform(*x, rng, 1.0);
        // The two key ranges as views into k and v.
        auto range = [](const HostTensor& x, int64_t j0, int64_t n) {
          HostTensor r = x;
          r.shape[1] = n;
          r.offset += j0 * x.strides[1];
          return r;
        };
        Options o;
        o.causal = causal;
        const double scale = 1.0 / std::sqrt(double(d));
        HostTensor direct = make_tensor(t, {B, Nq, H, d}), first = make_tensor(t, {B, Nq, H, d});
        HostTensor second = make_tensor(t, {B, Nq, H, d}), acc = make_tensor(DType::f32, {B, Nq, H, d});
        HostTensor lse_direct = make_lse({B, H, Nq}), lse_first = make_lse({B, H, Nq}), lse_second = make_lse({B, H, Nq});
        for (HostTensor* x : {&direct, &first, &second, &acc, &lse_direct, &lse_first, &lse_second}) poison(*x);
        Placement pl(dev);
        const Tensor tl_direct = pl.put(lse_direct), tl_first = pl.put(lse_first), tl_second = pl.put(lse_second);
        flashattn::forward(pl.put(q), pl.put(k), pl.put(v), pl.put(direct), &tl_direct, o);
        // Causal masks align bottom-right: over keys [0, split) query i keeps its diagonal key
        // i + Nk − Nq as a right window of Nk − split past that range's own diagonal.
        Options o_first = o;
        o_first.causal = false;
        if (causal) o_first.window_right = int(Nk - split);
        flashattn::forward(pl.put(q), pl.put(range(k, 0, split)), pl.put(range(v, 0, split)), pl.put(first), &tl_first,
                           o_first);
        flashattn::forward(pl.put(q), pl.put(range(k, split, Nk - split)), pl.put(range(v, split, Nk - split)),
                           pl.put(second), &tl_second, o);
        pl.fetch(first);
        // The accumulator: the first partial in fp32.
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < Nq; ++i)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t c = 0; c < d; ++c) acc.set(acc.index(b, i, h, c), first.get(first.index(b, i, h, c)));
        flashattn::merge_partial(pl.put(acc), tl_first, pl.put(second), tl_second);
        pl.fetch(acc);
        pl.fetch(direct);
        const std::vector<double> want = reference_attention(q, k, v, causal, scale);
        double err_direct = 0, err_merged = 0;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < Nq; ++i)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t c = 0; c < d; ++c) {
                const double w = want[size_t(((b * Nq + i) * H + h) * d + c)];
                err_direct = std::max(err_direct, std::fabs(direct.get(direct.index(b, i, h, c)) - w));
                err_merged = std::max(err_merged, std::fabs(acc.get(acc.index(b, i, h, c)) - w));
              }
        EXPECT_LE(err_merged, 2 * err_direct + 1e-6) << "merged " << err_merged << ", one call " << err_direct;
      }
  }
}

// Bad arguments: Error of the expected kind naming the argument; the accumulators unchanged.
TEST(MergePartial, BadArgumentsWriteNothing) {
  FA_SEED_TRACE();
  std::mt19937_64 rng(test_seed());
  const int64_t B = 1, S = 5, H = 2, d = 16;
  HostTensor acc = make_tensor(DType::f32, {B, S, H, d}), part = make_tensor(DType::bf16, {B, S, H, d});
  HostTensor lse_acc = make_lse({B, H, S}), lse_part = make_lse({B, H, S});
  for (HostTensor* x : {&acc, &part, &lse_acc, &lse_part}) fill_uniform(*x, rng, 1.0);
  HostTensor acc16 = make_tensor(DType::f16, {B, S, H, d}), short_part = make_tensor(DType::bf16, {B, S - 1, H, d});
  HostTensor wide_lse = make_lse({B, H + 1, S});
  for (HostTensor* x : {&acc16, &short_part, &wide_lse}) fill_uniform(*x, rng, 1.0);
  const std::vector<uint64_t> acc_before = snapshot(acc), lse_before = snapshot(lse_acc);
  struct Bad {
    const char* arg;
    flashattn::Error::Kind kind;
    Tensor out, lse, part, lse_part;
  };
  Tensor same_lse = lse_acc.view();
  const Bad bad[] = {
      {"out_acc", flashattn::Error::Kind::type, acc16.view(), lse_acc.view(), part.view(), lse_part.view()},
      {"part", flashattn::Error::Kind::value, acc.view(), lse_acc.view(), short_part.view(), lse_part.view()},
      {"lse_acc", flashattn::Error::Kind::value, acc.view(), wide_lse.view(), part.view(), lse_part.view()},
      {"lse_part", flashattn::Error::Kind::value, acc.view(), lse_acc.view(), part.view(), wide_lse.view()},
      {"lse_acc", flashattn::Error::Kind::value, acc.view(), same_lse, part.view(), same_lse},  // aliased
      {"out_acc", flashattn::Error::Kind::value, acc.view(), lse_acc.view(), acc.view(), lse_part.view()},
  };
  for (const Bad& x : bad) {
    try {
      flashattn::merge_partial(x.out, x.lse, x.part, x.lse_part);
      ADD_FAILURE() << "accepted a bad " << x.arg;
    } catch (const flashattn::Error& e) {
      EXPECT_EQ(e.kind(), x.kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("flashattn::merge_partial: ") + x.arg + ":"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(snapshot(acc) == acc_before && snapshot(lse_acc) == lse_before) << "a rejected call wrote";
}

}  // namespace
}  // namespace fa_test
