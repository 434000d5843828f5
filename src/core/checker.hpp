// The argument-checking helpers of src/core (check.cpp, check_kvcache.cpp): a Checker throws
// Error "flashattn::<call>: <argument>: expected <...>, got <...>" before anything is written.
#pragma once

#include <algorithm>
#include <cmath>
#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include <vector>

#include "core/backend.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::detail {

// Copies n int32 entries to the host for validation (the CUDA backend's pointers are device memory).
inline std::vector<int32_t> read_ints(const int32_t* p, int64_t n, Device device) {
  std::vector<int32_t> host(static_cast<size_t>(n));
  if (n == 0) return host;
  if (device == Device::cpu) {
    std::copy(p, p + n, host.begin());
  } else {
#if defined(FLASHATTN_WITH_CUDA)
    cuda::copy_to_host(host.data(), p, size_t(n) * sizeof(int32_t));
#endif
  }
  return host;
}

inline std::string shape_str(const std::array<int64_t, 4>& s) {
  std::ostringstream os;
  os << '(' << s[0] << ", " << s[1] << ", " << s[2] << ", " << s[3] << ')';
  return os.str();
}

inline bool valid_dtype(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }
inline bool valid_device(Device d) { return d == Device::cpu || d == Device::cuda; }
inline const char* dtype_name(DType t) { return valid_dtype(t) ? to_string(t) : "an invalid DType value"; }
inline const char* device_name(Device d) { return valid_device(d) ? to_string(d) : "an invalid Device value"; }

inline int64_t numel(const Tensor& t) { return t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3]; }

// Byte interval [lo, hi) that a tensor touches (empty when it has no elements).
struct Span {
  uintptr_t lo = 0, hi = 0;
};
inline Span byte_span(const Tensor& t, size_t elem) {
  if (numel(t) == 0 || t.data == nullptr) return {};
  int64_t last = 0;
  for (int i = 0; i < 4; ++i) last += (t.shape[i] - 1) * t.strides[i];
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  return {base, base + uintptr_t(last + 1) * elem};
}
inline bool overlaps(Span a, Span b) { return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi; }

// Two views whose byte ranges overlap can still be disjoint when they interleave row by row: the
// q, k, v (or dq, dk, dv) slices of one packed (batch, seqlen, 3, heads, head_dim) buffer. Exact
// for that pattern: same dtype and strides, batch stride a multiple of the row stride, and each
// one's per-row block of heads × head_dim elements falls between the other's.
inline bool interleaved_disjoint(const Tensor& a, const Tensor& b) {
  if (a.dtype != b.dtype || a.strides != b.strides) return false;
  const int64_t e = int64_t(element_size(a.dtype)), row = a.strides[1];
  if (row <= 0 || a.strides[0] % row != 0) return false;
  const int64_t width_a = (a.shape[2] - 1) * a.strides[2] + (a.shape[3] - 1) * a.strides[3] + 1;
  const int64_t width_b = (b.shape[2] - 1) * b.strides[2] + (b.shape[3] - 1) * b.strides[3] + 1;
  const int64_t delta_bytes = int64_t(reinterpret_cast<uintptr_t>(b.data) - reinterpret_cast<uintptr_t>(a.data));
  if (delta_bytes % e != 0) return false;
  const int64_t delta = ((delta_bytes / e) % row + row) % row;  // b's row block starts here within a's row
  return delta >= width_a && row - delta >= width_b;
}

class Checker {
 public:
  static constexpr int kMaxHeadDim = 256;

  explicit Checker(const char* call) : call_(call) {}

  [[noreturn]] void fail(const std::string& arg, const std::string& expected, const std::string& got,
                         Error::Kind kind = Error::Kind::value) const {
    throw Error(std::string("flashattn::") + call_ + ": " + arg + ": expected " + expected + ", got " + got, kind);
  }
  // A wrong dtype or device: TypeError in Python.
  [[noreturn]] void fail_type(const std::string& arg, const std::string& expected, const std::string& got) const {
    fail(arg, expected, got, Error::Kind::type);
  }

  // dtype, device, strides, null data; shape is checked by the caller against the others.
  void tensor(const char* name, const Tensor& t) const {
    if (!valid_dtype(t.dtype)) fail_type(name, "dtype f32, f16 or bf16", dtype_name(t.dtype));
    if (!valid_device(t.device)) fail_type(name, "device cpu or cuda", device_name(t.device));
    for (int i = 0; i < 4; ++i) {
      if (t.shape[i] < 0) fail(name, "non-negative sizes", "shape " + shape_str(t.shape));
      if (t.strides[i] < 0) fail(name, "non-negative strides", "strides " + shape_str(t.strides));
    }
    if (t.shape[3] > 1 && t.strides[3] != 1)
      fail(name, "a contiguous last dimension (stride 1)", "stride " + std::to_string(t.strides[3]));
    if (t.data == nullptr && numel(t) > 0) fail(name, "non-null data", "nullptr");
  }

