// Choice of the decode-kernel table: the instruction set of the tile-kernel table in use (the
// AVX-512 one with the bf16 dot-product kernels where the CPU has AVX512_BF16).
#include "cpu/decode_kernels.hpp"

#include <atomic>
#include <cstring>

#include "cpu/isa.hpp"

namespace flashattn::cpu {
namespace {
std::atomic<const DecodeKernels*> g_override{nullptr};
}  // namespace

void override_decode_kernels(const DecodeKernels* table) { g_override.store(table, std::memory_order_release); }

const DecodeKernels& decode_kernels() {
  if (const DecodeKernels* forced = g_override.load(std::memory_order_acquire)) return *forced;
#if defined(__x86_64__) || defined(_M_X64)
  const char* isa = tile_kernels().name;  // a table this CPU runs (isa.cpp checked it)
  if (!std::strcmp(isa, "avx512")) {
    static const bool bf16 = cpu_has_avx512_bf16();
    return bf16 ? kDecodeKernelsAvx512Bf16 : kDecodeKernelsAvx512;
  }
  if (!std::strcmp(isa, "avx2")) return kDecodeKernelsAvx2;
#endif
  return kDecodeKernelsScalar;
}

}  // namespace flashattn::cpu
