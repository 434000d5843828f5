// A tiny C ABI over flashattn for bench/compare_torch.py (ctypes): raw device pointers, shapes and
// element strides in, an error message out (nullptr on success). Built by scripts/dev/gpu-check:
//   g++ -O2 -shared -fPIC bench/torch_shim.cpp -Iinclude BUILD/libflashattn.a -lcudart -lcublas -fopenmp
#include <array>
#include <cstdint>
#include <string>

#include "flashattn/flashattn.hpp"

namespace {
thread_local std::string g_error;

flashattn::Tensor tensor(void* data, int dtype, const int64_t* shape, const int64_t* strides) {
  flashattn::Tensor t;
  t.data = data;
  t.dtype = static_cast<flashattn::DType>(dtype);
  t.device = flashattn::Device::cuda;
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = shape[i];
    t.strides[i] = strides[i];
  }
  return t;
}

struct Call {
  float scale;
  int causal, window_left, window_right;
  float softcap;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int max_seqlen_q, max_seqlen_k;
  int varlen_batch;  // sequences with cu_seqlens (entries - 1)
  int algorithm;  // 0 flash, 1 standard
  int deterministic;
  void* stream;
};

flashattn::Options options(const Call* c) {
  flashattn::Options o;
  o.scale = c->scale;
  o.causal = c->causal != 0;
  o.window_left = c->window_left;
  o.window_right = c->window_right;
  o.softcap = c->softcap;
  o.cu_seqlens_q = c->cu_seqlens_q;
  o.cu_seqlens_k = c->cu_seqlens_k;
  o.max_seqlen_q = c->max_seqlen_q;
  o.max_seqlen_k = c->max_seqlen_k;
  o.varlen_batch = c->varlen_batch;
  o.algorithm = c->algorithm ? flashattn::Algorithm::standard : flashattn::Algorithm::flash;
  o.deterministic = c->deterministic != 0;
  o.stream = c->stream;
  return o;
}
}  // namespace

extern "C" {

// ptrs: q k v out lse ; shapes/strides: 5 x 4 int64 (lse shape (B, H, Nq, 1)).
const char* fa_forward(void* const* ptrs, int dtype, const int64_t* shapes, const int64_t* strides,
                       const Call* call) {
  try {
    const auto q = tensor(ptrs[0], dtype, shapes + 0, strides + 0);
    const auto k = tensor(ptrs[1], dtype, shapes + 4, strides + 4);
    const auto v = tensor(ptrs[2], dtype, shapes + 8, strides + 8);
    const auto o = tensor(ptrs[3], dtype, shapes + 12, strides + 12);
    const auto l = tensor(ptrs[4], 0, shapes + 16, strides + 16);
    flashattn::forward(q, k, v, o, ptrs[4] ? &l : nullptr, options(call));
    return nullptr;
  } catch (const std::exception& e) {
    g_error = e.what();
    return g_error.c_str();
  }
}

// ptrs: q k v out dout lse dq dk dv ; shapes/strides: 9 x 4 int64.
const char* fa_backward(void* const* ptrs, int dtype, const int64_t* shapes, const int64_t* strides,
                        const Call* call) {
  try {
    std::array<flashattn::Tensor, 9> t;
    for (int i = 0; i < 9; ++i) t[i] = tensor(ptrs[i], i == 5 ? 0 : dtype, shapes + 4 * i, strides + 4 * i);
    flashattn::backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], options(call));
    return nullptr;
  } catch (const std::exception& e) {
    g_error = e.what();
    return g_error.c_str();
  }
}

const char* fa_info() {
  g_error = flashattn::build_info();
  return g_error.c_str();
}
}
