// flashattn::last_kernel_path() on the CPU backend: after a forward or a backward it names the
// algorithm that ran ("cpu.flash", "cpu.standard"); a call that raises an argument Error leaves the
// previous value; the value is per thread, "" before a thread's first call. The CUDA paths are
// checked in tests/attention/test_cuda_kernel_path.cpp (GPU binary).
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace {
using namespace flashattn;

// A small f32 problem in host memory: B = 1, Nq = 9, Nk = 13, H = 2, d = 16.
struct CpuProblem {
  static constexpr int64_t B = 1, Nq = 9, Nk = 13, H = 2, D = 16;
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv;
  CpuProblem()
      : q(B * Nq * H * D), k(B * Nk * H * D), v(B * Nk * H * D), out(q.size()), lse(B * H * Nq),
        dout(q.size()), dq(q.size()), dk(k.size()), dv(v.size()) {
    for (size_t i = 0; i < q.size(); ++i) q[i] = float((i * 37) % 11) / 11.f - 0.5f;
    for (size_t i = 0; i < k.size(); ++i) k[i] = float((i * 23) % 13) / 13.f - 0.5f;
    for (size_t i = 0; i < v.size(); ++i) v[i] = float((i * 29) % 7) / 7.f - 0.5f;
    for (size_t i = 0; i < dout.size(); ++i) dout[i] = float((i * 31) % 5) / 5.f - 0.5f;
  }
  static Tensor t(std::vector<float>& x, int64_t n) { return make_tensor(x.data(), DType::f32, {B, n, H, D}, Device::cpu); }
  Tensor lse_t() { return make_tensor(lse.data(), DType::f32, {B, H, Nq, 1}, Device::cpu); }
  void run_forward(const Options& o) {
    const Tensor l = lse_t();
    forward(t(q, Nq), t(k, Nk), t(v, Nk), t(out, Nq), &l, o);
  }
  void run_backward(const Options& o) {
    backward(t(q, Nq), t(k, Nk), t(v, Nk), t(out, Nq), t(dout, Nq), lse_t(), t(dq, Nq), t(dk, Nk), t(dv, Nk), o);
  }
  // A forward whose out has the wrong number of rows: an argument Error before anything runs.
  void bad_forward(const Options& o) {
    const Tensor l = lse_t();
    forward(t(q, Nq), t(k, Nk), t(v, Nk), t(out, Nq - 1), &l, o);
  }
  // A backward whose dk has the wrong number of rows.
  void bad_backward(const Options& o) {
    backward(t(q, Nq), t(k, Nk), t(v, Nk), t(out, Nq), t(dout, Nq), lse_t(), t(dq, Nq), t(dk, Nk - 1), t(dv, Nk), o);
  }
};

Options with(Algorithm a, bool causal = false) {
  Options o;
  o.algorithm = a;
  o.causal = causal;
  return o;
}

TEST(KernelPath, CpuForwardAndBackwardNameTheAlgorithm) {
  CpuProblem p;
  for (bool causal : {false, true}) {
    for (Algorithm a : {Algorithm::flash, Algorithm::standard, Algorithm::flash}) {
      const std::string want = a == Algorithm::flash ? "cpu.flash" : "cpu.standard";
      p.run_forward(with(a, causal));
      EXPECT_EQ(std::string(last_kernel_path()), want) << "forward, " << to_string(a) << ", causal " << causal;
      p.run_backward(with(a, causal));
      EXPECT_EQ(std::string(last_kernel_path()), want) << "backward, " << to_string(a) << ", causal " << causal;
    }
  }
}

TEST(KernelPath, FailedCallKeepsThePreviousPath) {
  CpuProblem p;
  p.run_forward(with(Algorithm::flash));
  ASSERT_EQ(std::string(last_kernel_path()), "cpu.flash");
  EXPECT_THROW(p.bad_forward(with(Algorithm::standard)), Error);
  EXPECT_EQ(std::string(last_kernel_path()), "cpu.flash") << "a rejected forward changed the path";
  EXPECT_THROW(p.bad_backward(with(Algorithm::standard)), Error);
  EXPECT_EQ(std::string(last_kernel_path()), "cpu.flash") << "a rejected backward changed the path";

  p.run_backward(with(Algorithm::standard));
  ASSERT_EQ(std::string(last_kernel_path()), "cpu.standard");
  EXPECT_THROW(p.bad_forward(with(Algorithm::flash)), Error);
  EXPECT_EQ(std::string(last_kernel_path()), "cpu.standard") << "a rejected forward changed the path";
  EXPECT_THROW(p.bad_backward(with(Algorithm::flash)), Error);
  EXPECT_EQ(std::string(last_kernel_path()), "cpu.standard") << "a rejected backward changed the path";
}

TEST(KernelPath, PerThreadAndEmptyBeforeTheFirstCall) {
  CpuProblem p;
  p.run_forward(with(Algorithm::standard));
  ASSERT_EQ(std::string(last_kernel_path()), "cpu.standard");
  std::string fresh = "unset", after = "unset";
  std::thread([&] {
    fresh = last_kernel_path();
    CpuProblem p2;
    p2.run_forward(with(Algorithm::flash));
    after = last_kernel_path();
  }).join();
  EXPECT_EQ(fresh, "") << "a thread that has made no call";
  EXPECT_EQ(after, "cpu.flash");
  EXPECT_EQ(std::string(last_kernel_path()), "cpu.standard") << "another thread's call changed this thread's path";
}

}  // namespace
