// forward_kvcache (include/flashattn/kvcache.hpp) against an fp64 oracle written here from the
// definition: the cache's first cache_seqlens[b] tokens, then the new tokens (keys rotated at their
// positions and stored in the cache's dtype), attended by the (rotated) queries with the mask
// aligned bottom-right to each sequence's total length. Checked: the output against the tolerance
// rule (plain same-precision attention over the same keys), the LSE, the cache after the call (the
// new slots hold the new tokens, every other byte as before), the library's own fp64 reference,
// split counts agreeing with each other, and bad input leaving out, lse and the cache untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/kv_params.hpp"
#include "cpu/decode_kernels.hpp"
#include "cpu/isa.hpp"
#include "cpu/reference.hpp"
#include "flashattn/kvcache.hpp"
#include "support/attention_case.hpp"
#include "support/test_util.hpp"

#if defined(FLASHATTN_TEST_CUDA)
#include <cuda_runtime.h>
#endif

namespace fa_test {
namespace {

struct KvCase {
  std::string name;
  int64_t B = 2, Sq = 1, H = 4, Hkv = 2, d = 32;
  std::vector<int32_t> lens{5, 17};  // cache_seqlens
  int64_t S_new = 0;
  int64_t page = 0;         // 0: contiguous
  int64_t capacity = 64;    // tokens per sequence (contiguous: S_max; paged: max_pages · page)
  bool causal = false;
  int wl = -1, wr = -1;
  float softcap = 0;
  int64_t rotary_dim = 0;
  bool interleaved = true;
  bool batch_idx = false;   // contiguous: sequences in permuted cache rows of a larger cache
  int splits = 0;
  DType dtype = DType::f32;
};

// Everything one call holds, on the host (the CPU backend).
struct KvRun {
  KvCase c;
  HostTensor q, kc, vc, kn, vn, out, lse, cos, sin;
  std::vector<int32_t> lens, table, bidx;
  int64_t max_pages = 0, num_pages = 0, cache_batch = 0;
  flashattn::KVCache cache;
  flashattn::KVCacheOptions o;
  Tensor tkn, tvn, tcos, tsin;

  explicit KvRun(const KvCase& c_) : c(c_), lens(c_.lens) {
    std::mt19937_64 rng(test_seed());
    q = make_tensor(c.dtype, {c.B, c.Sq, c.H, c.d});
    out = make_tensor(c.dtype, {c.B, c.Sq, c.H, c.d});
    lse = make_lse({c.B, c.H, c.Sq});
    if (c.page > 0) {
      max_pages = (c.capacity + c.page - 1) / c.page;
      num_pages = c.B * max_pages + 3;  // some pages belong to nobody
      table = shuffled_block_table(c.B * max_pages, num_pages, rng);
      kc = make_tensor(c.dtype, {num_pages, c.page, c.Hkv, c.d});
      vc = make_tensor(c.dtype, {num_pages, c.page, c.Hkv, c.d});
      cache.block_table = table.data();
      cache.max_pages = max_pages;
    } else {
      cache_batch = c.batch_idx ? c.B + 2 : c.B;
      kc = make_tensor(c.dtype, {cache_batch, c.capacity, c.Hkv, c.d}, Layout::heads_first);
      vc = make_tensor(c.dtype, {cache_batch, c.capacity, c.Hkv, c.d});
      if (c.batch_idx) {
        bidx.resize(size_t(cache_batch));
        std::iota(bidx.begin(), bidx.end(), 0);
        std::shuffle(bidx.begin(), bidx.end(), rng);
        bidx.resize(size_t(c.B));
        cache.batch_idx = bidx.data();
      }
    }
    for (HostTensor* t : {&q, &kc, &vc}) fill_uniform(*t, rng, 1.0);
    cache.k = kc.view();
    cache.v = vc.view();
    cache.seqlens = lens.data();
    o.causal = c.causal;
    o.window_left = c.wl;
    o.window_right = c.wr;
    o.softcap = c.softcap;
    o.num_splits = c.splits;
    if (c.S_new > 0) {
      kn = make_tensor(c.dtype, {c.B, c.S_new, c.Hkv, c.d});
      vn = make_tensor(c.dtype, {c.B, c.S_new, c.Hkv, c.d}, Layout::row_padded);
      fill_uniform(kn, rng, 1.0);
      fill_uniform(vn, rng, 1.0);
      tkn = kn.view(), tvn = vn.view();
      o.k_new = &tkn;
      o.v_new = &tvn;
    }
    if (c.rotary_dim > 0) {
      const int64_t S_rot = c.capacity + c.Sq;
      cos = make_tensor(DType::f32, {1, S_rot, 1, c.rotary_dim / 2});
      sin = make_tensor(DType::f32, {1, S_rot, 1, c.rotary_dim / 2});
      for (int64_t pos = 0; pos < S_rot; ++pos)
        for (int64_t i = 0; i < c.rotary_dim / 2; ++i) {
          const double a = double(pos) * std::pow(10000.0, -2.0 * double(i) / double(c.rotary_dim));
          cos.set(cos.index(0, pos, 0, i), std::cos(a));
          sin.set(sin.index(0, pos, 0, i), std::sin(a));
        }
      tcos = cos.view(), tsin = sin.view();
      o.rotary_cos = &tcos;
      o.rotary_sin = &tsin;
      o.rotary_interleaved = c.interleaved;
    }
  }

