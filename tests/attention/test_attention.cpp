// Forward and backward of every semantic, for Algorithm::flash and Algorithm::standard, f32/f16/bf16,
// on Device::cpu and Device::cuda (skipped without a device), against the fp64 reference with
// FlashAttention's tolerance rule. See attention_case.cpp for what each case checks.
//
// Suites (ctest names are "<Suite>/Attention.FwdBwd/<case>_<dtype>_<algorithm>_<device>"):
//   Shapes    edge (Nq, Nk) × head dims 32..256 × causal
//   Slow      (1023, 1024) at head dims 59 and 128 (ctest label "slow")
//   Semantics windows, softcap, custom scale, GQA/MQA, varlen, strides, magnitudes, determinism
//   Agree     flash vs standard on identical inputs
//   Repeat    the same call 4 times, bitwise-equal results (races)
#include <gtest/gtest.h>

#include "support/attention_case.hpp"

namespace fa_test {
namespace {

class Attention : public ::testing::TestWithParam<Param> {};
TEST_P(Attention, FwdBwd) { run_case(GetParam()); }

class Agree : public ::testing::TestWithParam<Param> {};
TEST_P(Agree, FlashVsStandard) { run_agreement(GetParam()); }

class Determinism : public ::testing::TestWithParam<Param> {};
TEST_P(Determinism, RepeatedCallsBitwiseEqual) { run_repeat(GetParam(), 4); }

std::string name_of(const ::testing::TestParamInfo<Param>& info) { return param_name(info.param); }

std::string shape_name(int64_t nq, int64_t nk, int64_t d, bool causal) {
  return "s" + std::to_string(nq) + "x" + std::to_string(nk) + "_d" + std::to_string(d) + (causal ? "_causal" : "");
}

// The edge shapes of FlashAttention's suite (style.md): non-multiples of any tile, Nq > Nk and
// Nq < Nk (causal then has fully masked rows or a shifted diagonal), a single row, a single key.
std::vector<Case> shape_cases() {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},   {17, 17}, {113, 203}, {203, 113},
                                                {1, 239}, {3, 799}, {128, 128}};
  std::vector<Case> cases;
  for (auto [nq, nk] : shapes)
    for (int64_t d : {32, 59, 64, 111, 128, 256})
      for (bool causal : {false, true}) {
        Case c;
        c.name = shape_name(nq, nk, d, causal);
        c.B = 2;
        c.H = 2;
        c.Hkv = 1;  // also exercises MQA indexing across the sweep
        c.Nq = nq;
        c.Nk = nk;
        c.d = d;
        c.causal = causal;
        cases.push_back(c);
      }
  return cases;
}

std::vector<Case> slow_cases() {
  std::vector<Case> cases;
  for (int64_t d : {59, 128})
    for (bool causal : {false, true}) {
      Case c;
      c.name = shape_name(1023, 1024, d, causal);
      c.B = 1;
      c.H = 1;
      c.Hkv = 1;
      c.Nq = 1023;
      c.Nk = 1024;
      c.d = d;
      c.causal = causal;
      cases.push_back(c);
    }
  return cases;
}

