// libFuzzer harness of the public API (docs/trust.md, "Fuzzing"). Each input is decoded into one
// call of forward, backward, forward_kvcache or merge_partial on the CPU: shapes (empty included),
// dtypes, devices, strides (dense, heads-first, padded rows, zero, negative, random and overlapping),
// options (causal, windows, softcap and scale with negative, NaN and infinite values, varlen with
// empty and inconsistent cu_seqlens, seqused_k, the KV cache's lengths, block tables, appends and
// rotary tables, split counts). Every tensor owns an allocation of exactly the bytes its view
// reaches, so AddressSanitizer sees a read or write one byte outside it.
//
// The oracle:
//   - no crash, no sanitizer report (the build adds ASan and UBSan);
//   - a rejected call raises flashattn::Error whose message reads "flashattn::<call>: <argument>: …"
//     and leaves every output byte (and the cache) as it was;
//   - any other exception is a failure;
//   - an accepted call with finite inputs matches the tests' own fp64 oracle
//     (tests/support/attention_oracle.cpp) within FlashAttention's tolerance rule (forward out and
//     LSE, backward dq/dk/dv, the KV cache's out and the appended rows, merge_partial's result).
// A failure prints what it found and aborts, which libFuzzer reports as a crash with its input.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "flashattn/flashattn.hpp"
#include "flashattn/kvcache.hpp"
#include "support/test_util.hpp"

namespace {

using flashattn::Algorithm;
using flashattn::Device;
using flashattn::DType;
using flashattn::Tensor;

std::string g_call;  // what the input decoded to, printed with a failure

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_api: %s\n  call: %s\n", what.c_str(), g_call.c_str());
  std::abort();
}

// A strided 4-d view over an allocation of exactly the elements it reaches (none when empty).
struct Buf {
  DType dtype = DType::f32;
  std::array<int64_t, 4> shape{}, strides{};
  std::unique_ptr<unsigned char[]> mem;
  size_t bytes = 0;
  int64_t base = 0;  // element index of view element (0, 0, 0, 0) in mem
  Device device = Device::cpu;

  int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  int64_t at(int64_t a, int64_t b, int64_t c, int64_t e) const {
    return base + a * strides[0] + b * strides[1] + c * strides[2] + e * strides[3];
  }
  Tensor view() const {
    Tensor t;
    t.data = numel() > 0 ? mem.get() + base * int64_t(fa_test::dtype_size(dtype)) : mem.get();
    t.dtype = dtype;
    t.device = device;
    t.shape = shape;
    t.strides = strides;
    return t;
  }
  double get(int64_t i) const { return flashattn::detail::load_as_float(mem.get(), i, dtype); }
  void set(int64_t i, double x) { flashattn::detail::store_from_float(mem.get(), i, dtype, float(x)); }
  std::vector<double> dense() const {
    std::vector<double> v;
    v.reserve(size_t(numel()));
    for (int64_t a = 0; a < shape[0]; ++a)
      for (int64_t b = 0; b < shape[1]; ++b)
        for (int64_t c = 0; c < shape[2]; ++c)
          for (int64_t e = 0; e < shape[3]; ++e) v.push_back(get(at(a, b, c, e)));
    return v;
  }
  std::vector<unsigned char> bytes_now() const { return {mem.get(), mem.get() + bytes}; }
};

// Layout kinds the decoder picks from; outputs that overlap themselves must be rejected.
enum Layout { dense, heads_first, padded, zero_stride, negative, odd_inner, random_strides, kLayouts };

