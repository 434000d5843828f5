// flashattn decode: the serving benchmark. For a sweep of batch × cache length, one query token per
// sequence attends to its whole KV cache through forward_kvcache (the decoding step of a served
// model). Each row gives the time, the KV bytes read per second (2·B·len·Hkv·d·element size) and,
// the headline, that rate as a fraction of this machine's read bandwidth, which the program
// measures itself (CPU: all OpenMP threads loading every cache line of a buffer well past the
// last-level cache; CUDA: a read-only kernel over a large device buffer, tools/decode_cuda.cu);
// then the split count and the max error of sampled rows against a float64 softmax computed from
// the cache contents. --json: one array, an object per row, numbers as json_number writes them.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <vector>

#include "commands.hpp"
#include "core/dtype.hpp"
#include "cpu/isa.hpp"
#include "flashattn/kvcache.hpp"

#if defined(FLASHATTN_TOOLS_CUDA)
#include <cuda_runtime.h>
#endif

namespace flashattn::tools {
namespace {

#if defined(FLASHATTN_TOOLS_CUDA)
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw Error(std::string("flashattn decode: ") + what + ": " + cudaGetErrorString(e));
  }
}
#endif

[[noreturn]] void fail(const std::string& option, const std::string& expected, const std::string& got) {
  throw Error("flashattn decode: " + option + ": expected " + expected + ", got " + got);
}

// A cache length as given on the command line: digits, optionally followed by K (×1024) or M (×1024²).
int64_t parse_tokens(const std::string& s) {
  const std::string expected = "token counts from 1 to 2147483647 such as 4096 or 32K (K = 1024)";
  int64_t v = 0;
  size_t i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    v = v * 10 + (s[i] - '0');
    if (v > std::numeric_limits<int32_t>::max()) fail("--cache", expected, s);
  }
  if (i == 0) fail("--cache", expected, s.empty() ? "an empty value" : s);
  if (i < s.size()) {
    const char unit = s[i++];
    if (unit == 'K' || unit == 'k') v *= 1024;
    else if (unit == 'M' || unit == 'm') v *= 1024 * 1024;
    else fail("--cache", expected, s);
  }
  if (i != s.size() || v < 1 || v > std::numeric_limits<int32_t>::max()) fail("--cache", expected, s);
  return v;
}

std::string tokens_label(int64_t n) {
  if (n % (1024 * 1024) == 0) return std::to_string(n / (1024 * 1024)) + "M";
  if (n % 1024 == 0) return std::to_string(n / 1024) + "K";
  return std::to_string(n);
}

struct Shape {
  int64_t batch, len;
};

// The shapes to run: --batch × --cache, or the device's default sweep: on a GPU every batch of
// 1, 8, 64 over 1K … 128K tokens (the largest, 64 × 128K bf16, is 34 GB of KV); on a CPU what runs
// in about a minute on a few cores, B 1 over 4K, 32K and 128K tokens, and B 8 over 4K.
std::vector<Shape> sweep(const DecodeArgs& a, Device device) {
  std::vector<int64_t> lens;
  for (const std::string& s : a.caches) lens.push_back(parse_tokens(s));
  for (int64_t b : a.batches)
    if (b < 1) fail("--batch", "values >= 1", std::to_string(b));
  const bool gpu = device == Device::cuda;
  if (a.batches.empty() && lens.empty() && !gpu) return {{1, 4096}, {1, 32768}, {1, 131072}, {8, 4096}};
  std::vector<int64_t> batches = a.batches;
  if (batches.empty()) batches = gpu ? std::vector<int64_t>{1, 8, 64} : std::vector<int64_t>{1};
  if (lens.empty()) {
    if (gpu)
      for (int64_t n = 1024; n <= 131072; n *= 2) lens.push_back(n);
    else
      lens = {4096, 32768, 131072};
  }
  std::vector<Shape> out;
  for (int64_t b : batches)
    for (int64_t n : lens) out.push_back({b, n});
  return out;
}