// Default: B 2, Nq 97, Nk 131, H 4, Hkv 2, d 64, uniform inputs in [-1, 1].
std::vector<Case> semantic_cases() {
  std::vector<Case> v;
  auto add = [&](std::string name, auto&& edit) {
    Case c;
    c.name = std::move(name);
    edit(c);
    v.push_back(c);
  };
  add("base", [](Case&) {});
  add("causal", [](Case& c) { c.causal = true; });
  add("causal_nq_gt_nk", [](Case& c) {  // rows 0..33 see no key
    c.Nq = 131;
    c.Nk = 97;
    c.causal = true;
  });
  add("nq_gt_nk", [](Case& c) {
    c.Nq = 131;
    c.Nk = 97;
  });
  add("window_8_0", [](Case& c) { c.wl = 8, c.wr = 0; });
  add("window_0_8", [](Case& c) { c.wl = 0, c.wr = 8; });
  add("window_16_16", [](Case& c) { c.wl = 16, c.wr = 16; });
  add("window_0_0", [](Case& c) { c.wl = 0, c.wr = 0; });
  add("window_left_only_24", [](Case& c) { c.wl = 24; });
  add("window_right_only_5", [](Case& c) { c.wr = 5; });
  add("causal_window_left_8", [](Case& c) {
    c.causal = true;
    c.wl = 8;
  });
  add("window_4_0_nq_gt_nk", [](Case& c) {  // masked rows at the top, a narrow band below
    c.Nq = 131;
    c.Nk = 97;
    c.wl = 4;
    c.wr = 0;
  });
  add("window_3_2_nq_lt_nk_d59", [](Case& c) {
    c.wl = 3;
    c.wr = 2;
    c.d = 59;
  });
  add("softcap5_x10", [](Case& c) {
    c.softcap = 5.0f;
    c.mag = 10;
  });
  add("softcap5_x10_causal", [](Case& c) {
    c.softcap = 5.0f;
    c.mag = 10;
    c.causal = true;
  });
  add("softcap30_x30_window_8_8", [](Case& c) {
    c.softcap = 30.0f;
    c.mag = 30;
    c.wl = 8;
    c.wr = 8;
  });
  // Scores far below the cap (|s| < 1 against 50): the score is cap·tanh(s/cap), so the kernel's
  // tanh must be accurate relative to its small value, not only to 1e-7 absolute (×50).
  // Few keys and d 8 keep the LSE bound near 1e-6, below what 50 × 1e-7 would leave.
  add("softcap50_small_scores_nk7_d8", [](Case& c) {
    c.softcap = 50.0f;
    c.Nq = 33;
    c.Nk = 7;
    c.d = 8;
  });
  add("scale_0p3", [](Case& c) { c.scale = 0.3f; });
  add("scale_1p7_causal", [](Case& c) {
    c.scale = 1.7f;
    c.causal = true;
  });
  add("scale_negative", [](Case& c) { c.scale = -0.2f; });
  add("x10", [](Case& c) { c.mag = 10; });
  add("x30", [](Case& c) { c.mag = 30; });
  add("x30_causal_d128", [](Case& c) {
    c.mag = 30;
    c.causal = true;
    c.d = 128;
  });
  add("gqa1_h8", [](Case& c) { c.H = 8, c.Hkv = 8; });
  add("gqa4_h8", [](Case& c) { c.H = 8, c.Hkv = 2; });
  add("mqa8_h8", [](Case& c) { c.H = 8, c.Hkv = 1; });
  add("mqa8_h8_causal_d111", [](Case& c) {
    c.H = 8, c.Hkv = 1;
    c.causal = true;
    c.d = 111;
  });
  add("batch3_d32", [](Case& c) {
    c.B = 3;
    c.d = 32;
  });
  // Varlen: q lengths 5, 0, 35, 1; k lengths 7, 12, 0, 41. Sequence 1 has queries but no keys (rows
  // that see no key), sequence 2 keys but no queries (keys no row sees), sequence 3 a single query.
  const std::vector<int32_t> cq = {0, 5, 5, 40, 41}, ck = {0, 7, 19, 19, 60};
  add("varlen", [&](Case& c) {
    c.cu_q = cq;
    c.cu_k = ck;
  });
  add("varlen_causal", [&](Case& c) {
    c.cu_q = cq;
    c.cu_k = ck;
    c.causal = true;
  });
  add("varlen_window_8_0_gqa4", [&](Case& c) {
    c.cu_q = cq;
    c.cu_k = ck;
    c.wl = 8;
    c.wr = 0;
    c.H = 8;
    c.Hkv = 2;
  });
  add("varlen_softcap5_x10_max_seqlen_given", [&](Case& c) {
    c.cu_q = cq;
    c.cu_k = ck;
    c.softcap = 5.0f;
    c.mag = 10;
    c.max_q = 64;  // larger than the longest sequence: allowed
    c.max_k = 41;  // exactly the longest
  });
  add("varlen_long_causal_d128", [](Case& c) {  // q lengths 0, 130, 1, 64; k 77, 200, 0, 64
    c.cu_q = {0, 0, 130, 131, 195};
    c.cu_k = {0, 77, 277, 277, 341};
    c.causal = true;
    c.d = 128;
  });
  // Strides.
  add("packed_qkv", [](Case& c) {  // q, k, v slices of one (B, N, H + 2·Hkv, d) buffer
    c.Nq = c.Nk = 97;
    c.packed_qkv = true;
  });
  add("packed_qkv_causal_mqa", [](Case& c) {
    c.Nq = c.Nk = 113;
    c.H = 4;
    c.Hkv = 1;
    c.packed_qkv = true;
    c.causal = true;
  });
  add("row_padded_in_out", [](Case& c) {  // row stride 3·H·d, like a slice of (B, N, 3, H, d)
    c.in_layout = Layout::row_padded;
    c.out_layout = Layout::row_padded;
    c.padded_lse = true;
  });
  add("heads_first_in", [](Case& c) { c.in_layout = Layout::heads_first; });
  add("heads_first_out_causal", [](Case& c) {
    c.out_layout = Layout::heads_first;
    c.causal = true;
  });
  add("heads_first_varlen", [&](Case& c) {
    c.cu_q = cq;
    c.cu_k = ck;
    c.in_layout = Layout::heads_first;
    c.out_layout = Layout::row_padded;
  });
  add("no_lse", [](Case& c) {
    c.with_lse = false;
    c.backward = false;
  });
  add("deterministic_causal_gqa4", [](Case& c) {
    c.deterministic = true;
    c.causal = true;
    c.H = 8;
    c.Hkv = 2;
  });
  // Everything at once.
  add("kitchen_sink", [&](Case& c) {
    c.cu_q = {0, 33, 33, 100, 101};
    c.cu_k = {0, 40, 41, 41, 160};
    c.H = 8;
    c.Hkv = 1;
    c.causal = true;
    c.wl = 16;
    c.softcap = 5.0f;
    c.mag = 10;
    c.scale = 0.11f;
    c.in_layout = Layout::heads_first;
    c.out_layout = Layout::row_padded;
    c.padded_lse = true;
    c.deterministic = true;
    c.d = 111;
  });
  return v;
}

