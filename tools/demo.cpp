// flashattn demo: the main job. For growing N, the standard (materializing) and flash algorithms
// side by side: time, peak extra memory, bytes moved through main memory, error against the
// float64 reference; then the online-softmax walk-through.
#include <cstdio>
#include <iostream>
#include <thread>

#include "commands.hpp"
#include "traffic_model.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace flashattn::tools {

int run_demo(const DemoArgs& a) {
  const Device device = parse_device(a.device);
  const DType dtype = parse_dtype(a.dtype, device);
  const uint64_t seed = fresh_seed();
  int threads = 1;
#if defined(_OPENMP)
  threads = omp_get_max_threads();
#endif
  std::printf("flashattn demo — %s", device == Device::cpu ? "cpu" : "cuda");
  if (device == Device::cpu) std::printf(" (%d threads)", threads);
  std::printf(", %s, batch %lld, %lld heads, head_dim %lld, %s; inputs N(0,1), seed %llu\n", to_string(dtype),
              (long long)a.batch, (long long)a.heads, (long long)a.head_dim, a.causal ? "causal" : "no mask",
              (unsigned long long)seed);
  std::printf(
      "standard writes the N×N scores S and probabilities P to main memory and reads them back;\n"
      "flash keeps them on chip, tile by tile, with an online softmax (docs/traffic-model.md has the byte model).\n\n");
  std::printf("%7s  %-9s %10s %10s %13s %14s %11s\n", "N", "algorithm", "time", "GFLOP/s", "extra memory",
              "bytes moved*", "max error");

  std::vector<double> flash_mem, std_mem;
  bool ok = true;
  for (int64_t n : a.seqlens) {
    Config c;
    c.device = device;
    c.dtype = dtype;
    c.batch = a.batch;
    c.heads = c.heads_kv = a.heads;
    c.head_dim = a.head_dim;
    c.seqlen_q = c.seqlen_k = n;
    c.causal = a.causal;
    Problem pb(c, false, seed + uint64_t(n));
    for (Algorithm alg : {Algorithm::standard, Algorithm::flash}) {
      Options opt;
      opt.causal = a.causal;
      opt.algorithm = alg;
      pb.out.fill_bytes(0xff);
      double ms = 0;
      const double extra = peak_scratch_during(device, [&] {
        ms = time_ms(device, [&] { forward(pb.tq, pb.tk, pb.tv, pb.tout, &pb.tlse, opt); }, 1, 5, 200);
      });
      const double err = forward_error_sampled(pb, opt, a.check_rows, seed ^ uint64_t(n));
      const Traffic t = forward_traffic(c, alg);
      const double tol = sampled_error_bound(dtype);
      ok = ok && err <= tol;
      (alg == Algorithm::flash ? flash_mem : std_mem).push_back(extra);
      std::printf("%7lld  %-9s %7.2f ms %10.1f %13s %14s %11.1e%s\n", (long long)n, to_string(alg), ms,
                  forward_flops(c) / (ms * 1e6), human_bytes(extra).c_str(),
                  human_bytes(t.total()).c_str(), err, err <= tol ? "" : "  [FAIL]");
    }
  }
  std::printf("* analytic model of one forward's main-memory traffic (reads + writes); compulsory part:\n"
              "  Q, K, V read once, O and LSE written once; standard adds S and P (N² per head each),\n"
              "  each written once and read once.\n");
  if (std_mem.size() >= 2) {
    std::printf("\nExtra memory from N=%lld to N=%lld: standard ×%.1f (N² would be ×%.0f), flash ×%.2f (flat).\n",
                (long long)a.seqlens.front(), (long long)a.seqlens.back(), std_mem.back() / std::max(std_mem.front(), 1.0),
                double(a.seqlens.back()) * double(a.seqlens.back()) / (double(a.seqlens.front()) * double(a.seqlens.front())),
                flash_mem.back() / std::max(flash_mem.front(), 1.0));
  }
  std::printf("\n");
  TraceArgs trace;  // the worked example: TraceArgs' default scores in tiles of 2 (row sums 1.368, 1.585, 2.415)
  const int trace_rc = run_trace(trace, std::cout);
  return ok && trace_rc == 0 ? 0 : 1;
}

}  // namespace flashattn::tools
