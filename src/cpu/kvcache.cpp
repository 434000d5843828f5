// The CPU backend of forward_kvcache: the new tokens appended in place (rotated first), then
// attention over each sequence's cache with its keys split into ranges, each range's fp32
// online-softmax state merged at the end (SoftmaxState::merge). Two paths:
//
// Decode (group · Sq ≤ kDecodeRows packed query rows per KV head, docs/cpu-kernels.md): bound by
// reading the cache. Work items: (sequence, key split), each over all KV heads. Keys go in chunks
// of kDecodeChunk, given to the decode kernels (decode_kernels.hpp) as one row address per key, so
// a chunk may span pages. Per chunk: the scores of every head's rows (K read in place, the chunk's
// V rows requested meanwhile), one online-softmax step per row, then the V rows added in place
// into the rows' accumulators (the next chunk's K rows requested meanwhile). A token's Hkv rows are
// adjacent in both layouts, so each item streams its range of the cache front to back, once.
//
// General (more rows): work items (sequence, KV head, block of query rows, key split). The query
// rows of one KV head are its group's heads × the query tokens, packed row = token · group + head,
// so every K/V row loaded serves the whole group (GQA packing). Keys are read in chunks of up to
// kChunk rows that never cross a page, converted to fp32 once per chunk and item; the scores and the
// P·V update are the tile products of the ISA table (tile_kernels.hpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/backend.hpp"
#include "core/dtype.hpp"
#include "core/kv_params.hpp"
#include "cpu/decode_kernels.hpp"
#include "cpu/isa.hpp"
#include "flashattn/online_softmax.hpp"

