// Bad input: every check in src/core/check.cpp. For each, flashattn::Error is thrown, its message
// has the form "flashattn::<forward|backward>: <argument>: expected <...>, got <...>" naming the
// argument, and no buffer (outputs or inputs) is touched: all storages are compared bitwise with a
// snapshot taken just before the call.
//
// Mutated descriptors always point at memory large enough for what they claim (a retyped or
// restrided tensor gets its own buffer), so a check that is missing shows up as a test failure,
// not as a crash elsewhere.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/test_util.hpp"

namespace fa_test {
namespace {

struct Dims {
  int64_t B = 2, Nq = 5, Nk = 7, H = 4, Hkv = 2, d = 16;
  bool varlen = false;  // cu_seqlens_q {0,3,3,8}, cu_seqlens_k {0,4,9,9}; Nq 8, Nk 9 (B as given)
};

// A valid call (forward and backward) that each case then breaks in one way.
struct Call {
  Dims dims;
  DType dtype = DType::f16;
  HostTensor q, k, v, out, lse, dout, dq, dk, dv;
  Tensor tq, tk, tv, tout, tlse, tdout, tdq, tdk, tdv;
  std::vector<int32_t> cu_q, cu_k;
  Options o;
  bool pass_lse = true;            // forward: lse pointer or nullptr
  std::vector<HostTensor> extras;  // buffers created by a mutation

  explicit Call(Dims d_ = {}) : dims(d_) {
    if (dims.varlen) {
      dims.Nq = 8;
      dims.Nk = 9;
      cu_q = {0, 3, 3, 8};
      cu_k = {0, 4, 9, 9};
      o.cu_seqlens_q = cu_q.data();
      o.cu_seqlens_k = cu_k.data();
      o.varlen_batch = 3;
    }
    const auto [B, Nq, Nk, H, Hkv, d, vl] = dims;
    (void)vl;
    q = make_tensor(dtype, {B, Nq, H, d});
    k = make_tensor(dtype, {B, Nk, Hkv, d});
    v = make_tensor(dtype, {B, Nk, Hkv, d});
    dout = make_tensor(dtype, {B, Nq, H, d});
    out = make_tensor(dtype, {B, Nq, H, d});
    dq = make_tensor(dtype, {B, Nq, H, d});
    dk = make_tensor(dtype, {B, Nk, Hkv, d});
    dv = make_tensor(dtype, {B, Nk, Hkv, d});
    lse = make_lse({B, H, Nq});
    std::mt19937_64 rng(test_seed());
    for (HostTensor* t : {&q, &k, &v, &dout}) fill_uniform(*t, rng, 1.0);
    for (HostTensor* t : {&out, &dq, &dk, &dv, &lse}) fill_sentinel(*t, 0x5a);
    tq = q.view(), tk = k.view(), tv = v.view(), tout = out.view(), tlse = lse.view();
    tdout = dout.view(), tdq = dq.view(), tdk = dk.view(), tdv = dv.view();
  }
  Call(Call&&) = default;
  Call& operator=(Call&& other) {
    // Rebuilding a call keeps the cu_seqlens pointers valid (they point into this object).
    dims = other.dims;
    dtype = other.dtype;
    q = other.q, k = other.k, v = other.v, out = other.out, lse = other.lse;
    dout = other.dout, dq = other.dq, dk = other.dk, dv = other.dv;
    tq = other.tq, tk = other.tk, tv = other.tv, tout = other.tout, tlse = other.tlse;
    tdout = other.tdout, tdq = other.tdq, tdk = other.tdk, tdv = other.tdv;
    cu_q = other.cu_q;
    cu_k = other.cu_k;
    o = other.o;
    if (o.cu_seqlens_q == other.cu_q.data()) o.cu_seqlens_q = cu_q.data();
    if (o.cu_seqlens_k == other.cu_k.data()) o.cu_seqlens_k = cu_k.data();
    pass_lse = other.pass_lse;
    extras = other.extras;
    return *this;
  }

