// The argument checks of forward_kvcache (include/flashattn/kvcache.hpp), in the same style as
// check.cpp's: every failure throws Error naming the argument before anything is written.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/checker.hpp"
#include "core/kv_params.hpp"

namespace flashattn::detail {
namespace {

TensorRef ref(const Tensor& t) { return TensorRef{t.data, t.strides[0], t.strides[1], t.strides[2]}; }

}  // namespace

KVParams check_kvcache(const Tensor& q, const KVCache& cache, const Tensor& out, const Tensor* lse,
                       const KVCacheOptions& o) {
  const Checker c("forward_kvcache");
  const Tensor& kc = cache.k;
  const Tensor& vc = cache.v;
  c.inputs(q, "k_cache", kc, "v_cache", vc, out);

  const int64_t B = q.shape[0], Sq = q.shape[1], H = q.shape[2], d = q.shape[3];
  const int64_t Hkv = kc.shape[2];
  if (d < 1 || d > Checker::kMaxHeadDim)
    c.fail("q", "head_dim (shape[3]) in 1.." + std::to_string(Checker::kMaxHeadDim), std::to_string(d));
  if (H < 1) c.fail("q", "at least one head (shape[2])", std::to_string(H));
  if (Sq < 1) c.fail("q", "at least one query token (shape[1])", std::to_string(Sq));
  if (Hkv < 1) c.fail("k_cache", "at least one head (shape[2])", std::to_string(Hkv));
  if (H % Hkv != 0)
    c.fail("k_cache", "heads_kv (shape[2]) dividing q's " + std::to_string(H) + " heads", std::to_string(Hkv));
  if (kc.shape[3] != d)
    c.fail("k_cache", "head_dim (shape[3]) " + std::to_string(d) + " as q", std::to_string(kc.shape[3]));
  if (kc.shape[0] < 1 || kc.shape[1] < 1)
    c.fail("k_cache", cache.paged() ? "at least one page of at least one row" : "at least one sequence row of capacity >= 1",
           "shape " + shape_str(kc.shape));
  c.shape("v_cache", vc, kc.shape, "as k_cache");
  c.shape("out", out, q.shape, "(batch, seqlen_q, heads, head_dim) as q");
  if (cache.seqlens == nullptr) c.fail("cache_seqlens", "a (batch) int32 array", "nullptr");

  c.scores(o.scale, o.softcap, o.window_left, o.window_right, o.causal);
  if (o.num_splits < 0) c.fail("num_splits", "0 (chosen by the library) or >= 1", std::to_string(o.num_splits));

  KVParams p;
  p.dtype = q.dtype;
  p.device = q.device;
  p.batch = B;
  p.seqlen_q = Sq;
  p.heads = H;
  p.heads_kv = Hkv;
  p.head_dim = d;
  p.q = ref(q);
  p.out = ref(out);
  p.k_cache = ref(kc);
  p.v_cache = ref(vc);
  p.paged = cache.paged();
  p.cache_batch = kc.shape[0];
  p.cache_rows = kc.shape[1];
  p.seqlens = cache.seqlens;
  p.scale = o.scale != 0 ? o.scale : float(1.0 / std::sqrt(double(d)));
  p.softcap = o.softcap;
  p.causal = o.causal;
  p.window_left = o.window_left;
  p.window_right = o.causal ? 0 : o.window_right;
  p.num_splits = o.num_splits;
  p.stream = o.stream;

  // New tokens.
  c.together("k_new", o.k_new, "v_new", o.v_new, "the other (new keys and values)");
  if (o.k_new != nullptr) {
    const Tensor& kn = *o.k_new;
    const Tensor& vn = *o.v_new;
    c.tensor("k_new", kn);
    c.tensor("v_new", vn);
    c.same_kind("k_new", kn, "k_cache", kc);
    c.same_kind("v_new", vn, "k_cache", kc);
    if (kn.shape[0] != B || kn.shape[2] != Hkv || kn.shape[3] != d)
      c.shape("k_new", kn, {B, kn.shape[1], Hkv, d}, "(batch, seqlen_new, heads_kv, head_dim) matching q and the cache");
    c.shape("v_new", vn, kn.shape, "as k_new");
    p.seqlen_new = kn.shape[1];
    p.k_new = ref(kn);
    p.v_new = ref(vn);
  }

  // Rotary tables.
  c.together("rotary_cos", o.rotary_cos, "rotary_sin", o.rotary_sin, "the other rotary table");
  if (o.rotary_cos != nullptr) {
    const Tensor& rc = *o.rotary_cos;
    const Tensor& rs = *o.rotary_sin;
    c.tensor("rotary_cos", rc);
    c.tensor("rotary_sin", rs);
    if (rc.device != q.device)
      c.fail_type("rotary_cos", std::string("device ") + to_string(q.device) + " (as q)", to_string(rc.device));
    c.same_kind("rotary_sin", rs, "rotary_cos", rc);
    if (rc.shape[0] != 1 || rc.shape[2] != 1 || rc.shape[1] < 1 || rc.shape[3] < 1 || 2 * rc.shape[3] > d)
      c.fail("rotary_cos", "shape (1, seqlen_rotary >= 1, 1, rotary_dim / 2) with rotary_dim <= head_dim " +
                               std::to_string(d),
             "shape " + shape_str(rc.shape));
    c.shape("rotary_sin", rs, rc.shape, "as rotary_cos");
    if (rs.strides[1] != rc.strides[1])
      c.fail("rotary_sin", "the row stride of rotary_cos, " + std::to_string(rc.strides[1]),
             std::to_string(rs.strides[1]));
    p.rotary_cos = rc.data;
    p.rotary_sin = rs.data;
    p.rotary_dtype = rc.dtype;
    p.rotary_stride = rc.strides[1];
    p.rotary_dim = 2 * rc.shape[3];
    p.rotary_len = rc.shape[1];
    p.rotary_interleaved = o.rotary_interleaved;
  }

  // Where each sequence lives, and that its tokens fit. While a CUDA stream is being captured
  // into a graph the host cannot read device memory, and with check_on_device it does not: the
  // values are then checked on the device (values_on_device) and only the shapes here.
#if defined(FLASHATTN_WITH_CUDA)
  p.values_on_device = p.device == Device::cuda && (o.check_on_device || cuda::stream_capturing(o.stream));
#endif
  const bool host_values = !p.values_on_device;
  const std::vector<int32_t> seqlens = host_values ? read_ints(cache.seqlens, B, p.device) : std::vector<int32_t>{};
  std::vector<int32_t> table, bidx;
  if (cache.paged()) {
    if (cache.batch_idx != nullptr)
      c.fail("cache_batch_idx", "nullptr with a paged cache (the block table places every sequence)", "set");
    if (cache.max_pages < 1) c.fail("block_table", "max_pages >= 1 entries per row", std::to_string(cache.max_pages));
    const int64_t stride = cache.block_table_stride != 0 ? cache.block_table_stride : cache.max_pages;
    if (stride < cache.max_pages)
      c.fail("block_table", "a row stride >= max_pages " + std::to_string(cache.max_pages), std::to_string(stride));
    if (host_values && B > 0) table = read_ints(cache.block_table, (B - 1) * stride + cache.max_pages, p.device);
    p.block_table = cache.block_table;
    p.block_table_stride = stride;
    p.max_pages = cache.max_pages;
  } else if (cache.batch_idx != nullptr) {
    if (host_values) bidx = read_ints(cache.batch_idx, B, p.device);
    p.batch_idx = cache.batch_idx;
  }
  const int64_t capacity = cache.paged() ? cache.max_pages * p.cache_rows : p.cache_rows;
  std::vector<char> row_used(cache.paged() ? 0 : size_t(p.cache_batch), 0);
  for (int64_t b = 0; b < (host_values ? B : 0); ++b) {
    const int64_t len = seqlens[size_t(b)];
    if (len < 0) c.fail("cache_seqlens", "entries >= 0", "entry " + std::to_string(b) + " = " + std::to_string(len));
    const int64_t total = len + p.seqlen_new;
    if (total > capacity)
      c.fail("cache_seqlens", "cache_seqlens[b] + seqlen_new <= the capacity of " + std::to_string(capacity) + " tokens",
             "entry " + std::to_string(b) + ": " + std::to_string(len) + " + " + std::to_string(p.seqlen_new));
    if (cache.paged()) {
      const int64_t pages = (total + p.cache_rows - 1) / p.cache_rows;
      for (int64_t i = 0; i < pages; ++i) {
        const int64_t page = table[size_t(b * p.block_table_stride + i)];
        if (page < 0 || page >= p.cache_batch)
          c.fail("block_table", "page indices in [0, " + std::to_string(p.cache_batch) + ") for the tokens in use",
                 "row " + std::to_string(b) + " entry " + std::to_string(i) + " = " + std::to_string(page));
      }
    } else {
      const int64_t row = bidx.empty() ? b : bidx[size_t(b)];
      if (row < 0 || row >= p.cache_batch)
        c.fail(bidx.empty() ? "k_cache" : "cache_batch_idx",
               bidx.empty() ? "a batch (shape[0]) of at least q's " + std::to_string(B) + " sequences"
                            : "entries in [0, " + std::to_string(p.cache_batch) + ")",
               bidx.empty() ? std::to_string(p.cache_batch) : "entry " + std::to_string(b) + " = " + std::to_string(row));
      if (p.seqlen_new > 0 && row_used[size_t(row)])
        c.fail("cache_batch_idx", "distinct cache rows when new tokens are appended",
               "cache row " + std::to_string(row) + " twice");
      row_used[size_t(row)] = 1;
    }
    if (p.rotary_dim > 0) {
      int64_t last = len + (p.causal || p.windowed() ? Sq - 1 : 0);  // the last query's position
      if (p.seqlen_new > 0) last = std::max(last, total - 1);          // the last new key's
      if (last >= p.rotary_len)
        c.fail("rotary_cos", "a row for every rotated position (up to " + std::to_string(last) + ")",
               std::to_string(p.rotary_len) + " rows");
    }
  }
  if (host_values && cache.paged() && p.seqlen_new > 0) {  // two sequences appending into one page would race
    std::vector<int64_t> owner(size_t(p.cache_batch), -1);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t first = seqlens[size_t(b)] / p.cache_rows, last = (seqlens[size_t(b)] + p.seqlen_new - 1) / p.cache_rows;
      for (int64_t i = first; i <= last; ++i) {
        const int64_t page = table[size_t(b * p.block_table_stride + i)];
        if (owner[size_t(page)] >= 0 && owner[size_t(page)] != b)
          c.fail("block_table", "pages that new tokens are written to held by one sequence only",
                 "page " + std::to_string(page) + " in rows " + std::to_string(owner[size_t(page)]) + " and " + std::to_string(b));
        owner[size_t(page)] = b;
      }
    }
  }