namespace flashattn::cpu {
namespace {

using detail::KVParams;
using State = SoftmaxState<float, true>;  // scores in log2 units (scale·log2 e folded in)

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kChunk = 64;      // keys per chunk (general path)
constexpr int kRowBlock = 64;   // packed query rows per work item (general path)
constexpr int64_t kMinSplitKeys = 256;
// The decode path: up to kDecodeRows packed rows per KV head (beyond, the general path's tile
// products; the crossover is a choice, not measured); kDecodeChunk keys per chunk, one online-softmax step each (measured at 32K tokens: 16 and 32
// keys 6–16 % slower for f32, 128 and 256 2–8 % slower for f32 and 3–5 % faster for bf16).
constexpr int kDecodeRows = 16;
constexpr int kDecodeChunk = 64;

char* elem(const detail::TensorRef& t, DType dt, int64_t b, int64_t i, int64_t h) {
  return static_cast<char*>(t.data) + t.offset(b, i, h) * int64_t(element_size(dt));
}

// x[0..rotary_dim) rotated at position pos (flash-attn's rule, interleaved or not), in fp32.
void rotate(const KVParams& p, int64_t pos, float* x) {
  const int64_t half = p.rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float c = detail::load_as_float(p.rotary_cos, pos * p.rotary_stride + i, p.rotary_dtype);
    const float s = detail::load_as_float(p.rotary_sin, pos * p.rotary_stride + i, p.rotary_dtype);
    const int64_t a = p.rotary_interleaved ? 2 * i : i, b = p.rotary_interleaved ? 2 * i + 1 : i + half;
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
}

void append(const KVParams& p, const TileKernels& tk) {
  const int64_t n = p.batch * p.seqlen_new * p.heads_kv, d = p.head_dim;
  const size_t row_bytes = size_t(d) * element_size(p.dtype);
#pragma omp parallel
  {
    std::vector<float> buf(size_t(pad_n(d)), 0.f);
#pragma omp for schedule(static)
    for (int64_t it = 0; it < n; ++it) {
      const int64_t h = it % p.heads_kv, j = (it / p.heads_kv) % p.seqlen_new, b = it / (p.heads_kv * p.seqlen_new);
      const int64_t t = p.seqlens[b] + j;
      int64_t cb = 0, row = 0;
      p.locate(b, t, &cb, &row);
      char* kdst = elem(p.k_cache, p.dtype, cb, row, h);
      const char* ksrc = elem(p.k_new, p.dtype, b, j, h);
      if (p.rotary_dim > 0) {
        tk.load(ksrc, p.dtype, int(d), 1.f, buf.data());
        rotate(p, t, buf.data());
        tk.store(buf.data(), int(d), 1.f, p.dtype, kdst);
      } else {
        std::memcpy(kdst, ksrc, row_bytes);
      }
      std::memcpy(elem(p.v_cache, p.dtype, cb, row, h), elem(p.v_new, p.dtype, b, j, h), row_bytes);
    }
  }
}

// The split count: the caller's, or enough items for two per thread (`items` work items per
// split), each split at least kMinSplitKeys keys of the longest sequence.
int choose_splits(const KVParams& p, int64_t items) {
  int64_t longest = 0;
  for (int64_t b = 0; b < p.batch; ++b) longest = std::max(longest, p.total_len(b));
  if (p.num_splits > 0) return int(std::max<int64_t>(1, std::min<int64_t>(p.num_splits, std::max<int64_t>(1, longest))));
  if (items <= 0) return 1;  // an empty batch: nothing to split
  const int64_t want = (2 * int64_t(omp_get_max_threads()) + items - 1) / items;
  return int(std::clamp<int64_t>(std::min<int64_t>(want, longest / kMinSplitKeys), 1, 128));
}

struct Scratch {
  std::vector<float> q, k, v, s, scale;
  explicit Scratch(int64_t d_pad)
      : q(size_t(kRowBlock * d_pad)), k(size_t(kChunk * d_pad), 0.f), v(k.size(), 0.f),
        s(size_t(kRowBlock * kChunk)), scale(kRowBlock) {}
};

// One work item: rows [r0, r0 + nr) of (b, hkv) over keys [k0, k1) into acc (nr × d_pad) and st.
void attend(const KVParams& p, const TileKernels& tk, int64_t b, int64_t hkv, int64_t r0, int nr, int64_t k0,
            int64_t k1, Scratch& w, float* acc, State* st) {
  const int64_t d = p.head_dim, d_pad = pad_n(d), G = p.group_size(), total = p.total_len(b);
  // The rows' queries (rotated, times scale) and visible key ranges.
  int64_t lo = k1, hi = k0;
  int64_t row_lo[kRowBlock], row_hi[kRowBlock];
  for (int r = 0; r < nr; ++r) {
    const int64_t i = (r0 + r) / G, h = hkv * G + (r0 + r) % G;
    float* q = &w.q[size_t(r * d_pad)];
    tk.load(elem(p.q, p.dtype, b, i, h), p.dtype, int(d), 1.f, q);
    if (p.rotary_dim > 0) rotate(p, p.query_position(b, i), q);
    for (int64_t c = 0; c < d; ++c) q[c] *= p.scale;
    const detail::KeyRange kr = p.visible(i, total);
    row_lo[r] = std::max(kr.lo, k0);
    row_hi[r] = std::min(kr.hi, k1);
    if (row_lo[r] < row_hi[r]) lo = std::min(lo, row_lo[r]), hi = std::max(hi, row_hi[r]);
    st[r] = State{};
  }
  std::fill(acc, acc + nr * d_pad, 0.f);
  const int64_t span = p.paged ? p.cache_rows : total;
  for (int64_t t = lo; t < hi;) {
    const int n = int(std::min<int64_t>({kChunk, hi - t, span - t % span}));  // within one page
    int64_t cb = 0, row = 0;
    p.locate(b, t, &cb, &row);
    const char* kb = elem(p.k_cache, p.dtype, cb, row, hkv);
    const char* vb = elem(p.v_cache, p.dtype, cb, row, hkv);
    const int64_t kstep = p.k_cache.row_stride * int64_t(element_size(p.dtype));
    const int64_t vstep = p.v_cache.row_stride * int64_t(element_size(p.dtype));
    for (int j = 0; j < n; ++j) {
      tk.load(kb + j * kstep, p.dtype, int(d), 1.f, &w.k[size_t(j * d_pad)]);
      tk.load(vb + j * vstep, p.dtype, int(d), 1.f, &w.v[size_t(j * d_pad)]);
    }
    tk.gemm_nt(nr, n, int(d), w.q.data(), d_pad, w.k.data(), d_pad, w.s.data(), kChunk);
    for (int r = 0; r < nr; ++r) {
      float* s = &w.s[size_t(r * kChunk)];
      if (p.softcap > 0)
        tk.softcap(s, n, p.softcap, kLog2e, nullptr);
      else
        for (int j = 0; j < n; ++j) s[j] *= kLog2e;
      const float ninf = -INFINITY;
      for (int j = 0; j < n; ++j)
        if (t + j < row_lo[r] || t + j >= row_hi[r]) s[j] = ninf;
      w.scale[size_t(r)] = st[r].begin_tile(tk.row_max(s, n));
      st[r].add_sum(tk.exp2_sum(s, n, st[r].exp_offset()));
    }
    tk.gemm(nr, int(d), n, w.s.data(), kChunk, 1, w.v.data(), d_pad, acc, d_pad, w.scale.data(), true);
    t += n;
  }
}

// ---- decode path --------------------------------------------------------------------------------

// A row between natural column order and the decode kernels' bf16 order (DecodeKernels::bf16_block,
// at most 2 × 16 lanes: within each whole block, the even columns first, then the odd ones).
void to_block_order(float* row, int64_t d, int block) {
  float tmp[32];
  for (int64_t c0 = 0; c0 + block <= d; c0 += block) {
    for (int i = 0; i < block; ++i) tmp[(i % 2) * (block / 2) + i / 2] = row[c0 + i];
    std::copy(tmp, tmp + block, row + c0);
  }
}
void from_block_order(float* row, int64_t d, int block) {
  float tmp[32];
  for (int64_t c0 = 0; c0 + block <= d; c0 += block) {
    for (int i = 0; i < block; ++i) tmp[i] = row[c0 + (i % 2) * (block / 2) + i / 2];
    std::copy(tmp, tmp + block, row + c0);
  }
}

// A row of accumulate_bf16's acc (DecodeKernels: bf16_dot_column order, d a multiple of 32) back
// into natural column order.
void from_dot_order(float* row, int64_t d) {
  float tmp[32];
  for (int64_t c0 = 0; c0 < d; c0 += 32) {
    for (int i = 0; i < 32; ++i) tmp[bf16_dot_column(i)] = row[c0 + i];
    std::copy(tmp, tmp + 32, row + c0);
  }
}

bool bf16_dot_accumulate(const KVParams& p, const DecodeKernels& dk) {
  return p.dtype == DType::bf16 && dk.accumulate_bf16 != nullptr && p.head_dim % 32 == 0;
}

struct DecodeScratch {
  std::vector<float> q;      // (Hkv, rows, d_pad): every head's query rows, rotated, times qmult
  std::vector<uint16_t> qb;  // (Hkv, rows, bf16_pad(d)): the same rotated rows in bf16, unscaled
  std::vector<float> s;      // (Hkv, rows, kDecodeChunk): scores, then probabilities, of one chunk
  std::vector<uint16_t> pb;  // (Hkv, rows, kDecodeChunk + 2): the chunk's probabilities in bf16
  std::vector<float> scale;  // (Hkv, rows): the online-softmax rescale of acc for that chunk
  DecodeScratch(int64_t heads_kv, int64_t rows, int64_t d)
      : q(size_t(heads_kv * rows * pad_n(d)), 0.f), qb(size_t(heads_kv * rows * bf16_pad(d)), 0),
        s(size_t(heads_kv * rows * kDecodeChunk)), pb(size_t(heads_kv * rows * (kDecodeChunk + 2)), 0),
        scale(size_t(heads_kv * rows)) {}
};

// One decode item: all KV heads of sequence b over keys [k0, k1) into acc (Hkv, rows, d_pad) and
// st (Hkv, rows), rows = group · Sq packed as in the general path.
void decode_item(const KVParams& p, const TileKernels& tk, const DecodeKernels& dk, int64_t b, int64_t k0, int64_t k1,
                 DecodeScratch& w, float* acc, State* st) {
  const int64_t d = p.head_dim, d_pad = pad_n(d), G = p.group_size(), total = p.total_len(b);
  const int nr = int(G * p.seqlen_q);
  const size_t es = element_size(p.dtype);
  // Scores come out of the kernel in log2 units (scale·log2 e folded into q), or scaled by `scale`
  // only when softcap needs them in natural units first.
  const float qmult = p.softcap > 0 ? p.scale : p.scale * kLog2e;
  const int bf16_block = p.dtype == DType::bf16 ? dk.bf16_block : 0;
  // A bf16 cache on a CPU with a bf16 dot product: the scores from the queries rounded to bf16 (the
  // dtype of the call; exact unless rotated, as the CUDA kernels round them) and times qmult after.
  const bool bf16_dot = p.dtype == DType::bf16 && dk.scores_bf16 != nullptr;
  const int64_t dq = bf16_pad(d);
  // and the values' sum by the same instruction over pairs of keys, the probabilities rounded to
  // bf16 (as the CUDA kernels round P), where d is a multiple of 32 (acc then in dot order).
  const bool bf16_acc = bf16_dot_accumulate(p, dk);
  constexpr int64_t ldpb = kDecodeChunk + 2;
  int64_t lo = k1, hi = k0;
  int64_t row_lo[kDecodeRows], row_hi[kDecodeRows];
  for (int r = 0; r < nr; ++r) {
    const int64_t i = r / G;
    const detail::KeyRange kr = p.visible(i, total);
    row_lo[r] = std::max(kr.lo, k0);
    row_hi[r] = std::min(kr.hi, k1);
    if (row_lo[r] < row_hi[r]) lo = std::min(lo, row_lo[r]), hi = std::max(hi, row_hi[r]);
    for (int64_t hkv = 0; hkv < p.heads_kv; ++hkv) {
      float* q = &w.q[size_t((hkv * nr + r) * d_pad)];
      tk.load(elem(p.q, p.dtype, b, i, hkv * G + r % G), p.dtype, int(d), 1.f, q);
      if (p.rotary_dim > 0) rotate(p, p.query_position(b, i), q);
      if (bf16_dot) {
        tk.store(q, int(d), 1.f, DType::bf16, &w.qb[size_t((hkv * nr + r) * dq)]);
        continue;
      }
      for (int64_t c = 0; c < d; ++c) q[c] *= qmult;
      if (bf16_block > 0) to_block_order(q, d, bf16_block);
    }
  }
  std::fill(acc, acc + p.heads_kv * nr * d_pad, 0.f);
  std::fill(st, st + p.heads_kv * nr, State{});
  if (lo >= hi) return;

  const int64_t k_head = p.k_cache.head_stride * int64_t(es), v_head = p.v_cache.head_stride * int64_t(es);
  const int64_t Hkv = p.heads_kv, s_head = nr * kDecodeChunk, q_head = nr * d_pad, row_bytes = d * int64_t(es);
  float* s = w.s.data();
  // Row addresses (head 0) of the chunk's keys and of the next chunk's, which accumulate requests.
  const char* k_rows[2][kDecodeChunk];
  const char* v_rows[2][kDecodeChunk];
  auto rows_of = [&](int64_t t, int n, int buf) {
    for (int j = 0; j < n; ++j) {
      int64_t cb = 0, row = 0;
      p.locate(b, t + j, &cb, &row);
      k_rows[buf][j] = elem(p.k_cache, p.dtype, cb, row, 0);
      v_rows[buf][j] = elem(p.v_cache, p.dtype, cb, row, 0);
    }
  };
  int cur = 0;
  rows_of(lo, int(std::min<int64_t>(kDecodeChunk, hi - lo)), cur);
  for (int64_t t = lo; t < hi; t += kDecodeChunk, cur ^= 1) {
    const int n = int(std::min<int64_t>(kDecodeChunk, hi - t));
    const int n_next = int(std::clamp<int64_t>(hi - t - n, 0, kDecodeChunk));
    const RowPrefetch v_also{v_rows[cur], v_head, row_bytes, int(Hkv), n};
    if (bf16_dot)
      dk.scores_bf16(int(Hkv), nr, n, int(d), w.qb.data(), nr * dq, dq, k_rows[cur], k_head, qmult, s, s_head,
                     kDecodeChunk, v_also);
    else
      dk.scores(int(Hkv), nr, n, int(d), w.q.data(), q_head, d_pad, k_rows[cur], k_head, p.dtype, s, s_head,
                kDecodeChunk, v_also);
    bool masked = false;  // some row sees only part of the chunk
    for (int r = 0; r < nr; ++r) masked |= row_lo[r] > t || row_hi[r] < t + n;
    for (int64_t hr = 0; hr < Hkv * nr; ++hr) {  // (head, row)
      const int r = int(hr % nr);
      float* sr = s + hr * kDecodeChunk;
      if (p.softcap > 0) tk.softcap(sr, n, p.softcap, kLog2e, nullptr);
      if (masked)
        for (int j = 0; j < n; ++j)
          if (t + j < row_lo[r] || t + j >= row_hi[r]) sr[j] = -INFINITY;
      w.scale[size_t(hr)] = st[hr].begin_tile(tk.row_max(sr, n));
      st[hr].add_sum(tk.exp2_sum(sr, n, st[hr].exp_offset()));
      if (bf16_acc) {
        uint16_t* pr = &w.pb[size_t(hr * ldpb)];
        tk.store(sr, n, 1.f, DType::bf16, pr);
        pr[n] = 0;  // the partner of an odd last key
      }
    }
    rows_of(t + n, n_next, cur ^ 1);
    const RowPrefetch k_also{k_rows[cur ^ 1], k_head, row_bytes, int(Hkv), n_next};
    if (bf16_acc)
      dk.accumulate_bf16(int(Hkv), nr, n, int(d), w.pb.data(), nr * ldpb, ldpb, v_rows[cur], v_head, w.scale.data(),
                         acc, q_head, d_pad, k_also);
    else
      dk.accumulate(int(Hkv), nr, n, int(d), s, s_head, kDecodeChunk, v_rows[cur], v_head, p.dtype, w.scale.data(),
                    acc, q_head, d_pad, k_also);
  }
}

// Returns the split count.
int decode(const KVParams& p, const TileKernels& tk) {
  const DecodeKernels& dk = decode_kernels();
  const int64_t d = p.head_dim, d_pad = pad_n(d), G = p.group_size(), Hkv = p.heads_kv;
  const int64_t nr = G * p.seqlen_q, per_item = Hkv * nr;  // rows of one item
  const int bf16_block = p.dtype == DType::bf16 ? dk.bf16_block : 0;
  const bool dot_order = bf16_dot_accumulate(p, dk);  // acc in bf16_dot_column order
  const int splits = choose_splits(p, p.batch);
  const int64_t items = p.batch * splits;  // (b, split), split fastest
  std::vector<float> acc(size_t(items * per_item * d_pad));
  std::vector<State> st(size_t(items * per_item));
#pragma omp parallel
  {
    DecodeScratch w(Hkv, nr, d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t b = it / splits, sp = it % splits, total = p.total_len(b);
      decode_item(p, tk, dk, b, total * sp / splits, total * (sp + 1) / splits, w,
                  &acc[size_t(it * per_item * d_pad)], &st[size_t(it * per_item)]);
    }
    // Merge the splits in order (the same result for the same split count), then write out.
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < p.batch * Hkv; ++bh) {
      const int64_t b = bh / Hkv, hkv = bh % Hkv;
      for (int64_t r = 0; r < nr; ++r) {
        const int64_t row = hkv * nr + r;  // within an item
        const int64_t it0 = b * splits;
        float* a0 = &acc[size_t((it0 * per_item + row) * d_pad)];
        State& s0 = st[size_t(it0 * per_item + row)];
        for (int sp = 1; sp < splits; ++sp) {
          const int64_t it = it0 + sp;
          s0.merge(st[size_t(it * per_item + row)], &acc[size_t((it * per_item + row) * d_pad)], int(d), a0);
        }
        const int64_t i = r / G, h = hkv * G + r % G;
        if (dot_order) from_dot_order(a0, d);
        else if (bf16_block > 0) from_block_order(a0, d, bf16_block);
        tk.store(a0, int(d), s0.inv_sum(), p.dtype, elem(p.out, p.dtype, b, i, h));
        if (p.lse.data) p.lse.data[p.lse.offset(b, h, i)] = s0.lse();
      }
    }
  }
  return splits;
}

}  // namespace

