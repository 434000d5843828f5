// Development driver for the CPU flash kernels: checks them against a naive float64 attention of
// its own (independent of src/cpu/reference.cpp) on edge shapes, and times them on the bar shapes.
//
//   cpu_flash check                      # edge-shape suite, forward + backward
//   cpu_flash bench [d] [causal] [N] [H] [reps] [fwd|bwd|both]   # best and median of reps
//   cpu_flash det                        # hash of all outputs: compare across thread counts
// FLASHATTN_CPU_ISA=scalar|avx2|avx512 picks the tile kernels (the avx2/avx512 tables do their tile
// products with OpenBLAS, the scalar one with plain loops); OMP_NUM_THREADS the threads.
// FLOPs: forward 4·B·H·Nq·Nk·d (half for causal), backward 2.5× forward.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/dtype.hpp"
#include "cpu/isa.hpp"

// From the OpenBLAS the library links (src/cpu/gemm_blas.cpp): which build is loaded.
extern "C" char* openblas_get_config(void);
extern "C" int openblas_get_parallel(void);  // 0 sequential, 1 pthreads, 2 OpenMP

using namespace flashattn;
using detail::Params;

namespace {

struct Config {
  std::string name;
  int64_t B = 1, H = 1, Hkv = 1, Nq = 1, Nk = 1, d = 64;
  DType dtype = DType::f32;
  bool causal = false;
  int wl = -1, wr = -1;
  float softcap = 0;
  std::vector<int> seq_q, seq_k;  // varlen when not empty
  int64_t pad = 0;                // extra elements per head (non-dense strides)
};

struct Buf {  // one (B, N, H, d) tensor with padded head stride
  std::vector<uint16_t> h;
  std::vector<float> f;
  DType t;
  int64_t B, N, H, d, hs;
  Buf(DType t_, int64_t B_, int64_t N_, int64_t H_, int64_t d_, int64_t pad)
      : t(t_), B(B_), N(N_), H(H_), d(d_), hs(d_ + pad) {
    const size_t n = size_t(B * N * H * hs);
    if (t == DType::f32) f.assign(n, std::nanf("")); else h.assign(n, 0x7e00);
  }
  int64_t idx(int64_t b, int64_t i, int64_t hh, int64_t c) const { return ((b * N + i) * H + hh) * hs + c; }
  void* data() { return t == DType::f32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
  double get(int64_t b, int64_t i, int64_t hh, int64_t c) const {
    const int64_t k = idx(b, i, hh, c);
    return t == DType::f32 ? f[size_t(k)] : detail::load_as_float(h.data(), k, t);
  }
  void set(int64_t b, int64_t i, int64_t hh, int64_t c, float x) {
    detail::store_from_float(data(), idx(b, i, hh, c), t, x);
  }
  void fill(std::mt19937& g, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t hh = 0; hh < H; ++hh)
          for (int64_t c = 0; c < d; ++c) set(b, i, hh, c, u(g));
  }
  detail::TensorRef ref() {
    return {data(), N * H * hs, H * hs, hs};
  }
};

Params make_params(const Config& c, Buf& q, Buf& k, Buf& v, Buf& o, std::vector<float>* lse) {
  Params p;
  p.dtype = c.dtype;
  p.batch = c.seq_q.empty() ? c.B : int64_t(c.seq_q.size());
  p.seqlen_q = c.Nq;
  p.seqlen_k = c.Nk;
  p.heads = c.H;
  p.heads_kv = c.Hkv;
  p.head_dim = c.d;
  p.q = q.ref(); p.k = k.ref(); p.v = v.ref(); p.out = o.ref();
  const int64_t Bt = c.seq_q.empty() ? c.B : 1;
  if (lse) {
    lse->assign(size_t(Bt * c.H * c.Nq), std::nanf(""));
    p.lse = {lse->data(), c.H * c.Nq, c.Nq, 1};
  }
  p.scale = float(1.0 / std::sqrt(double(c.d)));
  p.softcap = c.softcap;
  p.causal = c.causal;
  p.window_left = c.wl;
  p.window_right = c.causal ? 0 : c.wr;
  if (c.causal && c.wr >= 0) p.window_right = std::min(0, c.wr);
  p.max_seqlen_q = c.Nq;
  p.max_seqlen_k = c.Nk;
  return p;
}

// Visible range, written independently of params.hpp.
bool visible(const Params& p, int64_t i, int64_t j, int64_t lq, int64_t lk) {
  const int64_t diag = i + lk - lq;
  if (p.window_left >= 0 && j < diag - p.window_left) return false;
  if (p.window_right >= 0 && j > diag + p.window_right) return false;
  return true;
}

struct Ref {
  std::vector<double> o, lse, dq, dk, dv;
};

// Naive float64 forward + backward.
Ref naive(const Config& c, const Params& p, const Buf& q, const Buf& k, const Buf& v, const Buf* dout) {
  Ref r;
  const int64_t Bt = q.B;
  r.o.assign(size_t(Bt * c.Nq * c.H * c.d), 0);
  r.lse.assign(size_t(Bt * c.H * c.Nq), -INFINITY);
  r.dq.assign(r.o.size(), 0);
  r.dk.assign(size_t(Bt * c.Nk * c.Hkv * c.d), 0);
  r.dv.assign(r.dk.size(), 0);
  const int64_t G = c.H / c.Hkv;
  for (int64_t b = 0; b < p.batch; ++b) {
    int64_t bi = b, q0 = 0, k0 = 0, lq = c.Nq, lk = c.Nk;
    if (!c.seq_q.empty()) {
      bi = 0; q0 = 0; k0 = 0;
      for (int64_t x = 0; x < b; ++x) { q0 += c.seq_q[size_t(x)]; k0 += c.seq_k[size_t(x)]; }
      lq = c.seq_q[size_t(b)]; lk = c.seq_k[size_t(b)];
    }
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t hk = h / G;
      for (int64_t i = 0; i < lq; ++i) {
        std::vector<double> s(size_t(lk), -INFINITY), t(size_t(lk), 0);
        double m = -INFINITY;
        for (int64_t j = 0; j < lk; ++j) {
          double x = 0;
          for (int64_t e = 0; e < c.d; ++e) x += q.get(bi, q0 + i, h, e) * k.get(bi, k0 + j, hk, e);
          x *= p.scale;
          if (c.softcap > 0) { t[size_t(j)] = std::tanh(x / c.softcap); x = c.softcap * t[size_t(j)]; }
          if (!visible(p, i, j, lq, lk)) continue;
          s[size_t(j)] = x;
          m = std::max(m, x);
        }
        if (m == -INFINITY) continue;
        double l = 0;
        for (int64_t j = 0; j < lk; ++j) l += std::exp(s[size_t(j)] - m);
        r.lse[size_t((bi * c.H + h) * c.Nq + q0 + i)] = m + std::log(l);
        std::vector<double> P(static_cast<size_t>(lk));
        for (int64_t j = 0; j < lk; ++j) P[size_t(j)] = std::exp(s[size_t(j)] - m) / l;
        double* o = &r.o[size_t(((bi * c.Nq + q0 + i) * c.H + h) * c.d)];
        for (int64_t j = 0; j < lk; ++j)
          for (int64_t e = 0; e < c.d; ++e) o[e] += P[size_t(j)] * v.get(bi, k0 + j, hk, e);
        if (!dout) continue;
        double D = 0;
        for (int64_t e = 0; e < c.d; ++e) D += dout->get(bi, q0 + i, h, e) * o[e];
        double* dq = &r.dq[size_t(((bi * c.Nq + q0 + i) * c.H + h) * c.d)];
        for (int64_t j = 0; j < lk; ++j) {
          if (P[size_t(j)] == 0) continue;
          double dp = 0;
          for (int64_t e = 0; e < c.d; ++e) dp += dout->get(bi, q0 + i, h, e) * v.get(bi, k0 + j, hk, e);
          double ds = P[size_t(j)] * (dp - D);
          if (c.softcap > 0) ds *= 1 - t[size_t(j)] * t[size_t(j)];
          double* dk = &r.dk[size_t(((bi * c.Nk + k0 + j) * c.Hkv + hk) * c.d)];
          double* dv = &r.dv[size_t(((bi * c.Nk + k0 + j) * c.Hkv + hk) * c.d)];
          for (int64_t e = 0; e < c.d; ++e) {
            dq[e] += p.scale * ds * k.get(bi, k0 + j, hk, e);
            dk[e] += p.scale * ds * q.get(bi, q0 + i, h, e);
            dv[e] += P[size_t(j)] * dout->get(bi, q0 + i, h, e);
          }
        }
      }
    }
  }
  return r;
}

