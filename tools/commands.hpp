// The subcommands of the flashattn program (tools/main.cpp wires them to CLI11).
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "common.hpp"

namespace flashattn::tools {

struct DemoArgs {
  std::string device = "auto";
  std::string dtype = "auto";
  std::vector<int64_t> seqlens = {1024, 2048, 4096, 8192};
  int64_t batch = 1, heads = 4, head_dim = 64;
  bool causal = false;
  int check_rows = 8;
};
int run_demo(const DemoArgs& a);

struct BenchArgs {
  std::string device = "auto";
  std::vector<std::string> dtypes = {"auto"};
  std::vector<int64_t> seqlens = {1024, 2048, 4096};
  int64_t seqlen_k = 0;  // 0 = same as seqlen
  std::vector<int64_t> head_dims = {64, 128};
  int64_t batch = 1, heads = 8, heads_kv = 0;
  std::string causal = "both";        // no | yes | both
  int window_left = -1;               // >= 0: Options::window_left
  std::string algorithm = "flash";    // flash | standard | both
  bool backward = false;
  int check_rows = 4;                 // sampled rows checked against the fp64 reference (0 = off)
  int reps = 10;
  bool json = false;
};
int run_bench(const BenchArgs& a);

struct TraceArgs {
  std::string scores = "2.0,1.0,3.0,0.5,1.5,2.5";
  int tile = 2;
  std::string values;  // rows separated by ';', components by ','; empty = one-hot rows
  bool json = false;
};
int run_trace(const TraceArgs& a, std::ostream& os);

struct TrafficArgs {
  std::string device = "auto";
  std::string dtype = "f16";
  std::vector<int64_t> seqlens = {1024, 2048, 4096, 6144, 8192};
  int64_t batch = 1, heads = 32, heads_kv = 0, head_dim = 128;
  bool causal = false;
  std::string format = "table";  // table | json | csv
  // auto: on CUDA, also measure the DRAM bytes of each call (CUPTI), where the machine allows;
  // off: the analytic count only.
  std::string measure = "auto";
  // For Nsight Compute (scripts/dev/gpu-physics): "forward:standard", "forward:flash",
  // "backward:standard" or "backward:flash" runs only that call per N — its warm-up, then the call
  // between cudaProfilerStart and cudaProfilerStop (ncu --profile-from-start off) — and no CUPTI.
  std::string profile_call;
};
int run_traffic(const TrafficArgs& a, std::ostream& os);

// The bytes one measured call moved, or why there are none.
struct MeasuredCall {
  bool ok = false;
  double read = 0, write = 0;
  std::string reason;
};
// Runs `call` (one library call) inside whatever measures it.
using CallMeasurer = std::function<MeasuredCall(const std::function<void()>& call)>;
// run_traffic with `measurer` in place of CUPTI, on any device, the CPU included: how the tests
// check the measured columns and the calls' sequence without a GPU. `source` names the measurer.
int run_traffic_measured_by(const TrafficArgs& a, std::ostream& os, const CallMeasurer& measurer,
                            const std::string& source);

struct TimelineArgs {
  std::string device = "cpu";
  std::string dtype = "auto";  // f32 on cpu, bf16 on cuda
  int64_t batch = 1, heads = 4, head_dim = 64, seqlen = 4096;
  bool causal = false, backward = false;
};
int run_timeline(const TimelineArgs& a, std::ostream& os);
// The CUDA half of run_timeline (tools/timeline_cuda.cpp, built with the CUDA backend only).
int run_timeline_cuda(const Config& c, bool backward, std::ostream& os);

struct DecodeArgs {
  std::string device = "auto";
  std::string dtype = "auto";       // f32 on cpu, bf16 on cuda
  std::vector<int64_t> batches;     // empty: the device's default sweep
  std::vector<std::string> caches;  // cache lengths in tokens, e.g. 4096 or 4K (K = 1024); empty: the default sweep
  int64_t heads = 32, heads_kv = 8, head_dim = 128;
  int64_t page_size = 0;            // --paged: page size of a paged cache; 0 = contiguous
  int splits = 0;                   // 0 = the library's choice
  bool append = false;              // each call also appends one new token (cache_seqlens = len - 1)
  bool pages_in_order = false;      // --pages-in-order: a paged cache's block table 0, 1, 2, ... (else shuffled)
  bool heads_first = false;         // --heads-first: each KV head's rows contiguous ((B, Hkv, N, d) or (pages, Hkv, P, d))
  std::string flush = "read";       // before each timed call, read (or write) twice the last-level cache / L2
  double queue_us = 200;            // CUDA: a GPU wait of this many µs queued before each timed call (0 = none)
  int reps = 10;
  int check_rows = 4;               // sampled (sequence, head) rows checked against float64 (0 = off)
  bool json = false;
  bool progress = true;             // a line per shape on stderr while a sweep of several shapes runs
};
int run_decode(const DecodeArgs& a, std::ostream& os);
// The CUDA pieces of run_decode (tools/decode_cuda.cu, built with the CUDA backend only): bytes per
// second of a read-only kernel streaming `bytes` of device memory (best of `reps` after a warm-up),
// and `count` N(0, 1) values in dtype written to device memory by a counter-based generator keyed by seed.
double cuda_read_bandwidth(size_t bytes, int reps);
void cuda_fill_normal(void* data, DType dtype, size_t count, uint64_t seed);
void cuda_read_flush(const void* data, size_t bytes);  // one read of every byte, on the default stream
void cuda_queue_wait(double us);                       // a one-thread kernel that waits `us` µs, default stream

// Parsing helpers shared by the subcommands; throw Error naming the option.
Device parse_device(const std::string& s);
DType parse_dtype(const std::string& s, Device device);

}  // namespace flashattn::tools