std::vector<Case> agreement_cases() {
  std::vector<Case> v;
  Case c;
  c.name = "base";
  v.push_back(c);
  c.name = "causal_varlen_gqa4";
  c.cu_q = {0, 5, 5, 40, 41};
  c.cu_k = {0, 7, 19, 19, 60};
  c.causal = true;
  c.H = 8;
  c.Hkv = 2;
  v.push_back(c);
  Case w;
  w.name = "window_16_16_softcap5_x10";
  w.wl = w.wr = 16;
  w.softcap = 5.0f;
  w.mag = 10;
  v.push_back(w);
  Case s;
  s.name = "s203x113_d256_causal";
  s.Nq = 203;
  s.Nk = 113;
  s.d = 256;
  s.causal = true;
  s.B = 1;
  s.H = 2;
  s.Hkv = 2;
  v.push_back(s);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Repeat, Determinism,
                         ::testing::ValuesIn(cross(determinism_cases(), {DType::f32, DType::bf16}, all_algos(),
                                                   all_devices())),
                         name_of);
INSTANTIATE_TEST_SUITE_P(Shapes, Attention, ::testing::ValuesIn(cross(shape_cases(), all_dtypes(), all_algos(), all_devices())),
                         name_of);
INSTANTIATE_TEST_SUITE_P(Slow, Attention, ::testing::ValuesIn(cross(slow_cases(), all_dtypes(), all_algos(), all_devices())),
                         name_of);
INSTANTIATE_TEST_SUITE_P(Semantics, Attention,
                         ::testing::ValuesIn(cross(semantic_cases(), all_dtypes(), all_algos(), all_devices())), name_of);
INSTANTIATE_TEST_SUITE_P(Agree, Agree,
                         ::testing::ValuesIn(cross(agreement_cases(), all_dtypes(), {Algorithm::flash}, all_devices())),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return info.param.c.name + "_" + dtype_name(info.param.dtype) + "_" +
                                  flashattn::to_string(info.param.device);
                         });

// A row that sees one key has P = 1 on it whatever the inputs: softmax is constant there, so the
// row adds exactly 0 to dQ and to that key's dK. The fp64 reference gives 0 too; this checks the
// exact zero (no fp32 residue summed over the key's rows), on the CPU, every algorithm and dtype.
// Shapes: one key for 97 rows (B 1, H 4, Hkv 2, d 96); a diagonal window (0, 0) where each of 64
// rows sees its own key; seqused_k 1 of 131 keys.
TEST(OneVisibleKey, RowsAddNothingToDqDk) {
  FA_SEED_TRACE();
  struct Shape {
    const char* name;
    int64_t nq, nk;
    int wl, wr;
    int32_t used;  // 0: no seqused_k
  };
  const Shape shapes[] = {{"one key", 97, 1, -1, -1, 0}, {"window (0, 0)", 64, 64, 0, 0, 0},
                          {"seqused_k 1", 97, 131, -1, -1, 1}};
  std::mt19937_64 rng(test_seed());
  for (const Shape& sh : shapes)
    for (DType t : all_dtypes())
      for (Algorithm a : all_algos()) {
        SCOPED_TRACE(std::string(sh.name) + ", " + dtype_name(t) + ", " + flashattn::to_string(a));
        HostTensor q = make_tensor(t, {1, sh.nq, 4, 96}), k = make_tensor(t, {1, sh.nk, 2, 96}),
                   v = make_tensor(t, {1, sh.nk, 2, 96}), dout = make_tensor(t, {1, sh.nq, 4, 96});
        HostTensor out = make_tensor(t, q.shape), dq = make_tensor(t, q.shape), dk = make_tensor(t, k.shape),
                   dv = make_tensor(t, v.shape), lse = make_lse({1, 4, sh.nq});
        for (HostTensor* x : {&q, &k, &v, &dout}) fill_uniform(*x, rng, 1.0);
        for (HostTensor* x : {&out, &dq, &dk, &dv, &lse}) poison(*x);
        Options o;
        o.algorithm = a;
        o.window_left = sh.wl;
        o.window_right = sh.wr;
        const std::vector<int32_t> used = {sh.used};
        if (sh.used > 0) o.seqused_k = used.data();
        const Tensor tl = lse.view();
        flashattn::forward(q.view(), k.view(), v.view(), out.view(), &tl, o);
        flashattn::backward(q.view(), k.view(), v.view(), out.view(), dout.view(), tl, dq.view(), dk.view(),
                            dv.view(), o);
        const auto nonzero = [](const HostTensor& x) {
          int64_t n = 0;
          for (double e : x.dense()) n += e != 0.0;
          return n;
        };
        EXPECT_EQ(nonzero(dq), 0) << "dq";
        EXPECT_EQ(nonzero(dk), 0) << "dk";
        for (double e : dv.dense()) ASSERT_TRUE(std::isfinite(e)) << "dv";
      }
}

