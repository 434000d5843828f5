// Concurrent callers are independent: eight std::threads call forward, backward (deterministic) and
// forward_kvcache at once, each on its own tensors, with different shapes, dtypes, layouts and
// options; every output (the whole backing storage of out, lse, the gradients and the caches, gaps
// included) is bitwise equal to the same call made alone on the main thread. Each call opens its own
// OpenMP parallel regions from its own thread, so several OpenMP teams run side by side. The
// per-thread state is checked too: a fresh thread reads last_kernel_path() == "" and
// last_kvcache_splits() == 0, and once every thread has finished (all waiting at one gate, so no
// call runs while they read) each reads the path and split count of its own last call, which differ
// from thread to thread. A rejected call among them must throw Error and leave its outputs as they
// were. The same calls are made from the threads of an OpenMP parallel region too, where the
// library's regions are nested in the caller's.
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "flashattn/kvcache.hpp"
#include "support/test_util.hpp"

namespace fa_test {
namespace {

// What one call left behind, read on the calling thread right after it returned.
struct Outcome {
  std::vector<uint64_t> bytes;  // every output's whole backing storage, concatenated
  std::string path;             // last_kernel_path()
  int splits = 0;               // last_kvcache_splits()
  std::string error;            // non-empty: the call threw this (expected only for rejected jobs)
  bool wrote_on_error = false;  // it threw and yet an output's storage changed
};

struct Job {
  std::string name;
  std::string path;       // the kernel path the call must report ("" for a rejected call)
  bool rejected = false;  // the call must throw Error and leave the outputs untouched
  std::function<Outcome()> run;
};

void append(std::vector<uint64_t>& to, const HostTensor& t) {
  const std::vector<uint64_t> s = snapshot(t);
  to.insert(to.end(), s.begin(), s.end());
}

void finish(Outcome& r) {
  r.path = flashattn::last_kernel_path();
  r.splits = flashattn::last_kvcache_splits();
}

struct AttnSpec {
  DType dtype = DType::f32;
  Algorithm algo = Algorithm::flash;
  int64_t B = 1, Nq = 64, Nk = 64, H = 2, Hkv = 2, d = 32;
  bool causal = false;
  int wl = -1, wr = -1;
  float softcap = 0;
  Layout in_layout = Layout::dense, out_layout = Layout::dense;
  std::vector<int32_t> cu_q, cu_k;  // varlen when non-empty
  bool backward = false;            // forward, then a deterministic backward
  bool bad_out = false;             // out with one query row too few: rejected
};

// Fresh inputs from `seed`, poisoned outputs, the call(s), the outputs' storage.
Outcome run_attention(const AttnSpec& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const bool varlen = !s.cu_q.empty();
  const int64_t B = varlen ? 1 : s.B;
  const int64_t Nq = varlen ? s.cu_q.back() : s.Nq, Nk = varlen ? s.cu_k.back() : s.Nk;
  HostTensor q = make_tensor(s.dtype, {B, Nq, s.H, s.d}, s.in_layout);
  HostTensor k = make_tensor(s.dtype, {B, Nk, s.Hkv, s.d}, s.in_layout);
  HostTensor v = make_tensor(s.dtype, {B, Nk, s.Hkv, s.d}, s.in_layout);
  HostTensor out = make_tensor(s.dtype, {B, s.bad_out ? Nq - 1 : Nq, s.H, s.d}, s.out_layout);
  HostTensor lse = make_lse({B, s.H, Nq}, s.out_layout != Layout::dense);
  for (HostTensor* t : {&q, &k, &v}) fill_uniform(*t, rng, 1.0);
  poison(out);
  poison(lse);
  Options o;
  o.algorithm = s.algo;
  o.causal = s.causal;
  o.window_left = s.wl;
  o.window_right = s.wr;
  o.softcap = s.softcap;
  o.deterministic = true;
  if (varlen) {
    o.cu_seqlens_q = s.cu_q.data();
    o.cu_seqlens_k = s.cu_k.data();
    o.varlen_batch = int(s.cu_q.size()) - 1;
  }
  Outcome r;
  const Tensor tl = lse.view();
  const std::vector<uint64_t> out_before = snapshot(out), lse_before = snapshot(lse);
  try {
    flashattn::forward(q.view(), k.view(), v.view(), out.view(), &tl, o);
  } catch (const flashattn::Error& e) {
    r.error = e.what();
    r.wrote_on_error = snapshot(out) != out_before || snapshot(lse) != lse_before;
  }
  append(r.bytes, out);
  append(r.bytes, lse);
  if (s.backward && r.error.empty()) {
    HostTensor dout = make_tensor(s.dtype, {B, Nq, s.H, s.d}, s.in_layout);
    HostTensor dq = make_tensor(s.dtype, {B, Nq, s.H, s.d}, s.out_layout);
    HostTensor dk = make_tensor(s.dtype, {B, Nk, s.Hkv, s.d}, s.out_layout);
    HostTensor dv = make_tensor(s.dtype, {B, Nk, s.Hkv, s.d}, s.out_layout);
    fill_uniform(dout, rng, 1.0);
    for (HostTensor* t : {&dq, &dk, &dv}) poison(*t);
    flashattn::backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dk.view(),
                        dv.view(), o);
    for (const HostTensor* t : {&dq, &dk, &dv}) append(r.bytes, *t);
  }
  finish(r);
  return r;
}

struct KvSpec {
  DType dtype = DType::f32;
  int64_t B = 2, Sq = 1, H = 4, Hkv = 2, d = 32;
  std::vector<int32_t> lens;  // tokens already in each sequence's cache
  int64_t S_new = 0;
  int64_t page = 0;  // 0: contiguous
  int64_t capacity = 96;
  bool causal = false;
  int wl = -1;
  int splits = 0;
};

Outcome run_kvcache(const KvSpec& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostTensor q = make_tensor(s.dtype, {s.B, s.Sq, s.H, s.d});
  HostTensor out = make_tensor(s.dtype, {s.B, s.Sq, s.H, s.d}, Layout::row_padded);
  HostTensor lse = make_lse({s.B, s.H, s.Sq});
  HostTensor kc, vc, kn, vn;
  std::vector<int32_t> lens = s.lens, table;
  flashattn::KVCache cache;
  if (s.page > 0) {
    const int64_t max_pages = (s.capacity + s.page - 1) / s.page, num_pages = s.B * max_pages + 2;
    table = shuffled_block_table(s.B * max_pages, num_pages, rng);
    kc = make_tensor(s.dtype, {num_pages, s.page, s.Hkv, s.d});
    vc = make_tensor(s.dtype, {num_pages, s.page, s.Hkv, s.d});
    cache.block_table = table.data();
    cache.max_pages = max_pages;
  } else {
    kc = make_tensor(s.dtype, {s.B, s.capacity, s.Hkv, s.d}, Layout::heads_first);
    vc = make_tensor(s.dtype, {s.B, s.capacity, s.Hkv, s.d});
  }
  for (HostTensor* t : {&q, &kc, &vc}) fill_uniform(*t, rng, 1.0);
  poison(out);
  poison(lse);
  cache.k = kc.view();
  cache.v = vc.view();
  cache.seqlens = lens.data();
  flashattn::KVCacheOptions o;
  o.causal = s.causal;
  o.window_left = s.wl;
  o.num_splits = s.splits;
  Tensor tkn, tvn;
  if (s.S_new > 0) {
    kn = make_tensor(s.dtype, {s.B, s.S_new, s.Hkv, s.d});
    vn = make_tensor(s.dtype, {s.B, s.S_new, s.Hkv, s.d});
    fill_uniform(kn, rng, 1.0);
    fill_uniform(vn, rng, 1.0);
    tkn = kn.view();
    tvn = vn.view();
    o.k_new = &tkn;
    o.v_new = &tvn;
  }
  const Tensor tl = lse.view();
  flashattn::forward_kvcache(q.view(), cache, out.view(), &tl, o);
  Outcome r;
  for (const HostTensor* t : {&out, &lse, &kc, &vc}) append(r.bytes, *t);
  finish(r);
  return r;
}

std::vector<Job> make_jobs(uint64_t seed) {
  std::vector<Job> jobs;
  auto attn = [&](const std::string& name, const AttnSpec& s) {
    const uint64_t js = seed + jobs.size() * 0x9e3779b97f4a7c15ull;
    Job j;
    j.name = name;
    j.rejected = s.bad_out;
    j.path = s.bad_out ? "" : s.algo == Algorithm::flash ? "cpu.flash" : "cpu.standard";
    j.run = [s, js] { return run_attention(s, js); };
    jobs.push_back(j);
  };
  auto kv = [&](const std::string& name, const KvSpec& s) {
    const uint64_t js = seed + jobs.size() * 0x9e3779b97f4a7c15ull;
    Job j;
    j.name = name;
    j.path = "cpu.kvcache";
    j.run = [s, js] { return run_kvcache(s, js); };
    jobs.push_back(j);
  };
  AttnSpec a;
  a = {};
  a.B = 2, a.Nq = 97, a.Nk = 131, a.H = 4, a.Hkv = 2, a.d = 64, a.causal = true;
  attn("fwd_flash_f32_causal_gqa", a);
  a = {};
  a.dtype = DType::bf16, a.algo = Algorithm::standard, a.Nq = 64, a.Nk = 200, a.H = 4, a.Hkv = 1, a.wl = 16, a.wr = 8;
  attn("fwd_standard_bf16_window_mqa", a);
  a = {};
  a.dtype = DType::f16, a.Nq = 33, a.Nk = 77, a.d = 80, a.softcap = 30, a.in_layout = Layout::heads_first,
  a.out_layout = Layout::row_padded;
  attn("fwd_flash_f16_softcap_layouts", a);
  a = {};
  a.B = 2, a.Nq = 70, a.Nk = 90, a.d = 64, a.backward = true;
  attn("bwd_flash_f32", a);
  a = {};
  a.dtype = DType::f16, a.algo = Algorithm::standard, a.Nq = 50, a.Nk = 50, a.H = 4, a.Hkv = 2, a.causal = true,
  a.backward = true;
  attn("bwd_standard_f16_causal", a);
  a = {};
  a.dtype = DType::bf16, a.H = 4, a.Hkv = 2, a.cu_q = {0, 13, 40, 64}, a.cu_k = {0, 20, 20, 71}, a.causal = true,
  a.backward = true, a.out_layout = Layout::row_padded;
  attn("bwd_flash_bf16_varlen", a);
  a = {};
  a.dtype = DType::f32, a.algo = Algorithm::standard, a.Nq = 40, a.Nk = 56, a.d = 16, a.backward = true, a.wl = 5,
  a.in_layout = Layout::heads_first;
  attn("bwd_standard_f32_window", a);
  a = {};
  a.Nq = 20, a.Nk = 30, a.bad_out = true;
  attn("fwd_rejected_out_rows", a);
  KvSpec c;
  c = {};
  c.lens = {5, 40}, c.S_new = 3, c.causal = true, c.splits = 1;
  kv("kvcache_contiguous_f32_append", c);
  c = {};
  c.dtype = DType::bf16, c.lens = {30, 61}, c.S_new = 1, c.page = 16, c.splits = 3;
  kv("kvcache_paged16_bf16_append", c);
  c = {};
  c.dtype = DType::f16, c.Sq = 4, c.lens = {17, 2}, c.S_new = 4, c.page = 7, c.wl = 9, c.causal = true, c.splits = 2;
  kv("kvcache_paged7_f16_window", c);
  c = {};
  c.dtype = DType::bf16, c.B = 1, c.H = 8, c.Hkv = 2, c.d = 64, c.lens = {90}, c.capacity = 128, c.splits = 4;
  kv("kvcache_contiguous_bf16_decode", c);
  c = {};
  c.dtype = DType::f32, c.B = 3, c.lens = {0, 11, 63}, c.S_new = 2, c.page = 5, c.splits = 0;
  kv("kvcache_paged5_f32_auto_splits", c);
  return jobs;
}

// Appends to `out` every way `got` differs from `ref`, the same job's outcome when called alone.
void compare(const Job& job, const Outcome& got, const Outcome& ref, const std::string& where,
             std::vector<std::string>& out) {
  const std::string at = job.name + " (" + where + ")";
  if (got.bytes != ref.bytes) out.push_back(at + ": outputs differ from the call made alone");
  if (got.wrote_on_error) out.push_back(at + ": a rejected call wrote its outputs");
  if (got.error != ref.error) out.push_back(at + ": error \"" + got.error + "\", alone \"" + ref.error + "\"");
  if (job.rejected) return;
  if (got.path != job.path) out.push_back(at + ": last_kernel_path " + got.path);
  if (job.path == "cpu.kvcache" && got.splits != ref.splits)
    out.push_back(at + ": last_kvcache_splits " + std::to_string(got.splits) + ", alone " + std::to_string(ref.splits));
}

// The outcomes of every job called alone on this thread, each checked against the job's promise.
std::vector<Outcome> run_alone(const std::vector<Job>& jobs) {
  std::vector<Outcome> alone(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    alone[j] = jobs[j].run();
    EXPECT_FALSE(alone[j].wrote_on_error) << jobs[j].name << ": a rejected call wrote its outputs";
    if (jobs[j].rejected) {
      EXPECT_FALSE(alone[j].error.empty()) << jobs[j].name << ": the call was not rejected";
    } else {
      EXPECT_TRUE(alone[j].error.empty()) << jobs[j].name << ": " << alone[j].error;
      EXPECT_EQ(alone[j].path, jobs[j].path) << jobs[j].name;
    }
  }
  return alone;
}

// Threads of this process, from /proc (Linux); -1 where it cannot be read.
int os_threads() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

TEST(Concurrency, ThreadsAgreeBitwiseWithCallsMadeAlone) {
  FA_SEED_TRACE();
  const std::vector<Job> jobs = make_jobs(test_seed());
  const size_t J = jobs.size();

  // Alone, on this thread: the outcomes every concurrent call must reproduce.
  const std::vector<Outcome> alone = run_alone(jobs);

  // Eight threads, each running every job once, starting at a different job, so that each thread's
  // last call is a different one.
  constexpr int kThreads = 8;
  constexpr int kRounds = 2;
  struct PerThread {
    std::string first_path = "unset";
    int first_splits = -1;
    std::vector<std::string> mismatches;
    std::string final_path;
    int final_splits = -1;
    std::string want_path;
    int want_splits = 0;
  };
  std::vector<PerThread> per(kThreads);
  std::mutex m;
  std::condition_variable cv;
  int ready = 0, done = 0;
  bool go = false;
  int threads_at_gate = -1;
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      PerThread& me = per[size_t(t)];
      me.first_path = flashattn::last_kernel_path();
      me.first_splits = flashattn::last_kvcache_splits();
      {
        std::unique_lock<std::mutex> lock(m);
        ++ready;
        cv.notify_all();
        cv.wait(lock, [&] { return go; });
      }
      std::string want_path;
      int want_splits = 0;
      for (int round = 0; round < kRounds; ++round)
        for (size_t i = 0; i < J; ++i) {
          const size_t j = (size_t(t) * 5 + i) % J;
          compare(jobs[j], jobs[j].run(), alone[j],
                  "thread " + std::to_string(t) + ", round " + std::to_string(round), me.mismatches);
          if (!jobs[j].rejected) {
            want_path = jobs[j].path;
            if (want_path == "cpu.kvcache") want_splits = alone[j].splits;
          }
        }
      me.want_path = want_path;
      me.want_splits = want_splits;
      {
        std::unique_lock<std::mutex> lock(m);
        if (++done == kThreads) {
          threads_at_gate = os_threads();
          cv.notify_all();
        }
        cv.wait(lock, [&] { return done == kThreads; });
      }
      // No call runs anywhere now: a value shared between threads would read the same everywhere.
      me.final_path = flashattn::last_kernel_path();
      me.final_splits = flashattn::last_kvcache_splits();
    });
  }
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return ready == kThreads; });
    go = true;
  }
  cv.notify_all();
  for (std::thread& th : pool) th.join();

  std::vector<std::string> distinct_paths;
  std::vector<int> distinct_splits;
  for (int t = 0; t < kThreads; ++t) {
    const PerThread& me = per[size_t(t)];
    EXPECT_EQ(me.first_path, "") << "thread " << t << " before its first call";
    EXPECT_EQ(me.first_splits, 0) << "thread " << t << " before its first call";
    for (const std::string& s : me.mismatches) ADD_FAILURE() << s;
    EXPECT_EQ(me.final_path, me.want_path) << "thread " << t << ": not the path of its own last call";
    EXPECT_EQ(me.final_splits, me.want_splits) << "thread " << t << ": not the split count of its own last call";
    if (std::find(distinct_paths.begin(), distinct_paths.end(), me.want_path) == distinct_paths.end())
      distinct_paths.push_back(me.want_path);
    if (std::find(distinct_splits.begin(), distinct_splits.end(), me.want_splits) == distinct_splits.end())
      distinct_splits.push_back(me.want_splits);
  }
  // The gate check can only catch shared state if the threads' last calls differ.
  EXPECT_GE(distinct_paths.size(), 2u);
  EXPECT_GE(distinct_splits.size(), 2u);
  std::printf("[flashattn] %d threads x %zu calls each; %d OS threads in the process at the gate "
              "(each caller's OpenMP team kept its workers)\n",
              kThreads, size_t(kRounds) * J, threads_at_gate);
}

