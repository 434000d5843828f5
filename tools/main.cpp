// The flashattn program: runs, checks, benchmarks and shows attention.
#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.hpp"

// What every --json output promises about its numbers (tools/common.hpp, json_number).
constexpr const char* kJsonNumbers =
    "numbers are exact: the shortest decimal that reads back as the same double; JSON has no "
    "infinities or NaN, so -inf, inf and NaN are written as null";

int main(int argc, char** argv) {
  using namespace flashattn::tools;
  CLI::App app{"flashattn — exact attention that moves less data"};
  app.require_subcommand(1);

  DemoArgs demo;
  auto* c_demo = app.add_subcommand("demo", "standard vs flash for growing N: time, extra memory, bytes moved, error; "
                                            "then the online-softmax walk-through");
  c_demo->add_option("--device", demo.device, "cpu, cuda or auto")->capture_default_str();
  c_demo->add_option("--dtype", demo.dtype, "f32, f16, bf16 or auto (f32 on cpu, bf16 on cuda)")->capture_default_str();
  c_demo->add_option("-N,--seqlen", demo.seqlens, "sequence lengths")->capture_default_str();
  c_demo->add_option("--batch", demo.batch)->capture_default_str()->check(CLI::PositiveNumber);
  c_demo->add_option("--heads", demo.heads)->capture_default_str()->check(CLI::PositiveNumber);
  c_demo->add_option("--head-dim", demo.head_dim)->capture_default_str()->check(CLI::Range(1, 256));
  c_demo->add_flag("--causal", demo.causal);
  c_demo->add_option("--check-rows", demo.check_rows, "rows checked against the float64 reference")->capture_default_str();

  BenchArgs bench;
  auto* c_bench = app.add_subcommand("bench", "one line per configuration with FLOP/s; --json for machines");
  c_bench->add_option("--device", bench.device, "cpu, cuda or auto")->capture_default_str();
  c_bench->add_option("--dtype", bench.dtypes, "f32, f16, bf16 or auto")->capture_default_str();
  c_bench->add_option("-N,--seqlen", bench.seqlens, "query sequence lengths")->capture_default_str();
  c_bench->add_option("--seqlen-k", bench.seqlen_k, "key length (default: same as N)");
  c_bench->add_option("-d,--head-dim", bench.head_dims)->capture_default_str()->check(CLI::Range(1, 256));
  c_bench->add_option("--batch", bench.batch)->capture_default_str()->check(CLI::PositiveNumber);
  c_bench->add_option("--heads", bench.heads)->capture_default_str()->check(CLI::PositiveNumber);
  c_bench->add_option("--heads-kv", bench.heads_kv, "KV heads (GQA); default = heads");
  c_bench->add_option("--causal", bench.causal, "no, yes or both")->capture_default_str();
  c_bench->add_option("--window-left", bench.window_left,
                      "a sliding window: each query sees this many keys left of its diagonal (-1 = unbounded)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 30));
  c_bench->add_option("--algorithm", bench.algorithm, "flash, standard or both")->capture_default_str();
  c_bench->add_flag("--backward", bench.backward, "also time the backward pass");
  c_bench->add_option("--check-rows", bench.check_rows, "rows checked against the float64 reference (0 = off)")->capture_default_str();
  c_bench->add_option("--reps", bench.reps, "timed repetitions (median)")->capture_default_str()->check(CLI::PositiveNumber);
  c_bench->add_flag("--json", bench.json,
                    std::string("one JSON array on stdout, an object per configuration; ") + kJsonNumbers +
                        " (max_err of an output with NaN is null)");

  TraceArgs trace;
  auto* c_trace = app.add_subcommand("trace", "the online-softmax state after every key tile of one query row");
  c_trace->add_option("--scores", trace.scores, "comma-separated scores (-inf = masked)")->capture_default_str();
  c_trace->add_option("--tile", trace.tile, "keys per tile")->capture_default_str();
  c_trace->add_option("--values", trace.values, "one row per key, rows separated by ';', components by ','");
  c_trace->add_flag("--json", trace.json,
                    std::string("one JSON object: steps (tile, row_max, row_sum, rescale, acc), out, lse, direct_out, "
                                "max_abs_diff; ") +
                        kJsonNumbers + " (row_max and lse of a row whose keys are all masked: -inf, so null)");

  TrafficArgs traffic;
  auto* c_traffic = app.add_subcommand("traffic", "bytes each algorithm moves through main memory, for a sweep of N");
  c_traffic->add_option("--device", traffic.device, "cpu, cuda or auto")->capture_default_str();
  c_traffic->add_option("--dtype", traffic.dtype, "f32, f16 or bf16")->capture_default_str();
  c_traffic->add_option("-N,--seqlen", traffic.seqlens)->capture_default_str();
  c_traffic->add_option("--batch", traffic.batch)->capture_default_str()->check(CLI::PositiveNumber);
  c_traffic->add_option("--heads", traffic.heads)->capture_default_str()->check(CLI::PositiveNumber);
  c_traffic->add_option("--heads-kv", traffic.heads_kv, "KV heads (GQA); default = heads");
  c_traffic->add_option("-d,--head-dim", traffic.head_dim)->capture_default_str()->check(CLI::Range(1, 256));
  c_traffic->add_flag("--causal", traffic.causal);
  c_traffic->add_option("--format", traffic.format,
                        std::string("table, json or csv; json and csv numbers are exact (the shortest decimal that "
                                    "reads back as the same double; JSON writes a non-finite value as null, CSV "
                                    "leaves its field empty)"))
      ->capture_default_str();
  c_traffic->add_flag_callback("--json", [&] { traffic.format = "json"; }, std::string("--format json: ") + kJsonNumbers);
  c_traffic->add_flag_callback("--csv", [&] { traffic.format = "csv"; }, "--format csv");
  c_traffic->add_option("--measure", traffic.measure,
                        "auto: on cuda, also measure each call's DRAM bytes (CUPTI) where the machine allows; "
                        "off: the analytic count only")->capture_default_str();
  c_traffic->add_option("--profile-call", traffic.profile_call,
                        "for Nsight Compute: run only this call (forward:standard, forward:flash, backward:standard "
                        "or backward:flash) per N, after its warm-up, between cudaProfilerStart/Stop "
                        "(ncu --profile-from-start off); no CUPTI");

  TimelineArgs timeline;
  auto* c_timeline = app.add_subcommand("timeline", "time of each stage of the standard algorithm against this "
                                                    "machine's measured bandwidth and FLOP ceilings, beside flash");
  c_timeline->add_option("--device", timeline.device, "cpu, cuda or auto")->capture_default_str();
  c_timeline->add_option("--dtype", timeline.dtype, "f32, f16, bf16 or auto (f32 on cpu, bf16 on cuda)")->capture_default_str();
  c_timeline->add_option("-N,--seqlen", timeline.seqlen)->capture_default_str()->check(CLI::PositiveNumber);
  c_timeline->add_option("--batch", timeline.batch)->capture_default_str()->check(CLI::PositiveNumber);
  c_timeline->add_option("--heads", timeline.heads)->capture_default_str()->check(CLI::PositiveNumber);
  c_timeline->add_option("-d,--head-dim", timeline.head_dim)->capture_default_str()->check(CLI::Range(1, 256));
  c_timeline->add_flag("--causal", timeline.causal);
  c_timeline->add_flag("--backward", timeline.backward, "the backward pass's stages");

  DecodeArgs decode;
  auto* c_decode = app.add_subcommand("decode", "serving: one query token per sequence over a KV cache (forward_kvcache) "
                                                "for a sweep of batch x cache length; KV bytes read per second as a "
                                                "fraction of this machine's measured read bandwidth");
  c_decode->add_option("--device", decode.device, "cpu, cuda or auto")->capture_default_str();
  c_decode->add_option("--dtype", decode.dtype, "f32, f16, bf16 or auto (f32 on cpu, bf16 on cuda)")->capture_default_str();
  c_decode->add_option("--batch", decode.batches, "sequences per call (default: the device's sweep)");
  c_decode->add_option("--cache", decode.caches,
                       "cache lengths in tokens, K = 1024 (e.g. 4K 32K 128K; default: the device's sweep)");
  c_decode->add_option("--heads", decode.heads)->capture_default_str();
  c_decode->add_option("--heads-kv", decode.heads_kv, "KV heads (GQA)")->capture_default_str();
  c_decode->add_option("-d,--head-dim", decode.head_dim)->capture_default_str();
  c_decode->add_option("--paged", decode.page_size,
                       "page size: a paged cache, each sequence's pages in random order (0 = contiguous)")
      ->capture_default_str();
  c_decode->add_option("--splits", decode.splits, "key splits per sequence (0 = the library's choice)")->capture_default_str();
  c_decode->add_flag("--pages-in-order", decode.pages_in_order,
                    "a paged cache's pages in allocation order (block table 0, 1, 2, ...) instead of random");
  c_decode->add_flag("--heads-first", decode.heads_first,
                     "the cache laid out heads first: (B, Hkv, N, d), or (pages, Hkv, P, d) paged, each KV head's "
                     "rows contiguous (as Hugging Face's cache holds them); default tokens first, (B, N, Hkv, d)");
  c_decode->add_option("--flush", decode.flush,
                       "how each timed call finds the caches cold: read (twice the last-level cache / L2 of another "
                       "buffer read, which leaves clean lines, as a model's other layers mostly do) or write (the same "
                       "bytes written: the dirty lines' write-backs then overlap the call) or none (each call finds the lines of "
                       "the one before: its code and, where it fits, its cache warm)")
      ->capture_default_str()
      ->check(CLI::IsMember({"read", "write", "none"}));
  c_decode->add_option("--queue-ahead", decode.queue_us,
                       "CUDA: µs of GPU wait queued after the flush and before each timed call, so that the host's "
                       "launch work for the call overlaps it and the events time the GPU alone (0 = none)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  c_decode->add_flag("--append", decode.append, "each call also appends one new token (cache_seqlens = cache - 1)");
  c_decode->add_option("--reps", decode.reps, "timed calls (median)")->capture_default_str();
  c_decode->add_option("--check-rows", decode.check_rows, "sampled rows checked against float64 (0 = off)")
      ->capture_default_str();
  c_decode->add_flag("--json", decode.json,
                     std::string("one JSON array on stdout, an object per shape (a shape that does not fit carries "
                                 "\"skipped\", a call the build cannot run \"error\"); ") +
                         kJsonNumbers);

  CLI11_PARSE(app, argc, argv);
  try {
    if (c_demo->parsed()) return run_demo(demo);
    if (c_bench->parsed()) return run_bench(bench);
    if (c_trace->parsed()) return run_trace(trace, std::cout);
    if (c_traffic->parsed()) return run_traffic(traffic, std::cout);
    if (c_timeline->parsed()) return run_timeline(timeline, std::cout);
    if (c_decode->parsed()) return run_decode(decode, std::cout);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
