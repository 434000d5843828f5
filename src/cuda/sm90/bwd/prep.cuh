// The two small kernels around the Hopper backward kernel (bwd/kernel.cuh):
//   bwd_prep:    per query row of the padded (batch, heads, m_pad) grid, D = rowsum(dO ∘ O) and
//                LSE·log2(e) (+inf where the row saw no key, and for padding rows, so P = 0 there);
//                zeroes the row's fp32 dQ accumulator (a kernel rather than a memset: one pass
//                fewer, and profilers that count kernels only see every byte of the call)
//   dq_convert:  dQ = scale · dQ_accum, cast to the input dtype, into the caller's strides
// Both are memory-bound passes over O(N·D) data.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/params.hpp"
#include "cuda/sm90/primitives/acc_layout.hpp"

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
  float* dq_accum;  // (batch, heads, m_pad/64, acc_dim/64, 64, 64), see launch.hpp
  int heads, seqlen_q, m_pad, head_dim;
  int acc_dim;  // the kernel's head dim (128 for head_dim 96): dQ_accum's columns, the thread layout
  const int* cu_seqlens_q;  // varlen: row i of sequence b is packed row cu_seqlens_q[b] + i (else null)
};

// Row i of sequence b: its row in the tensors (O, dO, LSE, dQ) and whether it exists.
__device__ __forceinline__ bool seq_row(const int* cu_seqlens_q, int seqlen_q, int b, int i, int& row) {
  if (cu_seqlens_q == nullptr) {
    row = i;
    return i < seqlen_q;
  }
  const int q0 = __ldg(cu_seqlens_q + b);
  row = q0 + i;
  return i < __ldg(cu_seqlens_q + b + 1) - q0;
}

// Both passes move 8 elements (16 bytes) per access: the CUDA dispatch (check_flash_layout,
// cuda/backend.cpp) and supports_backward() require 16-byte aligned rows of O, dO and dQ.
constexpr int kVec = 8;

// kVec consecutive 16-bit elements (one 16-byte load) as floats.
template <class T>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[kVec]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < kVec; ++j) v[j] = float(e[j]);
}

// Grid (m_pad / rows per block, heads, batch): every index is 32-bit and the (batch, head) pair
// comes from the block — 64-bit divisions per row made these passes 2-3× slower than a copy.
// A row of the head dim is read by tpr = acc_dim / kVec neighbouring threads (an aligned group of
// the warp, a power of two, reduced with shuffles; D ≤ 256); with head_dim 96 (acc_dim 128) the
// last quarter of them reads nothing and zeroes its part of dQ_accum.
template <class T>
__global__ void bwd_prep_kernel(const PrepArgs a) {
  const int tpr = a.acc_dim / kVec;
  const int sub = threadIdx.x % tpr;
  const int i = blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;  // m_pad is a multiple of the rows per block
  const int h = blockIdx.y, b = blockIdx.z;
  const long long bh = static_cast<long long>(b) * a.heads + h;
  float d = 0.f, l2 = INFINITY;
  int row;
  if (seq_row(a.cu_seqlens_q, a.seqlen_q, b, i, row)) {
    const int tb = a.cu_seqlens_q == nullptr ? b : 0;  // the tensors' batch index
    const T* o = static_cast<const T*>(a.out) + tb * a.o_batch + row * a.o_row + h * a.o_head;
    const T* dO = static_cast<const T*>(a.dout) + tb * a.do_batch + row * a.do_row + h * a.do_head;
    for (int c = sub * kVec; c < a.head_dim; c += tpr * kVec) {
      float x[kVec], y[kVec];
      load_vec<T>(o + c, x);
      load_vec<T>(dO + c, y);
#pragma unroll
      for (int j = 0; j < kVec; ++j) d += x[j] * y[j];
    }
    const float l = a.lse[tb * a.lse_batch + h * a.lse_head + row * a.lse_row];
    l2 = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
  }
  for (int off = tpr / 2; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off);
  if (sub == 0) {
    a.dsum[bh * a.m_pad + i] = d;
    a.lse_log2[bh * a.m_pad + i] = l2;
  }
  // Row i of every 64 × 64 block of this query tile: 64 contiguous floats per head-dim chunk.
  float* acc = a.dq_accum + (bh * (a.m_pad / 64) + i / 64) * (a.acc_dim / 64) * 4096 + (i % 64) * 64;
  for (int c = sub * 4; c < a.acc_dim; c += tpr * 4)
    *reinterpret_cast<float4*>(acc + (c / 64) * 4096 + c % 64) = make_float4(0.f, 0.f, 0.f, 0.f);
}

struct ConvertArgs {
  const float* dq_accum;  // (batch, heads, m_blocks, acc_dim/64, 64, 64): 64 × 64 blocks, m_blocks = m_pad/64 (launch.hpp)
  void* dq;
  long long dq_batch, dq_row, dq_head;
  int heads, seqlen_q, m_blocks, head_dim;
  int acc_dim;  // as PrepArgs: columns past head_dim are not written
  float scale;
  const int* cu_seqlens_q;  // as PrepArgs
};

// Grid (ceil(seqlen_q / rows per block), heads, batch); thread = kVec consecutive elements of a row
// (two 16-byte loads, one 16-byte store).
template <class T>
__global__ void dq_convert_kernel(const ConvertArgs a) {
  const int tpr = a.acc_dim / kVec;  // threads per row (a power of two dividing the block)
  const int i = blockIdx.x * (blockDim.x / tpr) + threadIdx.x / tpr;
  const int c = (threadIdx.x % tpr) * kVec;
  if (c >= a.head_dim) return;  // head_dim 96: the kernel's zero columns
  const int h = blockIdx.y, b = blockIdx.z;
  int row;
  if (!seq_row(a.cu_seqlens_q, a.seqlen_q, b, i, row)) return;
  const int tb = a.cu_seqlens_q == nullptr ? b : 0;
  const long long bh = static_cast<long long>(b) * a.heads + h;
  // kVec = 8 columns from an 8-aligned c: contiguous in the block's permuted row (dq_block_offset)
  const float* src = a.dq_accum + ((bh * a.m_blocks + i / 64) * (a.acc_dim / 64) + c / 64) * 4096 + dq_block_offset(i % 64, c % 64);
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int j = 0; j < kVec; j += 4) {
    const float4 v = *reinterpret_cast<const float4*>(src + j);
    e[j] = T(v.x * a.scale);
    e[j + 1] = T(v.y * a.scale);
    e[j + 2] = T(v.z * a.scale);
    e[j + 3] = T(v.w * a.scale);
  }
  *reinterpret_cast<uint4*>(static_cast<T*>(a.dq) + tb * a.dq_batch + row * a.dq_row + h * a.dq_head + c) = raw;
}

}  // namespace flashattn::cuda::sm90
