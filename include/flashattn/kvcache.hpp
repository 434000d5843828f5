// Attention over a KV cache: decoding and appending for serving. #include <flashattn/kvcache.hpp>
// (it includes flashattn.hpp). After a call, last_kernel_path() names "cpu.kvcache".
//
// Per sequence b, cache_seqlens[b] tokens are already in the cache. The call
//   1. writes the new keys and values (k_new, v_new: S_new tokens, rotated first when rotary tables
//      are given) into the cache in place at positions cache_seqlens[b] … cache_seqlens[b] + S_new − 1;
//   2. lets q (Sq tokens, rotated when rotary tables are given) attend to the first
//      total_b = cache_seqlens[b] + S_new tokens of the cache.
// Causal and window masks align bottom-right to total_b: query i sees key j iff
// j <= i + total_b − Sq (+ window_right) and j >= i + total_b − Sq − window_left, as forward() with
// Nk = total_b. cache_seqlens itself is not changed: the caller advances it.
//
// The cache is contiguous, k and v (B_cache, S_max, Hkv, d) with sequence b in cache row
// cache_batch_idx[b] (default b), or paged, k and v (num_pages, page_size, Hkv, d) with token t of
// sequence b at page block_table[b·block_table_stride + t / page_size], row t % page_size; any
// page_size >= 1. Every argument is checked before anything is written: a rejected call writes
// neither out, lse nor the cache.
#pragma once

#include <cstdint>

#include "flashattn/flashattn.hpp"

namespace flashattn {

struct KVCache {
  Tensor k{}, v{};                        // contiguous (B_cache, S_max, Hkv, d) or paged pages
  const int32_t* seqlens = nullptr;       // (B) tokens already in each sequence's cache; required
  const int32_t* batch_idx = nullptr;     // contiguous only, optional: (B) cache row of sequence b
  const int32_t* block_table = nullptr;   // paged: (B, max_pages) page indices
  int64_t max_pages = 0;                  // paged: entries per block-table row
  int64_t block_table_stride = 0;         // paged: elements between rows (0 = max_pages)
  bool paged() const { return block_table != nullptr; }
};

struct KVCacheOptions {
  float scale = 0;  // 0 -> 1/sqrt(head_dim)
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0;
  // New tokens (B, S_new, Hkv, d), both or neither, of the cache's dtype.
  const Tensor* k_new = nullptr;
  const Tensor* v_new = nullptr;
  // Rotary embedding (as flash-attn applies it): cos and sin (1, S_rot, 1, rotary_dim / 2), f32,
  // rotary_dim even and <= head_dim; the first rotary_dim features of q and of the new keys are
  // rotated, the rest pass through. New key j of sequence b is rotated at position
  // cache_seqlens[b] + j; query i at cache_seqlens[b] + i with causal or a window, else every query
  // at cache_seqlens[b]. interleaved: pairs (2i, 2i + 1) (GPT-J); else (i, i + rotary_dim / 2)
  // (GPT-NeoX). Positions must be < S_rot.
  const Tensor* rotary_cos = nullptr;
  const Tensor* rotary_sin = nullptr;
  bool rotary_interleaved = true;
  // Splits of each sequence's keys, each its own fp32 online-softmax state merged at the end
  // (SoftmaxState::merge); 0 = the library chooses from the shape and the machine. Results agree
  // across split counts to rounding.
  int num_splits = 0;
  // Device::cuda: where cache_seqlens, block_table and cache_batch_idx (device memory) are checked.
  // false: read by the host (a synchronizing device-to-host copy), an out-of-range value throws
  // Error naming the argument. true: checked by a kernel on the call's stream, no synchronization;
  // an out-of-range value makes the call write nothing (neither out, lse nor the cache) and raises
  // no Error. While the stream is being captured into a CUDA graph the check is on the device
  // whatever this says. On the device only the ranges are checked (lengths within the capacity,
  // pages and cache rows in range, rotary rows present), not that appending sequences write
  // distinct pages or cache rows. Ignored on the CPU.
  bool check_on_device = false;
  void* stream = nullptr;  // cudaStream_t for Device::cuda
};

// q (B, Sq, H, d) with H % Hkv == 0; out like q; lse (B, H, Sq, 1) f32, may be null. dtypes: q, out,
// the cache and the new tokens all alike (f32, f16 or bf16 on the CPU; f16 or bf16 on CUDA), every
// pointer (cache_seqlens, block_table, cache_batch_idx included) on the tensors' device.
FLASHATTN_API void forward_kvcache(const Tensor& q, const KVCache& cache, const Tensor& out, const Tensor* lse,
                                   const KVCacheOptions& options = {});

// The split count this thread's last forward_kvcache that returned normally used (its own choice
// when num_splits was 0); 0 before the first.
FLASHATTN_API int last_kvcache_splits();

}  // namespace flashattn