struct Err { double max_abs = 0, max_ref = 0; bool nan = false; };
Err compare(const Buf& got, const std::vector<double>& want, int64_t H) {
  Err e;
  for (int64_t b = 0; b < got.B; ++b)
    for (int64_t i = 0; i < got.N; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < got.d; ++c) {
          const double g = got.get(b, i, h, c), w = want[size_t(((b * got.N + i) * H + h) * got.d + c)];
          if (std::isnan(g)) e.nan = true;
          e.max_abs = std::max(e.max_abs, std::fabs(g - w));
          e.max_ref = std::max(e.max_ref, std::fabs(w));
        }
  return e;
}

bool run_check(const Config& c, std::mt19937& g) {
  const int64_t Bt = c.seq_q.empty() ? c.B : 1;
  Buf q(c.dtype, Bt, c.Nq, c.H, c.d, c.pad), k(c.dtype, Bt, c.Nk, c.Hkv, c.d, c.pad),
      v(c.dtype, Bt, c.Nk, c.Hkv, c.d, c.pad), o(c.dtype, Bt, c.Nq, c.H, c.d, c.pad),
      dout(c.dtype, Bt, c.Nq, c.H, c.d, c.pad), dq(c.dtype, Bt, c.Nq, c.H, c.d, c.pad),
      dk(c.dtype, Bt, c.Nk, c.Hkv, c.d, c.pad), dv(c.dtype, Bt, c.Nk, c.Hkv, c.d, c.pad);
  q.fill(g, -2, 2); k.fill(g, -2, 2); v.fill(g, -1, 1); dout.fill(g, -1, 1);
  std::vector<float> lse;
  Params p = make_params(c, q, k, v, o, &lse);
  std::vector<int32_t> cuq, cuk;
  if (!c.seq_q.empty()) {
    cuq.push_back(0); cuk.push_back(0);
    for (size_t x = 0; x < c.seq_q.size(); ++x) { cuq.push_back(cuq.back() + c.seq_q[x]); cuk.push_back(cuk.back() + c.seq_k[x]); }
    p.cu_seqlens_q = cuq.data(); p.cu_seqlens_k = cuk.data();
  }
  // Rows outside every sequence (varlen totals cover all rows here) stay poisoned: fine.
  cpu::flash_forward(p);
  const Ref r = naive(c, p, q, k, v, &dout);
  const double tol = c.dtype == DType::f32 ? 2e-5 : c.dtype == DType::f16 ? 4e-3 : 3e-2;
  const Err eo = compare(o, r.o, c.H);
  double else_ = 0; bool lse_bad = false;
  for (size_t x = 0; x < lse.size(); ++x) {
    if (std::isinf(r.lse[x])) { if (!(std::isinf(lse[x]) && lse[x] < 0)) lse_bad = true; continue; }
    if (std::isnan(lse[x])) lse_bad = true;
    else_ = std::max(else_, std::fabs(lse[x] - r.lse[x]));
  }
  // Backward with the kernel's own O and LSE.
  Params pb = p;
  pb.dout = dout.ref(); pb.dq = dq.ref(); pb.dk = dk.ref(); pb.dv = dv.ref();
  cpu::flash_backward(pb);
  const Err eq = compare(dq, r.dq, c.H), ek = compare(dk, r.dk, c.Hkv), ev = compare(dv, r.dv, c.Hkv);
  auto ok = [&](const Err& e) { return !e.nan && e.max_abs <= tol * (1 + e.max_ref) * (c.dtype == DType::f32 ? 1 : 2); };
  const bool pass = ok(eo) && !lse_bad && else_ <= 1e-4 * (c.dtype == DType::f32 ? 1 : 10) && ok(eq) && ok(ek) && ok(ev);
  std::printf("%-34s o %.1e lse %.1e%s dq %.1e dk %.1e dv %.1e %s\n", c.name.c_str(), eo.max_abs,
              else_, lse_bad ? "(BAD)" : "", eq.max_abs, ek.max_abs, ev.max_abs,
              pass ? "[ok]" : (eo.nan || eq.nan || ek.nan || ev.nan) ? "[FAIL nan]" : "[FAIL]");
  return pass;
}