  // Token t of sequence b in the cache: (batch or page, row).
  std::pair<int64_t, int64_t> where(int64_t b, int64_t t) const {
    if (c.page > 0) return {table[size_t(b * max_pages + t / c.page)], t % c.page};
    return {c.batch_idx ? bidx[size_t(b)] : b, t};
  }
  // x rotated at position pos, in double.
  void rotate(std::vector<double>& x, int64_t off, int64_t pos) const {
    for (int64_t i = 0; i < c.rotary_dim / 2; ++i) {
      const double co = cos.get(cos.index(0, pos, 0, i)), si = sin.get(sin.index(0, pos, 0, i));
      const size_t a = size_t(off + (c.interleaved ? 2 * i : i));
      const size_t b = size_t(off + (c.interleaved ? 2 * i + 1 : i + c.rotary_dim / 2));
      const double x0 = x[a], x1 = x[b];
      x[a] = x0 * co - x1 * si;
      x[b] = x0 * si + x1 * co;
    }
  }
};

struct Expected {
  Problem prob;
  FwdResult exact, plain;
  std::vector<double> k_new_stored;  // (B, S_new, Hkv, d): what the new key slots must hold
  // The per-row LSE bound: the plain implementation's, plus, for rotated queries in a 16-bit
  // dtype, the rounding of the rotated query to it (the CUDA kernels round it, as a plain
  // same-precision implementation does), which moves each score by up to u·scale·‖q‖·‖k‖.
  std::vector<double> lse_tol;
};

// The oracle's view of the call, from the run's tensors before the call.
Expected expect(const KvRun& R) {
  const KvCase& c = R.c;
  int64_t nk = 1;
  for (int64_t b = 0; b < c.B; ++b) nk = std::max<int64_t>(nk, R.lens[size_t(b)] + c.S_new);
  Options o;
  o.causal = c.causal, o.window_left = c.wl, o.window_right = c.wr, o.softcap = c.softcap;
  Expected e;
  e.prob = make_problem(c.B, c.Sq, nk, c.H, c.Hkv, c.d, o, {}, {});
  std::vector<double> q(size_t(c.B * c.Sq * c.H * c.d)), k(size_t(c.B * nk * c.Hkv * c.d)), v(k.size());
  e.k_new_stored.assign(size_t(c.B * c.S_new * c.Hkv * c.d), 0);
  const bool by_token = c.causal || c.wl >= 0 || c.wr >= 0;
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t old = R.lens[size_t(b)];
    e.prob.seqs[size_t(b)].k_len = old + c.S_new;
    for (int64_t i = 0; i < c.Sq; ++i)
      for (int64_t h = 0; h < c.H; ++h) {
        for (int64_t x = 0; x < c.d; ++x) q[size_t(e.prob.qi(b, i, h, x))] = R.q.get(R.q.index(b, i, h, x));
        if (c.rotary_dim > 0) R.rotate(q, e.prob.qi(b, i, h), old + (by_token ? i : 0));
      }
    for (int64_t t = 0; t < old + c.S_new; ++t)
      for (int64_t h = 0; h < c.Hkv; ++h) {
        const int64_t base = e.prob.ki(b, t, h);
        if (t < old) {
          const auto [cb, row] = R.where(b, t);
          for (int64_t x = 0; x < c.d; ++x) {
            k[size_t(base + x)] = R.kc.get(R.kc.index(cb, row, h, x));
            v[size_t(base + x)] = R.vc.get(R.vc.index(cb, row, h, x));
          }
        } else {
          for (int64_t x = 0; x < c.d; ++x) {
            k[size_t(base + x)] = R.kn.get(R.kn.index(b, t - old, h, x));
            v[size_t(base + x)] = R.vn.get(R.vn.index(b, t - old, h, x));
          }
          if (c.rotary_dim > 0) R.rotate(k, base, t);
          for (int64_t x = 0; x < c.d; ++x) {
            k[size_t(base + x)] = round_to_dtype(k[size_t(base + x)], c.dtype);  // as stored
            e.k_new_stored[size_t(((b * c.S_new + t - old) * c.Hkv + h) * c.d + x)] = k[size_t(base + x)];
          }
        }
      }
  }
  e.exact = plain_forward(e.prob, q, k, v, c.dtype, true);
  e.plain = plain_forward(e.prob, q, k, v, c.dtype, false);
  e.lse_tol = e.plain.lse_tol;
  if (c.rotary_dim > 0 && c.dtype != DType::f32) {
    const double u = c.dtype == DType::f16 ? 0x1p-11 : 0x1p-8;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h) {
        double kmax = 0;
        for (int64_t t = 0; t < e.prob.seqs[size_t(b)].k_len; ++t) {
          double n2 = 0;
          for (int64_t x = 0; x < c.d; ++x) n2 += k[size_t(e.prob.ki(b, t, h / (c.H / c.Hkv), x))] * k[size_t(e.prob.ki(b, t, h / (c.H / c.Hkv), x))];
          kmax = std::max(kmax, std::sqrt(n2));
        }
        for (int64_t i = 0; i < c.Sq; ++i) {
          double qn2 = 0;
          for (int64_t x = 0; x < c.d; ++x) qn2 += q[size_t(e.prob.qi(b, i, h, x))] * q[size_t(e.prob.qi(b, i, h, x))];
          e.lse_tol[size_t(e.prob.li(b, h, i))] += u * e.prob.scale * std::sqrt(qn2) * kmax;
        }
      }
  }
  return e;
}

double ulp(double x, DType t) {
  const double u = t == DType::f32 ? 0x1p-23 : t == DType::f16 ? 0x1p-10 : 0x1p-7;
  return u * std::max(std::fabs(x), 0x1p-14);
}

