// The device-side form of one attention call: plain pointers, int64 element strides and the
// runtime semantics (window, softcap, GQA, varlen). Passed to kernels by value.
#pragma once

#include <cstdint>

#include "core/params.hpp"

namespace flashattn::cuda {

struct Strides {
  int64_t batch = 0, row = 0, head = 0;
};

struct AttnArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void* out = nullptr;
  const void* dout = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  Strides q_st, k_st, v_st, out_st, dout_st, dq_st, dk_st, dv_st;

  float* lse = nullptr;  // natural-log units, -inf for rows that see no key
  int64_t lse_batch = 0, lse_head = 0, lse_row = 0;

  // Backward scratch: D_i = rowsum(dO_i * O_i), dense (batch, heads, seqlen_q) fp32.
  float* dsum = nullptr;

  const int32_t* cu_seqlens_q = nullptr;  // device pointers, or null
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_k = nullptr;  // device pointer, or null: the keys each sequence uses
  int batch = 0, seqlen_q = 0, seqlen_k = 0;  // seqlens: per sequence, or packed totals (varlen)
  int max_seqlen_q = 0, max_seqlen_k = 0;
  int heads = 0, heads_kv = 0, group = 1, head_dim = 0;

  float scale = 0;        // softmax scale (natural units)
  float softcap = 0;      // 0 = off
  // Scores in the kernels are raw dot products x = q·k. Without softcap the log2-unit score is
  // x * score_scale with score_scale = scale·log2(e), folded here on the host once. With softcap
  // the kernel first forms t = tanh(x * cap_in), cap_in = scale / softcap, and the log2 score is
  // t * score_scale with score_scale = softcap·log2(e).
  float score_scale = 0;
  float cap_in = 0;
  int window_left = -1, window_right = -1;  // causal folded in as window_right = 0
};

inline Strides strides_of(const detail::TensorRef& t) {
  return {t.batch_stride, t.row_stride, t.head_stride};
}

inline AttnArgs make_args(const detail::Params& p) {
  constexpr float kLog2e = 1.4426950408889634f;
  AttnArgs a;
  a.q = p.q.data; a.k = p.k.data; a.v = p.v.data; a.out = p.out.data;
  a.dout = p.dout.data; a.dq = p.dq.data; a.dk = p.dk.data; a.dv = p.dv.data;
  a.q_st = strides_of(p.q); a.k_st = strides_of(p.k); a.v_st = strides_of(p.v);
  a.out_st = strides_of(p.out); a.dout_st = strides_of(p.dout);
  a.dq_st = strides_of(p.dq); a.dk_st = strides_of(p.dk); a.dv_st = strides_of(p.dv);
  a.lse = p.lse.data;
  a.lse_batch = p.lse.batch_stride; a.lse_head = p.lse.head_stride; a.lse_row = p.lse.row_stride;
  a.cu_seqlens_q = p.cu_seqlens_q; a.cu_seqlens_k = p.cu_seqlens_k; a.seqused_k = p.seqused_k;
  a.batch = int(p.batch); a.seqlen_q = int(p.seqlen_q); a.seqlen_k = int(p.seqlen_k);
  a.max_seqlen_q = int(p.max_rows_q());
  a.max_seqlen_k = int(p.max_rows_k());
  a.heads = int(p.heads); a.heads_kv = int(p.heads_kv); a.group = int(p.group_size());
  a.head_dim = int(p.head_dim);
  a.scale = p.scale; a.softcap = p.softcap;
  if (p.softcap > 0) {
    a.score_scale = p.softcap * kLog2e;
    a.cap_in = p.scale / p.softcap;
  } else {
    a.score_scale = p.scale * kLog2e;
    a.cap_in = 0;
  }
  a.window_left = p.window_left; a.window_right = p.window_right;
  return a;
}

}  // namespace flashattn::cuda
