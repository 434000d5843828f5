// The tile-kernel table for this CPU, chosen once at start-up.
#pragma once

#include "cpu/tile_kernels.hpp"

namespace flashattn::cpu {

// The best table the CPU supports (avx512 > avx2 > scalar), or the one named by the environment
// variable FLASHATTN_CPU_ISA=scalar|avx2|avx512 (for tests; a name the CPU cannot run, or an unknown
// name, falls back to the best supported and is reported by isa_name()).
const TileKernels& tile_kernels();

// Whether the CPU has the AVX-512 tables' instructions and AVX512_BF16 (vdpbf16ps).
bool cpu_has_avx512_bf16();

// Name of the table tile_kernels() returns ("scalar", "avx2", "avx512").
const char* isa_name();

// For tests and benchmarks: the table for a given name if this CPU can run it, else null.
const TileKernels* tile_kernels_for(const char* name);

// For tests and benchmarks: make tile_kernels() return `table` from now on (null: back to the
// start-up choice). Not for use while a kernel runs.
void override_tile_kernels(const TileKernels* table);

}  // namespace flashattn::cpu