// The call's arguments on a device: the run's tensors and int arrays placed there (for cpu the
// host views themselves). Built in place: the options point at the tensors held here.
struct Placed {
  Tensor q, out, lse, kn, vn, cos, sin;
  flashattn::KVCache cache;
  flashattn::KVCacheOptions o;
  Placed(const KvRun& R, Placement& pl) : cache(R.cache), o(R.o) {
    q = pl.put(R.q), out = pl.put(R.out), lse = pl.put(R.lse);
    cache.k = pl.put(R.kc), cache.v = pl.put(R.vc);
    cache.seqlens = pl.put_ints(R.lens);
    if (!R.table.empty()) cache.block_table = pl.put_ints(R.table);
    if (!R.bidx.empty()) cache.batch_idx = pl.put_ints(R.bidx);
    if (R.o.k_new) kn = pl.put(R.kn), vn = pl.put(R.vn), o.k_new = &kn, o.v_new = &vn;
    if (R.o.rotary_cos) cos = pl.put(R.cos), sin = pl.put(R.sin), o.rotary_cos = &cos, o.rotary_sin = &sin;
  }
  Placed(const Placed&) = delete;  // o points into this object
  Placed& operator=(const Placed&) = delete;
  void call() const { flashattn::forward_kvcache(q, cache, out, &lse, o); }
};

void run_case(const KvCase& c, Device device) {
  FA_SEED_TRACE();
  if (skip_without_device(device)) GTEST_SKIP() << "no usable CUDA device";
  KvRun R(c);
  const Expected e = expect(R);
  // The library's fp64 reference (what other tests may lean on) agrees with this oracle.
  if (device == Device::cpu) {
    const Tensor tq = R.q.view(), tout = R.out.view();
    const flashattn::detail::KVParams p = flashattn::detail::check_kvcache(tq, R.cache, tout, nullptr, R.o);
    std::vector<double> out(size_t(c.B * c.Sq * c.H * c.d)), lse(size_t(c.B * c.H * c.Sq));
    flashattn::cpu::reference_kvcache(p, out.data(), lse.data());
    EXPECT_TRUE(close_rel("reference out", out, e.exact.out, 1e-9));
  }
  const std::vector<uint64_t> kc0 = snapshot(R.kc), vc0 = snapshot(R.vc);
  poison(R.out);
  poison(R.lse);
  const std::vector<uint64_t> out0 = snapshot(R.out), lse0 = snapshot(R.lse);
  Placement pl(device);
  const Placed P(R, pl);
  P.call();
  EXPECT_STREQ(flashattn::last_kernel_path(), device == Device::cpu ? "cpu.kvcache" : "cuda.kvcache");
  for (HostTensor* t : {&R.out, &R.lse, &R.kc, &R.vc}) pl.fetch(*t);
  EXPECT_TRUE(written_exactly("out", R.out, out0));
  EXPECT_TRUE(written_exactly("lse", R.lse, lse0));
  EXPECT_TRUE(within_rule("kvcache out", R.out.dense(), e.exact.out, e.plain.out, c.dtype, e.plain.score_max));
  EXPECT_TRUE(lse_within(R.lse.dense(), e.exact.lse, e.lse_tol, 0.0));

  // The cache: the new slots hold the new tokens (keys as the oracle stored them, to the fp32
  // rotation's rounding and an ulp of the dtype), every other element exactly as before.
  std::vector<char> is_new_k(kc0.size() * 8 / dtype_size(c.dtype), 0), is_new_v(is_new_k.size(), 0);
  int bad_k = 0, bad_v = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t j = 0; j < c.S_new; ++j)
      for (int64_t h = 0; h < c.Hkv; ++h) {
        const auto [cb, row] = R.where(b, R.lens[size_t(b)] + j);
        for (int64_t x = 0; x < c.d; ++x) {
          const int64_t ik = R.kc.index(cb, row, h, x), iv = R.vc.index(cb, row, h, x);
          is_new_k[size_t(ik)] = 1;
          is_new_v[size_t(iv)] = 1;
          const double want = e.k_new_stored[size_t(((b * c.S_new + j) * c.Hkv + h) * c.d + x)];
          // fp32 rotation of inputs within [-1, 1]: two products and a sum, each rounded (<= 2^-22)
          const double rot_err = c.rotary_dim > 0 ? 0x1p-22 : 0.0;
          if (std::fabs(R.kc.get(ik) - want) > ulp(want, c.dtype) + rot_err) ++bad_k;
          if (R.vc.get(iv) != R.vn.get(R.vn.index(b, j, h, x))) ++bad_v;
        }
      }
  EXPECT_EQ(bad_k, 0) << "new key slots that do not hold the rotated new keys";
  EXPECT_EQ(bad_v, 0) << "new value slots that do not hold the new values";
  const std::vector<uint64_t> kc1 = snapshot(R.kc), vc1 = snapshot(R.vc);
  const size_t es = dtype_size(c.dtype);
  int changed = 0;
  for (size_t i = 0; i < is_new_k.size(); ++i) {
    auto byte_eq = [&](const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
      return std::memcmp(reinterpret_cast<const char*>(a.data()) + i * es, reinterpret_cast<const char*>(b.data()) + i * es, es) == 0;
    };
    if (!is_new_k[i] && !byte_eq(kc0, kc1)) ++changed;
    if (!is_new_v[i] && !byte_eq(vc0, vc1)) ++changed;
  }
  EXPECT_EQ(changed, 0) << "cache elements outside the new slots changed";
}