// The callers are the threads of an OpenMP parallel region: the library's own regions are then
// nested inside it. With the default max-active-levels of 1 (libgomp) they run as teams of one
// thread each, with more levels as teams of their own; either way every output must equal the call
// made alone (the CPU kernels divide their work by tiles and splits, not by the team).
TEST(Concurrency, CallersInsideAnOpenMPParallelRegion) {
  FA_SEED_TRACE();
  const std::vector<Job> jobs = make_jobs(test_seed());
  const std::vector<Outcome> alone = run_alone(jobs);
  const size_t J = jobs.size();
  constexpr int kThreads = 4;
  std::vector<std::vector<std::string>> mismatches(kThreads);
  int team = 0, levels = 0;
#pragma omp parallel num_threads(kThreads)
  {
    const int t = omp_get_thread_num();
#pragma omp single
    {
      team = omp_get_num_threads();
      levels = omp_get_max_active_levels();
    }
    for (size_t i = 0; i < J; ++i) {
      const size_t j = (size_t(t) * 3 + i) % J;
      compare(jobs[j], jobs[j].run(), alone[j], "OpenMP thread " + std::to_string(t), mismatches[size_t(t)]);
    }
  }
  for (const auto& m : mismatches)
    for (const std::string& s : m) ADD_FAILURE() << s;
  std::printf("[flashattn] %d OpenMP threads x %zu calls each, max-active-levels %d\n", team, J, levels);
  EXPECT_EQ(team, kThreads) << "the region must have several callers";
}

}  // namespace
}  // namespace fa_test
