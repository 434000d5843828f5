// GPU-only checks of the CUDA kernels (skipped loudly without a device):
//  - the same inputs 50x: forward bitwise equal, deterministic backward bitwise equal (races), and
//    10x on a problem of more work tiles than SMs;
//  - fully-masked rows (causal with Nq > Nk): output 0, LSE -inf, gradients 0, no NaN anywhere;
//  - inputs scaled x10 and x30: every output finite;
//  - concurrent callers: six host threads, each on its own non-blocking stream, run forward and the
//    deterministic backward of a different problem three times at once; every output is bitwise
//    equal to the same calls made alone on the default stream.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/device_buffer.hpp"
#include "flashattn/flashattn.hpp"

namespace {
using namespace flashattn;
using fa_test::DeviceBuffer;

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Problem {
  int64_t b, nq, nk, h, hkv, d;
  std::vector<uint16_t> q, k, v, dout;
  DeviceBuffer dq_, dk_, dv_, do_, q_, k_, v_, o_, lse_, gq, gk, gv;
  Problem(int64_t b_, int64_t nq_, int64_t nk_, int64_t h_, int64_t hkv_, int64_t d_, float mult, unsigned seed)
      : b(b_), nq(nq_), nk(nk_), h(h_), hkv(hkv_), d(d_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.f, 1.f);
    auto fill = [&](std::vector<uint16_t>& x, size_t count, float m) {
      x.resize(count);
      for (auto& e : x) e = to_bf16(n(rng) * m);
    };
    fill(q, b * nq * h * d, mult);
    fill(k, b * nk * hkv * d, mult);
    fill(v, b * nk * hkv * d, 1.f);
    fill(dout, b * nq * h * d, 1.f);
    q_ = DeviceBuffer(q.size() * 2); q_.upload(q.data(), q.size() * 2);
    k_ = DeviceBuffer(k.size() * 2); k_.upload(k.data(), k.size() * 2);
    v_ = DeviceBuffer(v.size() * 2); v_.upload(v.data(), v.size() * 2);
    do_ = DeviceBuffer(dout.size() * 2); do_.upload(dout.data(), dout.size() * 2);
    o_ = DeviceBuffer(q.size() * 2);
    lse_ = DeviceBuffer(b * h * nq * 4);
    gq = DeviceBuffer(q.size() * 2);
    gk = DeviceBuffer(k.size() * 2);
    gv = DeviceBuffer(v.size() * 2);
  }
  Tensor t(const DeviceBuffer& x, int64_t n, int64_t heads) const {
    return make_tensor(x.data(), DType::bf16, {b, n, heads, d}, Device::cuda);
  }
  Tensor lse() const { return make_tensor(lse_.data(), DType::f32, {b, h, nq, 1}, Device::cuda); }
  void launch(const Options& o) {  // on o.stream, without waiting
    const Tensor l = lse();
    forward(t(q_, nq, h), t(k_, nk, hkv), t(v_, nk, hkv), t(o_, nq, h), &l, o);
    backward(t(q_, nq, h), t(k_, nk, hkv), t(v_, nk, hkv), t(o_, nq, h), t(do_, nq, h), l, t(gq, nq, h),
             t(gk, nk, hkv), t(gv, nk, hkv), o);
  }
  void run(const Options& o) {
    launch(o);
    DeviceBuffer::synchronize();
  }
  void poison_outputs() {
    for (const DeviceBuffer* x : {&o_, &lse_, &gq, &gk, &gv}) {
      const std::vector<uint8_t> nan(x->bytes(), 0xff);
      const_cast<DeviceBuffer*>(x)->upload(nan.data(), nan.size());
    }
  }
  std::vector<uint8_t> snapshot() const {
    std::vector<uint8_t> s;
    for (const DeviceBuffer* x : {&o_, &lse_, &gq, &gk, &gv}) {
      const size_t at = s.size();
      s.resize(at + x->bytes());
      x->download(s.data() + at, x->bytes());
    }
    return s;
  }
  template <class F>
  void each_bf16(const DeviceBuffer& x, F f) const {
    std::vector<uint16_t> hbuf(x.bytes() / 2);
    x.download(hbuf.data(), x.bytes());
    for (size_t i = 0; i < hbuf.size(); ++i) f(i, from_bf16(hbuf[i]));
  }
};

class CudaKernels : public ::testing::TestWithParam<Algorithm> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: GPU-only test skipped";
  }
};

// `repeats` runs of p with the deterministic backward, outputs poisoned before each: all bitwise
// equal to the first.
void expect_repeats_equal(Problem& p, Algorithm algorithm, bool causal, int repeats, const std::string& what) {
  Options o;
  o.causal = causal;
  o.deterministic = true;
  o.algorithm = algorithm;
  p.run(o);
  const auto first = p.snapshot();
  for (int i = 1; i < repeats; ++i) {
    p.poison_outputs();
    p.run(o);
    ASSERT_TRUE(p.snapshot() == first) << "run " << i << " differs (" << what << ", causal " << causal << "): a race";
  }
}