std::vector<KvCase> cases() {
  std::vector<KvCase> v;
  auto add = [&](KvCase c) { v.push_back(c); };
  KvCase base;
  base.name = "decode_contiguous";
  add(base);
  for (DType t : {DType::f16, DType::bf16}) {
    KvCase c = base;
    c.dtype = t;
    c.name = std::string("decode_") + dtype_name(t);
    add(c);
  }
  { KvCase c = base; c.name = "empty_caches"; c.lens = {0, 0}; add(c); }
  { KvCase c = base; c.name = "one_token"; c.lens = {1, 0}; c.S_new = 0; add(c); }
  { KvCase c = base; c.name = "full_capacity"; c.lens = {64, 63}; add(c); }
  { KvCase c = base; c.name = "append_to_full"; c.lens = {60, 0}; c.S_new = 4; add(c); }
  { KvCase c = base; c.name = "append_empty_cache"; c.lens = {0, 9}; c.S_new = 3; c.Sq = 3; c.causal = true; add(c); }
  { KvCase c = base; c.name = "mqa"; c.H = 8; c.Hkv = 1; add(c); }
  { KvCase c = base; c.name = "gqa8"; c.H = 8; c.Hkv = 1; c.Sq = 2; c.causal = true; add(c); }
  { KvCase c = base; c.name = "mha"; c.H = 2; c.Hkv = 2; add(c); }
  { KvCase c = base; c.name = "speculative_causal"; c.Sq = 5; c.S_new = 5; c.lens = {30, 3}; c.causal = true; add(c); }
  { KvCase c = base; c.name = "sq_more_than_keys"; c.Sq = 7; c.lens = {2, 0}; c.S_new = 1; c.causal = true; add(c); }
  { KvCase c = base; c.name = "window"; c.Sq = 4; c.S_new = 2; c.lens = {40, 20}; c.wl = 9; c.wr = 0; add(c); }
  { KvCase c = base; c.name = "window_right"; c.Sq = 3; c.lens = {40, 20}; c.wl = 4; c.wr = 2; add(c); }
  { KvCase c = base; c.name = "softcap"; c.softcap = 5.f; c.lens = {33, 12}; add(c); }
  { KvCase c = base; c.name = "batch_idx"; c.batch_idx = true; c.S_new = 2; add(c); }
  { KvCase c = base; c.name = "head_dim_17_odd"; c.d = 17; c.lens = {13, 3}; add(c); }
  for (int64_t page : {1, 7, 16, 256}) {
    KvCase c = base;
    c.page = page;
    c.capacity = page == 256 ? 512 : 70;
    c.lens = page == 256 ? std::vector<int32_t>{255, 300} : std::vector<int32_t>{14, 49};
    c.S_new = 3;
    c.Sq = 2;
    c.causal = true;
    c.name = "paged_" + std::to_string(page);
    add(c);
  }
  { KvCase c = base; c.name = "paged_page_boundaries"; c.page = 16; c.capacity = 64; c.lens = {16, 31}; c.S_new = 1; add(c); }
  { KvCase c = base; c.name = "paged_bf16_gqa4"; c.dtype = DType::bf16; c.page = 16; c.capacity = 160; c.H = 8; c.Hkv = 2;
    c.lens = {100, 37}; c.S_new = 1; add(c); }
  for (bool inter : {true, false}) {
    KvCase c = base;
    c.rotary_dim = 16;
    c.interleaved = inter;
    c.S_new = 2;
    c.name = std::string("rotary_") + (inter ? "interleaved" : "halves");
    add(c);
    c.causal = true;
    c.Sq = 3;
    c.S_new = 3;
    c.name += "_causal";
    add(c);
    c.page = 7;
    c.capacity = 70;
    c.dtype = DType::bf16;
    c.rotary_dim = 32;
    c.name += "_paged_bf16_full";
    add(c);
  }
  // A window without causal rotates q per token too (flash-attn's rule).
  { KvCase c = base; c.name = "rotary_window"; c.rotary_dim = 16; c.Sq = 3; c.S_new = 2; c.lens = {30, 12}; c.wl = 6; c.wr = 1; add(c); }
  for (int s : {1, 2, 7}) {
    KvCase c = base;
    c.lens = {700, 333};
    c.capacity = 800;
    c.splits = s;
    c.S_new = 1;
    c.name = "splits_" + std::to_string(s);
    add(c);
  }
  // One split over more pages than the CUDA kernel's shared-memory window of the block table
  // (256 entries): the window is refilled as the tiles pass its end.
  { KvCase c; c.name = "page_1_window_refills_bf16"; c.H = 8; c.Hkv = 2; c.d = 64; c.dtype = DType::bf16; c.page = 1;
    c.lens = {700, 300}; c.capacity = 768; c.S_new = 1; c.splits = 1; v.push_back(c); }
  { KvCase c; c.name = "page_3_prefill_window_refills_f16"; c.H = 8; c.Hkv = 2; c.d = 64; c.dtype = DType::f16; c.page = 3;
    c.Sq = 20; c.S_new = 20; c.causal = true; c.lens = {900, 5}; c.capacity = 960; c.splits = 1; v.push_back(c); }
  return v;
}

// The CUDA kernels take f16/bf16 and head dims that are multiples of 8: every CPU case in a
// 16-bit type (f32 cases as bf16), plus the shapes that reach the kernels' other paths — head dims
// 64/128/256 and one padded (80), the prefill CTA shape (more than 16 packed query rows), long
// caches split many ways, and tiles that straddle pages.
std::vector<KvCase> cuda_cases() {
  std::vector<KvCase> v;
  for (KvCase c : cases()) {
    if (c.d % 8 != 0) continue;
    if (c.dtype == DType::f32) c.dtype = DType::bf16;
    v.push_back(c);
  }
  KvCase base;
  base.H = 32, base.Hkv = 8, base.lens = {1000, 77}, base.capacity = 1024, base.dtype = DType::bf16;
  for (int64_t d : {64, 80, 128, 256}) {
    KvCase c = base;
    c.d = d;
    c.name = "decode_gqa4_d" + std::to_string(d);
    v.push_back(c);
    c.page = 16;
    c.S_new = 1;
    c.name += "_paged16_append";
    v.push_back(c);
  }
  { KvCase c = base; c.name = "decode_f16_auto_splits_long"; c.dtype = DType::f16; c.B = 1; c.lens = {4000}; c.capacity = 4096; c.d = 128; v.push_back(c); }
  { KvCase c = base; c.name = "decode_splits_3_page_7"; c.splits = 3; c.page = 7; c.capacity = 1029; c.d = 128; v.push_back(c); }
  { KvCase c = base; c.name = "prefill_chunk_causal"; c.H = 8; c.Hkv = 2; c.Sq = 40; c.S_new = 40; c.lens = {300, 0}; c.causal = true; c.d = 128; v.push_back(c); }
  { KvCase c = base; c.name = "prefill_chunk_paged_window_d256"; c.H = 4; c.Hkv = 1; c.Sq = 33; c.S_new = 33; c.lens = {200, 31}; c.page = 16;
    c.capacity = 256; c.wl = 50; c.wr = 0; c.d = 256; v.push_back(c); }
  { KvCase c = base; c.name = "prefill_rotary_softcap"; c.H = 16; c.Hkv = 4; c.Sq = 5; c.S_new = 5; c.lens = {500, 9}; c.causal = true;
    c.rotary_dim = 64; c.interleaved = false; c.softcap = 30.f; c.d = 128; v.push_back(c); }
  { KvCase c = base; c.name = "speculative_gqa8_splits_7"; c.H = 8; c.Hkv = 1; c.Sq = 2; c.S_new = 2; c.causal = true; c.splits = 7; c.d = 64; v.push_back(c); }
  return v;
}

