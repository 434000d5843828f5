// What each backend provides to src/core/dispatch.cpp. Arguments have been checked already.
#pragma once

#include <string>

#include "core/kv_params.hpp"
#include "core/params.hpp"

namespace flashattn::detail {
// Records the kernel path of the call in progress on this thread (last_kernel_path()); a string
// literal. The dispatch and the CUDA backend call it just before the kernels run.
void set_kernel_path(const char* path);
}  // namespace flashattn::detail

namespace flashattn::cpu {
// Working precision, fp32 accumulation.
void flash_forward(const detail::Params& p);
void flash_backward(const detail::Params& p);
void standard_forward(const detail::Params& p);
void standard_backward(const detail::Params& p);
int kvcache_forward(const detail::KVParams& p);  // append, then split-KV attention; returns the split count
void merge_partial(const detail::MergeParams& p);
std::string info();  // tile-kernel table, OpenBLAS build and core, OpenMP threads
}  // namespace flashattn::cpu

namespace flashattn::cuda {
bool available();                                 // built with CUDA and a device is present
void check_device_pointers(const detail::Params& p, bool backward);  // throws Error
void forward(const detail::Params& p);
void backward(const detail::Params& p);
std::string info();
// Device-to-host copy of a few bytes (used to validate cu_seqlens held in device memory); throws Error.
void copy_to_host(void* host, const void* device_ptr, size_t bytes);
// Whether `stream` (a cudaStream_t, null = the legacy default stream) is being captured into a CUDA
// graph: the host cannot read device memory then, so length checks move to the device.
bool stream_capturing(void* stream);
// Append, then split-KV attention (src/cuda/kvcache); checks the device pointers and the layouts
// its kernels need (Error) before anything runs. Returns the split count.
int forward_kvcache(const detail::KVParams& p);
// merge_partial on the call's stream (src/cuda/merge.cu); checks the device pointers first.
void merge_partial(const detail::MergeParams& p);
}  // namespace flashattn::cuda