TEST_P(CudaKernels, Repeat50BitwiseEqual) {
  for (int64_t d : {64, 128, 256})
    for (bool causal : {false, true}) {
      Problem p(2, 333, 517, 8, 2, d, 1.f, unsigned(d));
      expect_repeats_equal(p, GetParam(), causal, 50, "d " + std::to_string(d));
    }
}

// More work tiles than the GPU has SMs (the Hopper backward's persistent grid without causal, a
// tile per CTA with it), each query tile seen by 32 key tiles: the deterministic backward's fixed
// dQ order holds across CTAs that run at once and after each other.
TEST_P(CudaKernels, DeterministicManyTilesBitwiseEqual) {
  for (bool causal : {false, true}) {
    Problem p(1, 4096, 4096, 16, 8, 128, 1.f, 11u + causal);
    expect_repeats_equal(p, GetParam(), causal, 10, "B 1, N 4096, H 16/8, d 128");
  }
}

TEST_P(CudaKernels, FullyMaskedRowsNoNaN) {
  Problem p(1, 200, 70, 4, 4, 128, 1.f, 7);  // causal, Nq > Nk: rows 0..129 see no key
  Options o;
  o.causal = true;
  o.algorithm = GetParam();
  p.run(o);
  std::vector<float> lse(p.b * p.h * p.nq);
  p.lse_.download(lse.data(), lse.size() * 4);
  for (int64_t h = 0; h < p.h; ++h)
    for (int64_t i = 0; i < p.nq; ++i) {
      const float l = lse[h * p.nq + i];
      if (i < p.nq - p.nk) EXPECT_TRUE(std::isinf(l) && l < 0) << "row " << i << " lse " << l;
      else EXPECT_TRUE(std::isfinite(l)) << "row " << i;
    }
  const int64_t masked = p.nq - p.nk;
  p.each_bf16(p.o_, [&](size_t idx, float x) {
    ASSERT_FALSE(std::isnan(x));
    const int64_t row = int64_t(idx) / (p.h * p.d);
    if (row < masked) ASSERT_EQ(x, 0.f) << "row " << row;
  });
  p.each_bf16(p.gq, [&](size_t idx, float x) {
    ASSERT_TRUE(std::isfinite(x));
    if (int64_t(idx) / (p.h * p.d) < masked) ASSERT_EQ(x, 0.f);
  });
  for (const DeviceBuffer* g : {&p.gk, &p.gv}) p.each_bf16(*g, [&](size_t, float x) { ASSERT_TRUE(std::isfinite(x)); });
}

TEST_P(CudaKernels, ScaledInputsStayFinite) {
  for (float mult : {10.f, 30.f}) {
    Problem p(1, 300, 300, 4, 2, 64, mult, 11);
    Options o;
    o.algorithm = GetParam();
    p.run(o);
    for (const DeviceBuffer* g : {&p.o_, &p.gq, &p.gk, &p.gv})
      p.each_bf16(*g, [&](size_t, float x) { ASSERT_TRUE(std::isfinite(x)) << "x" << mult; });
  }
}

TEST_P(CudaKernels, ConcurrentStreamsAgreeBitwiseWithCallsMadeAlone) {
  struct Spec {
    int64_t b, nq, nk, h, hkv, d;
    bool causal;
    int window_left;
  };
  const Spec specs[] = {{2, 333, 517, 8, 2, 64, false, -1}, {1, 700, 700, 4, 4, 128, true, -1},
                        {3, 129, 65, 8, 1, 128, false, -1}, {1, 256, 1024, 4, 2, 256, true, -1},
                        {2, 97, 211, 6, 3, 64, false, 40},  {1, 513, 513, 8, 8, 64, true, 100}};
  std::vector<std::unique_ptr<Problem>> ps;
  std::vector<Options> opts;
  std::vector<std::vector<uint8_t>> alone;
  for (const Spec& sp : specs) {
    ps.push_back(std::make_unique<Problem>(sp.b, sp.nq, sp.nk, sp.h, sp.hkv, sp.d, 1.f, unsigned(ps.size() + 101)));
    Options o;
    o.causal = sp.causal;
    o.window_left = sp.window_left;
    o.deterministic = true;
    o.algorithm = GetParam();
    ps.back()->run(o);
    alone.push_back(ps.back()->snapshot());
    ps.back()->poison_outputs();
    opts.push_back(o);
  }
  std::vector<std::string> errors(ps.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ps.size(); ++i)
    threads.emplace_back([&, i] {
      cudaStream_t s = nullptr;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        errors[i] = "cudaStreamCreateWithFlags failed";
        return;
      }
      Options o = opts[i];
      o.stream = s;
      try {
        for (int rep = 0; rep < 3; ++rep) ps[i]->launch(o);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
      if (cudaStreamSynchronize(s) != cudaSuccess) errors[i] += " cudaStreamSynchronize failed";
      cudaStreamDestroy(s);
    });
  for (std::thread& t : threads) t.join();
  DeviceBuffer::synchronize();
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(errors[i], "") << "problem " << i;
    EXPECT_TRUE(ps[i]->snapshot() == alone[i]) << "problem " << i << ": outputs on a concurrent stream differ from the call made alone";
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaKernels, ::testing::Values(Algorithm::flash, Algorithm::standard),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