Buf make_buf(FuzzedDataProvider& in, DType t, std::array<int64_t, 4> shape, bool allow_odd) {
  Buf b;
  b.dtype = t;
  b.shape = shape;
  const int64_t A = shape[0], N = shape[1], H = shape[2], d = shape[3];
  const int layout = allow_odd ? in.ConsumeIntegralInRange<int>(0, kLayouts - 1) : dense;
  switch (layout) {
    case heads_first: b.strides = {H * N * d, d, N * d, 1}; break;
    case padded: {
      const int64_t pad = in.ConsumeIntegralInRange<int64_t>(1, 9);
      b.strides = {N * (H * d + pad), H * d + pad, d, 1};
      break;
    }
    case zero_stride: {
      b.strides = {N * H * d, H * d, d, 1};
      b.strides[size_t(in.ConsumeIntegralInRange<int>(0, 3))] = 0;
      break;
    }
    case negative: b.strides = {N * H * d, -H * d, d, 1}; break;
    case odd_inner: b.strides = {N * H * d * 2, H * d * 2, d * 2, 2}; break;
    case random_strides:
      for (auto& s : b.strides) s = in.ConsumeIntegralInRange<int64_t>(-40, 40);
      break;
    default: b.strides = {N * H * d, H * d, d, 1};
  }
  (void)A;
  int64_t lo = 0, hi = 0;
  for (int i = 0; i < 4; ++i) {
    const int64_t span = (shape[i] > 0 ? shape[i] - 1 : 0) * b.strides[i];
    (span < 0 ? lo : hi) += span;
  }
  const size_t esz = fa_test::dtype_size(t);
  b.bytes = b.numel() > 0 ? size_t(hi - lo + 1) * esz : 0;
  b.base = -lo;
  b.mem.reset(new unsigned char[std::max<size_t>(b.bytes, 1)]);
  std::memset(b.mem.get(), 0xA5, std::max<size_t>(b.bytes, 1));
  return b;
}

// Finite uniform values in [-mag, mag] over every element the view reaches.
void fill(Buf& b, std::mt19937_64& rng, double mag) {
  std::uniform_real_distribution<double> u(-mag, mag);
  const size_t n = b.bytes / fa_test::dtype_size(b.dtype);
  for (size_t i = 0; i < n; ++i) b.set(int64_t(i), u(rng));
}

float pick_float(FuzzedDataProvider& in, std::initializer_list<float> values) {
  std::vector<float> v(values);
  return v[size_t(in.ConsumeIntegralInRange<size_t>(0, v.size() - 1))];
}

DType pick_dtype(FuzzedDataProvider& in) {
  return static_cast<DType>(in.ConsumeIntegralInRange<int>(0, 2));
}

// An Error from a rejected call: "flashattn::<call>: <argument>: …" and nothing written.
void check_rejection(const flashattn::Error& e, const char* call,
                     const std::vector<std::pair<const Buf*, std::vector<unsigned char>>>& outputs) {
  const std::string m = e.what(), prefix = std::string("flashattn::") + call + ": ";
  if (m.rfind(prefix, 0) != 0) fail("message without the call's prefix: " + m);
  const size_t arg_end = m.find(':', prefix.size());
  const std::string arg = m.substr(prefix.size(), arg_end == std::string::npos ? 0 : arg_end - prefix.size());
  const bool named = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '[' || c == ']';
  });
  if (!named) fail("message names no argument: " + m);
  for (const auto& [buf, before] : outputs)
    if (buf->bytes_now() != before) fail(std::string("a rejected call wrote an output: ") + m);
}

