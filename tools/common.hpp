// Shared pieces of the flashattn program: buffers on either device, random inputs, timing,
// error against the float64 reference on sampled rows, FLOP counts.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace flashattn::tools {

// One attention problem as the program describes it.
struct Config {
  Device device = Device::cpu;
  DType dtype = DType::f32;
  int64_t batch = 1, heads = 8, heads_kv = 8, seqlen_q = 1024, seqlen_k = 1024, head_dim = 64;
  bool causal = false;
  int window_left = -1;  // >= 0: a sliding window of that many keys left of each query's diagonal
  std::string label() const;  // e.g. "f32 d64 causal B=1 H=8 N=4096"
};

// FLOPs by the field's convention: forward 4·B·H·Nq·Nk·d, halved for causal (Nq == Nk); with a
// window, 4·B·H·d times the visible (query, key) pairs, counted; backward 2.5× forward.
double forward_flops(const Config& c);
inline double backward_flops(const Config& c) { return 2.5 * forward_flops(c); }

// An owning buffer on the host or a CUDA device.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device device, size_t bytes);
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  ~Buffer();
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  void fill_bytes(uint8_t value);

 private:
  Device device_ = Device::cpu;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// The tensors of one problem, densely packed, with fresh random inputs (normal, never zeros).
struct Problem {
  Config cfg;
  Buffer q, k, v, out, lse, dout, dq, dk, dv;
  Tensor tq, tk, tv, tout, tlse, tdout, tdq, tdk, tdv;
  Problem(const Config& c, bool backward, uint64_t seed);
};

// Median wall time in ms of fn() (synchronized on CUDA) after `warmup` runs; repeats until
// `min_total_ms` has passed or `max_reps` runs.
// Peak of the library's counted scratch (host for the CPU backend, device for CUDA) above what was
// held before, over fn(): the extra memory the calls inside fn needed.
double peak_scratch_during(Device device, const std::function<void()>& fn);

double time_ms(Device device, const std::function<void()>& fn, int warmup = 1, int max_reps = 20,
               double min_total_ms = 300);

// Max |out - ref| over `rows` sampled (batch, head, query) rows of the problem's forward output.
double forward_error_sampled(const Problem& pb, const Options& opt, int rows, uint64_t seed);

// The bound the program's own spot checks hold the sampled error to: a sanity check of what it
// runs and times (outputs of N(0,1) inputs have magnitude < 1), not the test suite's rule.
inline double sampled_error_bound(DType t) { return t == DType::f32 ? 1e-4 : t == DType::f16 ? 5e-3 : 4e-2; }

// Fills host memory with N(0,1) values stored in dtype.
void fill_random(void* host, DType dtype, size_t count, std::mt19937_64& rng, float stddev = 1.0f);

std::string human_bytes(double bytes);
// printf into a std::string (the subcommands write to a std::ostream that tests can capture).
std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// s padded with spaces to `width` characters as a terminal shows them (UTF-8: ᵀ, ∘, − are one
// character but several bytes, which printf's %-Ns would count).
std::string pad_right(const std::string& s, size_t width);
// A JSON string literal (quotes included) of s.
std::string json_string(const std::string& s);
// x as a JSON number that reads back as the same double: the shortest decimal form that
// round-trips (std::to_chars), e.g. 0.5, 1000, 0.1, 1.3680347067153985, 1e+300. JSON has no
// infinities or NaN: -inf, inf and NaN are written as null (every --json output of the program
// follows this rule).
std::string json_number(double x);
// x as a CSV number, the same shortest round-trip form; empty for -inf, inf and NaN.
std::string csv_number(double x);
// A CSV field (RFC 4180: quoted, inner quotes doubled) of s.
std::string csv_field(const std::string& s);

// Around one call that Nsight Compute should profile (ncu --profile-from-start off):
// cudaProfilerStart / cudaProfilerStop. Throw Error in a build without CUDA.
void external_profiler_start();
void external_profiler_stop();
// The CPU's model name as /proc/cpuinfo gives it ("model name"; "unknown CPU" where it has none).
std::string cpu_model_name();
uint64_t fresh_seed();
void device_synchronize(Device device);

}  // namespace flashattn::tools
