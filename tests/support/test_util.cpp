// Seeds, skips, host tensors and device placement (see test_util.hpp).
#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <mutex>
#include <numeric>
#include <sstream>

#include "core/dtype.hpp"

namespace fa_test {

// ---- seeds --------------------------------------------------------------------------------------
namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
std::string current_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (!info) return "";
  return std::string(info->test_suite_name()) + "." + info->name();
}
}  // namespace

uint64_t process_seed() {
  static const uint64_t seed = [] {
    if (const char* env = std::getenv("FLASHATTN_TEST_SEED"); env && *env) return uint64_t(std::strtoull(env, nullptr, 0));
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ uint64_t(rd());
  }();
  return seed;
}

uint64_t test_seed() {
  return splitmix64(process_seed() ^ std::hash<std::string>{}(current_test_name()));
}

std::string seed_banner() {
  std::ostringstream os;
  os << "seed: FLASHATTN_TEST_SEED=" << process_seed() << " (rerun: FLASHATTN_TEST_SEED=" << process_seed()
     << " ./flashattn_tests --gtest_filter='" << current_test_name() << "')";
  return os.str();
}

// ---- skips --------------------------------------------------------------------------------------
namespace {
std::mutex g_skip_mutex;
std::vector<std::string> g_skips;
}  // namespace
void note_skip(const std::string& why) {
  std::lock_guard<std::mutex> lock(g_skip_mutex);
  g_skips.push_back(current_test_name() + ": " + why);
}
// Printed by the environment in test_main.cpp.
std::vector<std::string> skips() {
  std::lock_guard<std::mutex> lock(g_skip_mutex);
  return g_skips;
}

// ---- dtypes -------------------------------------------------------------------------------------
size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}
double round_to_dtype(double x, DType t) { return double(flashattn::detail::round_to(float(x), t)); }

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::dense: return "dense";
    case Layout::heads_first: return "heads_first";
    case Layout::row_padded: return "row_padded";
  }
  return "?";
}

// ---- host tensors -------------------------------------------------------------------------------
Tensor HostTensor::view() const {
  Tensor t;
  t.data = data();
  t.dtype = dtype;
  t.device = Device::cpu;
  t.shape = shape;
  t.strides = strides;
  return t;
}

double HostTensor::get(int64_t i) const { return flashattn::detail::load_as_float(storage->data(), i, dtype); }
void HostTensor::set(int64_t i, double x) { flashattn::detail::store_from_float(storage->data(), i, dtype, float(x)); }

std::vector<double> HostTensor::dense() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  size_t n = 0;
  for (int64_t a = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (int64_t c = 0; c < shape[2]; ++c)
        for (int64_t e = 0; e < shape[3]; ++e) out[n++] = get(index(a, b, c, e));
  return out;
}

