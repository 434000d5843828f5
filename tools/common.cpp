#include "common.hpp"

#include "core/scratch.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

#include "commands.hpp"
#include "core/check.hpp"
#include "core/dtype.hpp"
#include "cpu/reference.hpp"

#if defined(FLASHATTN_TOOLS_CUDA)
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#endif

namespace flashattn::tools {

std::string Config::label() const {
  std::ostringstream os;
  os << to_string(dtype) << " d" << head_dim << (causal ? " causal" : " full") << " B=" << batch << " H=" << heads;
  if (heads_kv != heads) os << "/" << heads_kv;
  os << " N=" << seqlen_q;
  if (seqlen_k != seqlen_q) os << "x" << seqlen_k;
  if (window_left >= 0) os << " window " << window_left;
  return os.str();
}

// The subcommands' --device and --dtype (declared in commands.hpp); in this library, not in main.cpp,
// so that the tests can run the subcommands.
Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu;
  if (s == "cuda") {
    if (!cuda_available()) throw Error("flashattn: --device: expected a device present in this build and machine, got cuda (" + build_info() + ")");
    return Device::cuda;
  }
  if (s == "auto") return cuda_available() ? Device::cuda : Device::cpu;
  throw Error("flashattn: --device: expected cpu, cuda or auto, got " + s);
}

DType parse_dtype(const std::string& s, Device device) {
  if (s == "f32" || s == "fp32" || s == "float32") return DType::f32;
  if (s == "f16" || s == "fp16" || s == "float16") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "auto") return device == Device::cpu ? DType::f32 : DType::bf16;
  throw Error("flashattn: --dtype: expected f32, f16, bf16 or auto, got " + s);
}

double forward_flops(const Config& c) {
  const double full = 4.0 * double(c.batch) * double(c.heads) * double(c.seqlen_q) * double(c.seqlen_k) *
                      double(c.head_dim);
  if (c.window_left < 0) return c.causal ? full / 2 : full;
  double pairs = 0;  // bottom-right alignment: row i's diagonal key is i + Nk - Nq
  for (int64_t i = 0; i < c.seqlen_q; ++i) {
    const int64_t diag = i + c.seqlen_k - c.seqlen_q;
    const int64_t lo = std::max<int64_t>(0, diag - c.window_left);
    const int64_t hi = c.causal ? std::min<int64_t>(c.seqlen_k - 1, diag) : c.seqlen_k - 1;
    if (hi >= lo) pairs += double(hi - lo + 1);
  }
  return 4.0 * double(c.batch) * double(c.heads) * pairs * double(c.head_dim);
}

#if defined(FLASHATTN_TOOLS_CUDA)
static void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("flashattn tools: ") + what + ": " + cudaGetErrorString(e));
}
#endif

