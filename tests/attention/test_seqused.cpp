// Options::seqused_k (docs/semantics.md, "Padding without copies"): each sequence attends to the
// first seqused_k[b] rows of its keys, its masks aligned bottom-right to that count, and the rows
// past it are padding whose dK and dV are exact zeros. Checked on both backends (CUDA: skipped
// without a GPU) against the test's own fp64 oracle (tests/support/attention_oracle.cpp, which
// knows seqused_k only as each sequence's key count) with FlashAttention's tolerance rule;
// outputs are poisoned before every call. With NaN in the padding rows the results must stay finite
// and within the rule: the padding is never read as keys or values.
//
// Suites: Seqused (forward and backward, run_case), SequsedAgree (flash vs standard), SequsedRepeat
// (bitwise-equal repeated calls), SequsedChecks (bad values: Error naming seqused_k, nothing written,
// on every device; the boundary values run).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "support/attention_case.hpp"

namespace fa_test {
namespace {

class Seqused : public ::testing::TestWithParam<Param> {};
TEST_P(Seqused, FwdBwd) { run_case(GetParam()); }

class SequsedAgree : public ::testing::TestWithParam<Param> {};
TEST_P(SequsedAgree, FlashVsStandard) { run_agreement(GetParam()); }

class SequsedRepeat : public ::testing::TestWithParam<Param> {};
TEST_P(SequsedRepeat, RepeatedCallsBitwiseEqual) { run_repeat(GetParam(), 3); }

std::string name_of(const ::testing::TestParamInfo<Param>& info) { return param_name(info.param); }

// Default: B 4, Nq 97, Nk 131, H 4, Hkv 2, d 64; sequences use 1, 17, 0 (their rows see no key) and
// all 131 keys.
std::vector<Case> seqused_cases() {
  std::vector<Case> v;
  auto add = [&](std::string name, auto&& edit) {
    Case c;
    c.name = std::move(name);
    c.B = 4;
    c.seqused_k = {1, 17, 0, 131};
    edit(c);
    v.push_back(c);
  };
  add("base", [](Case&) {});
  add("causal", [](Case& c) { c.causal = true; });
  add("causal_nq_gt_nk", [](Case& c) {  // Nq > seqused_k: the top rows see no key
    c.Nq = 131;
    c.Nk = 97;
    c.causal = true;
    c.seqused_k = {97, 40, 0, 3};
  });
  add("window_8_0", [](Case& c) { c.wl = 8, c.wr = 0; });
  add("window_16_16", [](Case& c) { c.wl = 16, c.wr = 16; });
  add("causal_window_left_8", [](Case& c) {
    c.causal = true;
    c.wl = 8;
  });
  add("gqa4_h8", [](Case& c) { c.H = 8, c.Hkv = 2; });
  add("mqa8_h8_causal", [](Case& c) {
    c.H = 8, c.Hkv = 1;
    c.causal = true;
  });
  add("softcap5_x10_d128", [](Case& c) {
    c.softcap = 5.0f;
    c.mag = 10;
    c.d = 128;
  });
  // Key counts on both sides of the 128-key tiles (the Hopper d64/d128 kernels, the CPU backward).
  add("tiles_d128", [](Case& c) {
    c.Nq = 70;
    c.Nk = 300;
    c.d = 128;
    c.seqused_k = {300, 257, 129, 128};
  });
  add("tiles_d128_causal", [](Case& c) {
    c.Nq = 70;
    c.Nk = 300;
    c.d = 128;
    c.causal = true;
    c.seqused_k = {300, 257, 129, 127};
  });
  add("d96", [](Case& c) { c.d = 96; });
  add("d256_causal", [](Case& c) {  // the Hopper forward's 80-key tiles
    c.B = 3;
    c.Nk = 160;
    c.d = 256;
    c.causal = true;
    c.seqused_k = {81, 79, 160};
  });
  add("d59", [](Case& c) { c.d = 59; });
  add("all_used_b1", [](Case& c) {
    c.B = 1;
    c.seqused_k = {131};
  });
  add("heads_first_in_row_padded_out", [](Case& c) {
    c.in_layout = Layout::heads_first;
    c.out_layout = Layout::row_padded;
    c.padded_lse = true;
  });
  // NaN in every padding row of K and V.
  add("nan_padding", [](Case& c) { c.nan_padding = true; });
  add("nan_padding_causal_d128", [](Case& c) {
    c.nan_padding = true;
    c.causal = true;
    c.d = 128;
    c.Nk = 300;
    c.seqused_k = {300, 257, 0, 1};
  });
  add("nan_padding_window_gqa4", [](Case& c) {
    c.nan_padding = true;
    c.wl = 16, c.wr = 4;
    c.H = 8, c.Hkv = 2;
  });
  add("nan_padding_softcap5_x10_d128", [](Case& c) {
    c.nan_padding = true;
    c.softcap = 5.0f;
    c.mag = 10;
    c.d = 128;
  });
  add("nan_padding_d256", [](Case& c) {
    c.nan_padding = true;
    c.B = 3;
    c.Nk = 160;
    c.d = 256;
    c.seqused_k = {81, 17, 160};
  });
  // With varlen: q lengths 5, 0, 35, 1; k spans 7, 12, 0, 41, of which 3, 12, 0, 17 are used.
  const std::vector<int32_t> cq = {0, 5, 5, 40, 41}, ck = {0, 7, 19, 19, 60};
  add("varlen", [&](Case& c) {
    c.cu_q = cq;
    c.cu_k = ck;
    c.seqused_k = {3, 12, 0, 17};
  });
  add("varlen_causal_nan_padding", [&](Case& c) {
    c.cu_q = cq;
    c.cu_k = ck;
    c.seqused_k = {3, 12, 0, 17};
    c.causal = true;
    c.nan_padding = true;
  });
  add("varlen_long_causal_d128_nan_padding", [](Case& c) {  // q 0, 130, 1, 64; k spans 77, 200, 0, 64
    c.cu_q = {0, 0, 130, 131, 195};
    c.cu_k = {0, 77, 277, 277, 341};
    c.seqused_k = {70, 129, 0, 63};
    c.causal = true;
    c.d = 128;
    c.nan_padding = true;
  });
  return v;
}

std::vector<Case> agreement_cases() {
  std::vector<Case> v;
  Case c;
  c.name = "nan_padding_causal_gqa4";
  c.B = 3;
  c.H = 8;
  c.Hkv = 2;
  c.causal = true;
  c.seqused_k = {131, 50, 0};
  c.nan_padding = true;
  v.push_back(c);
  Case w;
  w.name = "varlen_window_16_16";
  w.cu_q = {0, 5, 5, 40, 41};
  w.cu_k = {0, 7, 19, 19, 60};
  w.seqused_k = {3, 12, 0, 17};
  w.wl = w.wr = 16;
  v.push_back(w);
  return v;
}

// determinism_cases()' batch shapes (larger than the tiles both ways, GQA), sequence 0 using 300
// of its 513 keys, NaN in the padding: races show up as bitwise differences between calls.
std::vector<Case> repeat_cases() {
  std::vector<Case> v;
  for (Case c : determinism_cases())
    if (c.cu_q.empty()) {
      c.seqused_k = {300, 513};
      c.nan_padding = true;
      v.push_back(c);
    }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Seqused, Seqused,
                         ::testing::ValuesIn(cross(seqused_cases(), all_dtypes(), all_algos(), all_devices())), name_of);
INSTANTIATE_TEST_SUITE_P(SequsedAgree, SequsedAgree,
                         ::testing::ValuesIn(cross(agreement_cases(), all_dtypes(), {Algorithm::flash}, all_devices())),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return info.param.c.name + "_" + dtype_name(info.param.dtype) + "_" +
                                  flashattn::to_string(info.param.device);
                         });
INSTANTIATE_TEST_SUITE_P(SequsedRepeat, SequsedRepeat,
                         ::testing::ValuesIn(cross(repeat_cases(), {DType::bf16}, all_algos(), all_devices())), name_of);

// ---- bad values ---------------------------------------------------------------------------------
// One small call on `dev` (bf16, B 2, Nq 9, Nk 13, H 2, Hkv 1, d 64; varlen when cu_k is given): its
// inputs, poisoned outputs and the options, seqused_k pointing at `used` in the device's memory.
struct SmallCall {
  Device dev;
  int64_t B, Nq, Nk;
  HostTensor q, k, v, out, lse, dout, dq, dk, dv;
  Placement pl;
  Options opts;
  std::vector<int32_t> cu_q, cu_k, used;