class KvCache : public ::testing::TestWithParam<KvCase> {};
TEST_P(KvCache, MatchesOracleAndWritesOnlyTheNewSlots) { run_case(GetParam(), Device::cpu); }
INSTANTIATE_TEST_SUITE_P(Cpu, KvCache, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

class KvCacheCuda : public ::testing::TestWithParam<KvCase> {};
TEST_P(KvCacheCuda, MatchesOracleAndWritesOnlyTheNewSlots) { run_case(GetParam(), Device::cuda); }
INSTANTIATE_TEST_SUITE_P(Cuda, KvCacheCuda, ::testing::ValuesIn(cuda_cases()),
                         [](const auto& info) { return info.param.name; });

// Split counts agree with each other to the rule's bound (the merge is exact up to rounding), up
// to one split per 64-key tile (32 here; the CUDA combine folds more than eight splits per warp in
// groups).
void splits_agree(Device device) {
  FA_SEED_TRACE();
  if (skip_without_device(device)) GTEST_SKIP() << "no usable CUDA device";
  KvCase c;
  c.lens = {2000, 517};
  c.capacity = 2048;
  c.H = 8;
  c.Hkv = 2;
  c.d = 64;
  c.dtype = DType::bf16;
  std::vector<std::vector<double>> outs;
  KvRun R(c);
  const Expected e = expect(R);
  for (int s : {1, 2, 7, 0, 16, 17, 32}) {
    R.o.num_splits = s;
    poison(R.out);
    Placement pl(device);
    const Placed P(R, pl);
    P.call();
    pl.fetch(R.out);
    outs.push_back(R.out.dense());
  }
  const double bound = rule_bound(e.exact.out, e.plain.out, c.dtype, e.plain.score_max);
  for (size_t i = 1; i < outs.size(); ++i) {
    double worst = 0;
    for (size_t j = 0; j < outs[0].size(); ++j) worst = std::max(worst, std::fabs(outs[i][j] - outs[0][j]));
    EXPECT_LE(worst, bound) << "split setting " << i << " against one split";
  }
}
TEST(KvCacheSplits, AgreeAcrossSplitCounts) { splits_agree(Device::cpu); }
TEST(KvCacheSplitsCuda, AgreeAcrossSplitCounts) { splits_agree(Device::cuda); }

// The CPU decode path (at most 16 packed query rows, group · Sq, per KV head: decode kernels
// reading K and V in place) and the general one on either side of that threshold; head dims that
// are not a multiple of the vector width (d 59, 72, 100: partial vectors and single-vector slices);
// f16; chunks that straddle pages and splits of a long cache.
std::vector<KvCase> decode_path_cases() {
  std::vector<KvCase> v;
  KvCase base;
  base.lens = {90, 41};
  base.capacity = 128;
  { KvCase c = base; c.name = "rows_16_mqa"; c.H = 16; c.Hkv = 1; v.push_back(c); }
  { KvCase c = base; c.name = "rows_17_mqa_general"; c.H = 17; c.Hkv = 1; v.push_back(c); }
  { KvCase c = base; c.name = "rows_16_gqa4_causal"; c.H = 8; c.Hkv = 2; c.Sq = 4; c.S_new = 4; c.causal = true; v.push_back(c); }
  { KvCase c = base; c.name = "rows_20_gqa4_causal_general"; c.H = 8; c.Hkv = 2; c.Sq = 5; c.S_new = 5; c.causal = true; v.push_back(c); }
  { KvCase c = base; c.name = "d59_bf16_gqa4"; c.d = 59; c.dtype = DType::bf16; c.H = 8; c.Hkv = 2; c.lens = {77, 120}; v.push_back(c); }
  { KvCase c = base; c.name = "d72_f16_paged_16"; c.d = 72; c.dtype = DType::f16; c.page = 16; c.H = 8; c.Hkv = 2; c.lens = {100, 37}; c.S_new = 1; v.push_back(c); }
  { KvCase c = base; c.name = "d100_f16_window_softcap"; c.d = 100; c.dtype = DType::f16; c.Sq = 3; c.S_new = 3; c.wl = 20; c.wr = 0; c.softcap = 8.f;
    c.lens = {90, 12}; v.push_back(c); }
  { KvCase c = base; c.name = "gqa8_rotary_halves_d64"; c.d = 64; c.H = 16; c.Hkv = 2; c.Sq = 2; c.S_new = 2; c.causal = true; c.rotary_dim = 32;
    c.interleaved = false; v.push_back(c); }
  { KvCase c = base; c.name = "long_paged_16_splits_3_bf16"; c.B = 1; c.H = 32; c.Hkv = 8; c.d = 128; c.dtype = DType::bf16; c.page = 16;
    c.lens = {1500}; c.capacity = 1600; c.S_new = 1; c.splits = 3; v.push_back(c); }
  { KvCase c = base; c.name = "long_paged_7_auto_splits_f32"; c.H = 8; c.Hkv = 2; c.d = 40; c.page = 7; c.lens = {1100, 650}; c.capacity = 1120;
    v.push_back(c); }
  return v;
}

class KvCacheDecode : public ::testing::TestWithParam<KvCase> {};
TEST_P(KvCacheDecode, MatchesOracleAndWritesOnlyTheNewSlots) { const KvCase& c = GetParam(); run_case(c, Device::cpu); }
INSTANTIATE_TEST_SUITE_P(Cpu, KvCacheDecode, ::testing::ValuesIn(decode_path_cases()),
                         [](const auto& info) { return info.param.name; });

// The decode kernels of every instruction set this CPU runs (the scalar table always), each
// against the oracle on the cases that take the decode path; on a CPU with AVX512_BF16 the
// AVX-512 table both with its bf16 dot-product kernels (its default there) and without.
TEST(KvCacheDecodeIsa, EveryInstructionSetMatchesTheOracle) {
  std::vector<KvCase> all = cases();
  for (const KvCase& c : decode_path_cases()) all.push_back(c);
  auto run_all = [&](const std::string& what) {
    for (const KvCase& c : all) {
      if (c.Sq * (c.H / c.Hkv) > 16) continue;
      SCOPED_TRACE(what + " " + c.name);
      run_case(c, Device::cpu);
    }
  };
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    const flashattn::cpu::TileKernels* table = flashattn::cpu::tile_kernels_for(isa);
    if (!table) continue;
    flashattn::cpu::override_tile_kernels(table);
    run_all(std::string(isa) + " (" + (flashattn::cpu::decode_kernels().scores_bf16 ? "bf16 dot products" : "fp32") + ")");
#if defined(__x86_64__) || defined(_M_X64)
    if (!std::strcmp(isa, "avx512") && flashattn::cpu::decode_kernels().scores_bf16) {
      flashattn::cpu::override_decode_kernels(&flashattn::cpu::kDecodeKernelsAvx512);
      run_all("avx512 (fp32)");
      flashattn::cpu::override_decode_kernels(nullptr);
    }
#endif
    flashattn::cpu::override_tile_kernels(nullptr);
  }
}