bool all_finite(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

// The (query row, key) pairs that are visible, over every head: the scores the call computes.
int64_t visible_pairs(const fa_test::Problem& p) {
  int64_t n = 0;
  for (const fa_test::Seq& sq : p.seqs)
    for (int64_t i = 0; i < sq.q_len; ++i)
      for (int64_t j = 0; j < sq.k_len; ++j) n += p.visible(i, j, sq.q_len, sq.k_len);
  return n * p.H;
}

// FlashAttention's rule compares two maxima, each a sample of the rounding errors behind it. With
// few roundings each maximum is decided by one of them, and two correct same-precision
// implementations that round at different points (the standard algorithm keeps S through the
// softcap in fp32, the plain model rounds before and after it) differ by that chance, by 7× on a
// single element. The rule applies where both samples are large: at least 1024 elements the call
// computed (the reference not exactly 0: keys no query sees, rows that see no key are excluded) and
// at least 1024 visible scores (each score's rounding moves all d columns of its row, and the
// gradients through it, together: a call with a query that sees two keys holds two samples
// however wide d is). Smaller calls must be finite wherever the reference is.
constexpr int64_t kRuleSamples = 1024;

void expect_rule(const char* what, const std::vector<double>& x, const std::vector<double>& ref,
                 const std::vector<double>& plain, DType t, double score_max, int64_t pairs) {
  const int64_t computed = std::count_if(ref.begin(), ref.end(), [](double r) { return r != 0; });
  if (computed >= kRuleSamples && pairs >= kRuleSamples) {
    const auto r = fa_test::within_rule(what, x, ref, plain, t, score_max);
    if (!r) fail(r.message());
    return;
  }
  for (size_t i = 0; i < x.size() && i < ref.size(); ++i)
    if (std::isfinite(ref[i]) && !std::isfinite(x[i])) fail(std::string(what) + ": not finite where the reference is");
}

// The shared shape and option draw of forward and backward.
struct AttnCall {
  int64_t B, Nq, Nk, H, Hkv, d;
  DType dtype;
  flashattn::Options o;
  std::vector<int32_t> cu_q, cu_k, used;
  bool consistent = true;  // cu_seqlens drawn consistent with the tensors (a valid varlen call)
};

AttnCall draw_attention(FuzzedDataProvider& in) {
  AttnCall c;
  c.dtype = pick_dtype(in);
  c.H = in.ConsumeIntegralInRange<int64_t>(0, 4);
  c.Hkv = in.ConsumeBool() ? c.H : in.ConsumeIntegralInRange<int64_t>(0, 4);
  c.d = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 40)
                         : int64_t(pick_float(in, {64.f, 96.f, 128.f, 256.f, 257.f}));
  c.o.algorithm = in.ConsumeBool() ? Algorithm::flash : Algorithm::standard;
  if (in.ConsumeIntegralInRange<int>(0, 40) == 0) c.o.algorithm = static_cast<Algorithm>(7);
  c.o.causal = in.ConsumeBool();
  c.o.window_left = int(pick_float(in, {-1.f, -1.f, 0.f, 1.f, 3.f, 1000.f, -5.f}));
  c.o.window_right = int(pick_float(in, {-1.f, -1.f, 0.f, 2.f, -3.f}));
  c.o.softcap = pick_float(in, {0.f, 0.f, 0.f, 5.f, 30.f, -1.f, std::nanf(""), INFINITY});
  c.o.scale = pick_float(in, {0.f, 0.f, 0.f, 0.125f, 1.f, -0.5f, std::nanf(""), INFINITY, 1e-30f});
  c.o.deterministic = in.ConsumeBool();
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {  // varlen: B 1, packed tokens
    const int nb = in.ConsumeIntegralInRange<int>(0, 4);
    c.o.varlen_batch = in.ConsumeIntegralInRange<int>(0, 5) == 0 ? nb + 1 : nb;
    c.consistent = in.ConsumeIntegralInRange<int>(0, 3) != 0;
    c.cu_q = {0};
    c.cu_k = {0};
    for (int b = 0; b < nb; ++b) {
      c.cu_q.push_back(c.cu_q.back() + in.ConsumeIntegralInRange<int32_t>(0, 9));
      c.cu_k.push_back(c.cu_k.back() + in.ConsumeIntegralInRange<int32_t>(0, 9));
    }
    c.B = 1;
    c.Nq = c.cu_q.back();
    c.Nk = c.cu_k.back();
    if (!c.consistent) {  // one entry moved anywhere, or a tensor length off by some
      auto& cu = in.ConsumeBool() ? c.cu_q : c.cu_k;
      cu[size_t(in.ConsumeIntegralInRange<size_t>(0, cu.size() - 1))] = in.ConsumeIntegralInRange<int32_t>(-3, 30);
      if (in.ConsumeBool()) c.Nq += in.ConsumeIntegralInRange<int64_t>(-2, 2);
      c.Nq = std::max<int64_t>(c.Nq, 0);
    }
    if (in.ConsumeBool()) c.o.max_seqlen_q = in.ConsumeIntegralInRange<int>(-1, 12);
    if (in.ConsumeBool()) c.o.max_seqlen_k = in.ConsumeIntegralInRange<int>(-1, 12);
    // The arrays hold varlen_batch + 1 entries, as the API requires (it cannot see their length).
    const size_t entries = size_t(std::max(c.o.varlen_batch, 0)) + 1;
    if (c.cu_q.size() < entries) c.cu_q.resize(entries, c.cu_q.back());
    if (c.cu_k.size() < entries) c.cu_k.resize(entries, c.cu_k.back());
    c.o.cu_seqlens_q = c.cu_q.data();
    c.o.cu_seqlens_k = c.cu_k.data();
  } else {
    c.B = in.ConsumeIntegralInRange<int64_t>(0, 3);
    c.Nq = in.ConsumeIntegralInRange<int64_t>(0, 20);
    c.Nk = in.ConsumeIntegralInRange<int64_t>(0, 20);
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) c.o.varlen_batch = 2;  // without cu_seqlens
  }
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    const int64_t seqs = c.o.cu_seqlens_q ? int64_t(c.o.varlen_batch) : c.B;
    for (int64_t b = 0; b < std::max<int64_t>(seqs, 0); ++b) {
      const int64_t rows = c.o.cu_seqlens_k ? c.cu_k[size_t(b) + 1] - c.cu_k[size_t(b)] : c.Nk;
      c.used.push_back(in.ConsumeIntegralInRange<int>(0, 8) == 0 ? in.ConsumeIntegralInRange<int32_t>(-2, 40)
                                                                 : int32_t(in.ConsumeIntegralInRange<int64_t>(0, std::max<int64_t>(rows, 0))));
    }
    c.o.seqused_k = c.used.empty() ? nullptr : c.used.data();
  }
  return c;
}