int check() {
  std::mt19937 g(1234);
  std::vector<Config> cs;
  auto add = [&](std::string n, int64_t Nq, int64_t Nk, int64_t d, bool causal = false) {
    Config c; c.name = n; c.Nq = Nq; c.Nk = Nk; c.d = d; c.causal = causal; c.H = 2; c.Hkv = 2;
    cs.push_back(c); return &cs.back();
  };
  add("1x1 d64", 1, 1, 64);
  add("17x17 d64", 17, 17, 64);
  add("113x203 d64", 113, 203, 64);
  add("113x203 d64 causal", 113, 203, 64, true);
  add("203x113 d64 causal", 203, 113, 64, true);
  add("1x239 d64", 1, 239, 64);
  add("1x239 d64 causal", 1, 239, 64, true);
  add("239x1 d64 causal", 239, 1, 64, true);
  add("113x203 d59", 113, 203, 59);
  add("113x203 d111 causal", 113, 203, 111, true);
  add("130x130 d256", 130, 130, 256);
  add("77x77 d1", 77, 77, 1);
  add("77x77 d8 causal", 77, 77, 8, true);
  add("200x200 d128 causal", 200, 200, 128, true);
  { auto c = add("gqa 8:2 113x203 d64 causal", 113, 203, 64, true); c->H = 8; c->Hkv = 2; }
  { auto c = add("mqa 4:1 70x90 d32", 70, 90, 32); c->H = 4; c->Hkv = 1; }
  { auto c = add("f16 113x203 d64 causal", 113, 203, 64, true); c->dtype = DType::f16; }
  { auto c = add("bf16 113x203 d59", 113, 203, 59); c->dtype = DType::bf16; }
  { auto c = add("f16 gqa 4:2 150x150 d128", 150, 150, 128); c->dtype = DType::f16; c->H = 4; }
  { auto c = add("window 0,0 100x150", 100, 150, 64); c->wl = 0; c->wr = 0; }
  { auto c = add("window 0,0 150x100", 150, 100, 64); c->wl = 0; c->wr = 0; }
  { auto c = add("window 20,5 200x180 d48", 200, 180, 48); c->wl = 20; c->wr = 5; }
  { auto c = add("window 30,-1 causal 170x170", 170, 170, 64, true); c->wl = 30; }
  { auto c = add("softcap 5 113x203 d64", 113, 203, 64); c->softcap = 5; }
  { auto c = add("softcap 2 causal 203x113 d40", 203, 113, 40, true); c->softcap = 2; }
  { auto c = add("strided pad 3 97x131 d64 causal", 97, 131, 64, true); c->pad = 3; }
  { auto c = add("batch 3 65x70 d64 causal", 65, 70, 64, true); c->B = 3; }
  {
    auto c = add("varlen [5,0,130,64] causal", 199, 0, 64, true);
    c->seq_q = {5, 0, 130, 64}; c->seq_k = {7, 0, 100, 90}; c->Nk = 197;
  }
  {
    auto c = add("varlen [0,3,70] k[4,0,80]", 73, 84, 32);
    c->seq_q = {0, 3, 70}; c->seq_k = {4, 0, 80};
  }
  // Several forward tiles in both directions (256 × 256): the online rescale across key
  // tiles, tiles skipped or partly masked by causal and windowed ranges.
  add("600x700 d64 causal", 600, 700, 64, true);
  { auto c = add("window 300,10 700x600 d72", 700, 600, 72); c->wl = 300; c->wr = 10; }
  { auto c = add("f16 gqa 4:2 520x530 d64 causal", 520, 530, 64, true); c->dtype = DType::f16; c->H = 4; }
  { auto c = add("bf16 softcap 3 530x600 d40", 530, 600, 40); c->dtype = DType::bf16; c->softcap = 3; }
  add("0x17", 0, 17, 64);
  add("17x0", 17, 0, 64);
  int fails = 0;
  std::printf("isa %s, %d threads, OpenBLAS: %s (parallel %d)\n", cpu::isa_name(),
              omp_get_max_threads(), openblas_get_config(), openblas_get_parallel());
  for (const Config& c : cs) fails += !run_check(c, g);
  std::printf("%d failures\n", fails);
  return fails ? 1 : 0;
}