std::vector<char> HostTensor::membership() const {
  std::vector<char> in(size_t(storage_elems()), 0);
  for (int64_t a = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (int64_t c = 0; c < shape[2]; ++c)
        for (int64_t e = 0; e < shape[3]; ++e) in[size_t(index(a, b, c, e))] = 1;
  return in;
}

namespace {
HostTensor alloc(DType t, std::array<int64_t, 4> shape, std::array<int64_t, 4> strides, int64_t offset) {
  HostTensor h;
  h.dtype = t;
  h.shape = shape;
  h.strides = strides;
  h.offset = offset;
  int64_t last = offset;
  bool empty = false;
  for (int i = 0; i < 4; ++i) {
    if (shape[i] == 0) empty = true;
    last += (shape[i] > 0 ? shape[i] - 1 : 0) * strides[i];
  }
  // A few elements of slack after the view so that writes past its end are caught as gap writes.
  const int64_t elems = (empty ? offset : last + 1) + 7;
  h.storage = std::make_shared<Storage>(size_t(elems) * dtype_size(t));
  return h;
}
}  // namespace

HostTensor make_tensor(DType t, std::array<int64_t, 4> s, Layout layout) {
  const int64_t B = s[0], N = s[1], H = s[2], d = s[3];
  switch (layout) {
    case Layout::dense: return alloc(t, s, {N * H * d, H * d, d, 1}, 0);
    case Layout::heads_first: return alloc(t, s, {H * N * d, d, N * d, 1}, 0);
    case Layout::row_padded: return alloc(t, s, {N * 3 * H * d, 3 * H * d, d, 1}, H * d);
  }
  (void)B;
  return {};
}

HostTensor make_lse(std::array<int64_t, 3> bhn, bool padded) {
  const int64_t B = bhn[0], H = bhn[1], N = bhn[2];
  if (!padded) return alloc(DType::f32, {B, H, N, 1}, {H * N, N, 1, 1}, 0);
  return alloc(DType::f32, {B, H, N, 1}, {H * (2 * N + 3), 2 * N + 3, 2, 1}, 1);
}

std::array<HostTensor, 3> make_packed_qkv(DType t, int64_t B, int64_t N, int64_t H, int64_t Hkv, int64_t d) {
  const int64_t W = H + 2 * Hkv;  // heads per token in the packed buffer
  HostTensor q = alloc(t, {B, N, W, d}, {N * W * d, W * d, d, 1}, 0);
  HostTensor k = q, v = q;
  q.shape = {B, N, H, d};
  k.shape = {B, N, Hkv, d};
  k.offset = H * d;
  v.shape = {B, N, Hkv, d};
  v.offset = (H + Hkv) * d;
  return {q, k, v};
}

std::vector<int32_t> shuffled_block_table(int64_t entries, int64_t num_pages, std::mt19937_64& rng) {
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  perm.resize(static_cast<size_t>(entries));
  return perm;
}

void fill_uniform(HostTensor& t, std::mt19937_64& rng, double mag) {
  std::uniform_real_distribution<double> u(-mag, mag);
  for (int64_t a = 0; a < t.shape[0]; ++a)
    for (int64_t b = 0; b < t.shape[1]; ++b)
      for (int64_t c = 0; c < t.shape[2]; ++c)
        for (int64_t e = 0; e < t.shape[3]; ++e) {
          double x;
          do x = round_to_dtype(u(rng), t.dtype);
          while (x == 0);
          t.set(t.index(a, b, c, e), x);
        }
}

void poison(HostTensor& t) {
  const int64_t n = t.storage_elems();
  void* base = t.storage->data();
  switch (t.dtype) {
    case DType::f32: {
      const uint32_t nan = 0x7fc0badau;
      for (int64_t i = 0; i < n; ++i) std::memcpy(static_cast<uint32_t*>(base) + i, &nan, 4);
      break;
    }
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(base)[i] = 0x7e5a;
      break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(base)[i] = 0x7fda;
      break;
  }
}

void fill_sentinel(HostTensor& t, uint8_t byte) { std::memset(t.storage->data(), byte, t.storage->bytes); }

namespace {
std::vector<uint64_t> snapshot_words(const HostTensor& t) {
  std::vector<uint64_t> w((t.storage->bytes + 7) / 8, 0);
  std::memcpy(w.data(), t.storage->data(), t.storage->bytes);
  return w;
}
}  // namespace

::testing::AssertionResult written_exactly(const std::string& what, const HostTensor& t,
                                           const std::vector<uint64_t>& before) {
  const std::vector<char> in = t.membership();
  const size_t es = dtype_size(t.dtype);
  const auto* now = static_cast<const unsigned char*>(t.storage->data());
  const auto* old = reinterpret_cast<const unsigned char*>(before.data());
  int64_t nan_count = 0, gap_writes = 0, first_nan = -1, first_gap = -1;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i]) {
      if (std::isnan(t.get(int64_t(i)))) {
        if (first_nan < 0) first_nan = int64_t(i);
        ++nan_count;
      }
    } else if (std::memcmp(now + i * es, old + i * es, es) != 0) {
      if (first_gap < 0) first_gap = int64_t(i);
      ++gap_writes;
    }
  }
  if (nan_count == 0 && gap_writes == 0) return ::testing::AssertionSuccess();
  auto r = ::testing::AssertionFailure() << what << ": ";
  if (nan_count)
    r << nan_count << " of " << t.numel() << " elements are NaN after the call (poison not overwritten or NaN "
      << "produced; first at storage index " << first_nan << "). ";
  if (gap_writes)
    r << gap_writes << " storage elements outside the view were written (first at storage index " << first_gap
      << "; strides " << t.strides[0] << "," << t.strides[1] << "," << t.strides[2] << "," << t.strides[3] << ").";
  return r;
}

bool bitwise_equal(const HostTensor& a, const HostTensor& b) {
  if (a.shape != b.shape || a.dtype != b.dtype) return false;
  const size_t es = dtype_size(a.dtype);
  const auto* pa = static_cast<const unsigned char*>(a.storage->data());
  const auto* pb = static_cast<const unsigned char*>(b.storage->data());
  for (int64_t x = 0; x < a.shape[0]; ++x)
    for (int64_t y = 0; y < a.shape[1]; ++y)
      for (int64_t z = 0; z < a.shape[2]; ++z)
        for (int64_t w = 0; w < a.shape[3]; ++w)
          if (std::memcmp(pa + a.index(x, y, z, w) * es, pb + b.index(x, y, z, w) * es, es) != 0) return false;
  return true;
}

// Exposed for tests that snapshot storages.
std::vector<uint64_t> snapshot(const HostTensor& t) { return snapshot_words(t); }

// ---- placement ----------------------------------------------------------------------------------
Tensor Placement::put(const HostTensor& t) {
  Tensor v = t.view();
  if (device_ == Device::cpu) return v;
  auto it = buffers_.find(t.storage.get());
  if (it == buffers_.end()) {
    DeviceBuffer buf(t.storage->bytes);
    buf.upload(t.storage->data(), t.storage->bytes);
    it = buffers_.emplace(t.storage.get(), std::move(buf)).first;
  }
  v.device = Device::cuda;
  v.data = static_cast<char*>(it->second.data()) + t.offset * int64_t(dtype_size(t.dtype));
  return v;
}

void Placement::refresh(const HostTensor& t) {
  if (device_ == Device::cpu) return;
  auto it = buffers_.find(t.storage.get());
  if (it == buffers_.end()) {
    put(t);
    return;
  }
  it->second.upload(t.storage->data(), t.storage->bytes);
}

void Placement::fetch(HostTensor& t) {
  if (device_ == Device::cpu) return;
  DeviceBuffer::synchronize();
  auto it = buffers_.find(t.storage.get());
  if (it == buffers_.end()) throw std::runtime_error("Placement::fetch: tensor was never put on the device");
  it->second.download(t.storage->data(), t.storage->bytes);
}

const int32_t* Placement::put_ints(const std::vector<int32_t>& v) {
  if (device_ == Device::cpu) return v.data();
  auto buf = std::make_unique<DeviceBuffer>(v.size() * sizeof(int32_t));
  buf->upload(v.data(), v.size() * sizeof(int32_t));
  const auto* p = static_cast<const int32_t*>(buf->data());
  int_buffers_.push_back(std::move(buf));
  return p;
}

}  // namespace fa_test