  // Points t at a fresh buffer of the same shape in another dtype.
  void retype(Tensor& t, DType to) {
    HostTensor h = make_tensor(to, t.shape);
    fill_sentinel(h, 0x3c);
    extras.push_back(h);
    t.data = h.data();
    t.dtype = to;
  }
  // Points t at a fresh buffer where the last dimension has stride 2.
  void restride_last(Tensor& t) {
    HostTensor h = make_tensor(t.dtype, {t.shape[0], t.shape[1], t.shape[2], 2 * t.shape[3]});
    fill_sentinel(h, 0x3c);
    extras.push_back(h);
    t.data = h.data();
    t.strides = {t.shape[1] * t.shape[2] * 2 * t.shape[3], t.shape[2] * 2 * t.shape[3], 2 * t.shape[3], 2};
  }
  void set_cu(std::vector<int32_t> cq, std::vector<int32_t> ck) {
    cu_q = std::move(cq);
    cu_k = std::move(ck);
    o.cu_seqlens_q = cu_q.data();
    o.cu_seqlens_k = cu_k.data();
  }
  // Shrinks one dimension of t (the claim stays within its memory).
  static void shrink(Tensor& t, int dim, int64_t by = 1) { t.shape[size_t(dim)] -= by; }

  std::vector<HostTensor*> all() {
    std::vector<HostTensor*> v_ = {&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv};
    for (auto& e : extras) v_.push_back(&e);
    return v_;
  }