// A given split count gives the same bits on every call, whichever thread runs which split.
TEST(KvCacheDecodeRepeat, SameBitsForTheSameSplitCount) {
  FA_SEED_TRACE();
  KvCase c;
  c.B = 1, c.H = 32, c.Hkv = 8, c.d = 128, c.lens = {3000}, c.capacity = 3072, c.dtype = DType::bf16;
  for (int s : {1, 3, 0}) {
    c.splits = s;
    KvRun R(c);
    const Tensor tq = R.q.view(), tout = R.out.view(), tlse = R.lse.view();
    poison(R.out);  // the whole buffer, gaps between rows included
    flashattn::forward_kvcache(tq, R.cache, tout, &tlse, R.o);
    const std::vector<uint64_t> out0 = snapshot(R.out), lse0 = snapshot(R.lse);
    for (int rep = 0; rep < 3; ++rep) {
      poison(R.out);
      flashattn::forward_kvcache(tq, R.cache, tout, &tlse, R.o);
      EXPECT_EQ(snapshot(R.out), out0) << "splits " << s << ", call " << rep + 2;
      EXPECT_EQ(snapshot(R.lse), lse0) << "splits " << s << ", call " << rep + 2;
    }
  }
}

// Bad input: an Error naming the argument, and neither out, lse nor the cache written.
struct BadCase {
  std::string name, arg;
  std::function<void(KvRun&)> mutate;
};

