// ctypes shim over flashattn::cuda::sm90::forward for bench/sm90_check.py: raw device pointers and
// element strides in, nothing from the rest of the library needed. Built by bench/sm90_build.sh
// (or the nvcc line in bench/sm90_check.py) into libfa_sm90.so.
#include <cstdio>
#include <string>

#include "cuda/sm90/sm90.hpp"

namespace {
thread_local std::string g_error;
}

extern "C" {

const char* fa_sm90_last_error() { return g_error.c_str(); }

// dtype: 0 = bf16, 1 = f16. Strides in elements: {batch, row, head} for q, k, v, o; LSE (B, H, Nq)
// contiguous fp32 or null. Returns 0 on success, 1 if unsupported, 2 on error (fa_sm90_last_error).
int fa_sm90_forward(int dtype, void* q, void* k, void* v, void* o, float* lse, long long batch,
                    long long seqlen_q, long long seqlen_k, long long heads, long long heads_kv,
                    long long head_dim, const long long* q_strides, const long long* k_strides,
                    const long long* v_strides, const long long* o_strides, float scale, int causal,
                    void* stream) {
  using namespace flashattn;
  detail::Params p;
  p.dtype = dtype == 1 ? DType::f16 : DType::bf16;
  p.device = Device::cuda;
  p.batch = batch;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.max_seqlen_q = seqlen_q;
  p.max_seqlen_k = seqlen_k;
  p.heads = heads;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  auto ref = [](void* data, const long long* s) {
    detail::TensorRef t;
    t.data = data;
    t.batch_stride = s[0];
    t.row_stride = s[1];
    t.head_stride = s[2];
    return t;
  };
  p.q = ref(q, q_strides);
  p.k = ref(k, k_strides);
  p.v = ref(v, v_strides);
  p.out = ref(o, o_strides);
  p.lse.data = lse;
  p.lse.batch_stride = heads * seqlen_q;
  p.lse.head_stride = seqlen_q;
  p.lse.row_stride = 1;
  p.scale = scale;
  p.causal = causal != 0;
  p.window_right = causal ? 0 : -1;
  p.stream = stream;
  try {
    if (!cuda::sm90::supports(p)) return 1;
    cuda::sm90::forward(p);
  } catch (const std::exception& e) {
    g_error = e.what();
    return 2;
  }
  return 0;
}
}