  void forward() { flashattn::forward(tq, tk, tv, tout, pass_lse ? &tlse : nullptr, o); }
  void backward() { flashattn::backward(tq, tk, tv, tout, tdout, tlse, tdq, tdk, tdv, o); }
};

enum Which { kFwd = 1, kBwd = 2, kBoth = 3 };

struct Bad {
  std::string name;
  std::string arg;  // the argument the message must name
  int which;
  std::function<void(Call&)> mutate;
};

std::vector<Bad> bad_cases() {
  std::vector<Bad> v;
  auto add = [&](std::string name, std::string arg, int which, std::function<void(Call&)> f) {
    v.push_back({std::move(name), std::move(arg), which, std::move(f)});
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();

  // dtypes
  add("k_dtype_f32", "k", kBoth, [](Call& c) { c.retype(c.tk, DType::f32); });
  add("v_dtype_bf16", "v", kBoth, [](Call& c) { c.retype(c.tv, DType::bf16); });
  add("out_dtype_f32", "out", kBoth, [](Call& c) { c.retype(c.tout, DType::f32); });
  add("q_dtype_invalid", "q", kBoth, [](Call& c) { c.tq.dtype = static_cast<DType>(7); });
  add("dout_dtype_f32", "dout", kBwd, [](Call& c) { c.retype(c.tdout, DType::f32); });
  add("dq_dtype_bf16", "dq", kBwd, [](Call& c) { c.retype(c.tdq, DType::bf16); });
  add("dk_dtype_f32", "dk", kBwd, [](Call& c) { c.retype(c.tdk, DType::f32); });
  add("dv_dtype_bf16", "dv", kBwd, [](Call& c) { c.retype(c.tdv, DType::bf16); });
  add("lse_dtype_f16", "lse", kBoth, [](Call& c) {
    c.tlse.dtype = DType::f16;  // its buffer is f32-sized, so large enough
  });
  // devices
  add("k_device_cuda", "k", kBoth, [](Call& c) { c.tk.device = Device::cuda; });
  add("v_device_cuda", "v", kBoth, [](Call& c) { c.tv.device = Device::cuda; });
  add("out_device_cuda", "out", kBoth, [](Call& c) { c.tout.device = Device::cuda; });
  add("lse_device_cuda", "lse", kBoth, [](Call& c) { c.tlse.device = Device::cuda; });
  add("q_device_invalid", "q", kBoth, [](Call& c) { c.tq.device = static_cast<Device>(9); });
  add("dout_device_cuda", "dout", kBwd, [](Call& c) { c.tdout.device = Device::cuda; });
  add("dq_device_cuda", "dq", kBwd, [](Call& c) { c.tdq.device = Device::cuda; });
  add("dk_device_cuda", "dk", kBwd, [](Call& c) { c.tdk.device = Device::cuda; });
  add("dv_device_cuda", "dv", kBwd, [](Call& c) { c.tdv.device = Device::cuda; });
  // last dimension not contiguous
  add("q_last_stride_2", "q", kBoth, [](Call& c) { c.restride_last(c.tq); });
  add("k_last_stride_2", "k", kBoth, [](Call& c) { c.restride_last(c.tk); });
  add("v_last_stride_2", "v", kBoth, [](Call& c) { c.restride_last(c.tv); });
  add("out_last_stride_2", "out", kBoth, [](Call& c) { c.restride_last(c.tout); });
  add("dout_last_stride_2", "dout", kBwd, [](Call& c) { c.restride_last(c.tdout); });
  add("dq_last_stride_2", "dq", kBwd, [](Call& c) { c.restride_last(c.tdq); });
  add("dk_last_stride_2", "dk", kBwd, [](Call& c) { c.restride_last(c.tdk); });
  add("dv_last_stride_2", "dv", kBwd, [](Call& c) { c.restride_last(c.tdv); });
  // shapes that disagree
  add("k_batch", "k", kBoth, [](Call& c) { Call::shrink(c.tk, 0); });
  add("k_head_dim", "k", kBoth, [](Call& c) { Call::shrink(c.tk, 3, 8); });
  add("v_seqlen", "v", kBoth, [](Call& c) { Call::shrink(c.tv, 1); });
  add("v_heads", "v", kBoth, [](Call& c) { Call::shrink(c.tv, 2); });
  add("v_head_dim", "v", kBoth, [](Call& c) { Call::shrink(c.tv, 3, 8); });
  add("v_batch", "v", kBoth, [](Call& c) { Call::shrink(c.tv, 0); });
  add("out_batch", "out", kBoth, [](Call& c) { Call::shrink(c.tout, 0); });
  add("out_seqlen", "out", kBoth, [](Call& c) { Call::shrink(c.tout, 1); });
  add("out_heads", "out", kBoth, [](Call& c) { Call::shrink(c.tout, 2, 2); });
  add("out_head_dim", "out", kBoth, [](Call& c) { Call::shrink(c.tout, 3, 8); });
  add("lse_seqlen", "lse", kBoth, [](Call& c) { Call::shrink(c.tlse, 2); });
  add("lse_heads", "lse", kBoth, [](Call& c) { Call::shrink(c.tlse, 1); });
  add("lse_transposed_b_nq_h", "lse", kBoth, [](Call& c) {  // (B, Nq, H, 1) instead of (B, H, Nq, 1)
    c.tlse.shape = {c.dims.B, c.dims.Nq, c.dims.H, 1};
    c.tlse.strides = {c.dims.Nq * c.dims.H, c.dims.H, 1, 1};
  });
  add("lse_last_dim_2", "lse", kBoth, [](Call& c) {
    c.tlse.shape = {c.dims.B, c.dims.H, c.dims.Nq / 2, 2};
    c.tlse.strides = {c.dims.H * (c.dims.Nq / 2) * 2, (c.dims.Nq / 2) * 2, 2, 1};
  });
  add("dout_seqlen", "dout", kBwd, [](Call& c) { Call::shrink(c.tdout, 1); });
  add("dq_heads", "dq", kBwd, [](Call& c) { Call::shrink(c.tdq, 2); });
  add("dk_seqlen", "dk", kBwd, [](Call& c) { Call::shrink(c.tdk, 1); });
  add("dv_heads", "dv", kBwd, [](Call& c) { Call::shrink(c.tdv, 2); });
  add("dv_head_dim", "dv", kBwd, [](Call& c) { Call::shrink(c.tdv, 3, 8); });
  add("q_negative_size", "q", kBoth, [](Call& c) { c.tq.shape[1] = -1; });
  add("q_negative_stride", "q", kBoth, [](Call& c) {
    c.tq.strides[1] = -c.tq.strides[1];
    c.tq.data = static_cast<char*>(c.tq.data) + (c.dims.Nq - 1) * c.dims.H * c.dims.d * 2;  // stays in bounds
  });
  // head_dim and heads
  add("head_dim_0", "q", kBoth, [](Call& c) {
    Dims d = c.dims;
    d.d = 0;
    c = Call(d);
  });
  add("head_dim_264", "q", kBoth, [](Call& c) {
    Dims d = c.dims;
    d.d = 264;
    c = Call(d);
  });
  add("heads_not_divisible", "k", kBoth, [](Call& c) {
    Dims d = c.dims;
    d.H = 4;
    d.Hkv = 3;
    c = Call(d);
  });
  add("heads_kv_more_than_heads", "k", kBoth, [](Call& c) {
    Dims d = c.dims;
    d.H = 2;
    d.Hkv = 4;
    c = Call(d);
  });
  add("heads_0", "q", kBoth, [](Call& c) {
    Dims d = c.dims;
    d.H = 0;
    c = Call(d);
  });
  add("heads_kv_0", "k", kBoth, [](Call& c) {
    Dims d = c.dims;
    d.Hkv = 0;
    c = Call(d);
  });
  // null data
  add("q_null", "q", kBoth, [](Call& c) { c.tq.data = nullptr; });
  add("k_null", "k", kBoth, [](Call& c) { c.tk.data = nullptr; });
  add("v_null", "v", kBoth, [](Call& c) { c.tv.data = nullptr; });
  add("out_null", "out", kBoth, [](Call& c) { c.tout.data = nullptr; });
  add("lse_null", "lse", kBoth, [](Call& c) { c.tlse.data = nullptr; });
  add("dout_null", "dout", kBwd, [](Call& c) { c.tdout.data = nullptr; });
  add("dq_null", "dq", kBwd, [](Call& c) { c.tdq.data = nullptr; });
  add("dk_null", "dk", kBwd, [](Call& c) { c.tdk.data = nullptr; });
  add("dv_null", "dv", kBwd, [](Call& c) { c.tdv.data = nullptr; });
  // varlen
  auto varlen = [](Call& c) { c = Call(Dims{1, 0, 0, 4, 2, 16, true}); };
  add("cu_seqlens_q_not_monotone", "cu_seqlens_q", kBoth, [=](Call& c) {
    varlen(c);
    c.set_cu({0, 3, 2, 8}, c.cu_k);
  });
  add("cu_seqlens_k_not_monotone", "cu_seqlens_k", kBoth, [=](Call& c) {
    varlen(c);
    c.set_cu(c.cu_q, {0, 5, 4, 9});
  });
  add("cu_seqlens_q_first_not_0", "cu_seqlens_q", kBoth, [=](Call& c) {
    varlen(c);
    c.set_cu({1, 3, 3, 8}, c.cu_k);
  });
  add("cu_seqlens_k_first_not_0", "cu_seqlens_k", kBoth, [=](Call& c) {
    varlen(c);
    c.set_cu(c.cu_q, {2, 4, 9, 9});
  });
  add("cu_seqlens_q_last_short", "cu_seqlens_q", kBoth, [=](Call& c) {
    varlen(c);
    c.set_cu({0, 3, 3, 7}, c.cu_k);
  });
  add("cu_seqlens_k_last_long", "cu_seqlens_k", kBoth, [=](Call& c) {
    varlen(c);
    c.set_cu(c.cu_q, {0, 4, 9, 10});
  });
  add("cu_seqlens_only_q", "cu_seqlens_k", kBoth, [=](Call& c) {
    varlen(c);
    c.o.cu_seqlens_k = nullptr;
  });
  add("cu_seqlens_only_k", "cu_seqlens_q", kBoth, [=](Call& c) {
    varlen(c);
    c.o.cu_seqlens_q = nullptr;
  });
  add("varlen_batch_2", "q", kBoth, [](Call& c) { c = Call(Dims{2, 0, 0, 4, 2, 16, true}); });
  add("varlen_batch_count_0", "varlen_batch", kBoth, [=](Call& c) {
    varlen(c);
    c.o.varlen_batch = 0;
  });
  add("varlen_batch_count_without_cu", "varlen_batch", kBoth, [](Call& c) { c.o.varlen_batch = 2; });
  add("max_seqlen_q_too_small", "max_seqlen_q", kBoth, [=](Call& c) {
    varlen(c);
    c.o.max_seqlen_q = 4;  // the longest query sequence is 5
  });
  add("max_seqlen_k_too_small", "max_seqlen_k", kBoth, [=](Call& c) {
    varlen(c);
    c.o.max_seqlen_k = 4;  // the longest key sequence is 5
  });
  add("max_seqlen_q_negative", "max_seqlen_q", kBoth, [=](Call& c) {
    varlen(c);
    c.o.max_seqlen_q = -1;
  });
  // options
  add("window_left_minus_2", "window_left", kBoth, [](Call& c) { c.o.window_left = -2; });
  add("window_right_minus_5", "window_right", kBoth, [](Call& c) { c.o.window_right = -5; });
  add("causal_with_window_right_1", "window_right", kBoth, [](Call& c) {
    c.o.causal = true;
    c.o.window_right = 1;
  });
  add("scale_nan", "scale", kBoth, [=](Call& c) { c.o.scale = nan; });
  add("scale_inf", "scale", kBoth, [=](Call& c) { c.o.scale = inf; });
  add("softcap_nan", "softcap", kBoth, [=](Call& c) { c.o.softcap = nan; });
  add("softcap_inf", "softcap", kBoth, [=](Call& c) { c.o.softcap = inf; });
  add("softcap_negative", "softcap", kBoth, [](Call& c) { c.o.softcap = -1.0f; });
  add("algorithm_invalid", "algorithm", kBoth, [](Call& c) { c.o.algorithm = static_cast<Algorithm>(5); });
  // overlap (outputs may not share memory with inputs or with each other)
  add("out_aliases_q", "out", kFwd, [](Call& c) { c.tout.data = c.tq.data; });
  add("out_overlaps_k_tail", "out", kFwd, [](Call& c) {
    // One buffer: k at its start, out starting in k's second half (the buffer fits out).
    HostTensor h = make_tensor(c.dtype, {c.dims.B, c.dims.Nq + c.dims.Nk, c.dims.H, c.dims.d});
    std::mt19937_64 rng(test_seed());
    fill_uniform(h, rng, 1.0);
    c.extras.push_back(h);
    c.tk.data = h.data();
    c.tout.data = static_cast<char*>(h.data()) + c.k.numel() / 2 * 2;
  });
  add("lse_overlaps_out", "lse", kFwd, [](Call& c) { c.tlse.data = c.tout.data; });
  add("lse_aliases_q", "lse", kFwd, [](Call& c) { c.tlse.data = c.tq.data; });
  add("dq_aliases_q", "dq", kBwd, [](Call& c) { c.tdq.data = c.tq.data; });
  add("dq_aliases_out", "dq", kBwd, [](Call& c) { c.tdq.data = c.tout.data; });
  add("dk_overlaps_dq", "dk", kBwd, [](Call& c) { c.tdk.data = static_cast<char*>(c.tdq.data) + 64; });
  add("dv_aliases_dk", "dv", kBwd, [](Call& c) { c.tdv.data = c.tdk.data; });
  add("dv_aliases_dout", "dv", kBwd, [](Call& c) { c.tdv.data = c.tdout.data; });
  add("dk_overlaps_lse", "dk", kBwd, [](Call& c) { c.tlse.data = c.tdk.data; });
  add("dv_overlaps_v", "dv", kBwd, [](Call& c) { c.tdv.data = c.tv.data; });
  return v;
}

struct BadParam {
  Bad bad;
  bool backward;
};

void PrintTo(const BadParam& p, std::ostream* os) {
  *os << (p.backward ? "backward " : "forward ") << p.bad.name << " (must name " << p.bad.arg << ")";
}

class BadInput : public ::testing::TestWithParam<BadParam> {};

TEST_P(BadInput, ThrowsNamesArgumentWritesNothing) {
  FA_SEED_TRACE();
  const BadParam& P = GetParam();
  Call c;
  P.bad.mutate(c);
  std::vector<std::vector<uint64_t>> before;
  for (HostTensor* t : c.all()) before.push_back(snapshot(*t));
  const char* call = P.backward ? "backward" : "forward";
  const std::string prefix = std::string("flashattn::") + call + ": " + P.bad.arg + ": expected ";
  bool threw = false;
  try {
    if (P.backward)
      c.backward();
    else
      c.forward();
  } catch (const flashattn::Error& e) {
    threw = true;
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(prefix, 0), 0u) << "the message must start with \"" << prefix << "\"; got: " << msg;
    EXPECT_NE(msg.find(", got "), std::string::npos) << "the message must say what was given: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-flashattn exception: " << e.what();
    threw = true;
  }
  EXPECT_TRUE(threw) << call << " accepted the bad argument (" << P.bad.name << ")";
  const auto all = c.all();
  const char* names[] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
  for (size_t i = 0; i < all.size(); ++i)
    EXPECT_TRUE(snapshot(*all[i]) == before[i]) << "buffer " << (i < 9 ? names[i] : "extra") << " was modified by a "
                                                << call << " call that must be rejected";
}

std::vector<BadParam> params() {
  std::vector<BadParam> out;
  for (const Bad& b : bad_cases()) {
    if (b.which & kFwd) out.push_back({b, false});
    if (b.which & kBwd) out.push_back({b, true});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Checks, BadInput, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<BadParam>& info) {
                           return std::string(info.param.backward ? "bwd_" : "fwd_") + info.param.bad.name;
                         });

// The unbroken calls are accepted (otherwise the cases above would prove nothing), with and without
// lse, with and without varlen.
TEST(Checks, ValidCallsAccepted) {
  FA_SEED_TRACE();
  for (bool varlen : {false, true}) {
    Call c(Dims{1, 5, 7, 4, 2, 16, varlen});
    if (!varlen) c = Call();
    EXPECT_NO_THROW(c.forward()) << "varlen " << varlen;
    EXPECT_NO_THROW(c.backward()) << "varlen " << varlen;
    c.pass_lse = false;
    EXPECT_NO_THROW(c.forward()) << "varlen " << varlen << ", lse = nullptr";
    c.o.max_seqlen_q = 100;  // larger than needed is allowed
    if (varlen) {
      EXPECT_NO_THROW(c.forward()) << "max_seqlen larger than the longest sequence";
    }
  }
}

// Tensors on Device::cuda in a build or on a machine without CUDA: an Error, nothing written.
TEST(Checks, CudaTensorsWithoutCudaDevice) {
  FA_SEED_TRACE();
  if (flashattn::cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  for (bool varlen : {false, true}) {
    Call c(Dims{1, 5, 7, 4, 2, 16, varlen});
    if (!varlen) c = Call();
    for (Tensor* t : {&c.tq, &c.tk, &c.tv, &c.tout, &c.tlse, &c.tdout, &c.tdq, &c.tdk, &c.tdv}) t->device = Device::cuda;
    std::vector<std::vector<uint64_t>> before;
    for (HostTensor* t : c.all()) before.push_back(snapshot(*t));
    for (bool bwd : {false, true}) {
      try {
        bwd ? c.backward() : c.forward();
        ADD_FAILURE() << "accepted cuda tensors without a CUDA device (varlen " << varlen << ")";
      } catch (const flashattn::Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("cuda"), std::string::npos)
            << "the message should say that CUDA is what is missing (varlen " << varlen << "): " << msg;
      }
    }
    const auto all = c.all();
    for (size_t i = 0; i < all.size(); ++i) EXPECT_TRUE(snapshot(*all[i]) == before[i]) << "buffer " << i << " modified";
  }
}

}  // namespace
}  // namespace fa_test