  SmallCall(Device d, std::vector<int32_t> used_, std::vector<int32_t> cu_k_ = {})
      : dev(d), pl(d), cu_k(std::move(cu_k_)), used(std::move(used_)) {
    const bool varlen = !cu_k.empty();
    B = varlen ? 1 : 2;
    if (varlen) cu_q = {0, 4, 9};
    Nq = 9;
    Nk = varlen ? cu_k.back() : 13;
    const DType t = DType::bf16;
    q = make_tensor(t, {B, Nq, 2, 64});
    k = make_tensor(t, {B, Nk, 1, 64});
    v = make_tensor(t, {B, Nk, 1, 64});
    dout = make_tensor(t, {B, Nq, 2, 64});
    out = make_tensor(t, {B, Nq, 2, 64});
    dq = make_tensor(t, {B, Nq, 2, 64});
    dk = make_tensor(t, {B, Nk, 1, 64});
    dv = make_tensor(t, {B, Nk, 1, 64});
    lse = make_lse({B, 2, Nq}, false);
    std::mt19937_64 rng(test_seed());
    for (HostTensor* x : {&q, &k, &v, &dout, &out, &lse}) fill_uniform(*x, rng, 1.0);
    if (varlen) {
      opts.cu_seqlens_q = pl.put_ints(cu_q);
      opts.cu_seqlens_k = pl.put_ints(cu_k);
      opts.varlen_batch = 2;
    }
    opts.seqused_k = used.empty() ? nullptr : pl.put_ints(used);
  }
};

// The call is rejected before anything is written: Error of kind value naming seqused_k (and the
// call), every output still holds its poison.
void expect_rejected(Device dev, const std::vector<int32_t>& used, const std::vector<int32_t>& cu_k = {}) {
  FA_SEED_TRACE();
  if (skip_without_device(dev)) GTEST_SKIP() << "no usable CUDA device";
  SmallCall c(dev, used, cu_k);
  SCOPED_TRACE(std::string("device ") + flashattn::to_string(dev) + ", seqused_k {" + [&] {
    std::string s;
    for (int32_t x : used) s += std::to_string(x) + ",";
    return s;
  }() + "}" + (cu_k.empty() ? "" : " with varlen"));
  for (HostTensor* x : {&c.dq, &c.dk, &c.dv}) poison(*x);
  HostTensor fresh_out = make_tensor(DType::bf16, c.out.shape), fresh_lse = make_lse({c.B, 2, c.Nq}, false);
  poison(fresh_out);
  poison(fresh_lse);
  const auto snap = [](HostTensor* const* xs, size_t n) {
    std::vector<std::vector<uint64_t>> s;
    for (size_t i = 0; i < n; ++i) s.push_back(snapshot(*xs[i]));
    return s;
  };
  HostTensor* outs[] = {&fresh_out, &fresh_lse, &c.dq, &c.dk, &c.dv};
  const auto before = snap(outs, 5);
  const Tensor tl = c.pl.put(fresh_lse);
  try {
    flashattn::forward(c.pl.put(c.q), c.pl.put(c.k), c.pl.put(c.v), c.pl.put(fresh_out), &tl, c.opts);
    ADD_FAILURE() << "forward accepted a bad seqused_k";
  } catch (const flashattn::Error& e) {
    EXPECT_EQ(e.kind(), flashattn::Error::Kind::value) << e.what();
    EXPECT_NE(std::strstr(e.what(), "flashattn::forward: seqused_k"), nullptr) << e.what();
  }
  try {
    flashattn::backward(c.pl.put(c.q), c.pl.put(c.k), c.pl.put(c.v), c.pl.put(c.out), c.pl.put(c.dout),
                        c.pl.put(c.lse), c.pl.put(c.dq), c.pl.put(c.dk), c.pl.put(c.dv), c.opts);
    ADD_FAILURE() << "backward accepted a bad seqused_k";
  } catch (const flashattn::Error& e) {
    EXPECT_EQ(e.kind(), flashattn::Error::Kind::value) << e.what();
    EXPECT_NE(std::strstr(e.what(), "flashattn::backward: seqused_k"), nullptr) << e.what();
  }
  for (HostTensor* x : outs) c.pl.fetch(*x);
  EXPECT_TRUE(snap(outs, 5) == before) << "a rejected call wrote an output";
}

// The checks' boundary values (0 and the sequence's key rows) pass them: the call runs, forward
// and backward.
void expect_accepted(Device dev, const std::vector<int32_t>& used, const std::vector<int32_t>& cu_k = {}) {
  FA_SEED_TRACE();
  if (skip_without_device(dev)) GTEST_SKIP() << "no usable CUDA device";
  SmallCall c(dev, used, cu_k);
  const Tensor tl = c.pl.put(c.lse);
  EXPECT_NO_THROW(flashattn::forward(c.pl.put(c.q), c.pl.put(c.k), c.pl.put(c.v), c.pl.put(c.out), &tl, c.opts));
  EXPECT_NO_THROW(flashattn::backward(c.pl.put(c.q), c.pl.put(c.k), c.pl.put(c.v), c.pl.put(c.out), c.pl.put(c.dout),
                                      c.pl.put(c.lse), c.pl.put(c.dq), c.pl.put(c.dk), c.pl.put(c.dv), c.opts));
}

class SequsedChecks : public ::testing::TestWithParam<Device> {};

TEST_P(SequsedChecks, NegativeEntryRejected) { expect_rejected(GetParam(), {-1, 5}); }
TEST_P(SequsedChecks, EntryPastNkRejected) { expect_rejected(GetParam(), {14, 3}); }
TEST_P(SequsedChecks, SecondEntryPastNkRejected) { expect_rejected(GetParam(), {13, 14}); }
TEST_P(SequsedChecks, VarlenEntryPastSpanRejected) { expect_rejected(GetParam(), {8, 1}, {0, 7, 20}); }
TEST_P(SequsedChecks, VarlenSecondEntryPastSpanRejected) { expect_rejected(GetParam(), {7, 14}, {0, 7, 20}); }
TEST_P(SequsedChecks, BoundsAccepted) {
  expect_accepted(GetParam(), {0, 13});
  expect_accepted(GetParam(), {7, 0}, {0, 7, 20});
  expect_accepted(GetParam(), {0, 13}, {0, 7, 20});
}

INSTANTIATE_TEST_SUITE_P(SequsedChecks, SequsedChecks, ::testing::ValuesIn(all_devices()),
                         [](const ::testing::TestParamInfo<Device>& info) { return flashattn::to_string(info.param); });

// Null seqused_k is absent: every key row used. And seqused_k[b] = Nk for all b is the same call:
// on the CPU bitwise the same results (one code path).
TEST(SequsedCpu, AllKeysUsedIsBitwiseTheSameAsAbsent) {
  FA_SEED_TRACE();
  for (bool causal : {false, true}) {
    SmallCall with(Device::cpu, {13, 13}), without(Device::cpu, {});
    with.opts.causal = without.opts.causal = causal;
    ASSERT_EQ(without.opts.seqused_k, nullptr);
    ASSERT_TRUE(bitwise_equal(with.q, without.q) && bitwise_equal(with.k, without.k));
    for (SmallCall* c : {&with, &without}) {
      const Tensor tl = c->lse.view();
      flashattn::forward(c->q.view(), c->k.view(), c->v.view(), c->out.view(), &tl, c->opts);
      flashattn::backward(c->q.view(), c->k.view(), c->v.view(), c->out.view(), c->dout.view(), c->lse.view(),
                          c->dq.view(), c->dk.view(), c->dv.view(), c->opts);
    }
    EXPECT_TRUE(bitwise_equal(with.out, without.out)) << "causal " << causal;
    EXPECT_TRUE(bitwise_equal(with.lse, without.lse)) << "causal " << causal;
    EXPECT_TRUE(bitwise_equal(with.dq, without.dq)) << "causal " << causal;
    EXPECT_TRUE(bitwise_equal(with.dk, without.dk)) << "causal " << causal;
    EXPECT_TRUE(bitwise_equal(with.dv, without.dv)) << "causal " << causal;
  }
}

// CUDA reads seqused_k in device memory: a host pointer is rejected (Error of kind type naming it).
TEST(SequsedCuda, HostPointerRejected) {
  FA_SEED_TRACE();
  if (skip_without_device(Device::cuda)) GTEST_SKIP() << "no usable CUDA device";
  SmallCall c(Device::cuda, {5, 13});
  c.opts.seqused_k = c.used.data();  // host memory
  HostTensor out = make_tensor(DType::bf16, c.out.shape);
  poison(out);
  const auto before = snapshot(out);
  const Tensor tl = c.pl.put(c.lse);
  try {
    flashattn::forward(c.pl.put(c.q), c.pl.put(c.k), c.pl.put(c.v), c.pl.put(out), &tl, c.opts);
    ADD_FAILURE() << "forward accepted a host pointer for seqused_k on CUDA";
  } catch (const flashattn::Error& e) {
    EXPECT_EQ(e.kind(), flashattn::Error::Kind::type) << e.what();
    EXPECT_NE(std::strstr(e.what(), "seqused_k"), nullptr) << e.what();
  }
  c.pl.fetch(out);
  EXPECT_TRUE(snapshot(out) == before) << "a rejected call wrote out";
}

}  // namespace
}  // namespace fa_test
