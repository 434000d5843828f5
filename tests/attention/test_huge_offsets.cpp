// Element offsets past 2^31 are computed in int64: every tensor of a call (q, k, v, out, lse, dout,
// dq, dk, dv, and a contiguous KV cache with its new tokens) has batch stride 2^31 + 64 elements,
// so batch 1 starts more than 8 GiB (f32) after batch 0. The tensors lie in one sparse anonymous
// mapping of 72 GiB (MAP_NORESERVE: only the pages the calls touch take memory, a few hundred KiB); the
// results must be bitwise equal to the same problem laid out densely, for the flash and the
// standard algorithm, forward and deterministic backward, and forward_kvcache with appended
// tokens. An offset truncated to 32 bits would read and write elsewhere in the mapping (a wrong
// result) or outside it (a crash). Elements just before and after each batch's rows are checked
// untouched. Skipped, with the reason, where the address space cannot hold the mapping.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn/kvcache.hpp"
#include "support/test_util.hpp"

namespace fa_test {
namespace {

constexpr int64_t kBatchStride = (int64_t(1) << 31) + 64;  // elements
constexpr int64_t kSlot = int64_t(1) << 16;                 // room for one batch of any tensor here
constexpr int kSlots = 9;
constexpr float kGuard = 1234.5f;

// One f32 mapping of kSlots·(kBatchStride + kSlot) elements: tensor number `slot` has batch b at
// element slot·(kBatchStride + kSlot) + b·kBatchStride + 1 (a guard element before it). The
// tensors' spans are disjoint (the library rejects outputs whose span overlaps another tensor's).
class SparseRegion {
 public:
  SparseRegion() {
    bytes_ = size_t(kSlots) * size_t(kBatchStride + kSlot) * sizeof(float);
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      error_ = std::string("mmap of ") + std::to_string(bytes_ >> 20) + " MiB (MAP_NORESERVE) failed: " +
               std::strerror(errno);
      return;
    }
    base_ = static_cast<float*>(p);
  }
  ~SparseRegion() {
    if (base_) munmap(base_, bytes_);
  }
  SparseRegion(const SparseRegion&) = delete;
  SparseRegion& operator=(const SparseRegion&) = delete;
  bool ok() const { return base_ != nullptr; }
  const std::string& error() const { return error_; }
  float* slot(int s) const { return base_ + int64_t(s) * (kBatchStride + kSlot) + 1; }

