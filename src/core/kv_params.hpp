// The checked, normalized form of one KV-cache call (forward_kvcache) that every backend receives.
// Built by src/core/check_kvcache.cpp; all offsets are int64 and in elements.
#pragma once

#include <cstdint>

#include "core/params.hpp"
#include "flashattn/kvcache.hpp"

namespace flashattn::detail {

struct KVParams {
  DType dtype = DType::f32;  // of q, out, the cache and the new tokens (all the same)
  Device device = Device::cpu;
  int64_t batch = 0, seqlen_q = 0, heads = 0, heads_kv = 0, head_dim = 0;

  TensorRef q, out;
  LseRef lse;  // data == nullptr: not requested

  // The cache: contiguous, k/v (cache_batch = B_cache, cache_rows = S_max, Hkv, d), sequence b in
  // batch row batch_idx[b] (or b); paged, k/v (cache_batch = num_pages, cache_rows = page_size,
  // Hkv, d), token t of sequence b in page block_table[b·block_table_stride + t / page_size].
  TensorRef k_cache, v_cache;
  bool paged = false;
  int64_t cache_batch = 0, cache_rows = 0;
  const int32_t* seqlens = nullptr;  // (batch) tokens already in the cache
  const int32_t* batch_idx = nullptr;
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0, max_pages = 0;

  // New tokens, seqlen_new per sequence (0: none).
  int64_t seqlen_new = 0;
  TensorRef k_new, v_new;

  // Rotary tables (rotary_dim = 0: none): element (pos, i) at rotary_cos[pos·rotary_stride + i].
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  DType rotary_dtype = DType::f32;
  int64_t rotary_stride = 0, rotary_dim = 0, rotary_len = 0;
  bool rotary_interleaved = true;

  float scale = 0;    // resolved: never 0
  float softcap = 0;  // 0 = off
  bool causal = false;
  int window_left = -1, window_right = -1;  // resolved; causal folded in as window_right = 0
  int num_splits = 0;                       // 0 = the backend chooses
  void* stream = nullptr;
  // The lengths, page indices and cache rows were not read on the host (check_on_device, or CUDA
  // graph capture): the backend validates them on the device and writes nothing when one is out
  // of range.
  bool values_on_device = false;

  int64_t group_size() const { return heads / heads_kv; }
  bool windowed() const { return window_left >= 0 || window_right >= 0; }
  // Host only (read seqlens / block_table / batch_idx; the CPU backend's pointers are host memory).
  int64_t total_len(int64_t b) const { return int64_t(seqlens[b]) + seqlen_new; }
  // The cache's (batch coordinate, row) holding token t of sequence b.
  void locate(int64_t b, int64_t t, int64_t* cache_b, int64_t* row) const {
    if (paged) {
      *cache_b = block_table[b * block_table_stride + t / cache_rows];
      *row = t % cache_rows;
    } else {
      *cache_b = batch_idx != nullptr ? batch_idx[b] : b;
      *row = t;
    }
  }
  // The rotary position of query i of sequence b (flash-attn's rule).
  int64_t query_position(int64_t b, int64_t i) const { return int64_t(seqlens[b]) + (causal || windowed() ? i : 0); }
  // Visible keys [lo, hi) of query i among the sequence's `total` tokens (bottom-right aligned).
  KeyRange visible(int64_t i, int64_t total) const { return window_keys(window_left, window_right, i, seqlen_q, total); }
};

KVParams check_kvcache(const Tensor& q, const KVCache& cache, const Tensor& out, const Tensor* lse,
                       const KVCacheOptions& options);

}  // namespace flashattn::detail
