// This machine's fp32 FMA peak, measured: the number the CPU kernels are judged against.
//
// Peak = FMA instructions/cycle × lanes × 2 FLOP × GHz × cores. Each factor is measured:
//  - GHz: a chain of dependent integer adds (latency 1 cycle on every x86 core) timed with
//    steady_clock: adds/second = cycles/second.
//  - FMA/cycle × lanes: kChains independent accumulators (more than latency × pipes, so the loop is
//    throughput-bound), FMA on 256-bit (AVX2) and 512-bit (AVX-512) vectors, timed the same way.
//  - cores: the same loop on every OpenMP thread at once (OMP_NUM_THREADS).
// Zen 4 has two 256-bit FMA pipes (a 512-bit FMA occupies both), so both widths should give
// 32 FLOP/cycle/core there.
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Dependent adds: one per cycle. The asm keeps the compiler from folding the chain.
__attribute__((noinline)) double measure_ghz() {
  const int64_t iters = 400'000'000;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    uint64_t x = 0;
    const double t0 = now();
    for (int64_t i = 0; i < iters; i += 8) {
      asm volatile(
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
          : "+r"(x));
    }
    const double t = now() - t0;
    const double ghz = double(iters) / t / 1e9;
    if (ghz > best) best = ghz;
  }
  return best;
}

constexpr int kChains = 12;  // > 4-cycle latency × 2 pipes (ymm) and > 4 × 1 (zmm)

// The loop body is written in asm so that the 12 accumulators stay in registers (an array of
// intrinsics would be kept in memory) and nothing but the FMAs and the loop counter executes.
#define FMA12(OP, R)                                                                    \
  OP " %%" R "13, %%" R "14, %%" R "0\n\t" OP " %%" R "13, %%" R "14, %%" R "1\n\t"      \
  OP " %%" R "13, %%" R "14, %%" R "2\n\t" OP " %%" R "13, %%" R "14, %%" R "3\n\t"      \
  OP " %%" R "13, %%" R "14, %%" R "4\n\t" OP " %%" R "13, %%" R "14, %%" R "5\n\t"      \
  OP " %%" R "13, %%" R "14, %%" R "6\n\t" OP " %%" R "13, %%" R "14, %%" R "7\n\t"      \
  OP " %%" R "13, %%" R "14, %%" R "8\n\t" OP " %%" R "13, %%" R "14, %%" R "9\n\t"      \
  OP " %%" R "13, %%" R "14, %%" R "10\n\t" OP " %%" R "13, %%" R "14, %%" R "11\n\t"

#define CLOBBER_VEC(R)                                                                  \
  R "0", R "1", R "2", R "3", R "4", R "5", R "6", R "7", R "8", R "9", R "10", R "11", \
  R "13", R "14"

__attribute__((target("avx2,fma"), noinline)) double fma_flops_avx2(int64_t iters) {
  const double t0 = now();
  int64_t n = iters;
  asm volatile(
      "vxorps %%ymm13, %%ymm13, %%ymm13\n\tvxorps %%ymm14, %%ymm14, %%ymm14\n\t"
      "1:\n\t" FMA12("vfmadd231ps", "ymm") "dec %0\n\tjnz 1b\n\t"
      : "+r"(n)
      :
      : CLOBBER_VEC("xmm"), "cc");
  const double t = now() - t0;
  return double(iters) * kChains * 8 * 2 / t;
}

__attribute__((target("avx512f,fma"), noinline)) double fma_flops_avx512(int64_t iters) {
  const double t0 = now();
  int64_t n = iters;
  asm volatile(
      "vxorps %%zmm13, %%zmm13, %%zmm13\n\tvxorps %%zmm14, %%zmm14, %%zmm14\n\t"
      "1:\n\t" FMA12("vfmadd231ps", "zmm") "dec %0\n\tjnz 1b\n\tvzeroupper\n\t"
      : "+r"(n)
      :
      : CLOBBER_VEC("xmm"), "cc");
  const double t = now() - t0;
  return double(iters) * kChains * 16 * 2 / t;
}

template <class F>
double per_core(F f) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const double r = f();
    if (r > best) best = r;
  }
  return best;
}

template <class F>
double all_cores(F f) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    double total = 0;
#pragma omp parallel reduction(+ : total)
    total += f();
    if (total > best) best = total;
  }
  return best;
}

}  // namespace

int main() {
  const int threads = omp_get_max_threads();
  const double ghz = measure_ghz();
  std::printf("clock (dependent-add chain): %.3f GHz\n", ghz);
  const int64_t iters = 50'000'000;
  const bool has512 = __builtin_cpu_supports("avx512f");
  const double a1 = per_core([&] { return fma_flops_avx2(iters); });
  std::printf("avx2   fp32 FMA, 1 core : %7.1f GFLOP/s = %5.1f FLOP/cycle\n", a1 / 1e9, a1 / 1e9 / ghz);
  double z1 = 0;
  if (has512) {
    z1 = per_core([&] { return fma_flops_avx512(iters); });
    std::printf("avx512 fp32 FMA, 1 core : %7.1f GFLOP/s = %5.1f FLOP/cycle\n", z1 / 1e9, z1 / 1e9 / ghz);
  }
  const double an = all_cores([&] { return fma_flops_avx2(iters); });
  std::printf("avx2   fp32 FMA, %d cores: %7.1f GFLOP/s\n", threads, an / 1e9);
  double zn = 0;
  if (has512) {
    zn = all_cores([&] { return fma_flops_avx512(iters); });
    std::printf("avx512 fp32 FMA, %d cores: %7.1f GFLOP/s\n", threads, zn / 1e9);
  }
  const double best1 = a1 > z1 ? a1 : z1, bestn = an > zn ? an : zn;
  const double flop_per_cycle = best1 / 1e9 / ghz;
  std::printf("peak: %.1f FLOP/cycle/core x %.3f GHz x %d cores = %.1f GFLOP/s (measured all-core %.1f)\n",
              flop_per_cycle, ghz, threads, flop_per_cycle * ghz * threads, bestn / 1e9);
  return 0;
}
