// The device-side form of one forward_kvcache call (src/core/kv_params.hpp): plain pointers, int64
// element strides and the runtime semantics. Passed to the KV-cache kernels by value.
//
// Query rows are packed per (sequence, KV head): packed row r = token · group + head-in-group, so
// one CTA's K/V loads serve every query head of its group (GQA packing); `rows` = seqlen_q · group.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/kv_params.hpp"
#include "cuda/common/args.hpp"

namespace flashattn::cuda::kv {

struct KvArgs {
  const void* q = nullptr;
  void* out = nullptr;
  Strides q_st, out_st;
  bool q_vec16 = false;  // q's data and strides 16-byte aligned: rows read 16 bytes at a time
  float* lse = nullptr;  // natural-log units, or null
  int64_t lse_batch = 0, lse_head = 0, lse_row = 0;

  // The cache. Token t of sequence b: paged (page_size > 0) at page block_table[b·bt_stride +
  // t / page_size], row t % page_size; contiguous at cache row batch_idx[b] (or b), row t. The
  // batch stride of k_st / v_st is the page stride when paged.
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  Strides k_st, v_st;
  const int32_t* seqlens = nullptr;
  const int32_t* batch_idx = nullptr;
  const int32_t* block_table = nullptr;
  int64_t bt_stride = 0;
  int page_size = 0;  // 0: contiguous
  int page_shift = -1;  // log2(page_size) for a power of two, else -1 (divisions then)

  // New tokens appended before attending (seqlen_new = 0: none).
  int seqlen_new = 0;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  Strides kn_st, vn_st;

  // Rotary tables (rotary_dim = 0: none), element (pos, i) at rot_cos[pos·rot_stride + i].
  const void* rot_cos = nullptr;
  const void* rot_sin = nullptr;
  DType rot_dtype = DType::f32;
  int64_t rot_stride = 0;
  int rotary_dim = 0;
  bool rot_interleaved = true;
  bool rot_by_token = false;  // query i rotated at seqlens[b] + i (causal or windowed), else seqlens[b]

  int batch = 0, seqlen_q = 0, heads = 0, heads_kv = 0, group = 1, head_dim = 0;
  int rows = 0;  // packed query rows per (sequence, KV head)

  // log2-unit score of a raw dot product x: x·score_scale, or with softcap
  // tanh(x·cap_in)·score_scale (score_scale = softcap·log2 e). Applied before the row maximum, so
  // any scale sign is right.
  float score_scale = 0, cap_in = 0;
  int window_left = -1, window_right = -1;  // causal folded in as window_right = 0

  // Key splits. With splits > 1 each split's unnormalized fp32 accumulator and state go to
  // part / part_state, (B·Hkv·rows, splits, head_dim) and (B·Hkv·rows, splits), and the combine
  // kernel merges them in split order.
  int splits = 1;
  float* part = nullptr;
  float2* part_state = nullptr;  // (row_max in log2 units, row_sum)

  // The device-side validation (check_on_device or graph capture, where the host does not read
  // the lengths): *invalid non-zero means a length, page index, cache row or rotary row is out of
  // range, and every kernel writes nothing. Either kv_validate_kernel sets it before the others,
  // or (validate_first) every CTA of the call's first kernel checks all entries itself and its
  // CTA 0 writes the flag for the kernels after it.
  int* invalid = nullptr;
  bool validate_first = false;
  int64_t capacity = 0;         // tokens a sequence may hold (pages · page_size, or cache rows)
  int64_t slots = 0;            // pages, or cache batch rows
  int64_t rotary_len = 0;       // rows of the rotary tables
  int64_t entries_per_seq = 1;  // block-table entries per sequence (1 contiguous)
};

KvArgs make_kv_args(const detail::KVParams& p);

}  // namespace flashattn::cuda::kv
