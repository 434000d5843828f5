// GPU-only (skipped loudly without a device): which CUDA kernel path answered, by
// flashattn::last_kernel_path() —
//  - bf16 d128 forward and backward: "cuda.sm90" on an sm_90 device (the portable "cuda.sm80"
//    elsewhere, or with FLASHATTN_PORTABLE_ONLY set);
//  - Options::deterministic: the backward takes the same path (the Hopper backward adds dQ in a fixed
//    order then), causal and not;
//  - Algorithm::standard: "cuda.standard" for both;
//  - f32 with Algorithm::flash: Error with kind() unsupported (no flash kernel takes f32), and the
//    path of the previous call is kept.
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "support/device_buffer.hpp"

namespace {
using namespace flashattn;
using fa_test::DeviceBuffer;

// Inputs of one small call in device memory: B = 2, Nq = 200, Nk = 328, H = 4 (2 KV heads), d = 128.
struct DeviceProblem {
  static constexpr int64_t B = 2, Nq = 200, Nk = 328, H = 4, Hkv = 2, D = 128;
  DType dtype;
  size_t el;
  DeviceBuffer q, k, v, out, lse, dout, dq, dk, dv;
  explicit DeviceProblem(DType t)
      : dtype(t), el(element_size(t)), q(B * Nq * H * D * el), k(B * Nk * Hkv * D * el), v(B * Nk * Hkv * D * el),
        out(B * Nq * H * D * el), lse(B * H * Nq * 4), dout(B * Nq * H * D * el), dq(B * Nq * H * D * el),
        dk(B * Nk * Hkv * D * el), dv(B * Nk * Hkv * D * el) {
    // Small values of either format: a bf16/f16 pattern (0x3c00: 1.0 in f16, 0x3c00 ≈ 0.0078 in bf16) or
    // 0.25 in f32; the results are not checked here, only which path ran.
    for (DeviceBuffer* b : {&q, &k, &v, &dout}) {
      std::vector<uint8_t> host(b->bytes());
      if (t == DType::f32) {
        const float x = 0.25f;
        for (size_t i = 0; i + 4 <= host.size(); i += 4) std::memcpy(&host[i], &x, 4);
      } else {
        for (size_t i = 0; i + 2 <= host.size(); i += 2) host[i] = 0x00, host[i + 1] = 0x3c;
      }
      b->upload(host.data(), host.size());
    }
  }
  Tensor t(const DeviceBuffer& x, int64_t n, int64_t heads) const {
    return make_tensor(x.data(), dtype, {B, n, heads, D}, Device::cuda);
  }
  Tensor lse_t() const { return make_tensor(lse.data(), DType::f32, {B, H, Nq, 1}, Device::cuda); }
  void run_forward(const Options& o) {
    const Tensor l = lse_t();
    forward(t(q, Nq, H), t(k, Nk, Hkv), t(v, Nk, Hkv), t(out, Nq, H), &l, o);
    DeviceBuffer::synchronize();
  }
  void run_backward(const Options& o) {
    backward(t(q, Nq, H), t(k, Nk, Hkv), t(v, Nk, Hkv), t(out, Nq, H), t(dout, Nq, H), lse_t(), t(dq, Nq, H),
             t(dk, Nk, Hkv), t(dv, Nk, Hkv), o);
    DeviceBuffer::synchronize();
  }
};

// The path the Hopper-capable calls take on this device: "cuda.sm90" on sm_90 unless the Hopper
// kernels are turned off (FLASHATTN_PORTABLE_ONLY, src/cuda/backend.cpp), else "cuda.sm80".
std::string flash_path(std::string* why) {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return "?";
  const char* portable = std::getenv("FLASHATTN_PORTABLE_ONLY");
  const bool hopper_off = portable && *portable && std::string(portable) != "0";
  *why = "sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + (hopper_off ? ", FLASHATTN_PORTABLE_ONLY" : "");
  return prop.major == 9 && !hopper_off ? "cuda.sm90" : "cuda.sm80";
}

class CudaKernelPath : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: GPU-only test skipped";
  }
};

TEST_F(CudaKernelPath, Bf16D128FlashOnHopper) {
  std::string why;
  const std::string want = flash_path(&why);
  if (want != "cuda.sm90") std::printf("[flashattn] %s: expecting the portable kernels (%s)\n", why.c_str(), want.c_str());
  DeviceProblem p(DType::bf16);
  for (bool causal : {false, true}) {
    Options o;
    o.causal = causal;
    p.run_forward(o);
    EXPECT_EQ(std::string(last_kernel_path()), want) << "forward, causal " << causal << " (" << why << ")";
    p.run_backward(o);
    EXPECT_EQ(std::string(last_kernel_path()), want) << "backward, causal " << causal << " (" << why << ")";
  }
}

TEST_F(CudaKernelPath, DeterministicBackward) {
  std::string why;
  const std::string want = flash_path(&why);
  DeviceProblem p(DType::bf16);
  for (bool causal : {false, true}) {
    Options o;
    o.causal = causal;
    o.deterministic = true;
    p.run_forward(o);
    p.run_backward(o);
    EXPECT_EQ(std::string(last_kernel_path()), want) << "Options::deterministic backward, causal " << causal << " (" << why << ")";
  }
}

TEST_F(CudaKernelPath, StandardAlgorithm) {
  for (DType t : {DType::bf16, DType::f32}) {
    DeviceProblem p(t);
    Options o;
    o.algorithm = Algorithm::standard;
    p.run_forward(o);
    EXPECT_EQ(std::string(last_kernel_path()), "cuda.standard") << "forward " << to_string(t);
    p.run_backward(o);
    EXPECT_EQ(std::string(last_kernel_path()), "cuda.standard") << "backward " << to_string(t);
  }
}

TEST_F(CudaKernelPath, F32FlashIsUnsupported) {
  DeviceProblem p(DType::f32);
  Options standard;
  standard.algorithm = Algorithm::standard;
  p.run_forward(standard);  // out and lse for the backward below, and a path to keep
  ASSERT_EQ(std::string(last_kernel_path()), "cuda.standard");
  Options flash;
  flash.algorithm = Algorithm::flash;
  for (bool bwd : {false, true}) {
    try {
      bwd ? p.run_backward(flash) : p.run_forward(flash);
      ADD_FAILURE() << (bwd ? "backward" : "forward") << ": f32 with Algorithm::flash on CUDA did not raise";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), Error::Kind::unsupported) << (bwd ? "backward: " : "forward: ") << e.what();
    }
    EXPECT_EQ(std::string(last_kernel_path()), "cuda.standard") << "a call that raised changed the path";
  }
}

}  // namespace
