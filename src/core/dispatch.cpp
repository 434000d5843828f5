// The public entry points: check every argument once, then hand the resolved Params to the
// backend chosen by device (and, inside the CUDA backend, the kernel chosen by a registry).
#include <sstream>

#include "core/backend.hpp"
#include "core/check.hpp"
#include "core/kv_params.hpp"

namespace flashattn {

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}
const char* to_string(Device device) {
  switch (device) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
  }
  return "?";
}
const char* to_string(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::flash: return "flash";
    case Algorithm::standard: return "standard";
  }
  return "?";
}
namespace {
thread_local const char* t_kernel_path = "";  // of the last call that returned normally
thread_local const char* t_pending_path = "";  // of the call in progress
thread_local int t_kvcache_splits = 0;  // of the last forward_kvcache that returned normally
}  // namespace

void detail::set_kernel_path(const char* path) { t_pending_path = path; }
const char* last_kernel_path() { return t_kernel_path; }
int last_kvcache_splits() { return t_kvcache_splits; }

size_t element_size(DType dtype) { return dtype == DType::f32 ? 4 : 2; }

Tensor make_tensor(void* data, DType dtype, std::array<int64_t, 4> shape, Device device) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.shape = shape;
  t.strides = {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1};
  return t;
}

bool cuda_available() {
#if defined(FLASHATTN_WITH_CUDA)
  return cuda::available();
#else
  return false;
#endif
}

std::string build_info() {
  std::ostringstream os;
  os << "flashattn: cpu backend (" << cpu::info() << ")";
#if defined(FLASHATTN_WITH_CUDA)
  os << "; " << cuda::info();
#else
  os << "; built without CUDA";
#endif
  return os.str();
}

void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor* lse,
             const Options& options) {
  const detail::Params p = detail::check_forward(q, k, v, out, lse, options);
#if defined(FLASHATTN_WITH_CUDA)  // without it, check_forward has rejected Device::cuda
  if (p.device == Device::cuda) {
    cuda::check_device_pointers(p, /*backward=*/false);
    cuda::forward(p);
    t_kernel_path = t_pending_path;
    return;
  }
#endif
  if (p.algorithm == Algorithm::flash)
    cpu::flash_forward(p);
  else
    cpu::standard_forward(p);
  t_kernel_path = p.algorithm == Algorithm::flash ? "cpu.flash" : "cpu.standard";
}

void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
              const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& options) {
  const detail::Params p = detail::check_backward(q, k, v, out, dout, lse, dq, dk, dv, options);
#if defined(FLASHATTN_WITH_CUDA)  // without it, check_backward has rejected Device::cuda
  if (p.device == Device::cuda) {
    cuda::check_device_pointers(p, /*backward=*/true);
    cuda::backward(p);
    t_kernel_path = t_pending_path;
    return;
  }
#endif
  if (p.algorithm == Algorithm::flash)
    cpu::flash_backward(p);
  else
    cpu::standard_backward(p);
  t_kernel_path = p.algorithm == Algorithm::flash ? "cpu.flash" : "cpu.standard";
}

void merge_partial(const Tensor& out_acc, const Tensor& lse_acc, const Tensor& part, const Tensor& lse_part,
                   void* stream) {
  const detail::MergeParams p = detail::check_merge(out_acc, lse_acc, part, lse_part, stream);
#if defined(FLASHATTN_WITH_CUDA)  // without it, check_merge has rejected Device::cuda
  if (p.device == Device::cuda) return cuda::merge_partial(p);
#endif
  cpu::merge_partial(p);
}

void forward_kvcache(const Tensor& q, const KVCache& cache, const Tensor& out, const Tensor* lse,
                     const KVCacheOptions& options) {
  const detail::KVParams p = detail::check_kvcache(q, cache, out, lse, options);
#if defined(FLASHATTN_WITH_CUDA)  // without it, check_kvcache has rejected Device::cuda
  if (p.device == Device::cuda) {
    const int splits = cuda::forward_kvcache(p);
    t_kernel_path = t_pending_path;
    t_kvcache_splits = splits;
    return;
  }
#endif
  const int splits = cpu::kvcache_forward(p);
  t_kernel_path = "cpu.kvcache";
  t_kvcache_splits = splits;
}

}  // namespace flashattn