std::string describe(const AttnCall& c, const Buf& q, const Buf& k) {
  auto arr = [](const std::array<int64_t, 4>& a) {
    return "(" + std::to_string(a[0]) + "," + std::to_string(a[1]) + "," + std::to_string(a[2]) + "," + std::to_string(a[3]) + ")";
  };
  std::string s = std::string(fa_test::dtype_name(c.dtype)) + " " + flashattn::to_string(c.o.algorithm) + " q" +
                  arr(q.shape) + " strides" + arr(q.strides) + " k" + arr(k.shape) + " strides" + arr(k.strides) +
                  " causal " + std::to_string(c.o.causal) + " window (" + std::to_string(c.o.window_left) + "," +
                  std::to_string(c.o.window_right) + ") softcap " + std::to_string(c.o.softcap) + " scale " +
                  std::to_string(c.o.scale) + " det " + std::to_string(c.o.deterministic);
  auto ints = [](const char* n, const std::vector<int32_t>& v) {
    std::string r = std::string(" ") + n + " {";
    for (int32_t x : v) r += std::to_string(x) + ",";
    return r + "}";
  };
  if (c.o.cu_seqlens_q) s += ints("cu_q", c.cu_q) + ints("cu_k", c.cu_k) + " varlen_batch " + std::to_string(c.o.varlen_batch);
  if (c.o.seqused_k) s += ints("seqused_k", c.used);
  return s;
}

fa_test::Problem problem_of(const AttnCall& c) {
  return fa_test::make_problem(c.B, c.Nq, c.Nk, c.H, c.Hkv, c.d, c.o, c.o.cu_seqlens_q ? c.cu_q : std::vector<int32_t>{},
                               c.o.cu_seqlens_k ? c.cu_k : std::vector<int32_t>{}, c.used);
}

// Compares only what the tests' oracle defines: finite options (a NaN or infinite scale or softcap
// is accepted or rejected, but has no reference) and finite inputs.
// Inputs ×30, and any call whose largest score |scale·q·k| passes kMaxScore, run for crashes and
// the error contract only: large scores make P nearly one-hot and, in 16-bit types, round by
// 2^-9·|s| (0.06 at 30), so the rule's max statistic is decided by single elements (the suite's
// fixed ×10 and ×30 cases check that regime).
constexpr double kMaxScore = 16;
bool comparable(const AttnCall& c, double mag) {
  return std::isfinite(c.o.scale) && std::isfinite(c.o.softcap) && c.B * c.Nq * c.H * c.d > 0 && mag <= 4;
}

void device_flip(FuzzedDataProvider& in, std::vector<Buf*> bufs) {
  if (in.ConsumeIntegralInRange<int>(0, 30) == 0)
    bufs[size_t(in.ConsumeIntegralInRange<size_t>(0, bufs.size() - 1))]->device = Device::cuda;
}