 private:
  float* base_ = nullptr;
  size_t bytes_ = 0;
  std::string error_;
};

// A (B, N, H, d) f32 tensor (or the LSE, (B, H, N, 1)) in slot `s` of the region with batch stride
// kBatchStride and rows packed inside a batch; the dense twin has the same values.
struct Huge {
  Tensor t;
  int64_t per_batch = 0;  // elements of one batch (contiguous)
  float* at(int64_t b) const { return static_cast<float*>(t.data) + b * kBatchStride; }
};

Huge place(const SparseRegion& r, int s, std::array<int64_t, 4> shape) {
  Huge h;
  h.per_batch = shape[1] * shape[2] * shape[3];
  EXPECT_LT(h.per_batch + 2, kSlot);
  h.t.data = r.slot(s);
  h.t.dtype = DType::f32;
  h.t.shape = shape;
  h.t.strides = {kBatchStride, shape[2] * shape[3], shape[3], 1};
  for (int64_t b = 0; b < shape[0]; ++b) {
    h.at(b)[-1] = kGuard;
    h.at(b)[h.per_batch] = kGuard;
  }
  return h;
}

// Dense tensors from test_util are packed: batch b's elements are [b·per_batch, (b+1)·per_batch).
void copy_in(const HostTensor& dense, const Huge& h) {
  const float* src = static_cast<const float*>(dense.data());
  for (int64_t b = 0; b < dense.shape[0]; ++b) std::memcpy(h.at(b), src + b * h.per_batch, size_t(h.per_batch) * 4);
}
void fill_nan(const Huge& h) {
  for (int64_t b = 0; b < h.t.shape[0]; ++b)
    for (int64_t i = 0; i < h.per_batch; ++i) h.at(b)[i] = std::nanf("");
}

// The huge tensor's elements equal the dense one's bit for bit, and the guards are intact.
::testing::AssertionResult same_as(const char* what, const Huge& h, const HostTensor& dense) {
  const float* src = static_cast<const float*>(dense.data());
  for (int64_t b = 0; b < h.t.shape[0]; ++b) {
    if (h.at(b)[-1] != kGuard || h.at(b)[h.per_batch] != kGuard)
      return ::testing::AssertionFailure() << what << ": batch " << b << " wrote outside its rows";
    if (std::memcmp(h.at(b), src + b * h.per_batch, size_t(h.per_batch) * 4) != 0) {
      for (int64_t i = 0; i < h.per_batch; ++i)
        if (std::memcmp(h.at(b) + i, src + b * h.per_batch + i, 4) != 0)
          return ::testing::AssertionFailure() << what << ": batch " << b << " element " << i << " is " << h.at(b)[i]
                                               << ", dense layout " << src[b * h.per_batch + i];
    }
  }
  return ::testing::AssertionSuccess();
}

class HugeOffsets : public ::testing::TestWithParam<Algorithm> {};

TEST_P(HugeOffsets, ForwardBackwardPast2To31Elements) {
  FA_SEED_TRACE();
  SparseRegion region;
  if (!region.ok()) {
    note_skip(region.error());
    GTEST_SKIP() << region.error();
  }
  const int64_t B = 2, Nq = 24, Nk = 40, H = 4, Hkv = 2, d = 32;
  std::mt19937_64 rng(test_seed());
  HostTensor q = make_tensor(DType::f32, {B, Nq, H, d}), k = make_tensor(DType::f32, {B, Nk, Hkv, d}),
             v = make_tensor(DType::f32, {B, Nk, Hkv, d}), out = make_tensor(DType::f32, {B, Nq, H, d}),
             dout = make_tensor(DType::f32, {B, Nq, H, d}), dq = make_tensor(DType::f32, {B, Nq, H, d}),
             dk = make_tensor(DType::f32, {B, Nk, Hkv, d}), dv = make_tensor(DType::f32, {B, Nk, Hkv, d});
  HostTensor lse = make_lse({B, H, Nq});
  for (HostTensor* t : {&q, &k, &v, &dout}) fill_uniform(*t, rng, 1.0);
  for (HostTensor* t : {&out, &lse, &dq, &dk, &dv}) poison(*t);

  Huge hq = place(region, 0, q.shape), hk = place(region, 1, k.shape), hv = place(region, 2, v.shape),
       hout = place(region, 3, out.shape), hlse = place(region, 4, lse.shape), hdout = place(region, 5, dout.shape),
       hdq = place(region, 6, dq.shape), hdk = place(region, 7, dk.shape), hdv = place(region, 8, dv.shape);
  copy_in(q, hq);
  copy_in(k, hk);
  copy_in(v, hv);
  copy_in(dout, hdout);
  for (const Huge* h : {&hout, &hlse, &hdq, &hdk, &hdv}) fill_nan(*h);

  Options o;
  o.algorithm = GetParam();
  o.causal = true;
  o.deterministic = true;
  const Tensor tl = lse.view();
  flashattn::forward(q.view(), k.view(), v.view(), out.view(), &tl, o);
  flashattn::forward(hq.t, hk.t, hv.t, hout.t, &hlse.t, o);
  EXPECT_TRUE(same_as("out", hout, out));
  EXPECT_TRUE(same_as("lse", hlse, lse));
  // The dense result itself is attention (not, say, zeros or a copy of an input).
  for (double x : out.dense()) ASSERT_TRUE(std::isfinite(x));

  flashattn::backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dk.view(),
                      dv.view(), o);
  flashattn::backward(hq.t, hk.t, hv.t, hout.t, hdout.t, hlse.t, hdq.t, hdk.t, hdv.t, o);
  EXPECT_TRUE(same_as("dq", hdq, dq));
  EXPECT_TRUE(same_as("dk", hdk, dk));
  EXPECT_TRUE(same_as("dv", hdv, dv));
  // The inputs were only read.
  EXPECT_TRUE(same_as("q", hq, q));
  EXPECT_TRUE(same_as("k", hk, k));
  EXPECT_TRUE(same_as("v", hv, v));
}