// The flash backward takes P from the LSE and D from the O it is given (docs/semantics.md): a
// caller that cuts the keys into blocks and passes every block the whole rows' O and LSE, as a
// context-parallel ring does, gets each block's share, and the shares add up to the full gradients
// (dQ summed over the blocks, dK and dV block by block). Blocks of 1, 40, 60 and 30 keys of 131
// (each within one CPU key tile, the first a single key), B 1, Nq 97, H 4, Hkv 2, d 64, f32 and
// bf16 inputs (bf16 gradients are rounded once per block, so their sums are compared at bf16 scale).
TEST(BackwardContract, KeyBlocksGivenTheRowsLseAddUpToTheFullGradients) {
  FA_SEED_TRACE();
  std::mt19937_64 rng(test_seed());
  const int64_t nq = 97, nk = 131, H = 4, Hkv = 2, d = 64;
  const int64_t blocks[] = {1, 40, 60, 30};
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    HostTensor q = make_tensor(t, {1, nq, H, d}), k = make_tensor(t, {1, nk, Hkv, d}),
               v = make_tensor(t, {1, nk, Hkv, d}), dout = make_tensor(t, {1, nq, H, d});
    HostTensor out = make_tensor(t, q.shape), dq = make_tensor(t, q.shape), dk = make_tensor(t, k.shape),
               dv = make_tensor(t, v.shape), lse = make_lse({1, H, nq});
    for (HostTensor* x : {&q, &k, &v, &dout}) fill_uniform(*x, rng, 1.0);
    for (HostTensor* x : {&out, &dq, &dk, &dv, &lse}) poison(*x);
    const Tensor tl = lse.view();
    flashattn::forward(q.view(), k.view(), v.view(), out.view(), &tl, Options{});
    flashattn::backward(q.view(), k.view(), v.view(), out.view(), dout.view(), tl, dq.view(), dk.view(),
                        dv.view(), Options{});

    HostTensor dkb = make_tensor(t, k.shape), dvb = make_tensor(t, v.shape);
    poison(dkb);
    poison(dvb);
    std::vector<double> dq_sum(size_t(q.numel()), 0.0);
    int64_t j0 = 0;
    for (int64_t n : blocks) {
      const auto keys = [&](const HostTensor& x) {  // x[:, j0:j0+n] as a view
        HostTensor b = x;
        b.shape[1] = n;
        b.offset = x.index(0, j0, 0, 0);
        return b;
      };
      HostTensor dqb = make_tensor(t, q.shape);
      poison(dqb);
      flashattn::backward(q.view(), keys(k).view(), keys(v).view(), out.view(), dout.view(), tl, dqb.view(),
                          keys(dkb).view(), keys(dvb).view(), Options{});
      const std::vector<double> part = dqb.dense();
      for (size_t i = 0; i < part.size(); ++i) dq_sum[i] += part[i];
      j0 += n;
    }
    const auto close = [&](const char* what, const std::vector<double>& x, const std::vector<double>& full) {
      double m = 1.0, e = 0.0;
      for (size_t i = 0; i < full.size(); ++i) m = std::max(m, std::abs(full[i]));
      for (size_t i = 0; i < full.size(); ++i) e = std::max(e, std::abs(x[i] - full[i]));
      // f32: summation-order differences of a few ulps per block; bf16: one rounding per block.
      const double tol = (t == DType::f32 ? 64 * 0x1p-24 : 4 * 0x1p-8) * m;
      EXPECT_LE(e, tol) << what << ": max |blocks − full| " << e << ", max |full| " << m;
    };
    close("dq", dq_sum, dq.dense());
    close("dk", dkb.dense(), dk.dense());
    close("dv", dvb.dense(), dv.dense());
  }
}

}  // namespace
}  // namespace fa_test