TEST(KvCacheChecks, BadInputNamesTheArgumentAndWritesNothing) {
  FA_SEED_TRACE();
  KvCase c;
  c.S_new = 2;
  c.page = 8;
  c.capacity = 64;
  std::vector<HostTensor> keep;
  const std::vector<BadCase> bad = {
      {"negative_length", "cache_seqlens", [](KvRun& r) { r.lens[1] = -1; }},
      {"past_capacity", "cache_seqlens", [](KvRun& r) { r.lens[0] = 63; }},
      {"page_out_of_range", "block_table", [](KvRun& r) { r.table[0] = int32_t(r.num_pages); }},
      {"negative_page", "block_table", [](KvRun& r) { r.table[size_t(r.max_pages)] = -1; }},
      {"short_table", "block_table", [](KvRun& r) { r.cache.max_pages = 0; }},
      {"shared_append_page", "block_table", [](KvRun& r) { r.table[size_t(r.max_pages)] = r.table[0]; r.lens[1] = 0; r.lens[0] = 0; }},
      {"heads_mismatch", "k_cache", [&keep](KvRun& r) {
         keep.push_back(make_tensor(r.c.dtype, {r.num_pages, r.c.page, 3, r.c.d}));
         r.cache.k = keep.back().view(); }},
      {"dim_mismatch", "k_cache", [&keep](KvRun& r) {
         keep.push_back(make_tensor(r.c.dtype, {r.num_pages, r.c.page, r.c.Hkv, r.c.d + 1}));
         r.cache.k = keep.back().view(); }},
      {"v_shape", "v_cache", [&keep](KvRun& r) {
         keep.push_back(make_tensor(r.c.dtype, {r.num_pages, r.c.page + 1, r.c.Hkv, r.c.d}));
         r.cache.v = keep.back().view(); }},
      {"cache_dtype", "k_cache", [&keep](KvRun& r) {
         keep.push_back(make_tensor(DType::f16, {r.num_pages, r.c.page, r.c.Hkv, r.c.d}));
         r.cache.k = keep.back().view(); }},
      {"new_dtype", "k_new", [&keep](KvRun& r) {
         keep.push_back(make_tensor(DType::bf16, {r.c.B, r.c.S_new, r.c.Hkv, r.c.d}));
         r.tkn = keep.back().view(); }},
      {"new_shape", "k_new", [&keep](KvRun& r) {
         keep.push_back(make_tensor(r.c.dtype, {r.c.B, r.c.S_new, r.c.Hkv + 1, r.c.d}));
         r.tkn = keep.back().view(); }},
      {"v_new_missing", "v_new", [](KvRun& r) { r.o.v_new = nullptr; }},
      {"no_seqlens", "cache_seqlens", [](KvRun& r) { r.cache.seqlens = nullptr; }},
      {"batch_idx_paged", "cache_batch_idx", [](KvRun& r) { static const int32_t idx[2] = {0, 1}; r.cache.batch_idx = idx; }},
      {"splits", "num_splits", [](KvRun& r) { r.o.num_splits = -1; }},
      {"window", "window_right", [](KvRun& r) { r.o.causal = true; r.o.window_right = 2; }},
      {"rotary_short", "rotary_cos", [&keep](KvRun& r) {
         keep.push_back(make_tensor(DType::f32, {1, 4, 1, 4}));
         keep.push_back(make_tensor(DType::f32, {1, 4, 1, 4}));
         r.tcos = keep[keep.size() - 2].view(); r.tsin = keep.back().view();
         r.o.rotary_cos = &r.tcos; r.o.rotary_sin = &r.tsin; }},
      {"rotary_too_wide", "rotary_cos", [&keep](KvRun& r) {
         keep.push_back(make_tensor(DType::f32, {1, 128, 1, r.c.d}));
         keep.push_back(make_tensor(DType::f32, {1, 128, 1, r.c.d}));
         r.tcos = keep[keep.size() - 2].view(); r.tsin = keep.back().view();
         r.o.rotary_cos = &r.tcos; r.o.rotary_sin = &r.tsin; }},
      {"sin_missing", "rotary_sin", [&keep](KvRun& r) {
         keep.push_back(make_tensor(DType::f32, {1, 128, 1, 4}));
         r.tcos = keep.back().view(); r.o.rotary_cos = &r.tcos; r.o.rotary_sin = nullptr; }},
      {"out_overlaps_cache", "out", [](KvRun& r) {
         r.out.storage = r.kc.storage; r.out.offset = 0; r.out.strides = {r.c.Sq * r.c.H * r.c.d, r.c.H * r.c.d, r.c.d, 1}; }},
  };
  for (const BadCase& bc : bad) {
    SCOPED_TRACE(bc.name);
    KvRun R(c);
    fill_sentinel(R.out, 0x5a);
    fill_sentinel(R.lse, 0x5a);
    bc.mutate(R);
    const std::vector<uint64_t> s_out = snapshot(R.out), s_lse = snapshot(R.lse), s_k = snapshot(R.kc), s_v = snapshot(R.vc);
    const Tensor tq = R.q.view(), tout = R.out.view(), tlse = R.lse.view();
    try {
      flashattn::forward_kvcache(tq, R.cache, tout, &tlse, R.o);
      ADD_FAILURE() << bc.name << ": no Error";
    } catch (const flashattn::Error& err) {
      const std::string m = err.what();
      EXPECT_EQ(m.rfind("flashattn::forward_kvcache: " + bc.arg + ":", 0), 0u) << m;
    }
    EXPECT_EQ(snapshot(R.out), s_out) << "out written";
    EXPECT_EQ(snapshot(R.lse), s_lse) << "lse written";
    EXPECT_EQ(snapshot(R.kc), s_k) << "k_cache written";
    EXPECT_EQ(snapshot(R.vc), s_v) << "v_cache written";
  }
}

// A batch of 0 sequences over a paged cache whose block-table rows are 5 entries apart (2 used):
// nothing to read or write, so the call returns without touching the table (whose extent for 0
// rows, (B − 1)·stride + max_pages, would be negative).
TEST(KvCacheChecks, EmptyBatchWithARowStrideReadsNoTable) {
  HostTensor q = make_tensor(DType::f32, {0, 1, 2, 8}), out = make_tensor(DType::f32, {0, 1, 2, 8});
  HostTensor kc = make_tensor(DType::f32, {4, 8, 1, 8}), vc = make_tensor(DType::f32, {4, 8, 1, 8});
  const int32_t table[1] = {0}, lens[1] = {0};
  flashattn::KVCache cache;
  cache.k = kc.view();
  cache.v = vc.view();
  cache.seqlens = lens;
  cache.block_table = table;
  cache.max_pages = 2;
  cache.block_table_stride = 5;
  EXPECT_NO_THROW(flashattn::forward_kvcache(q.view(), cache, out.view(), nullptr));
}

#if defined(FLASHATTN_TEST_CUDA)
// P's call captured into a CUDA graph on a stream of its own (global capture mode, what
// torch.cuda.graph uses), instantiated, ready to launch.
struct CapturedCall {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool ok = false;
  explicit CapturedCall(Placed& P) {
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return;
    P.o.stream = stream;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess) return;
    P.call();
    ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  }
  bool replay() const { return cudaGraphLaunch(exec, stream) == cudaSuccess && cudaStreamSynchronize(stream) == cudaSuccess; }
  ~CapturedCall() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (stream) cudaStreamDestroy(stream);
  }
  CapturedCall(const CapturedCall&) = delete;
  CapturedCall& operator=(const CapturedCall&) = delete;
};

