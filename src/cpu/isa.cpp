// Run-time choice of the tile-kernel table (Highway's pattern: per-target code, one table).
#include "cpu/isa.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

namespace flashattn::cpu {
namespace {

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(_M_X64)
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(_M_X64)
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

std::atomic<const TileKernels*> g_override{nullptr};

}  // namespace

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) || defined(_M_X64)
  // CPUID leaf 7, sub-leaf 1, EAX bit 5 (Cooper Lake, Sapphire Rapids and later Xeons; Zen 4 and later).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return cpu_has_avx512() && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5)) != 0;
#else
  return false;
#endif
}

namespace {

const TileKernels& choose() {
  const TileKernels* best = &kTileKernelsScalar;
#if defined(__x86_64__) || defined(_M_X64)
  if (cpu_has_avx512()) best = &kTileKernelsAvx512;
  else if (cpu_has_avx2()) best = &kTileKernelsAvx2;
#endif
  if (const char* forced = std::getenv("FLASHATTN_CPU_ISA"))
    if (const TileKernels* t = tile_kernels_for(forced)) return *t;
  return *best;
}

}  // namespace

const TileKernels* tile_kernels_for(const char* name) {
  if (!name) return nullptr;
  if (!std::strcmp(name, "scalar")) return &kTileKernelsScalar;
#if defined(__x86_64__) || defined(_M_X64)
  if (!std::strcmp(name, "avx2") && cpu_has_avx2()) return &kTileKernelsAvx2;
  if (!std::strcmp(name, "avx512") && cpu_has_avx512()) return &kTileKernelsAvx512;
#endif
  return nullptr;
}

const TileKernels& tile_kernels() {
  static const TileKernels& table = choose();  // thread-safe static initialization
  const TileKernels* forced = g_override.load(std::memory_order_acquire);
  return forced ? *forced : table;
}

void override_tile_kernels(const TileKernels* table) {
  g_override.store(table, std::memory_order_release);
}

const char* isa_name() { return tile_kernels().name; }

}  // namespace flashattn::cpu