void fuzz_forward_backward(FuzzedDataProvider& in, std::mt19937_64& rng, bool with_backward) {
  AttnCall c = draw_attention(in);
  const bool odd = in.ConsumeBool();
  const double mag = pick_float(in, {1.f, 1.f, 4.f, 30.f});
  Buf q = make_buf(in, c.dtype, {c.B, c.Nq, c.H, c.d}, odd);
  Buf k = make_buf(in, in.ConsumeIntegralInRange<int>(0, 20) == 0 ? pick_dtype(in) : c.dtype, {c.B, c.Nk, c.Hkv, c.d}, odd);
  Buf v = make_buf(in, c.dtype, {c.B, c.Nk, c.Hkv, c.d}, odd);
  Buf out = make_buf(in, c.dtype, {c.B, c.Nq, c.H, c.d}, odd);
  Buf lse = make_buf(in, DType::f32, {c.B, c.H, c.Nq, 1}, false);
  for (Buf* b : {&q, &k, &v}) fill(*b, rng, mag);
  device_flip(in, {&q, &k, &v, &out, &lse});
  g_call = (with_backward ? "backward " : "forward ") + describe(c, q, k) + " mag " + std::to_string(mag);
  const bool use_lse = with_backward || in.ConsumeBool();
  const Tensor tl = lse.view();
  const auto out_before = out.bytes_now(), lse_before = lse.bytes_now();
  bool accepted = true;
  try {
    flashattn::forward(q.view(), k.view(), v.view(), out.view(), use_lse ? &tl : nullptr, c.o);
  } catch (const flashattn::Error& e) {
    check_rejection(e, "forward", {{&out, out_before}, {&lse, lse_before}});
    accepted = false;
  }
  const fa_test::Problem p = accepted && comparable(c, mag) ? problem_of(c) : fa_test::Problem{};
  const std::vector<double> qd = q.dense(), kd = k.dense(), vd = v.dense();
  if (accepted && comparable(c, mag)) {
    const fa_test::FwdResult ref = fa_test::plain_forward(p, qd, kd, vd, c.dtype, true);
    const fa_test::FwdResult plain = fa_test::plain_forward(p, qd, kd, vd, c.dtype, false);
    if (plain.score_max > kMaxScore) return;
    expect_rule("forward out", out.dense(), ref.out, plain.out, c.dtype, plain.score_max, visible_pairs(p));
    if (use_lse) {
      const auto r = fa_test::lse_within(lse.dense(), ref.lse, fa_test::lse_bound(c.o.algorithm, c.dtype, plain), 0.0);
      if (!r) fail(std::string("forward lse: ") + r.message());
    }
  }
  if (!with_backward) return;
  // The backward runs on this forward's out and LSE when it was accepted, on the poison-free
  // random buffers otherwise (then it must be rejected or at least stay in bounds).
  if (!accepted) {
    fill(out, rng, mag);
    fill(lse, rng, 2.0);
  }
  Buf dout = make_buf(in, c.dtype, {c.B, c.Nq, c.H, c.d}, odd);
  Buf dq = make_buf(in, c.dtype, {c.B, c.Nq, c.H, c.d}, odd);
  Buf dk = make_buf(in, c.dtype, {c.B, c.Nk, c.Hkv, c.d}, odd);
  Buf dv = make_buf(in, c.dtype, {c.B, c.Nk, c.Hkv, c.d}, odd);
  fill(dout, rng, 1.0);
  device_flip(in, {&dout, &dq, &dk, &dv});
  const auto dq0 = dq.bytes_now(), dk0 = dk.bytes_now(), dv0 = dv.bytes_now();
  try {
    flashattn::backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dk.view(),
                        dv.view(), c.o);
  } catch (const flashattn::Error& e) {
    check_rejection(e, "backward", {{&dq, dq0}, {&dk, dk0}, {&dv, dv0}});
    return;
  }
  if (!accepted || !comparable(c, mag)) return;
  const std::vector<double> dod = dout.dense();
  const fa_test::BwdResult ref = fa_test::plain_backward(p, qd, kd, vd, dod, c.dtype, true);
  const fa_test::BwdResult plain = fa_test::plain_backward(p, qd, kd, vd, dod, c.dtype, false);
  const double smax = fa_test::plain_forward(p, qd, kd, vd, c.dtype, false).score_max;
  if (smax > kMaxScore) return;
  const int64_t pairs = visible_pairs(p);
  expect_rule("backward dq", dq.dense(), ref.dq, plain.dq, c.dtype, smax, pairs);
  expect_rule("backward dk", dk.dense(), ref.dk, plain.dk, c.dtype, smax, pairs);
  expect_rule("backward dv", dv.dense(), ref.dv, plain.dv, c.dtype, smax, pairs);
}

