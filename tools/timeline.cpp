// flashattn timeline: where the time of the standard algorithm goes, stage by stage, beside the
// flash kernel — each stage's achieved bandwidth and FLOP rate against this machine's ceilings,
// which the program measures itself (CPU: a large copy, the tile GEMM on cache-resident data;
// CUDA: tools/timeline_cuda.cpp).
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ostream>

#include "commands.hpp"
#include "core/backend.hpp"
#include "core/check.hpp"
#include "core/scratch.hpp"
#include "cpu/isa.hpp"

namespace flashattn::tools {
namespace {

// Read + write bytes per second of a large multi-threaded copy (several times the last-level cache).
double measure_copy_bandwidth() {
  const size_t bytes = size_t(512) << 20;
  detail::Scratch<char> a(bytes), b(bytes);
  std::memset(a.data(), 1, bytes);
  std::memset(b.data(), 2, bytes);
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const double t0 = omp_get_wtime();
#pragma omp parallel
    {
      const size_t n = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
      const size_t chunk = bytes / n;
      std::memcpy(b.data() + t * chunk, a.data() + t * chunk, t + 1 == n ? bytes - t * chunk : chunk);
    }
    best = std::max(best, 2.0 * double(bytes) / (omp_get_wtime() - t0));
  }
  return best;
}

// FLOP/s of the tile GEMM (the flash and standard paths' arithmetic) on cache-resident tiles, all threads.
double measure_gemm_rate(int64_t d) {
  const cpu::TileKernels& tk = cpu::tile_kernels();
  const int m = 64, n = 64, k = int(cpu::pad_n(d));
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    double flops = 0;
    const double t0 = omp_get_wtime();
#pragma omp parallel reduction(+ : flops)
    {
      detail::Scratch<float> a(size_t(m * k)), b(size_t(k * n)), c(size_t(m * n));
      for (size_t i = 0; i < a.size(); ++i) a[i] = 1e-3f * float(i % 97);
      for (size_t i = 0; i < b.size(); ++i) b[i] = 1e-3f * float(i % 89);
      std::fill(c.data(), c.data() + c.size(), 0.0f);
      for (int it = 0; it < 4000; ++it) tk.gemm(m, n, k, a.data(), k, 1, b.data(), n, c.data(), n, nullptr, true);
      flops += 2.0 * m * n * k * 4000;
    }
    best = std::max(best, flops / (omp_get_wtime() - t0));
  }
  return best;
}

}  // namespace

int run_timeline(const TimelineArgs& a, std::ostream& os) {
  const Device device = parse_device(a.device);  // cuda without a device: an Error naming --device
  Config c;
  c.device = device;
  c.dtype = parse_dtype(a.dtype, device);
  c.batch = a.batch;
  c.heads = c.heads_kv = a.heads;
  c.head_dim = a.head_dim;
  c.seqlen_q = c.seqlen_k = a.seqlen;
  c.causal = a.causal;
  if (a.seqlen < 1) throw Error("flashattn timeline: --seqlen: expected >= 1, got " + std::to_string(a.seqlen));
  if (device == Device::cuda) {
#if defined(FLASHATTN_TOOLS_CUDA)
    return run_timeline_cuda(c, a.backward, os);
#else
    throw Error("flashattn timeline: --device: this build has no CUDA backend");
#endif
  }
  const double bw = measure_copy_bandwidth(), peak = measure_gemm_rate(c.head_dim);
  os << strprintf("flashattn timeline — cpu (%d threads, %s kernels), %s\n", omp_get_max_threads(), cpu::isa_name(),
                  c.label().c_str());
  os << strprintf("ceilings measured now: copy %.1f GB/s (read + write), tile GEMM %.1f GFLOP/s (cache-resident)\n\n",
                  bw / 1e9, peak / 1e9);

  Problem pb(c, a.backward, fresh_seed());
  Options opt;
  opt.causal = c.causal;
  auto run_pass = [&](Algorithm alg, detail::StageProfile* prof) {
    opt.algorithm = alg;
    detail::Params p = a.backward ? detail::check_backward(pb.tq, pb.tk, pb.tv, pb.tout, pb.tdout, pb.tlse, pb.tdq,
                                                           pb.tdk, pb.tdv, opt)
                                  : detail::check_forward(pb.tq, pb.tk, pb.tv, pb.tout, &pb.tlse, opt);
    p.profile = prof;
    const double t0 = omp_get_wtime();
    if (a.backward)
      alg == Algorithm::flash ? cpu::flash_backward(p) : cpu::standard_backward(p);
    else
      alg == Algorithm::flash ? cpu::flash_forward(p) : cpu::standard_forward(p);
    return omp_get_wtime() - t0;
  };
  if (a.backward) {  // backward needs out and lse of a forward
    opt.algorithm = Algorithm::flash;
    forward(pb.tq, pb.tk, pb.tv, pb.tout, &pb.tlse, opt);
  }
  run_pass(Algorithm::standard, nullptr);  // warm-up (page faults, thread start)
  detail::StageProfile prof;
  const double std_s = run_pass(Algorithm::standard, &prof);
  run_pass(Algorithm::flash, nullptr);
  const double flash_s = run_pass(Algorithm::flash, nullptr);

  os << strprintf("%-42s %9s %6s %10s %6s %11s %6s  %s\n", "standard, stage", "time", "share", "GB/s", "of bw",
                  "GFLOP/s", "of pk", "bound by");
  double mem_s = 0;
  for (const auto& st : prof.stages) {
    const double t_mem = st.bytes / bw, t_math = st.flops / peak;
    mem_s += std::min(st.seconds, t_mem);
    os << strprintf("%s %6.1f ms %5.0f%% %10.1f %5.0f%% %11.1f %5.0f%%  %s\n", pad_right(st.name, 42).c_str(), st.seconds * 1e3,
                    100 * st.seconds / std_s, st.bytes / st.seconds / 1e9, 100 * t_mem / st.seconds,
                    st.flops / st.seconds / 1e9, 100 * t_math / st.seconds, t_mem > t_math ? "memory" : "arithmetic");
  }
  const double flops = a.backward ? backward_flops(c) : forward_flops(c);
  os << strprintf("%-42s %6.1f ms\n", "standard, whole call", std_s * 1e3);
  os << strprintf("%-42s %6.1f ms %6s %10s %6s %11.1f %5.0f%%\n", "flash, whole call (S, P stay in cache)",
                  flash_s * 1e3, "", "", "", flops / flash_s / 1e9, 100 * flops / flash_s / peak);
  os << strprintf("\nAt the copy ceiling, moving the standard path's bytes alone takes %.1f ms of its %.1f ms;\n"
                  "flash is %.1fx faster on the same tile kernels. (FLOP/s of whole calls use the 4·B·H·N²·d "
                  "convention%s.)\n",
                  mem_s * 1e3, std_s * 1e3, std_s / flash_s, a.backward ? " ×2.5" : "");
  return 0;
}

}  // namespace flashattn::tools