  void same_kind(const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) const {
    if (t.dtype != ref.dtype)
      fail_type(name, std::string("dtype ") + dtype_name(ref.dtype) + " (as " + ref_name + ")", dtype_name(t.dtype));
    if (t.device != ref.device)
      fail_type(name, std::string("device ") + device_name(ref.device) + " (as " + ref_name + ")", device_name(t.device));
  }

  void shape(const char* name, const Tensor& t, const std::array<int64_t, 4>& want, const char* layout) const {
    if (t.shape != want) fail(name, std::string("shape ") + shape_str(want) + " " + layout, shape_str(t.shape));
  }

  void lse(const char* name, const Tensor& t, const Tensor& q_like, int64_t b, int64_t h, int64_t nq) const {
    tensor(name, t);
    if (t.dtype != DType::f32) fail_type(name, "dtype f32", dtype_name(t.dtype));
    if (t.device != q_like.device)
      fail_type(name, std::string("device ") + device_name(q_like.device) + " (as q)", device_name(t.device));
    shape(name, t, {b, h, nq, 1}, "(batch, heads, seqlen_q, 1)");
  }

  // An output whose strides map two elements to one address would be written twice at once.
  void distinct_elements(const char* name, const Tensor& t) const {
    std::array<std::pair<int64_t, int64_t>, 4> dims{};  // (stride, size) of the dims with size > 1
    int n = 0;
    for (int i = 0; i < 4; ++i)
      if (t.shape[i] > 1) dims[size_t(n++)] = {t.strides[i], t.shape[i]};
    for (int i = 1; i < n; ++i)  // insertion sort by stride (at most 4 entries)
      for (int j = i; j > 0 && dims[size_t(j)] < dims[size_t(j - 1)]; --j) std::swap(dims[size_t(j)], dims[size_t(j - 1)]);
    int64_t reach = 0;  // largest offset reachable with the smaller-stride dims
    for (int i = 0; i < n; ++i) {
      if (dims[size_t(i)].first <= reach)
        fail(name, "strides that give every element its own memory (an output)", "strides " + shape_str(t.strides) +
             " for shape " + shape_str(t.shape));
      reach += (dims[size_t(i)].second - 1) * dims[size_t(i)].first;
    }
  }

  // The options that shape the scores, as forward, backward and forward_kvcache take them.
  void scores(float scale, float softcap, int window_left, int window_right, bool causal) const {
    if (!std::isfinite(scale)) fail("scale", "a finite value (0 = 1/sqrt(head_dim))", std::to_string(scale));
    if (!std::isfinite(softcap) || softcap < 0) fail("softcap", "a finite value >= 0 (0 = off)", std::to_string(softcap));
    if (window_left < -1) fail("window_left", "-1 (unbounded) or >= 0", std::to_string(window_left));
    if (window_right < -1) fail("window_right", "-1 (unbounded) or >= 0", std::to_string(window_right));
    if (causal && window_right > 0)
      fail("window_right", "-1 or 0 with causal (causal sees no key right of the diagonal)", std::to_string(window_right));
  }

  // Two optional arguments that come as a pair: both set or neither.
  void together(const char* a_name, const void* a, const char* b_name, const void* b, const char* what) const {
    if ((a == nullptr) != (b == nullptr)) fail(a ? b_name : a_name, std::string("set together with ") + what, "nullptr");
  }

  // q, k, v (or the cache) and out: valid, and of q's dtype and device.
  void inputs(const Tensor& q, const char* k_name, const Tensor& k, const char* v_name, const Tensor& v,
              const Tensor& out) const {
    tensor("q", q);
    tensor(k_name, k);
    tensor(v_name, v);
    tensor("out", out);
    same_kind(k_name, k, "q", q);
    same_kind(v_name, v, "q", q);
    same_kind("out", out, "q", q);
#if !defined(FLASHATTN_WITH_CUDA)
    if (q.device == Device::cuda) fail_type("q", "device cpu (this build has no CUDA backend)", "cuda");
#endif
  }

  void no_overlap(const char* out_name, const Tensor& out, const char* in_name, const Tensor& in) const {
    if (overlaps(byte_span(out, element_size(out.dtype)), byte_span(in, element_size(in.dtype))) &&
        !interleaved_disjoint(out, in))
      fail(out_name, std::string("memory disjoint from ") + in_name, "overlapping buffers");
  }

 private:
  const char* call_;
};

}  // namespace flashattn::detail