void fuzz_kvcache(FuzzedDataProvider& in, std::mt19937_64& rng) {
  const DType t = pick_dtype(in);
  const int64_t B = in.ConsumeIntegralInRange<int64_t>(0, 3), Sq = in.ConsumeIntegralInRange<int64_t>(0, 5);
  const int64_t Hkv = in.ConsumeIntegralInRange<int64_t>(0, 3), H = Hkv * in.ConsumeIntegralInRange<int64_t>(0, 3);
  const int64_t d = 2 * in.ConsumeIntegralInRange<int64_t>(0, 12) + (in.ConsumeIntegralInRange<int>(0, 8) == 0);
  const bool paged = in.ConsumeBool(), append = in.ConsumeBool(), rotary = in.ConsumeIntegralInRange<int>(0, 3) == 0;
  const int64_t S_new = append ? in.ConsumeIntegralInRange<int64_t>(0, 4) : 0;
  const int64_t page = in.ConsumeIntegralInRange<int64_t>(0, 7), pages = in.ConsumeIntegralInRange<int64_t>(0, 12);
  const int64_t max_pages = in.ConsumeIntegralInRange<int64_t>(0, 6);
  const int64_t Bc = B + in.ConsumeIntegralInRange<int64_t>(0, 2), Smax = in.ConsumeIntegralInRange<int64_t>(0, 24);
  const bool odd = in.ConsumeBool();
  Buf q = make_buf(in, t, {B, Sq, H, d}, odd);
  Buf out = make_buf(in, t, {B, Sq, H, d}, odd);
  Buf lse = make_buf(in, DType::f32, {B, H, Sq, 1}, false);
  const std::array<int64_t, 4> cshape = paged ? std::array<int64_t, 4>{pages, page, Hkv, d} : std::array<int64_t, 4>{Bc, Smax, Hkv, d};
  Buf kc = make_buf(in, t, cshape, odd), vc = make_buf(in, in.ConsumeIntegralInRange<int>(0, 20) == 0 ? pick_dtype(in) : t, cshape, odd);
  Buf kn = make_buf(in, t, {B, S_new, Hkv, d}, odd), vn = make_buf(in, t, {B, S_new, Hkv, d}, odd);
  const int64_t rot_dim = 2 * in.ConsumeIntegralInRange<int64_t>(0, std::max<int64_t>(d / 2, 0));
  const int64_t S_rot = in.ConsumeIntegralInRange<int64_t>(0, 30);
  Buf cosb = make_buf(in, DType::f32, {1, S_rot, 1, rot_dim / 2}, false), sinb = make_buf(in, DType::f32, {1, S_rot, 1, rot_dim / 2}, false);
  for (Buf* b : {&q, &kc, &vc, &kn, &vn}) fill(*b, rng, 1.0);
  for (Buf* b : {&cosb, &sinb}) fill(*b, rng, 1.0);
  device_flip(in, {&q, &out, &kc, &vc, &kn});

  // Lengths and tables: valid with distinct pages most of the time, anything otherwise.
  const bool wild = in.ConsumeIntegralInRange<int>(0, 3) == 0;
  std::vector<int32_t> seqlens(static_cast<size_t>(B));
  std::vector<int32_t> batch_idx, table;
  int64_t bt_stride = 0;
  const int64_t capacity = paged ? max_pages * page : Smax;
  for (auto& s : seqlens)
    s = wild ? in.ConsumeIntegralInRange<int32_t>(-2, 30)
             : int32_t(in.ConsumeIntegralInRange<int64_t>(0, std::max<int64_t>(capacity - S_new, 0)));
  if (paged) {
    std::vector<int32_t> perm(size_t(std::max<int64_t>(pages, 0)));
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    bt_stride = in.ConsumeIntegralInRange<int>(0, 8) == 0 ? in.ConsumeIntegralInRange<int64_t>(-1, 8) : 0;
    const int64_t row = std::max<int64_t>(bt_stride != 0 ? bt_stride : max_pages, max_pages);
    table.resize(size_t(B > 0 ? (B - 1) * row + max_pages : 0));  // what the rows reach, no more
    for (size_t i = 0; i < table.size(); ++i)
      table[i] = wild ? in.ConsumeIntegralInRange<int32_t>(-1, int32_t(pages) + 1) : (i < perm.size() ? perm[i] : 0);
  } else if (in.ConsumeBool()) {
    batch_idx.resize(size_t(B));
    for (size_t b = 0; b < batch_idx.size(); ++b) batch_idx[b] = wild ? in.ConsumeIntegralInRange<int32_t>(-1, int32_t(Bc)) : int32_t(b);
  }
  flashattn::KVCache cache;
  cache.k = kc.view();
  cache.v = vc.view();
  cache.seqlens = in.ConsumeIntegralInRange<int>(0, 30) == 0 ? nullptr : seqlens.data();
  cache.batch_idx = batch_idx.empty() ? nullptr : batch_idx.data();
  if (paged) {
    cache.block_table = table.data();
    cache.max_pages = max_pages;
    cache.block_table_stride = bt_stride;
  }
  flashattn::KVCacheOptions o;
  o.causal = in.ConsumeBool();
  o.window_left = int(pick_float(in, {-1.f, -1.f, 0.f, 2.f, -4.f}));
  o.window_right = int(pick_float(in, {-1.f, -1.f, 0.f, 1.f}));
  o.softcap = pick_float(in, {0.f, 0.f, 5.f, -2.f, std::nanf("")});
  o.scale = pick_float(in, {0.f, 0.f, 0.25f, INFINITY});
  o.num_splits = int(pick_float(in, {0.f, 0.f, 1.f, 3.f, 64.f, -1.f}));
  const Tensor tkn = kn.view(), tvn = vn.view(), tcos = cosb.view(), tsin = sinb.view();
  if (append) {
    o.k_new = &tkn;
    o.v_new = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : &tvn;
  }
  if (rotary) {
    o.rotary_cos = &tcos;
    o.rotary_sin = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : &tsin;
    o.rotary_interleaved = in.ConsumeBool();
  }
  const bool use_lse = in.ConsumeBool();
  const Tensor tl = lse.view();
  const auto out0 = out.bytes_now(), lse0 = lse.bytes_now(), k0 = kc.bytes_now(), v0 = vc.bytes_now();
  const std::vector<double> kc_in = kc.dense(), vc_in = vc.dense();
  try {
    flashattn::forward_kvcache(q.view(), cache, out.view(), use_lse ? &tl : nullptr, o);
  } catch (const flashattn::Error& e) {
    check_rejection(e, "forward_kvcache", {{&out, out0}, {&lse, lse0}, {&kc, k0}, {&vc, v0}});
    return;
  }
  // Reference: only valid, distinct-page calls without rotary, with finite options and layouts
  // whose cache views do not alias themselves.
  if (wild || rotary || !std::isfinite(o.scale) || !std::isfinite(o.softcap) || odd || B * Sq * H * d == 0) return;
  // An empty block table is a null pointer: the call saw a contiguous cache.
  const bool is_paged = cache.paged();
  if (is_paged && (B * max_pages > pages || bt_stride != 0)) return;  // pages shared by sequences (a table of distinct pages only)
  // The cache rows each sequence attends to, after the append, as a varlen problem.
  auto row_of = [&](int64_t b, int64_t tok, int64_t& slot, int64_t& row) {
    if (is_paged) {
      slot = table[size_t(b * (bt_stride != 0 ? bt_stride : max_pages) + tok / page)];
      row = tok % page;
    } else {
      slot = cache.batch_idx ? batch_idx[size_t(b)] : b;
      row = tok;
    }
  };
  std::vector<int32_t> cu_q{0}, cu_k{0};
  std::vector<double> qd = q.dense(), kd, vd, kn_d = kn.dense(), vn_d = vn.dense();
  std::vector<double> q_packed;
  const std::vector<double> kc_out = kc.dense(), vc_out = vc.dense();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t total = seqlens[size_t(b)] + S_new;
    cu_q.push_back(cu_q.back() + int32_t(Sq));
    cu_k.push_back(cu_k.back() + int32_t(total));
    for (int64_t i = 0; i < Sq * H * d; ++i) q_packed.push_back(qd[size_t(b * Sq * H * d + i)]);
    for (int64_t tok = 0; tok < total; ++tok)
      for (int64_t h = 0; h < Hkv; ++h) {
        int64_t slot, row;
        row_of(b, tok, slot, row);
        for (int64_t e = 0; e < d; ++e) {
          const int64_t ci = ((slot * cshape[1] + row) * Hkv + h) * d + e;
          const bool is_new = tok >= seqlens[size_t(b)];
          const int64_t ni = ((b * S_new + (tok - seqlens[size_t(b)])) * Hkv + h) * d + e;
          kd.push_back(is_new ? kn_d[size_t(ni)] : kc_in[size_t(ci)]);
          vd.push_back(is_new ? vn_d[size_t(ni)] : vc_in[size_t(ci)]);
          // The appended rows hold the new keys and values now.
          if (is_new && (kc_out[size_t(ci)] != kn_d[size_t(ni)] || vc_out[size_t(ci)] != vn_d[size_t(ni)]))
            fail("forward_kvcache: an appended cache row differs from k_new/v_new");
        }
      }
  }
  flashattn::Options po;
  po.scale = o.scale;
  po.causal = o.causal;
  po.window_left = o.window_left;
  po.window_right = o.window_right;
  po.softcap = o.softcap;
  const fa_test::Problem p = fa_test::make_problem(1, cu_q.back(), cu_k.back(), H, Hkv, d, po, cu_q, cu_k);
  const fa_test::FwdResult ref = fa_test::plain_forward(p, q_packed, kd, vd, t, true);
  const fa_test::FwdResult plain = fa_test::plain_forward(p, q_packed, kd, vd, t, false);
  if (plain.score_max > kMaxScore) return;
  expect_rule("forward_kvcache out", out.dense(), ref.out, plain.out, t, plain.score_max, visible_pairs(p));
}