// Process CPU time (all threads): on a shared machine, flops × threads / cpu_time estimates the
// rate with the cores to ourselves (conservative: OpenMP spin-waits count as busy).
double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int bench(int argc, char** argv) {
  Config c;
  c.d = argc > 2 ? std::atoi(argv[2]) : 64;
  c.causal = argc > 3 ? std::atoi(argv[3]) != 0 : false;
  c.Nq = c.Nk = argc > 4 ? std::atoll(argv[4]) : 4096;
  c.H = c.Hkv = argc > 5 ? std::atoll(argv[5]) : 8;
  const int reps = argc > 6 ? std::atoi(argv[6]) : 5;
  const std::string what = argc > 7 ? argv[7] : "both";
  std::mt19937 g(1);
  Buf q(c.dtype, 1, c.Nq, c.H, c.d, 0), k(c.dtype, 1, c.Nk, c.Hkv, c.d, 0), v(c.dtype, 1, c.Nk, c.Hkv, c.d, 0),
      o(c.dtype, 1, c.Nq, c.H, c.d, 0), dout(c.dtype, 1, c.Nq, c.H, c.d, 0), dq = o, dk = k, dv = k;
  q.fill(g, -2, 2); k.fill(g, -2, 2); v.fill(g, -1, 1); dout.fill(g, -1, 1);
  std::vector<float> lse;
  Params p = make_params(c, q, k, v, o, &lse);
  p.dout = dout.ref(); p.dq = dq.ref(); p.dk = dk.ref(); p.dv = dv.ref();
  const double flops = 4.0 * c.B * c.H * c.Nq * c.Nk * c.d * (c.causal ? 0.5 : 1.0);
  auto time = [&](auto f) {
    f();  // warm-up
    std::vector<double> ts, cs;
    for (int r = 0; r < reps; ++r) {
      const double t0 = now(), c0 = cpu_now();
      f();
      ts.push_back(now() - t0);
      cs.push_back((cpu_now() - c0) / omp_get_max_threads());
    }
    std::sort(ts.begin(), ts.end());
    std::sort(cs.begin(), cs.end());
    std::printf("  [cpu-time per thread: best %.2f ms, median %.2f ms; wall best %.2f ms]\n",
                cs.front() * 1e3, cs[cs.size() / 2] * 1e3, ts.front() * 1e3);
    return std::make_pair(ts.front(), cs[cs.size() / 2]);
  };
  cpu::flash_forward(p);
  if (what != "bwd") {
    const auto [t, tm] = time([&] { cpu::flash_forward(p); });
    std::printf("cpu %s f32 d%lld %s N=%lld H=%lld fwd: wall-best %8.2f ms %6.1f GFLOP/s, cpu-time-median %6.1f GFLOP/s (%d threads)\n",
                cpu::isa_name(), (long long)c.d, c.causal ? "causal" : "full", (long long)c.Nq,
                (long long)c.H, t * 1e3, flops / t / 1e9, flops / tm / 1e9, omp_get_max_threads());
  }
  if (what != "fwd") {
    const auto [t, tm] = time([&] { cpu::flash_backward(p); });
    std::printf("cpu %s f32 d%lld %s N=%lld H=%lld bwd: wall-best %8.2f ms %6.1f GFLOP/s, cpu-time-median %6.1f GFLOP/s (%d threads)\n",
                cpu::isa_name(), (long long)c.d, c.causal ? "causal" : "full", (long long)c.Nq,
                (long long)c.H, t * 1e3, 2.5 * flops / t / 1e9, 2.5 * flops / tm / 1e9, omp_get_max_threads());
  }
  return 0;
}