Buffer::Buffer(Device device, size_t bytes) : device_(device), bytes_(bytes) {
  const size_t n = std::max<size_t>(bytes, 64);
  if (device == Device::cpu) {
    data_ = std::aligned_alloc(64, (n + 63) / 64 * 64);
    if (!data_) throw std::bad_alloc();
  } else {
#if defined(FLASHATTN_TOOLS_CUDA)
    cuda_check(cudaMalloc(&data_, n), "cudaMalloc");
#else
    throw Error("flashattn tools: device cuda: this build has no CUDA backend");
#endif
  }
}
Buffer::Buffer(Buffer&& o) noexcept : device_(o.device_), data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  std::swap(device_, o.device_);
  std::swap(data_, o.data_);
  std::swap(bytes_, o.bytes_);
  return *this;
}
Buffer::~Buffer() {
  if (!data_) return;
  if (device_ == Device::cpu) std::free(data_);
#if defined(FLASHATTN_TOOLS_CUDA)
  else cudaFree(data_);
#endif
}
void Buffer::upload(const void* host, size_t bytes) {
  if (device_ == Device::cpu) { std::memcpy(data_, host, bytes); return; }
#if defined(FLASHATTN_TOOLS_CUDA)
  cuda_check(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
#endif
}
void Buffer::download(void* host, size_t bytes) const {
  if (device_ == Device::cpu) { std::memcpy(host, data_, bytes); return; }
#if defined(FLASHATTN_TOOLS_CUDA)
  cuda_check(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
#endif
}
void Buffer::fill_bytes(uint8_t value) {
  if (device_ == Device::cpu) { std::memset(data_, value, bytes_); return; }
#if defined(FLASHATTN_TOOLS_CUDA)
  cuda_check(cudaMemset(data_, value, bytes_), "cudaMemset");
#endif
}

void device_synchronize(Device device) {
#if defined(FLASHATTN_TOOLS_CUDA)
  if (device == Device::cuda) cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
  (void)device;
#endif
}

void fill_random(void* host, DType dtype, size_t count, std::mt19937_64& rng, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  for (size_t i = 0; i < count; ++i) detail::store_from_float(host, int64_t(i), dtype, dist(rng));
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    if (start != std::string::npos) return line.substr(start);
  }
  return "unknown CPU";
}

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

Problem::Problem(const Config& c, bool backward, uint64_t seed) : cfg(c) {
  const size_t e = element_size(c.dtype);
  const size_t nq = size_t(c.batch * c.seqlen_q * c.heads * c.head_dim);
  const size_t nk = size_t(c.batch * c.seqlen_k * c.heads_kv * c.head_dim);
  const size_t nl = size_t(c.batch * c.heads * c.seqlen_q);
  std::mt19937_64 rng(seed);
  auto make_input = [&](size_t count) {
    std::vector<uint8_t> host(count * e);
    fill_random(host.data(), c.dtype, count, rng);
    Buffer b(c.device, count * e);
    b.upload(host.data(), host.size());
    return b;
  };
  q = make_input(nq);
  k = make_input(nk);
  v = make_input(nk);
  out = Buffer(c.device, nq * e);
  out.fill_bytes(0xff);  // NaN poison
  lse = Buffer(c.device, nl * 4);
  lse.fill_bytes(0xff);
  tq = make_tensor(q.data(), c.dtype, {c.batch, c.seqlen_q, c.heads, c.head_dim}, c.device);
  tk = make_tensor(k.data(), c.dtype, {c.batch, c.seqlen_k, c.heads_kv, c.head_dim}, c.device);
  tv = make_tensor(v.data(), c.dtype, {c.batch, c.seqlen_k, c.heads_kv, c.head_dim}, c.device);
  tout = make_tensor(out.data(), c.dtype, {c.batch, c.seqlen_q, c.heads, c.head_dim}, c.device);
  tlse = make_tensor(lse.data(), DType::f32, {c.batch, c.heads, c.seqlen_q, 1}, c.device);
  if (backward) {
    dout = make_input(nq);
    dq = Buffer(c.device, nq * e);
    dk = Buffer(c.device, nk * e);
    dv = Buffer(c.device, nk * e);
    tdout = make_tensor(dout.data(), c.dtype, {c.batch, c.seqlen_q, c.heads, c.head_dim}, c.device);
    tdq = make_tensor(dq.data(), c.dtype, {c.batch, c.seqlen_q, c.heads, c.head_dim}, c.device);
    tdk = make_tensor(dk.data(), c.dtype, {c.batch, c.seqlen_k, c.heads_kv, c.head_dim}, c.device);
    tdv = make_tensor(dv.data(), c.dtype, {c.batch, c.seqlen_k, c.heads_kv, c.head_dim}, c.device);
  }
}

double time_ms(Device device, const std::function<void()>& fn, int warmup, int max_reps, double min_total_ms) {
  using clock = std::chrono::steady_clock;
  for (int i = 0; i < warmup; ++i) fn();
  device_synchronize(device);
  std::vector<double> times;
  double total = 0;
  while (int(times.size()) < max_reps && (times.size() < 3 || total < min_total_ms)) {
    const auto t0 = clock::now();
    fn();
    device_synchronize(device);
    const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    times.push_back(ms);
    total += ms;
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double forward_error_sampled(const Problem& pb, const Options& opt, int rows, uint64_t seed) {
  const Config& c = pb.cfg;
  // Host copies (the reference reads host memory).
  std::vector<uint8_t> q(pb.q.bytes()), k(pb.k.bytes()), v(pb.v.bytes()), out(pb.out.bytes());
  pb.q.download(q.data(), q.size());
  pb.k.download(k.data(), k.size());
  pb.v.download(v.data(), v.size());
  pb.out.download(out.data(), out.size());
  const Tensor hq = make_tensor(q.data(), c.dtype, pb.tq.shape), hk = make_tensor(k.data(), c.dtype, pb.tk.shape),
               hv = make_tensor(v.data(), c.dtype, pb.tv.shape), ho = make_tensor(out.data(), c.dtype, pb.tout.shape);
  Options o = opt;
  o.stream = nullptr;
  const detail::Params p = detail::check_forward(hq, hk, hv, ho, nullptr, o);
  std::mt19937_64 rng(seed);
  std::vector<double> ref(static_cast<size_t>(c.head_dim));
  double err = 0;
  for (int r = 0; r < rows; ++r) {
    const int64_t b = int64_t(rng() % uint64_t(c.batch)), h = int64_t(rng() % uint64_t(c.heads));
    const int64_t i = int64_t(rng() % uint64_t(c.seqlen_q));
    double lse;
    cpu::reference_row(p, b, h, i, ref.data(), &lse);
    for (int64_t col = 0; col < c.head_dim; ++col) {
      const double got = detail::load_as_float(out.data(), p.out.offset(b, i, h) + col, c.dtype);
      if (std::isnan(got)) return INFINITY;
      err = std::max(err, std::fabs(got - ref[size_t(col)]));
    }
  }
  return err;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) bytes /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, bytes < 10 ? "%.2f %s" : bytes < 100 ? "%.1f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

std::string strprintf(const char* fmt, ...) {
  va_list args, again;
  va_start(args, fmt);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string out(n > 0 ? size_t(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, again);
  va_end(again);
  return out;
}

std::string pad_right(const std::string& s, size_t width) {
  size_t shown = 0;
  for (const char ch : s) shown += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;  // not a continuation byte
  return shown >= width ? s : s + std::string(width - shown, ' ');
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20)
          out += strprintf("\\u%04x", unsigned(static_cast<unsigned char>(ch)));
        else
          out += ch;
    }
  }
  return out + "\"";
}

namespace {
// The shortest decimal that parses back to x (std::to_chars without a precision: fixed or
// scientific, whichever is shorter). x must be finite.
std::string shortest_round_trip(double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  if (r.ec != std::errc()) return strprintf("%.17g", x);  // not reached: 64 bytes hold any double
  return std::string(buf, r.ptr);
}
}  // namespace

std::string json_number(double x) { return std::isfinite(x) ? shortest_round_trip(x) : "null"; }

std::string csv_number(double x) { return std::isfinite(x) ? shortest_round_trip(x) : std::string(); }

std::string csv_field(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"') out += '"';
    out += ch == '\n' ? ' ' : ch;
  }
  return out + "\"";
}

void external_profiler_start() {
#if defined(FLASHATTN_TOOLS_CUDA)
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cuda_check(cudaProfilerStart(), "cudaProfilerStart");
#else
  throw Error("flashattn tools: an external profiler range needs the CUDA backend, which this build lacks");
#endif
}

void external_profiler_stop() {
#if defined(FLASHATTN_TOOLS_CUDA)
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cuda_check(cudaProfilerStop(), "cudaProfilerStop");
#endif
}

double peak_scratch_during(Device device, const std::function<void()>& fn) {
  detail::ScratchCounter& counter =
      device == Device::cpu ? detail::host_scratch_counter() : detail::device_scratch_counter();
  detail::reset_scratch_peak(counter);
  const int64_t before = counter.current.load();
  fn();
  return double(detail::scratch_peak(counter) - before);
}

}  // namespace flashattn::tools