INSTANTIATE_TEST_SUITE_P(Cpu, HugeOffsets, ::testing::Values(Algorithm::flash, Algorithm::standard),
                         [](const ::testing::TestParamInfo<Algorithm>& i) {
                           return std::string(flashattn::to_string(i.param));
                         });

// forward_kvcache over a contiguous cache whose batch stride is past 2^31 elements, appending two
// tokens per sequence: out, lse and the cache after the call equal the dense layout's.
TEST(HugeOffsetsKvcache, AppendAndAttendPast2To31Elements) {
  FA_SEED_TRACE();
  SparseRegion region;
  if (!region.ok()) {
    note_skip(region.error());
    GTEST_SKIP() << region.error();
  }
  const int64_t B = 2, Sq = 3, H = 4, Hkv = 2, d = 32, S_max = 64, S_new = 2;
  std::mt19937_64 rng(test_seed());
  HostTensor q = make_tensor(DType::f32, {B, Sq, H, d}), out = make_tensor(DType::f32, {B, Sq, H, d}),
             kc = make_tensor(DType::f32, {B, S_max, Hkv, d}), vc = make_tensor(DType::f32, {B, S_max, Hkv, d}),
             kn = make_tensor(DType::f32, {B, S_new, Hkv, d}), vn = make_tensor(DType::f32, {B, S_new, Hkv, d});
  HostTensor lse = make_lse({B, H, Sq});
  for (HostTensor* t : {&q, &kc, &vc, &kn, &vn}) fill_uniform(*t, rng, 1.0);
  poison(out);
  poison(lse);
  Huge hq = place(region, 0, q.shape), hout = place(region, 1, out.shape), hlse = place(region, 2, lse.shape),
       hkc = place(region, 3, kc.shape), hvc = place(region, 4, vc.shape), hkn = place(region, 5, kn.shape),
       hvn = place(region, 6, vn.shape);
  copy_in(q, hq);
  copy_in(kc, hkc);
  copy_in(vc, hvc);
  copy_in(kn, hkn);
  copy_in(vn, hvn);
  fill_nan(hout);
  fill_nan(hlse);

  std::vector<int32_t> lens{7, 45};
  flashattn::KVCacheOptions o;
  o.causal = true;
  o.num_splits = 2;
  const Tensor tkn = kn.view(), tvn = vn.view(), tl = lse.view();
  o.k_new = &tkn;
  o.v_new = &tvn;
  flashattn::KVCache cache;
  cache.k = kc.view();
  cache.v = vc.view();
  cache.seqlens = lens.data();
  flashattn::forward_kvcache(q.view(), cache, out.view(), &tl, o);

  flashattn::KVCacheOptions ho = o;
  ho.k_new = &hkn.t;
  ho.v_new = &hvn.t;
  flashattn::KVCache hcache = cache;
  hcache.k = hkc.t;
  hcache.v = hvc.t;
  flashattn::forward_kvcache(hq.t, hcache, hout.t, &hlse.t, ho);
  EXPECT_TRUE(same_as("out", hout, out));
  EXPECT_TRUE(same_as("lse", hlse, lse));
  EXPECT_TRUE(same_as("k cache", hkc, kc));
  EXPECT_TRUE(same_as("v cache", hvc, vc));
  for (double x : out.dense()) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace fa_test
