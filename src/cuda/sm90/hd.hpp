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
