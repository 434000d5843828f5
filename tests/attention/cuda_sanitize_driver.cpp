// A small case of every CUDA kernel, for compute-sanitizer (memcheck, racecheck, ...). No GoogleTest:
// run as `compute-sanitizer --tool racecheck cuda_sanitize_driver`. Exit code 0 = every call returned
// without Error and every output is finite.
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "flashattn/kvcache.hpp"

using namespace flashattn;

namespace {
void ck(cudaError_t e) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA: %s\n", cudaGetErrorString(e));
    std::exit(2);
  }
}

struct Buf {
  void* p = nullptr;
  size_t n = 0;
  explicit Buf(size_t bytes) : n(bytes) { ck(cudaMalloc(&p, bytes)); }
  ~Buf() { cudaFree(p); }
};

// Random 16-bit data: f16 or bf16 values in [-2, 2) built bitwise on the host.
void fill(Buf& b, DType t, std::mt19937& rng) {
  std::vector<uint16_t> h(b.n / 2);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (auto& x : h) {
    float f = u(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if (t == DType::bf16) {
      x = uint16_t(bits >> 16);
    } else {  // crude f16: exponent rebias, good enough for random test data
      const uint32_t sign = (bits >> 16) & 0x8000u;
      const int e = int((bits >> 23) & 0xff) - 127 + 15;
      x = e <= 0 ? uint16_t(sign) : uint16_t(sign | (uint32_t(e) << 10) | ((bits >> 13) & 0x3ffu));
    }
  }
  ck(cudaMemcpy(b.p, h.data(), b.n, cudaMemcpyHostToDevice));
}

bool finite16(const Buf& b, DType t) {
  std::vector<uint16_t> h(b.n / 2);
  ck(cudaMemcpy(h.data(), b.p, b.n, cudaMemcpyDeviceToHost));
  for (uint16_t x : h) {
    const bool inf_nan = t == DType::bf16 ? ((x & 0x7f80u) == 0x7f80u) : ((x & 0x7c00u) == 0x7c00u);
    if (inf_nan) return false;
  }
  return true;
}

// heads > 66: more query tiles than an H200 has SMs, so the Hopper forward's causal calls take the
// dynamic persistent schedule (a CTA runs several tiles).
// window_left >= 0: a sliding window (causal: the Hopper forward's left window); softcap > 0: tanh capping.
int run(DType t, int d, bool causal, Algorithm algo, bool varlen, bool deterministic = true, int64_t heads = 4,
        int window_left = -1, float softcap = 0.f, int window_right = -1) {
  std::mt19937 rng(d * 7 + causal);
  const int64_t B = varlen ? 1 : 2, Nq = varlen ? 150 : 70, Nk = varlen ? 190 : 90, H = heads, Hkv = heads / 2;
  const size_t e = 2;
  Buf q(B * Nq * H * d * e), k(B * Nk * Hkv * d * e), v(B * Nk * Hkv * d * e), o(B * Nq * H * d * e),
      lse(B * H * Nq * 4), dout(B * Nq * H * d * e), dq(B * Nq * H * d * e), dk(B * Nk * Hkv * d * e),
      dv(B * Nk * Hkv * d * e);
  fill(q, t, rng); fill(k, t, rng); fill(v, t, rng); fill(dout, t, rng);
  Options opt;
  opt.causal = causal;
  opt.algorithm = algo;
  opt.deterministic = deterministic;  // false: the Hopper backward kernel where it applies
  opt.window_left = window_left;
  opt.window_right = causal && window_left >= 0 ? 0 : window_right;
  opt.softcap = softcap;
  std::vector<int32_t> cq = {0, 60, 60, 150}, ckv = {0, 50, 120, 190};
  Buf cuq(16), cuk(16);
  if (varlen) {
    ck(cudaMemcpy(cuq.p, cq.data(), 16, cudaMemcpyHostToDevice));
    ck(cudaMemcpy(cuk.p, ckv.data(), 16, cudaMemcpyHostToDevice));
    opt.cu_seqlens_q = static_cast<int32_t*>(cuq.p);
    opt.cu_seqlens_k = static_cast<int32_t*>(cuk.p);
    opt.max_seqlen_q = 90;
    opt.max_seqlen_k = 70;
    opt.varlen_batch = 3;
  }
  const int64_t Bt = varlen ? 1 : B;
  auto T = [&](Buf& b, int64_t n, int64_t h) { return make_tensor(b.p, t, {Bt, n, h, d}, Device::cuda); };
  Tensor tl = make_tensor(lse.p, DType::f32, {Bt, H, Nq, 1}, Device::cuda);
  try {
    forward(T(q, Nq, H), T(k, Nk, Hkv), T(v, Nk, Hkv), T(o, Nq, H), &tl, opt);
    backward(T(q, Nq, H), T(k, Nk, Hkv), T(v, Nk, Hkv), T(o, Nq, H), T(dout, Nq, H), tl, T(dq, Nq, H),
             T(dk, Nk, Hkv), T(dv, Nk, Hkv), opt);
    ck(cudaDeviceSynchronize());
  } catch (const Error& err) {
    std::printf("ERROR %s\n", err.what());
    return 1;
  }
  const bool ok = finite16(o, t) && finite16(dq, t) && finite16(dk, t) && finite16(dv, t);
  std::printf("%s %s d%d causal=%d varlen=%d deterministic=%d window=(%d, %d) softcap=%g: %s\n", to_string(algo),
              to_string(t), d, causal, varlen, deterministic, window_left, opt.window_right, softcap,
              ok ? "ok" : "NON-FINITE");
  return ok ? 0 : 1;
}
// forward_kvcache: decode (Sq 1, GQA 4) or prefill (Sq 40), contiguous or paged (page 7, pages in
// reverse order), with new tokens and rotary tables, `splits` key splits (> 1: the combine kernel)
// over a cache of `cap` tokens; check_on_device: the lengths and pages checked by the validation
// kernel.
int run_kvcache(DType t, int d, int64_t Sq, int64_t page, int splits, bool causal, bool check_on_device = false,
                int64_t cap = 300) {
  std::mt19937 rng(d * 13 + int(Sq) + int(page));
  const int64_t B = 2, H = 8, Hkv = 2, S_new = Sq, rd = d / 2;
  const int64_t max_pages = page > 0 ? (cap + page - 1) / page : 0, pages = B * max_pages;
  const size_t e = 2;
  Buf q(B * Sq * H * d * e), o(B * Sq * H * d * e), lse(B * H * Sq * 4), kn(B * S_new * Hkv * d * e),
      vn(B * S_new * Hkv * d * e), kc((page > 0 ? pages * page : B * cap) * Hkv * d * e),
      vc((page > 0 ? pages * page : B * cap) * Hkv * d * e), cs((cap + Sq) * rd / 2 * 4), sn((cap + Sq) * rd / 2 * 4);
  for (Buf* b : {&q, &kn, &vn, &kc, &vc}) fill(*b, t, rng);
  std::vector<float> table_cs((cap + Sq) * rd / 2), table_sn(table_cs.size());
  for (size_t i = 0; i < table_cs.size(); ++i) table_cs[i] = std::cos(0.01f * float(i)), table_sn[i] = std::sin(0.01f * float(i));
  ck(cudaMemcpy(cs.p, table_cs.data(), cs.n, cudaMemcpyHostToDevice));
  ck(cudaMemcpy(sn.p, table_sn.data(), sn.n, cudaMemcpyHostToDevice));
  const std::vector<int32_t> lens = {int32_t(cap - S_new), 17};
  std::vector<int32_t> table(static_cast<size_t>(pages));
  for (int64_t i = 0; i < pages; ++i) table[size_t(i)] = int32_t(pages - 1 - i);
  Buf dl(B * 4), dt(std::max<int64_t>(pages, 1) * 4);
  ck(cudaMemcpy(dl.p, lens.data(), dl.n, cudaMemcpyHostToDevice));
  if (page > 0) ck(cudaMemcpy(dt.p, table.data(), size_t(pages) * 4, cudaMemcpyHostToDevice));
  KVCache cache;
  const std::array<int64_t, 4> cshape = page > 0 ? std::array<int64_t, 4>{pages, page, Hkv, d} : std::array<int64_t, 4>{B, cap, Hkv, d};
  cache.k = make_tensor(kc.p, t, cshape, Device::cuda);
  cache.v = make_tensor(vc.p, t, cshape, Device::cuda);
  cache.seqlens = static_cast<int32_t*>(dl.p);
  if (page > 0) cache.block_table = static_cast<int32_t*>(dt.p), cache.max_pages = max_pages;
  const Tensor tkn = make_tensor(kn.p, t, {B, S_new, Hkv, d}, Device::cuda), tvn = make_tensor(vn.p, t, {B, S_new, Hkv, d}, Device::cuda);
  const Tensor tcs = make_tensor(cs.p, DType::f32, {1, cap + Sq, 1, rd / 2}, Device::cuda);
  const Tensor tsn = make_tensor(sn.p, DType::f32, {1, cap + Sq, 1, rd / 2}, Device::cuda);
  KVCacheOptions opt;
  opt.causal = causal;
  opt.k_new = &tkn, opt.v_new = &tvn, opt.rotary_cos = &tcs, opt.rotary_sin = &tsn;
  opt.num_splits = splits;
  opt.check_on_device = check_on_device;  // the validation kernel
  const Tensor tl = make_tensor(lse.p, DType::f32, {B, H, Sq, 1}, Device::cuda);
  try {
    forward_kvcache(make_tensor(q.p, t, {B, Sq, H, d}, Device::cuda), cache, make_tensor(o.p, t, {B, Sq, H, d}, Device::cuda), &tl, opt);
    ck(cudaDeviceSynchronize());
  } catch (const Error& err) {
    std::printf("ERROR %s\n", err.what());
    return 1;
  }
  const bool ok = finite16(o, t) && finite16(kc, t);
  std::printf("kvcache %s d%d Sq=%lld page=%lld splits=%d causal=%d: %s\n", to_string(t), d, (long long)Sq, (long long)page,
              splits, causal, ok ? "ok" : "NON-FINITE");
  return ok ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  if (!cuda_available()) {
    std::printf("no CUDA device: nothing to check\n");
    return 0;
  }
  int fails = 0;
  // `cuda_sanitize_driver kvcache`: the KV-cache kernels only.
  const bool kv_only = argc > 1 && std::strcmp(argv[1], "kvcache") == 0;
  if (!kv_only) {
    for (int d : {32, 64, 96, 128, 192, 256}) fails += run(DType::f16, d, d % 64 == 0, Algorithm::flash, false);
    fails += run(DType::bf16, 128, true, Algorithm::flash, true);
    for (int d : {64, 256}) fails += run(DType::f16, d, d == 64, Algorithm::flash, true, false);  // Hopper varlen
    fails += run(DType::bf16, 192, false, Algorithm::flash, false);
    // Sliding-window causal and softcap (the Hopper forward's window and tanh paths), one tile shape each.
    for (int d : {64, 128, 192, 256}) fails += run(DType::bf16, d, true, Algorithm::flash, false, true, 4, 37, d == 128 ? 0.f : 30.f);
    fails += run(DType::f16, 128, false, Algorithm::flash, false, true, 4, -1, 20.f);
    // Windows without causal (the causal kernels with both bounds): left only, and left + right.
    fails += run(DType::bf16, 128, false, Algorithm::flash, false, true, 4, 20, 0.f);
    fails += run(DType::f16, 64, false, Algorithm::flash, false, true, 4, 9, 0.f, 5);
    // The backward with windows (deterministic = false): the Hopper d64/d128 kernel; d256 falls back.
    fails += run(DType::bf16, 128, false, Algorithm::flash, false, false, 4, 20, 0.f, 5);
    fails += run(DType::f16, 64, true, Algorithm::flash, false, false, 4, 30);
    fails += run(DType::bf16, 256, true, Algorithm::flash, false, false, 4, 37);
    for (int d : {64, 128, 256}) fails += run(DType::bf16, d, d != 64, Algorithm::flash, false, false);
    for (bool c : {false, true}) fails += run(DType::f16, 96, c, Algorithm::flash, false, false);  // Hopper bwd, d96 on d128
    for (bool c : {false, true}) fails += run(DType::bf16, 192, c, Algorithm::flash, false, false);  // d192 on d256
    fails += run(DType::bf16, 128, true, Algorithm::flash, false, false, 4, -1, 30.f);  // Hopper bwd softcap
    for (int d : {64, 128}) fails += run(DType::f16, d, d == 128, Algorithm::flash, true, false);  // Hopper bwd varlen
    for (int d : {64, 128}) fails += run(DType::bf16, d, true, Algorithm::flash, false, false, 160);
    fails += run(DType::bf16, 64, false, Algorithm::standard, false);
    fails += run(DType::f16, 64, true, Algorithm::standard, true);
  }
  // The KV-cache kernels: append, both attention shapes (decode, prefill), the combine.
  for (int d : {64, 128, 256}) fails += run_kvcache(DType::bf16, d, 1, d == 128 ? 7 : 0, d == 64 ? 1 : 3, false);
  fails += run_kvcache(DType::f16, 128, 40, 16, 2, true);
  fails += run_kvcache(DType::bf16, 64, 3, 0, 0, true, true);
  fails += run_kvcache(DType::bf16, 128, 1, 0, 20, false, false, 1300);  // the combine's groups of eight splits
  std::printf("sanitize driver: %d failures\n", fails);
  return fails ? 1 : 0;
}
