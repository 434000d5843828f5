// flashattn bench: one line per configuration, FLOP/s by the standard formula, the peak extra
// memory of each call (the library's counted scratch: host for the CPU, device for CUDA), optional
// check against the float64 reference on sampled rows, --json for machines (numbers exact, as
// json_number writes them; a non-finite value, e.g. max_err of an output with NaN, is null).
#include <cmath>
#include <cstdio>

#include "commands.hpp"

namespace flashattn::tools {

int run_bench(const BenchArgs& a) {
  const Device device = parse_device(a.device);
  std::vector<bool> causal_modes;
  if (a.causal == "no" || a.causal == "both") causal_modes.push_back(false);
  if (a.causal == "yes" || a.causal == "both") causal_modes.push_back(true);
  if (causal_modes.empty()) throw Error("flashattn bench: --causal: expected no, yes or both, got " + a.causal);
  std::vector<Algorithm> algs;
  if (a.algorithm == "flash" || a.algorithm == "both") algs.push_back(Algorithm::flash);
  if (a.algorithm == "standard" || a.algorithm == "both") algs.push_back(Algorithm::standard);
  if (algs.empty()) throw Error("flashattn bench: --algorithm: expected flash, standard or both, got " + a.algorithm);
  // What ran: on stderr, so that --json output stays one JSON document.
  std::fprintf(stderr, "%s\n", build_info().c_str());
  const uint64_t seed = fresh_seed();
  const double unit = device == Device::cpu ? 1e9 : 1e12;
  const char* unit_name = device == Device::cpu ? "GFLOP/s" : "TFLOP/s";
  if (a.json) std::printf("[\n");
  bool first = true, ok = true;
  for (const std::string& dt : a.dtypes)
    for (int64_t d : a.head_dims)
      for (int64_t n : a.seqlens)
        for (bool causal : causal_modes)
          for (Algorithm alg : algs) {
            Config c;
            c.device = device;
            c.dtype = parse_dtype(dt, device);
            c.batch = a.batch;
            c.heads = a.heads;
            c.heads_kv = a.heads_kv > 0 ? a.heads_kv : a.heads;
            c.head_dim = d;
            c.seqlen_q = n;
            c.seqlen_k = a.seqlen_k > 0 ? a.seqlen_k : n;
            c.causal = causal;
            c.window_left = a.window_left;
            Problem pb(c, a.backward, seed + uint64_t(n * 7 + d));
            Options opt;
            opt.causal = causal;
            opt.window_left = a.window_left;
            opt.algorithm = alg;
            double fwd_ms = NAN;
            const double fwd_extra = peak_scratch_during(device, [&] {
              fwd_ms = time_ms(device, [&] { forward(pb.tq, pb.tk, pb.tv, pb.tout, &pb.tlse, opt); }, 1, a.reps, 200);
            });
            double err = NAN;
            if (a.check_rows > 0) err = forward_error_sampled(pb, opt, a.check_rows, seed ^ uint64_t(n));
            const double tol = sampled_error_bound(c.dtype);
            const bool pass = a.check_rows == 0 || err <= tol;
            ok = ok && pass;
            double bwd_ms = NAN, bwd_extra = NAN;
            if (a.backward)
              bwd_extra = peak_scratch_during(device, [&] {
                bwd_ms = time_ms(device, [&] {
                  backward(pb.tq, pb.tk, pb.tv, pb.tout, pb.tdout, pb.tlse, pb.tdq, pb.tdk, pb.tdv, opt);
                }, 1, a.reps, 200);
              });
            const double fwd_rate = forward_flops(c) / (fwd_ms * 1e-3) / unit;
            const double bwd_rate = backward_flops(c) / (bwd_ms * 1e-3) / unit;
            if (a.json) {
              std::printf("%s  {\"device\":\"%s\",\"algorithm\":\"%s\",\"dtype\":\"%s\",\"batch\":%lld,\"heads\":%lld,"
                          "\"heads_kv\":%lld,\"seqlen_q\":%lld,\"seqlen_k\":%lld,\"head_dim\":%lld,\"causal\":%s,\"window_left\":%d,"
                          "\"fwd_ms\":%s,\"fwd_flops_per_s\":%s,\"fwd_extra_bytes\":%s",
                          first ? "" : ",\n", to_string(device), to_string(alg), to_string(c.dtype), (long long)c.batch,
                          (long long)c.heads, (long long)c.heads_kv, (long long)c.seqlen_q, (long long)c.seqlen_k,
                          (long long)d, causal ? "true" : "false", a.window_left, json_number(fwd_ms).c_str(),
                          json_number(fwd_rate * unit).c_str(), json_number(fwd_extra).c_str());
              if (a.backward)
                std::printf(",\"bwd_ms\":%s,\"bwd_flops_per_s\":%s,\"bwd_extra_bytes\":%s", json_number(bwd_ms).c_str(),
                            json_number(bwd_rate * unit).c_str(), json_number(bwd_extra).c_str());
              if (a.check_rows > 0)
                std::printf(",\"max_err\":%s,\"ok\":%s", json_number(err).c_str(), pass ? "true" : "false");
              std::printf("}");
              first = false;
            } else {
              std::printf("%-8s %s: fwd %.3f ms %.1f %s extra %s", to_string(alg), c.label().c_str(), fwd_ms, fwd_rate,
                          unit_name, human_bytes(fwd_extra).c_str());
              if (a.backward)
                std::printf(" | bwd %.3f ms %.1f %s extra %s", bwd_ms, bwd_rate, unit_name, human_bytes(bwd_extra).c_str());
              if (a.check_rows > 0) std::printf(" max_err %.1e [%s]", err, pass ? "ok" : "FAIL");
              std::printf("\n");
            }
            std::fflush(stdout);
          }
  if (a.json) std::printf("\n]\n");
  return ok ? 0 : 1;
}

}  // namespace flashattn::tools
