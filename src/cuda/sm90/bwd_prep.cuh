// The two small kernels around the Hopper backward kernel (kernel_bwd.cuh):
//   bwd_prep:    per query row of the padded (batch, heads, m_pad) grid, D = rowsum(dO ∘ O) and
//                LSE·log2(e) (+inf where the row saw no key, and for padding rows, so P = 0 there);
//                zeroes the row's fp32 dQ accumulator (a kernel rather than a memset: one pass
//                fewer, and profilers that count kernels only see every byte of the call)
//   dq_convert:  dQ = scale · dQ_accum, cast to the input dtype, into the caller's strides
// Both are memory-bound passes over O(N·D) data.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "core/params.hpp"

namespace flashattn::cuda::sm90 {

struct PrepArgs {
  const void* out;
  const void* dout;
  long long o_batch, o_row, o_head;     // element strides of O
  long long do_batch, do_row, do_head;  // and of dO
  const float* lse;
  long long lse_batch, lse_head, lse_row;
  float* lse_log2;  // (batch, heads, m_pad)
  float* dsum;
  float* dq_accum;  // (batch, heads, m_pad/64, D/64, 64, 64), see launch.hpp
  int heads, seqlen_q, m_pad, head_dim;
  long long rows;  // batch · heads · m_pad
};

template <class T>
__global__ void bwd_prep_kernel(const PrepArgs a) {
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= a.rows) return;
  const int lane = threadIdx.x % 32;
  const int i = int(row % a.m_pad);
  const long long bh = row / a.m_pad;
  const int h = int(bh % a.heads), b = int(bh / a.heads);
  float d = 0.f, l2 = INFINITY;
  if (i < a.seqlen_q) {
    const T* o = static_cast<const T*>(a.out) + b * a.o_batch + i * a.o_row + h * a.o_head;
    const T* dO = static_cast<const T*>(a.dout) + b * a.do_batch + i * a.do_row + h * a.do_head;
    for (int c = lane; c < a.head_dim; c += 32) d += float(o[c]) * float(dO[c]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
    const float l = a.lse[b * a.lse_batch + h * a.lse_head + i * a.lse_row];
    l2 = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
  }
  if (lane == 0) {
    a.dsum[row] = d;
    a.lse_log2[row] = l2;
  }
  // Row i of every 64 × 64 block of this query tile: 64 contiguous floats per head-dim chunk.
  const long long block0 = (bh * (a.m_pad / 64) + i / 64) * (a.head_dim / 64);
  for (int c = 0; c < a.head_dim / 64; ++c)
    reinterpret_cast<float2*>(a.dq_accum + (block0 + c) * 4096 + (i % 64) * 64)[lane] = make_float2(0.f, 0.f);
}

struct ConvertArgs {
  const float* dq_accum;  // (batch, heads, m_blocks, D/64, 64, 64): 64 × 64 blocks, m_blocks = m_pad/64 (launch.hpp)
  void* dq;
  long long dq_batch, dq_row, dq_head;
  int heads, seqlen_q, m_blocks, head_dim;
  float scale;
  long long pairs;  // batch · heads · seqlen_q · D / 2
};

template <class T>
__global__ void dq_convert_kernel(const ConvertArgs a) {
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= a.pairs) return;
  const int half_d = a.head_dim / 2;
  const int c = 2 * int(idx % half_d);
  const long long r = idx / half_d;  // (b, h, i) with i < seqlen_q
  const int i = int(r % a.seqlen_q);
  const long long bh = r / a.seqlen_q;
  const int h = int(bh % a.heads), b = int(bh / a.heads);
  const long long block = (bh * a.m_blocks + i / 64) * (a.head_dim / 64) + c / 64;
  const float2 v = *reinterpret_cast<const float2*>(a.dq_accum + block * 4096 + (i % 64) * 64 + c % 64);
  T* dst = static_cast<T*>(a.dq) + b * a.dq_batch + i * a.dq_row + h * a.dq_head + c;
  dst[0] = T(v.x * a.scale);
  dst[1] = T(v.y * a.scale);
}

}  // namespace flashattn::cuda::sm90
