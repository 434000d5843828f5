// FLASHATTN_HD: a small function for the Hopper kernels that the CPU tests call too (host and
// device under nvcc, plain inline under a host compiler).
#pragma once

#ifndef FLASHATTN_HD
#if defined(__CUDACC__)
#define FLASHATTN_HD __host__ __device__ __forceinline__
#else
#define FLASHATTN_HD inline
#endif
#endif

// FLASHATTN_HOST_DEVICE: a kernel function that the CPU tests call too, its device inlining left as
// it was (__host__ added under nvcc; nothing under a host compiler, where a function defined in its
// class or a template is inline already).
#ifndef FLASHATTN_HOST_DEVICE
#if defined(__CUDACC__)
#define FLASHATTN_HOST_DEVICE __host__ __device__
#else
#define FLASHATTN_HOST_DEVICE
#endif
#endif

// Under a host compiler, the integer min and max that CUDA declares for device code (and, under
// nvcc, for host code too), so the host-device functions call them unqualified either way.
#if !defined(__CUDACC__)
#include <algorithm>
namespace flashattn::cuda::sm90 {
using std::max;
using std::min;
}  // namespace flashattn::cuda::sm90
#endif