// Bytes of host memory the program may still take: MemAvailable (/proc/meminfo), else the free pages.
double host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return double(sysconf(_SC_AVPHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
}

// The last-level cache as the C library reports it (L3, else L2; 32 MiB if it reports neither).
size_t last_level_cache_bytes() {
  long bytes = 0;
#if defined(_SC_LEVEL3_CACHE_SIZE)
  bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (bytes <= 0) bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return bytes > 0 ? size_t(bytes) : size_t(32) << 20;
}

// Copies bytes [offset, offset + bytes) of buf to host memory.
void copy_to_host(const Buffer& buf, size_t offset, void* host, size_t bytes) {
  const char* src = static_cast<const char*>(buf.data()) + offset;
  if (buf.device() == Device::cpu) {
    std::memcpy(host, src, bytes);
    return;
  }
#if defined(FLASHATTN_TOOLS_CUDA)
  cuda_check(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
#endif
}

// count N(0, 1) values in dtype over buf: on the CPU in parallel (one generator per 1 Mi-element
// block, so the first touch of each page is by the thread that fills it), on CUDA by a kernel.
void fill_normal(Buffer& buf, DType dtype, size_t count, uint64_t seed) {
  if (buf.device() == Device::cuda) {
#if defined(FLASHATTN_TOOLS_CUDA)
    cuda_fill_normal(buf.data(), dtype, count, seed);
#endif
    return;
  }
  const size_t block = size_t(1) << 20, e = element_size(dtype);
  const int64_t blocks = int64_t((count + block - 1) / block);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < blocks; ++i) {
    std::mt19937_64 rng(seed + 0x9E3779B97F4A7C15ull * uint64_t(i + 1));
    fill_random(static_cast<char*>(buf.data()) + size_t(i) * block * e, dtype,
                std::min(block, count - size_t(i) * block), rng);
  }
}

// The sink of the CPU read loop: its sum is stored, so the loads cannot be dropped.
volatile uint64_t g_read_sink = 0;

struct ReadBandwidth {
  double bytes_per_s = 0;
  std::string method;  // how it was measured, in words
};

// CPU: bytes per second that all OpenMP threads read from memory. The buffer is at least 8× the
// last-level cache (1 GiB at least), so that no replacement policy keeps a useful part of it
// between passes; it goes out in 4 MiB blocks as threads come free (as the library hands out its
// decode work items), so that a thread the system holds back does not hold up the rest. Each
// 64-byte line is loaded once, which moves the whole line from memory: summing every word would
// measure the cores' adds instead (16 threads of the H200 machine's Xeon: about 145 against 105
// GB/s). Best pass of at least 5 over at least a second.
ReadBandwidth cpu_read_bandwidth() {
  const size_t block = size_t(4) << 20, per_block = block / sizeof(uint64_t);
  size_t bytes = std::max(size_t(1) << 30, 8 * last_level_cache_bytes());
  bytes = std::max(block, std::min(bytes, size_t(host_available_bytes() / 4)) / block * block);
  const int64_t blocks = int64_t(bytes / block);
  Buffer buf(Device::cpu, bytes);
  auto* p = static_cast<uint64_t*>(buf.data());
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < bytes / sizeof(uint64_t); ++i) p[i] = i;
  double best = 0, total = 0;
  uint64_t sink = 0;
  int passes = 0;
  for (; passes < 50 && (passes < 5 || total < 1.0); ++passes) {
    uint64_t sum = 0;
    const double t0 = omp_get_wtime();
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : sum)
    for (int64_t b = 0; b < blocks; ++b) {
      const uint64_t* q = p + size_t(b) * per_block;
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;  // one word of each 64-byte line, four lines in flight
      for (size_t i = 0; i < per_block; i += 32) s0 += q[i], s1 += q[i + 8], s2 += q[i + 16], s3 += q[i + 24];
      sum += s0 + s1 + s2 + s3;
    }
    const double seconds = omp_get_wtime() - t0;
    best = std::max(best, double(bytes) / seconds);
    total += seconds;
    sink += sum;
  }
  g_read_sink = sink;
  return {best, strprintf("%d threads loading each 64-byte line of %s, best of %d passes", omp_get_max_threads(),
                          human_bytes(double(bytes)).c_str(), passes)};
}

// What the program prints about the machine: its name (CPU model or GPU), and the rest of the header.
struct Machine {
  std::string name, header;
  size_t flush_bytes = 0;  // passed over before every timed call: twice the last-level cache (CPU) or the L2 (GPU)
  std::string flush_what;
};

