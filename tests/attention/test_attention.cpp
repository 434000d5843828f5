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

// Larger than the tiles in both directions, GQA, many threads' worth of work: races show up as
// bitwise differences between repeated calls.
std::vector<Case> determinism_cases() {
  std::vector<Case> v;
  for (bool causal : {false, true})
    for (bool det : {false, true}) {
      Case c;
      c.name = std::string(causal ? "causal" : "full") + (det ? "_deterministic" : "");
      c.B = 2;
      c.Nq = 257;
      c.Nk = 513;
      c.H = 8;
      c.Hkv = 2;
      c.d = 64;
      c.causal = causal;
      c.deterministic = det;
      v.push_back(c);
    }
  Case w;
  w.name = "varlen_window_softcap";
  w.cu_q = {0, 200, 200, 457};
  w.cu_k = {0, 300, 333, 633};
  w.H = 8;
  w.Hkv = 1;
  w.wl = 64;
  w.wr = 32;
  w.softcap = 5.0f;
  w.mag = 10;
  v.push_back(w);
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

}  // namespace
}  // namespace fa_test