// With the lengths, pages and cache rows in device memory an out-of-range value is still rejected
// before anything is written: read on the host by default (an Error naming the argument), checked
// on the device with check_on_device or while the stream is being captured into a graph (the call,
// or the replay, then writes nothing). On the device every path of the check: the append kernel
// or the attend kernel checking the entries itself (at most 1024 of them; with one split and with
// several, the combine reading the flag), and the validation kernel ahead of them (more than 1024
// entries: a grid over a zeroed flag), with and without an append.
TEST(KvCacheCudaChecks, BadValuesWriteNothingOnEveryCheckPath) {
  FA_SEED_TRACE();
  if (skip_without_device(Device::cuda)) GTEST_SKIP() << "no usable CUDA device";
  struct Path {
    const char* name;
    int64_t S_new, page, capacity;
    int splits;
  };
  const Path paths[] = {
      {"append kernel checks (16 entries)", 2, 8, 64, 0},
      {"attend kernel checks, one split (16 entries)", 0, 8, 64, 1},
      {"attend kernel checks, three splits and the combine (16 entries)", 0, 8, 64, 3},
      {"attend kernel checks, 8 entries a thread (1000 entries)", 0, 1, 500, 0},
      {"validation kernel (2200 entries)", 0, 1, 1100, 0},
      {"validation kernel and append (8400 entries)", 2, 1, 4200, 0},
  };
  const std::vector<BadCase> bad = {
      {"negative_length", "cache_seqlens", [](KvRun& r) { r.lens[1] = -1; }},
      {"past_capacity", "cache_seqlens", [](KvRun& r) { r.lens[0] = int32_t(r.c.capacity - r.c.S_new + 1); }},
      {"page_out_of_range", "block_table", [](KvRun& r) { r.table[0] = int32_t(r.num_pages); }},
      {"negative_page", "block_table", [](KvRun& r) { r.table[size_t(r.max_pages)] = -1; }},
  };
  enum Mode { host, on_device, capture };
  for (const Path& path : paths) {
    KvCase c;
    c.S_new = path.S_new, c.page = path.page, c.capacity = path.capacity, c.splits = path.splits;
    c.d = 64, c.dtype = DType::bf16;
    for (Mode mode : {host, on_device, capture})
      for (const BadCase& bc : bad) {
        SCOPED_TRACE(std::string(path.name) + ": " + bc.name +
                     (mode == host ? "" : mode == on_device ? " (check_on_device)" : " (graph capture)"));
        KvRun R(c);
        fill_sentinel(R.out, 0x5a);
        fill_sentinel(R.lse, 0x5a);
        bc.mutate(R);
        const std::vector<uint64_t> s_out = snapshot(R.out), s_lse = snapshot(R.lse), s_k = snapshot(R.kc), s_v = snapshot(R.vc);
        Placement pl(Device::cuda);
        Placed P(R, pl);
        if (mode == on_device) {
          P.o.check_on_device = true;
          P.call();  // no Error: the host never sees the values
        } else if (mode == host) {
          try {
            P.call();
            ADD_FAILURE() << bc.name << ": no Error";
          } catch (const flashattn::Error& err) {
            const std::string m = err.what();
            EXPECT_EQ(m.rfind("flashattn::forward_kvcache: " + bc.arg + ":", 0), 0u) << m;
          }
        } else {
          const CapturedCall g(P);  // shapes are valid: nothing to reject on the host
          ASSERT_TRUE(g.ok) << "capture failed";
          ASSERT_TRUE(g.replay()) << "replay failed";
        }
        for (HostTensor* t : {&R.out, &R.lse, &R.kc, &R.vc}) pl.fetch(*t);
        EXPECT_EQ(snapshot(R.out), s_out) << "out written";
        EXPECT_EQ(snapshot(R.lse), s_lse) << "lse written";
        EXPECT_EQ(snapshot(R.kc), s_k) << "k_cache written";
        EXPECT_EQ(snapshot(R.vc), s_v) << "v_cache written";
      }
    // The same call with valid values checked on the device runs and agrees with the reference.
    SCOPED_TRACE(std::string(path.name) + ": valid values (check_on_device)");
    KvRun R(c);
    poison(R.out);
    Placement pl(Device::cuda);
    Placed P(R, pl);
    P.o.check_on_device = true;
    P.call();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    pl.fetch(R.out);
    const Expected e = expect(R);
    EXPECT_TRUE(within_rule("out", R.out.dense(), e.exact.out, e.plain.out, c.dtype, e.plain.score_max));
  }
}

// A decode step captured once replays with new lengths (what serving loops do): each replay
// equals, bit for bit, a direct call with the lengths the device holds at that moment.
TEST(KvCacheCudaGraph, ReplayWithNewLengthsEqualsDirectCalls) {
  FA_SEED_TRACE();
  if (skip_without_device(Device::cuda)) GTEST_SKIP() << "no usable CUDA device";
  KvCase c;
  c.H = 32, c.Hkv = 8, c.d = 128, c.B = 2, c.lens = {900, 33}, c.capacity = 1024, c.page = 16, c.dtype = DType::bf16;
  KvRun R(c);
  Placement pl(Device::cuda);
  Placed P(R, pl);
  const CapturedCall g(P);  // the first call of the process: captured, never run eagerly before
  ASSERT_TRUE(g.ok) << "capture failed";
  for (const std::vector<int32_t>& lens : {std::vector<int32_t>{900, 33}, {1000, 1}, {0, 517}}) {
    SCOPED_TRACE("lengths " + std::to_string(lens[0]) + ", " + std::to_string(lens[1]));
    ASSERT_EQ(cudaMemcpy(const_cast<int32_t*>(P.cache.seqlens), lens.data(), lens.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    poison(R.out);
    pl.refresh(R.out);
    ASSERT_TRUE(g.replay()) << "replay failed";
    pl.fetch(R.out);
    const std::vector<double> from_graph = R.out.dense();
    poison(R.out);
    pl.refresh(R.out);
    P.call();
    ASSERT_EQ(cudaStreamSynchronize(g.stream), cudaSuccess);
    pl.fetch(R.out);
    EXPECT_EQ(R.out.dense(), from_graph) << "graph replay differs from a direct call";
    R.lens = lens;
    const Expected e = expect(R);
    EXPECT_TRUE(within_rule("replayed out", from_graph, e.exact.out, e.plain.out, c.dtype, e.plain.score_max));
  }
}
#endif

}  // namespace
}  // namespace fa_test