Machine describe(Device device) {
  Machine m;
  if (device == Device::cpu) {
    m.name = cpu_model_name();
    m.header = strprintf("cpu (%s, %d threads, %s kernels)", m.name.c_str(), omp_get_max_threads(), cpu::isa_name());
    m.flush_bytes = 2 * last_level_cache_bytes();
    m.flush_what = "twice the last-level cache";
    return m;
  }
#if defined(FLASHATTN_TOOLS_CUDA)
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  m.name = prop.name;
  m.header = strprintf("cuda (%s, %d SMs, sm_%d%d)", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
  m.flush_bytes = 2 * size_t(std::max(prop.l2CacheSize, 1 << 20));
  m.flush_what = "twice the L2";
#endif
  return m;
}

double device_available_bytes(Device device) {
  if (device == Device::cpu) return host_available_bytes();
#if defined(FLASHATTN_TOOLS_CUDA)
  size_t free_bytes = 0, total = 0;
  cuda_check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  return double(free_bytes);
#else
  return 0;
#endif
}

struct Dims {
  DType dtype;
  Device device;
  int64_t heads, heads_kv, head_dim, page_size;  // page_size 0: contiguous
  bool append;
  bool pages_in_order;
  bool heads_first;  // each KV head's rows contiguous in a batch row or page
};

// One shape's buffers on the device: q (B, 1, H, d) and the cache, fresh N(0, 1) values; out
// poisoned with NaN; cache_seqlens = len (len − 1 with --append, the new token making it len);
// a paged cache has each sequence's ⌈len / P⌉ pages drawn from a random permutation of all pages
// (--pages-in-order: sequence b's pages are b·⌈len / P⌉, +1, ...).
struct Case {
  int64_t batch = 0, len = 0, pages_per_seq = 0;
  Buffer q, out, k, v, k_new, v_new, seqlens, block_table;
  Tensor tq{}, tout{}, tk_new{}, tv_new{};
  KVCache cache{};
  std::vector<int32_t> table;  // host copy of the block table
  size_t seq_bytes = 0;        // one sequence's share of k (or v), one KV head included

  Case(const Dims& d, const Shape& s, uint64_t seed) : batch(s.batch), len(s.len) {
    const size_t e = element_size(d.dtype);
    const int64_t rows_per_seq = d.page_size > 0 ? (s.len + d.page_size - 1) / d.page_size * d.page_size : s.len;
    pages_per_seq = d.page_size > 0 ? rows_per_seq / d.page_size : 0;
    const size_t kv_count = size_t(s.batch * rows_per_seq * d.heads_kv * d.head_dim);
    seq_bytes = size_t(rows_per_seq * d.heads_kv * d.head_dim) * e;
    std::mt19937_64 rng(seed);
    const size_t q_count = size_t(s.batch * d.heads * d.head_dim);
    std::vector<uint8_t> host(q_count * e);
    fill_random(host.data(), d.dtype, q_count, rng);
    q = Buffer(d.device, host.size());
    q.upload(host.data(), host.size());
    out = Buffer(d.device, host.size());
    out.fill_bytes(0xff);
    k = Buffer(d.device, kv_count * e);
    v = Buffer(d.device, kv_count * e);
    fill_normal(k, d.dtype, kv_count, rng());
    fill_normal(v, d.dtype, kv_count, rng());
    tq = make_tensor(q.data(), d.dtype, {s.batch, 1, d.heads, d.head_dim}, d.device);
    tout = make_tensor(out.data(), d.dtype, {s.batch, 1, d.heads, d.head_dim}, d.device);
    if (d.page_size > 0) {
      const int64_t pages = s.batch * pages_per_seq;
      table.resize(size_t(pages));
      std::iota(table.begin(), table.end(), 0);
      if (!d.pages_in_order) std::shuffle(table.begin(), table.end(), rng);
      block_table = Buffer(d.device, table.size() * sizeof(int32_t));
      block_table.upload(table.data(), table.size() * sizeof(int32_t));
      cache.k = cache_view(k, d, pages, d.page_size);
      cache.v = cache_view(v, d, pages, d.page_size);
      cache.block_table = static_cast<const int32_t*>(block_table.data());
      cache.max_pages = pages_per_seq;
    } else {
      cache.k = cache_view(k, d, s.batch, s.len);
      cache.v = cache_view(v, d, s.batch, s.len);
    }
    const std::vector<int32_t> lens(size_t(s.batch), int32_t(d.append ? s.len - 1 : s.len));
    seqlens = Buffer(d.device, lens.size() * sizeof(int32_t));
    seqlens.upload(lens.data(), lens.size() * sizeof(int32_t));
    cache.seqlens = static_cast<const int32_t*>(seqlens.data());
    if (d.append) {
      const size_t new_count = size_t(s.batch * d.heads_kv * d.head_dim);
      k_new = Buffer(d.device, new_count * e);
      v_new = Buffer(d.device, new_count * e);
      fill_normal(k_new, d.dtype, new_count, rng());
      fill_normal(v_new, d.dtype, new_count, rng());
      tk_new = make_tensor(k_new.data(), d.dtype, {s.batch, 1, d.heads_kv, d.head_dim}, d.device);
      tv_new = make_tensor(v_new.data(), d.dtype, {s.batch, 1, d.heads_kv, d.head_dim}, d.device);
    }
  }

  // The (outer, rows, Hkv, d) cache over `kv`: densely packed tokens first, or heads first (each
  // outer entry (Hkv, rows, d) in memory).
  static Tensor cache_view(const Buffer& kv, const Dims& d, int64_t outer, int64_t rows) {
    Tensor t = make_tensor(kv.data(), d.dtype, {outer, rows, d.heads_kv, d.head_dim}, d.device);
    if (d.heads_first) t.strides = {rows * d.heads_kv * d.head_dim, d.head_dim, rows * d.head_dim, 1};
    return t;
  }

  // Sequence b's keys or values as the cache holds them, copied to host memory in token order:
  // (tokens, Hkv, d), the pages of a paged cache gathered and a heads-first layout transposed.
  std::vector<uint8_t> sequence(const Buffer& kv, int64_t b, const Dims& d) const {
    std::vector<uint8_t> host(seq_bytes);
    const int64_t blocks = d.page_size == 0 ? 1 : pages_per_seq;  // batch row or pages
    const size_t block_bytes = seq_bytes / size_t(blocks);
    for (int64_t i = 0; i < blocks; ++i) {
      const size_t from = d.page_size == 0 ? size_t(b) : size_t(table[size_t(b * pages_per_seq + i)]);
      copy_to_host(kv, from * block_bytes, host.data() + size_t(i) * block_bytes, block_bytes);
    }
    if (d.heads_first) {  // each block (Hkv, rows, d) -> (rows, Hkv, d)
      const size_t e = element_size(d.dtype), row = size_t(d.head_dim) * e;
      const int64_t rows = int64_t(block_bytes / (size_t(d.heads_kv) * row));
      std::vector<uint8_t> block(block_bytes);
      for (int64_t i = 0; i < blocks; ++i) {
        uint8_t* p = host.data() + size_t(i) * block_bytes;
        std::copy(p, p + block_bytes, block.begin());
        for (int64_t h = 0; h < d.heads_kv; ++h)
          for (int64_t t = 0; t < rows; ++t)
            std::copy_n(block.begin() + std::ptrdiff_t((h * rows + t) * int64_t(row)), row, p + (t * d.heads_kv + h) * int64_t(row));
      }
    }
    return host;
  }
};

// Max |out − ref| over `rows` sampled (sequence, head) pairs, the reference in double from the
// cache as the call read it (its append included): s_j = scale·q·k_j over the len cached tokens,
// ref = Σ softmax(s)_j v_j. NaN in the output counts as an infinite error.
double sampled_error(const Case& c, const Dims& d, int rows, uint64_t seed) {
  const int64_t H = d.heads, D = d.head_dim, G = d.heads / d.heads_kv;
  std::vector<uint8_t> q(c.q.bytes()), out(c.out.bytes());
  copy_to_host(c.q, 0, q.data(), q.size());
  copy_to_host(c.out, 0, out.data(), out.size());
  std::mt19937_64 rng(seed);
  std::vector<std::pair<int64_t, int64_t>> picks;  // (sequence, head), by sequence so that each is gathered once
  for (int r = 0; r < rows; ++r) picks.emplace_back(int64_t(rng() % uint64_t(c.batch)), int64_t(rng() % uint64_t(H)));
  std::sort(picks.begin(), picks.end());
  const double scale = double(float(1.0 / std::sqrt(double(D))));  // the library's default, in float
  auto at = [&](const std::vector<uint8_t>& buf, int64_t i) { return double(detail::load_as_float(buf.data(), i, d.dtype)); };
  std::vector<uint8_t> kh, vh;
  std::vector<double> qd(static_cast<size_t>(D)), s(static_cast<size_t>(c.len)), acc(static_cast<size_t>(D));
  double err = 0;
  int64_t loaded = -1;
  for (const auto& [b, h] : picks) {
    if (b != loaded) {
      kh = c.sequence(c.k, b, d);
      vh = c.sequence(c.v, b, d);
      loaded = b;
    }
    const int64_t hkv = h / G;
    for (int64_t col = 0; col < D; ++col) qd[size_t(col)] = at(q, (b * H + h) * D + col);
    double row_max = -INFINITY;
    for (int64_t t = 0; t < c.len; ++t) {
      const int64_t base = (t * d.heads_kv + hkv) * D;
      double dot = 0;
      for (int64_t col = 0; col < D; ++col) dot += qd[size_t(col)] * at(kh, base + col);
      s[size_t(t)] = scale * dot;
      row_max = std::max(row_max, s[size_t(t)]);
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    double row_sum = 0;
    for (int64_t t = 0; t < c.len; ++t) {
      const double p = std::exp(s[size_t(t)] - row_max);
      row_sum += p;
      const int64_t base = (t * d.heads_kv + hkv) * D;
      for (int64_t col = 0; col < D; ++col) acc[size_t(col)] += p * at(vh, base + col);
    }
    for (int64_t col = 0; col < D; ++col) {
      const double got = at(out, (b * H + h) * D + col);
      if (std::isnan(got)) return INFINITY;
      err = std::max(err, std::fabs(got - acc[size_t(col)] / row_sum));
    }
  }
  return err;
}

volatile uint64_t flush_sink = 0;  // keeps the CPU read pass

// Median ms of `reps` calls (after the caller's warm-up), each after a pass over `flush` (read, or
// written with `write_flush`), so that every call finds the caches cold, as a decoding step does once
// the other layers' weights and caches have passed through. A read pass leaves clean lines; a write
// pass leaves the cache full of dirty ones, whose write-backs then overlap the timed call; an empty
// `flush` (--flush none) leaves each call the lines of the one before (what the call costs with its
// code and, where it fits, its cache in the L2). CPU: wall
// time around the call; CUDA: events on the default stream around it, after a wait of queue_us
// queued behind the flush, so that the host's work for the call overlaps that wait instead of
// leaving the GPU idle between the events.
double time_calls(Device device, const std::function<void()>& call, int reps, Buffer& flush, bool write_flush,
                  double queue_us) {
  std::vector<double> times;
  if (device == Device::cpu) {
    char* f = static_cast<char*>(flush.data());
    const size_t bytes = flush.bytes();
    for (int r = 0; r < reps; ++r) {
      uint64_t folded = 0;
#pragma omp parallel reduction(^ : folded) if (bytes > 0)  // none: one thread, no bytes
      {
        const size_t n = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num()), chunk = bytes / n;
        char* mine = f + t * chunk;
        const size_t len = t + 1 == n ? bytes - t * chunk : chunk;
        if (len == 0) {
        } else if (write_flush) {
          std::memset(mine, r & 0xff, len);
        } else {
          for (size_t i = 0; i + 8 <= len; i += 64) {  // one word per 64-byte line
            uint64_t w;
            std::memcpy(&w, mine + i, 8);
            folded ^= w;
          }
        }
      }
      flush_sink = folded;
      const auto t0 = std::chrono::steady_clock::now();
      call();
      times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  } else {
#if defined(FLASHATTN_TOOLS_CUDA)
    cudaEvent_t begin = nullptr, end = nullptr;
    cuda_check(cudaEventCreate(&begin), "cudaEventCreate");
    cuda_check(cudaEventCreate(&end), "cudaEventCreate");
    try {
      for (int r = 0; r < reps; ++r) {
        if (flush.bytes() == 0) {
        } else if (write_flush) {
          cuda_check(cudaMemsetAsync(flush.data(), r & 0xff, flush.bytes(), nullptr), "cudaMemsetAsync");
        } else {
          cuda_read_flush(flush.data(), flush.bytes());
        }
        if (queue_us > 0) cuda_queue_wait(queue_us);
        cuda_check(cudaEventRecord(begin, nullptr), "cudaEventRecord");
        call();
        cuda_check(cudaEventRecord(end, nullptr), "cudaEventRecord");
        cuda_check(cudaEventSynchronize(end), "cudaEventSynchronize");
        float ms = 0;
        cuda_check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
        times.push_back(ms);
      }
    } catch (...) {
      cudaEventDestroy(begin);
      cudaEventDestroy(end);
      throw;
    }
    cudaEventDestroy(begin);
    cudaEventDestroy(end);
#endif
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int run_decode(const DecodeArgs& a, std::ostream& os) {
  const Device device = parse_device(a.device);
  Dims d{parse_dtype(a.dtype, device), device, a.heads, a.heads_kv, a.head_dim, a.page_size, a.append, a.pages_in_order,
         a.heads_first};
  if (a.heads < 1) fail("--heads", ">= 1", std::to_string(a.heads));
  if (a.heads_kv < 1 || a.heads % a.heads_kv != 0)
    fail("--heads-kv", "a divisor of --heads " + std::to_string(a.heads), std::to_string(a.heads_kv));
  if (a.head_dim < 1 || a.head_dim > 256) fail("--head-dim", "1..256", std::to_string(a.head_dim));
  if (a.page_size < 0) fail("--paged", "a page size >= 1 (or 0: a contiguous cache)", std::to_string(a.page_size));
  if (a.splits < 0) fail("--splits", "0 (the library's choice) or >= 1", std::to_string(a.splits));
  if (a.reps < 1) fail("--reps", ">= 1", std::to_string(a.reps));
  if (a.check_rows < 0) fail("--check-rows", ">= 0", std::to_string(a.check_rows));
  if (device == Device::cuda && d.dtype == DType::f32)
    fail("--dtype", "f16 or bf16 on cuda (forward_kvcache's CUDA dtypes)", "f32");
  const std::vector<Shape> shapes = sweep(a, device);
  for (const Shape& s : shapes) {
    if (a.append && s.len < 2) fail("--cache", "lengths >= 2 with --append (one cached token and the new one)", "1");
    if (d.page_size > 0 && s.batch * ((s.len + d.page_size - 1) / d.page_size) > std::numeric_limits<int32_t>::max())
      fail("--paged", "a page size that keeps the page count of B " + std::to_string(s.batch) + " × " +
                          std::to_string(s.len) + " tokens within int32",
           std::to_string(d.page_size));
  }

  std::fprintf(stderr, "%s\n", build_info().c_str());  // what ran, on stderr (as flashattn bench)
  const Machine m = describe(device);
  ReadBandwidth bw;
  if (device == Device::cpu) {
    bw = cpu_read_bandwidth();
  } else {
#if defined(FLASHATTN_TOOLS_CUDA)
    size_t bytes = size_t(2) << 30;
    bytes = std::min(bytes, size_t(device_available_bytes(device) / 4)) / 4096 * 4096;
    bw.bytes_per_s = cuda_read_bandwidth(bytes, 10);
    bw.method = "a read-only kernel over " + human_bytes(double(bytes)) + " of device memory, best of 10";
#endif
  }
  Buffer flush(device, a.flush == "none" ? 0 : m.flush_bytes);
  if (flush.bytes() > 0) flush.fill_bytes(0);

  const size_t e = element_size(d.dtype);
  const bool gpu = device == Device::cuda;
  const std::string layout = (d.page_size > 0 ? "paged " + std::to_string(d.page_size) + (d.pages_in_order ? " (pages in order)" : "") : "contiguous") +
                             (d.heads_first ? ", heads first" : "");
  if (a.json) {
    os << "[\n";
  } else {
    os << strprintf("flashattn decode — %s, %s H=%lld/%lld d=%lld, one query token per sequence%s, %s cache\n",
                    m.header.c_str(), to_string(d.dtype), (long long)d.heads, (long long)d.heads_kv,
                    (long long)d.head_dim, a.append ? " appending one token" : "", layout.c_str());
    os << strprintf("read bandwidth measured now: %.1f GB/s (%s)\n\n", bw.bytes_per_s / 1e9, bw.method.c_str());
    os << strprintf("%5s %8s %11s %9s %11s %9s %7s  %s\n", "B", "cache", "of read BW", "GB/s", "time", "KV read",
                    "splits", a.check_rows > 0 ? "max_err" : "");
  }
  os.flush();  // before the progress lines on stderr
  const uint64_t seed = fresh_seed();
  bool first = true, ok = true;
  size_t index = 0;
  std::string unsupported;
  for (const Shape& s : shapes) {
    ++index;
    const double kv_bytes = 2.0 * double(s.batch) * double(s.len) * double(d.heads_kv) * double(d.head_dim) * double(e);
    const int64_t rows_per_seq = d.page_size > 0 ? (s.len + d.page_size - 1) / d.page_size * d.page_size : s.len;
    const double need = 2.0 * double(s.batch * rows_per_seq * d.heads_kv * d.head_dim) * double(e);
    if (a.progress && shapes.size() > 1)
      std::fprintf(stderr, "flashattn decode: %zu/%zu B=%lld cache=%s (%s of KV)\n", index, shapes.size(),
                   (long long)s.batch, tokens_label(s.len).c_str(), human_bytes(kv_bytes).c_str());
    std::string row = strprintf("{\"device\":\"%s\",\"machine\":%s,", to_string(device), json_string(m.name).c_str());
    if (!gpu) row += strprintf("\"threads\":%d,", omp_get_max_threads());
    row += strprintf("\"dtype\":\"%s\",\"batch\":%lld,\"seqlen_q\":1,\"cache_len\":%lld,\"heads\":%lld,\"heads_kv\":%lld,"
                     "\"head_dim\":%lld,\"layout\":\"%s\",\"page_size\":%lld,\"heads_first\":%s,\"append\":%s,\"flush\":\"%s\","
                     "\"queue_ahead_us\":%s,\"kv_bytes\":%s",
                     to_string(d.dtype), (long long)s.batch, (long long)s.len, (long long)d.heads,
                     (long long)d.heads_kv, (long long)d.head_dim, d.page_size > 0 ? "paged" : "contiguous",
                     (long long)d.page_size, d.heads_first ? "true" : "false", a.append ? "true" : "false",
                     a.flush.c_str(), json_number(gpu ? a.queue_us : 0.0).c_str(), json_number(kv_bytes).c_str());
    auto emit = [&](const std::string& json_tail, const std::string& table_line) {
      if (a.json) {
        os << (first ? "  " : ",\n  ") << row << json_tail << "}";
        first = false;
      } else {
        os << table_line << "\n";
      }
      os.flush();
    };
    const std::string shape_cols = strprintf("%5lld %8s", (long long)s.batch, tokens_label(s.len).c_str());
    const double available = device_available_bytes(device);
    if (need > 0.9 * available) {
      const std::string why = "needs " + human_bytes(need) + " of " + (gpu ? "device" : "host") + " memory, " +
                              human_bytes(available) + " available";
      emit(",\"skipped\":" + json_string(why), shape_cols + "  skipped: " + why);
      continue;
    }

    std::unique_ptr<Case> owned;
    try {
      owned = std::make_unique<Case>(d, s, seed + 0x51ED27ull * index);
    } catch (const std::exception& err) {  // the allocation failed after all (std::bad_alloc, or cudaMalloc's Error)
      const std::string why = "needs " + human_bytes(need) + ": " + err.what();
      emit(",\"skipped\":" + json_string(why), shape_cols + "  skipped: " + why);
      continue;
    }
    const Case& c = *owned;
    KVCacheOptions opt;
    opt.num_splits = a.splits;
    // A serving loop's configuration: the lengths checked by a kernel on the stream, no
    // synchronizing copy to the host per call (KVCacheOptions::check_on_device).
    opt.check_on_device = gpu;
    if (a.append) {
      opt.k_new = &c.tk_new;
      opt.v_new = &c.tv_new;
    }
    auto call = [&] { forward_kvcache(c.tq, c.cache, c.tout, nullptr, opt); };
    try {
      call();  // warm-up
      device_synchronize(device);
    } catch (const Error& err) {
      if (err.kind() != Error::Kind::unsupported) throw;
      unsupported = err.what();
      emit(",\"error\":" + json_string(unsupported), shape_cols + "  not run: " + unsupported);
      break;
    }
    const std::string path = last_kernel_path();
    const int splits = last_kvcache_splits();  // what the warm-up call used (shapes and thread count decide)
    const double ms = time_calls(device, call, a.reps, flush, a.flush == "write", a.queue_us);
    const double rate = kv_bytes / (ms * 1e-3), fraction = rate / bw.bytes_per_s;
    double err = NAN;
    const double tol = sampled_error_bound(d.dtype);
    if (a.check_rows > 0) err = sampled_error(c, d, a.check_rows, seed ^ uint64_t(index));
    const bool pass = a.check_rows == 0 || err <= tol;
    ok = ok && pass;
    std::string tail = strprintf(",\"num_splits_requested\":%d,\"num_splits\":%d,"
                                 "\"kernel_path\":%s,\"time_ms\":%s,\"kv_bytes_per_s\":%s,\"read_bw_bytes_per_s\":%s,"
                                 "\"read_bw_method\":%s,\"read_bw_fraction\":%s",
                                 a.splits, splits,
                                 json_string(path).c_str(), json_number(ms).c_str(), json_number(rate).c_str(),
                                 json_number(bw.bytes_per_s).c_str(), json_string(bw.method).c_str(),
                                 json_number(fraction).c_str());
    if (a.check_rows > 0)
      tail += strprintf(",\"check_rows\":%d,\"max_err\":%s,\"ok\":%s", a.check_rows, json_number(err).c_str(),
                        pass ? "true" : "false");
    std::string line = strprintf("%s %10.0f%% %9.1f %8.3f ms %9s %7s", shape_cols.c_str(), 100 * fraction, rate / 1e9, ms,
                                 human_bytes(kv_bytes).c_str(), std::to_string(splits).c_str());
    if (a.check_rows > 0) line += strprintf("  %.1e [%s]", err, pass ? "ok" : "FAIL");
    emit(tail, line);
  }
  if (a.json) {
    os << "\n]\n";
  } else {
    if (!unsupported.empty() && index < shapes.size())
      os << strprintf("%zu more shape%s not run: forward_kvcache is not supported on this device in this build.\n",
                      shapes.size() - index, shapes.size() - index == 1 ? "" : "s");
    const std::string cold =
        a.flush == "none"
            ? std::string("with the caches as the call before left them (no flush)")
            : strprintf("each after %s %s over %s, so that it starts with the caches cold",
                        human_bytes(double(m.flush_bytes)).c_str(), a.flush == "write" ? "written" : "read",
                        m.flush_what.c_str());
    os << strprintf("\nof read BW: KV bytes read per second over the read bandwidth above; KV bytes = "
                    "2·B·cache·Hkv·d·%zu (%s). time: median of %d calls, %s%s.\n",
                    e, to_string(d.dtype), a.reps, cold.c_str(),
                    gpu && a.queue_us > 0
                        ? strprintf(", and after a %.0f µs GPU wait queued before each, so that the host's launch "
                                    "work overlaps it and the events time the GPU",
                                    a.queue_us).c_str()
                        : "");
    os << "splits: the key splits the call used (last_kvcache_splits(); --splits 0 lets the library choose).\n";
    if (a.check_rows > 0)
      os << strprintf("max_err: %d sampled (sequence, head) rows against a float64 softmax over the cache contents; "
                      "bound %.0e.\n",
                      a.check_rows, sampled_error_bound(d.dtype));
  }
  os.flush();
  return ok && unsupported.empty() ? 0 : 1;
}

}  // namespace flashattn::tools