  if (lse != nullptr) {
    c.lse("lse", *lse, q, B, H, Sq);
    p.lse = LseRef{static_cast<float*>(lse->data), lse->strides[0], lse->strides[1], lse->strides[2]};
  }

  // What is written must not overlap what is read, nor itself.
  c.distinct_elements("out", out);
  if (lse) c.distinct_elements("lse", *lse);
  std::vector<std::pair<const char*, const Tensor*>> inputs = {{"q", &q}, {"k_cache", &kc}, {"v_cache", &vc}};
  if (o.k_new) inputs.insert(inputs.end(), {{"k_new", o.k_new}, {"v_new", o.v_new}});
  if (o.rotary_cos) inputs.insert(inputs.end(), {{"rotary_cos", o.rotary_cos}, {"rotary_sin", o.rotary_sin}});
  for (const auto& [name, t] : inputs) {
    c.no_overlap("out", out, name, *t);
    if (lse) c.no_overlap("lse", *lse, name, *t);
  }
  if (lse) c.no_overlap("lse", *lse, "out", out);
  if (o.k_new) {
    c.distinct_elements("k_cache", kc);
    c.distinct_elements("v_cache", vc);
    c.no_overlap("k_cache", kc, "v_cache", vc);
    for (const auto& [name, t] : inputs)
      if (t != &kc && t != &vc) {
        c.no_overlap("k_cache", kc, name, *t);
        c.no_overlap("v_cache", vc, name, *t);
      }
  }
  return p;
}

}  // namespace flashattn::detail