int kvcache_forward(const KVParams& p) {
  const TileKernels& tk = tile_kernels();
  if (p.seqlen_new > 0) append(p, tk);

  const int64_t rows = p.group_size() * p.seqlen_q;
  if (rows <= kDecodeRows) return decode(p, tk);
  const int64_t row_blocks = (rows + kRowBlock - 1) / kRowBlock;
  const int splits = choose_splits(p, p.batch * p.heads_kv * row_blocks);
  const int64_t d = p.head_dim, d_pad = pad_n(d);
  const int64_t groups = p.batch * p.heads_kv * row_blocks;  // (b, hkv, row block), split fastest
  std::vector<float> acc(size_t(groups * splits * kRowBlock * d_pad));
  std::vector<State> st(size_t(groups * splits * kRowBlock));
  auto item_rows = [&](int64_t g) { return int(std::min<int64_t>(kRowBlock, rows - (g % row_blocks) * kRowBlock)); };

#pragma omp parallel
  {
    Scratch w(d_pad);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < groups * splits; ++it) {
      const int64_t g = it / splits, s = it % splits;
      const int64_t rb = g % row_blocks, hkv = (g / row_blocks) % p.heads_kv, b = g / (row_blocks * p.heads_kv);
      const int64_t total = p.total_len(b);
      attend(p, tk, b, hkv, rb * kRowBlock, item_rows(g), total * s / splits, total * (s + 1) / splits, w,
             &acc[size_t(it * kRowBlock * d_pad)], &st[size_t(it * kRowBlock)]);
    }
    // Merge the splits in order (the same result for the same split count), then write out.
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t rb = g % row_blocks, hkv = (g / row_blocks) % p.heads_kv, b = g / (row_blocks * p.heads_kv);
      const int64_t G = p.group_size();
      for (int r = 0; r < item_rows(g); ++r) {
        float* a0 = &acc[size_t((g * splits * kRowBlock + r) * d_pad)];
        State& s0 = st[size_t(g * splits * kRowBlock + r)];
        for (int s = 1; s < splits; ++s) {
          const int64_t it = g * splits + s;
          s0.merge(st[size_t(it * kRowBlock + r)], &acc[size_t((it * kRowBlock + r) * d_pad)], int(d), a0);
        }
        const int64_t row = rb * kRowBlock + r, i = row / G, h = hkv * G + row % G;
        tk.store(a0, int(d), s0.inv_sum(), p.dtype, elem(p.out, p.dtype, b, i, h));
        if (p.lse.data) p.lse.data[p.lse.offset(b, h, i)] = s0.lse();
      }
    }
  }
  return splits;
}

}  // namespace flashattn::cpu