void fuzz_merge(FuzzedDataProvider& in, std::mt19937_64& rng) {
  const int64_t B = in.ConsumeIntegralInRange<int64_t>(0, 2), S = in.ConsumeIntegralInRange<int64_t>(0, 9);
  const int64_t H = in.ConsumeIntegralInRange<int64_t>(0, 3), d = in.ConsumeIntegralInRange<int64_t>(0, 20);
  const bool odd = in.ConsumeBool();
  const DType tp = pick_dtype(in), ta = in.ConsumeIntegralInRange<int>(0, 10) == 0 ? pick_dtype(in) : DType::f32;
  Buf acc = make_buf(in, ta, {B, S, H, d}, odd), part = make_buf(in, tp, {B, S, H, d}, odd);
  Buf lacc = make_buf(in, DType::f32, {B, H, S, 1}, odd), lpart = make_buf(in, DType::f32, {B, H, S, 1}, odd);
  for (Buf* b : {&acc, &part}) fill(*b, rng, 1.0);
  for (Buf* b : {&lacc, &lpart}) fill(*b, rng, 3.0);
  // Rows that saw no key on one side or both: LSE −inf.
  const float ninf = -std::numeric_limits<float>::infinity();
  for (Buf* b : {&lacc, &lpart})
    if (b->bytes > 0 && in.ConsumeBool()) b->set(in.ConsumeIntegralInRange<int64_t>(0, int64_t(b->bytes / 4) - 1), ninf);
  device_flip(in, {&acc, &lacc, &part, &lpart});
  const auto a0 = acc.bytes_now(), l0 = lacc.bytes_now();
  const std::vector<double> ad = acc.dense(), la = lacc.dense(), pd = part.dense(), lp = lpart.dense();
  try {
    flashattn::merge_partial(acc.view(), lacc.view(), part.view(), lpart.view());
  } catch (const flashattn::Error& e) {
    check_rejection(e, "merge_partial", {{&acc, a0}, {&lacc, l0}});
    return;
  }
  if (odd) return;  // aliasing input views (zero or random strides) have no single reference
  const std::vector<double> got = acc.dense(), got_l = lacc.dense();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s) {
        const size_t li = size_t((b * H + h) * S + s);
        const double m = std::max(la[li], lp[li]);
        const double l = m == -INFINITY ? -INFINITY : m + std::log(std::exp(la[li] - m) + std::exp(lp[li] - m));
        if (!(std::abs(got_l[li] - l) <= 1e-5 * std::max(1.0, std::abs(l))) && !(l == -INFINITY && got_l[li] == l))
          fail("merge_partial lse off the fp64 merge");
        for (int64_t e = 0; e < d; ++e) {
          const size_t oi = size_t(((b * S + s) * H + h) * d + e);
          const double wa = la[li] == -INFINITY ? 0 : std::exp(la[li] - l), wp = lp[li] == -INFINITY ? 0 : std::exp(lp[li] - l);
          const double want = l == -INFINITY ? 0 : wa * ad[oi] + wp * pd[oi];
          if (!(std::abs(got[oi] - want) <= 1e-5 * (1 + std::abs(want)))) fail("merge_partial out off the fp64 merge");
        }
      }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  std::mt19937_64 rng(in.ConsumeIntegral<uint64_t>());
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: fuzz_forward_backward(in, rng, false); break;
    case 1: fuzz_forward_backward(in, rng, true); break;
    case 2: fuzz_kvcache(in, rng); break;
    default: fuzz_merge(in, rng); break;
  }
  return 0;
}
