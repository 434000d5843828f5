#include "cuda/registry.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <sstream>

#include "cuda/sm80/launch.hpp"

namespace flashattn::cuda {
namespace {

struct Row {
  int min_arch;  // runs on this compute capability and newer
  DType dtype;
  int head_dim;
  bool causal;
  KernelEntry entry;
};

#define FLASHATTN_SM80_ROW(T, DT, D, CAUSAL) \
  Row{80, DType::DT, D, CAUSAL, {&sm80::run_flash_fwd<T, D>, &sm80::run_flash_bwd<T, D>}}
#define FLASHATTN_SM80_ROWS(T, DT, D) FLASHATTN_SM80_ROW(T, DT, D, false), FLASHATTN_SM80_ROW(T, DT, D, true)

const Row kRows[] = {
    FLASHATTN_SM80_ROWS(__half, f16, 32),         FLASHATTN_SM80_ROWS(__half, f16, 64),
    FLASHATTN_SM80_ROWS(__half, f16, 96),         FLASHATTN_SM80_ROWS(__half, f16, 128),
    FLASHATTN_SM80_ROWS(__half, f16, 192),        FLASHATTN_SM80_ROWS(__half, f16, 256),
    FLASHATTN_SM80_ROWS(__nv_bfloat16, bf16, 32), FLASHATTN_SM80_ROWS(__nv_bfloat16, bf16, 64),
    FLASHATTN_SM80_ROWS(__nv_bfloat16, bf16, 96), FLASHATTN_SM80_ROWS(__nv_bfloat16, bf16, 128),
    FLASHATTN_SM80_ROWS(__nv_bfloat16, bf16, 192), FLASHATTN_SM80_ROWS(__nv_bfloat16, bf16, 256),
};

}  // namespace

int kernel_head_dim(int head_dim) {
  for (int d : {32, 64, 96, 128, 192, 256})
    if (head_dim <= d) return d;
  return head_dim;
}

const KernelEntry& find_kernel(const KernelKey& key) {
  // Every row is an sm80 (portable) kernel; the Hopper kernels are chosen before the registry.
  for (const Row& r : kRows)
    if (key.arch >= r.min_arch && r.dtype == key.dtype && r.head_dim == key.head_dim && r.causal == key.causal)
      return r.entry;
  std::ostringstream os;
  os << "no CUDA flash kernel for (arch sm_" << key.arch << ", dtype " << to_string(key.dtype)
     << ", head_dim " << key.head_dim << ", causal " << (key.causal ? "true" : "false")
     << "); available: " << registry_summary() << " (Algorithm::standard covers every case)";
  throw Error(os.str(), Error::Kind::unsupported);
}

std::string registry_summary() {
  return "flash sm80+ (mma.sync) f16/bf16, head_dim 32/64/96/128/192/256 (multiples of 8 up to 256 "
         "rounded up inside), causal or not";
}

}  // namespace flashattn::cuda
