// The registry of explicit kernel instantiations, keyed on (arch, dtype, head_dim, causal).
// Window, softcap, GQA and varlen are runtime values (src/cuda/sm80/mask.cuh). Causal is part of
// the key (docs/architecture.md, "Dispatch"), but both values map to the same instantiation: the
// causal mask is the window (-1, 0), and fully-masked tiles are skipped at run time either way.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/common/args.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::cuda {

struct KernelKey {
  int arch;       // compute capability of the device, e.g. 90
  DType dtype;
  int head_dim;   // the kernel's head dim (kernel_head_dim of the call's)
  bool causal;
};

struct KernelEntry {
  void (*forward)(const AttnArgs&, cudaStream_t);
  void (*backward)(const AttnArgs&, cudaStream_t);  // AttnArgs::dsum set by the caller
};

// The smallest instantiated head dim >= head_dim (32, 64, 96, 128, 192, 256), or head_dim itself
// when none is (the lookup then fails with an Error naming the key).
int kernel_head_dim(int head_dim);

// Throws Error naming the key when no kernel is registered for it.
const KernelEntry& find_kernel(const KernelKey& key);

std::string registry_summary();

}  // namespace flashattn::cuda
