// The checked, normalized form of one attention call that every backend receives.
// Built once by src/core/dispatch.cpp after src/core/check.cpp has accepted the arguments;
// all offsets are int64 and in elements.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace flashattn::detail {

// A (batch, seqlen, heads, head_dim) tensor with a contiguous last dimension.
struct TensorRef {
  void* data = nullptr;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;

  // Element offset of (batch b, row i, head h, 0).
  int64_t offset(int64_t b, int64_t i, int64_t h) const {
    return b * batch_stride + i * row_stride + h * head_stride;
  }
};

// The fp32 log-sum-exp, logically (batch, heads, seqlen_q).
struct LseRef {
  float* data = nullptr;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
  int64_t offset(int64_t b, int64_t h, int64_t i) const {
    return b * batch_stride + h * head_stride + i * row_stride;
  }
};

// Per-stage timings of one call, filled by backends that know their stages (the standard path:
// src/cpu/standard.cpp with wall time, src/cuda/standard with CUDA events) when the flashattn
// program asks for them (`flashattn timeline`); never set by the public API.
struct StageProfile {
  struct Stage {
    std::string name;
    double seconds = 0, flops = 0, bytes = 0;  // bytes: main-memory traffic the stage implies
  };
  std::vector<Stage> stages;
  void add(const std::string& name, double seconds, double flops, double bytes) {
    for (Stage& s : stages)
      if (s.name == name) {
        s.seconds += seconds, s.flops += flops, s.bytes += bytes;
        return;
      }
    stages.push_back({name, seconds, flops, bytes});
  }
};

// merge_partial, checked: out and lse (f32) are read and written, part (dtype part_dtype) and
// lse_part only read; all (batch, seqlen, heads, head_dim) / (batch, heads, seqlen).
struct MergeParams {
  Device device = Device::cpu;
  DType part_dtype = DType::f32;
  int64_t batch = 0, seqlen = 0, heads = 0, head_dim = 0;
  TensorRef out, part;
  LseRef lse, lse_part;
  void* stream = nullptr;
};

struct Params {
  DType dtype = DType::f32;  // of q, k, v, out, dout, dq, dk, dv (all the same)
  Device device = Device::cpu;
  Algorithm algorithm = Algorithm::flash;

  // batch = number of sequences (cu_seqlens entries - 1 with varlen).
  // seqlen_q/k = tensor rows: per sequence, or the packed total with varlen.
  int64_t batch = 0, seqlen_q = 0, seqlen_k = 0;
  int64_t heads = 0, heads_kv = 0, head_dim = 0;

  TensorRef q, k, v, out;
  LseRef lse;                      // forward: may have data == nullptr (not requested)
  TensorRef dout, dq, dk, dv;      // backward only

  float scale = 0;                 // resolved: never 0
  float softcap = 0;               // 0 = off
  bool causal = false;
  // Resolved window in keys relative to the bottom-right diagonal; -1 = unbounded.
  // causal is folded in as window_right = 0.
  int window_left = -1, window_right = -1;

  // Varlen: both null or both set (host pointers for the CPU backend, device pointers for CUDA).
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;  // per-sequence maxima (== seqlen_q/k without varlen)
  // Keys used per sequence (batch entries, in the memory of cu_seqlens), or null: all of them.
  // Checked: 0 <= seqused_k[b] <= the sequence's key rows. seq_span applies it.
  const int32_t* seqused_k = nullptr;

  bool deterministic = false;
  void* stream = nullptr;
  StageProfile* profile = nullptr;  // internal: stage timings for `flashattn timeline`

  bool varlen() const { return cu_seqlens_q != nullptr; }
  // The longest sequence's rows: max_seqlen with varlen, else the tensors' (what check() stores in
  // max_seqlen too; a Params filled in by hand may leave it 0 without varlen).
  int64_t max_rows_q() const { return varlen() ? max_seqlen_q : seqlen_q; }
  int64_t max_rows_k() const { return varlen() ? max_seqlen_k : seqlen_k; }
  int64_t group_size() const { return heads / heads_kv; }  // query heads per KV head
};

// Where sequence b lives and how long it is. Valid on the host only (reads cu_seqlens and
// seqused_k). k_len is the keys the sequence attends to, the length its causal and window masks
// align to; k_rows the key rows the tensors hold for it: k_len = seqused_k[b] when given, else
// k_rows. Rows [k_len, k_rows) are padding: never read, their dK and dV written as zeros.
struct SeqSpan {
  int64_t batch_index;     // batch coordinate for the tensors (0 with varlen)
  int64_t q_start, k_start;  // first row in the tensors
  int64_t q_len, k_len;
  int64_t k_rows;
};

// The keys sequence b uses out of the k_rows its tensors hold (the CUDA kernels apply the same
// rule on the device: src/cuda/sm80/mask.cuh, seq_info).
inline int64_t used_keys(const int32_t* seqused_k, int64_t b, int64_t k_rows) {
  return seqused_k != nullptr ? int64_t(seqused_k[b]) : k_rows;
}

inline SeqSpan seq_span(const Params& p, int64_t b) {
  if (!p.varlen()) return {b, 0, 0, p.seqlen_q, used_keys(p.seqused_k, b, p.seqlen_k), p.seqlen_k};
  const int64_t q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1];
  const int64_t k0 = p.cu_seqlens_k[b], k1 = p.cu_seqlens_k[b + 1];
  return {0, q0, k0, q1 - q0, used_keys(p.seqused_k, b, k1 - k0), k1 - k0};
}

// The visible key range [lo, hi) of query row i (local to its sequence) under the resolved window
// with bottom-right alignment; lo >= hi means the row sees no key (output 0, LSE -inf).
// softcap and scale do not affect visibility.
struct KeyRange {
  int64_t lo, hi;
};
inline KeyRange window_keys(int window_left, int window_right, int64_t i, int64_t q_len, int64_t k_len) {
  const int64_t diag = i + k_len - q_len;
  int64_t lo = window_left < 0 ? 0 : diag - window_left;
  int64_t hi = window_right < 0 ? k_len : diag + window_right + 1;
  if (lo < 0) lo = 0;
  if (hi > k_len) hi = k_len;
  return {lo, hi};
}
inline KeyRange visible_keys(const Params& p, int64_t i, int64_t q_len, int64_t k_len) {
  return window_keys(p.window_left, p.window_right, i, q_len, k_len);
}

}  // namespace flashattn::detail