// Bitwise reproducibility: a hash of O, LSE, dQ, dK, dV; compare across runs and thread counts.
int det() {
  Config c; c.H = 8; c.Hkv = 2; c.Nq = 300; c.Nk = 333; c.d = 72; c.causal = true;
  std::mt19937 g(7);
  Buf q(c.dtype, 1, c.Nq, c.H, c.d, 0), k(c.dtype, 1, c.Nk, c.Hkv, c.d, 0), v = k, o = q, dout = q,
      dq = q, dk = k, dv = k;
  q.fill(g, -2, 2); k.fill(g, -2, 2); v.fill(g, -1, 1); dout.fill(g, -1, 1);
  std::vector<float> lse;
  Params p = make_params(c, q, k, v, o, &lse);
  p.dout = dout.ref(); p.dq = dq.ref(); p.dk = dk.ref(); p.dv = dv.ref();
  cpu::flash_forward(p);
  cpu::flash_backward(p);
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::vector<float>& x) {
    const unsigned char* b = reinterpret_cast<const unsigned char*>(x.data());
    for (size_t i = 0; i < x.size() * 4; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  mix(o.f); mix(lse); mix(dq.f); mix(dk.f); mix(dv.f);
  std::printf("isa %s threads %d hash %016llx\n", cpu::isa_name(), omp_get_max_threads(), (unsigned long long)h);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  if (mode == "check") return check();
  if (mode == "bench") return bench(argc, argv);
  if (mode == "det") return det();
  std::fprintf(stderr, "usage: cpu_flash check | bench [d] [causal] [N] [H] [reps] [fwd|bwd|both]\n");
  return 2;
}
