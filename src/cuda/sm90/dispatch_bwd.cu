// Dispatch of the Hopper backward kernel (bwd/kernel.cuh): what it supports, its scratch (the
// per-row statistics and the fp32 dQ accumulator), the two small kernels around it (bwd/prep.cuh)
// and the choice of explicit instantiation (src/cuda/inst/sm90_bwd_*.cu).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "cuda/common/runtime.hpp"
#include "cuda/sm90/bwd/prep.cuh"
#include "cuda/sm90/host.hpp"
#include "cuda/sm90/args.hpp"
#include "cuda/sm90/sm90.hpp"
#include "cuda/sm90/tile_size.hpp"

namespace flashattn::cuda::sm90 {
namespace {

template <int kHeadDim, bool kF16>
cudaError_t launch_b(const BwdArgs& a, const detail::Params& p, cudaStream_t s) {
  return causal_kernel(p) ? launch_bwd<kHeadDim, kF16, true>(a, s) : launch_bwd<kHeadDim, kF16, false>(a, s);
}

// BwdFlags: the measured defaults, or FLASHATTN_SM90_BWD_FLAGS (FLASHATTN_DEV_KNOBS builds: its
// kBwdPersistent bit). The persistent grid pays at d64/d128 non-causal (+7–14 % at N = 512, +1–2 %
// at 8192) and loses 3–9 % causal (docs/perf/log.md, P-042).
int bwd_flags(int d, bool causal, bool deterministic) {
  static const int forced = FLASHATTN_DEV_KNOB("FLASHATTN_SM90_BWD_FLAGS", -1);
  const int persistent = forced >= 0 ? forced & kBwdPersistent : d <= 128 && !causal ? kBwdPersistent : 0;
  return persistent | (deterministic ? kBwdDeterministic : 0);
}

}  // namespace

bool supports_backward(const detail::Params& p) {
  if (p.seqused_k != nullptr) return false;  // the portable kernels take seqused_k (sm80/mask.cuh)
  // head_dim 96 runs the d128 kernel, Q, K, V, dO zero-padded to 128 by TMA (BwdArgs::x_chunks);
  // 192 the d256 kernel with its fourth column chunk zero (bwd/kernel_wide.cuh, kCols).
  if (p.head_dim != 64 && p.head_dim != 96 && p.head_dim != 128 && p.head_dim != 192 && p.head_dim != 256)
    return false;
  if (p.device != Device::cuda || p.algorithm != Algorithm::flash) return false;
  if (p.dtype != DType::bf16 && p.dtype != DType::f16) return false;
  // varlen: the d64/d128 kernel (head dims 64, 96, 128; seq.cuh, SeqRows), some query row
  if (p.varlen() && (p.head_dim > 128 || p.max_rows_q() <= 0 || p.max_rows_k() <= 0)) return false;
  // softcap: the d128 kernel only (head dims 96 and 128; its own instance, bwd/kernel.cuh kSoftcap)
  if (p.softcap != 0.f && p.head_dim != 96 && p.head_dim != 128) return false;
  // d192/d256 (bwd/kernel_wide.cuh): causal, no other window (the window mask cost it 6-9 %: bwd/kernel.cuh StepMask)
  if (p.head_dim >= 192 && causal_kernel(p) && (kernel_window_left(p) >= 0 || kernel_window_right(p) != 0)) return false;
  if (!window_bounds_fit(p)) return false;
  if (p.scale == 0.f || !std::isfinite(p.scale)) return false;
  if (p.seqlen_q <= 0 || p.seqlen_k <= 0 || p.batch <= 0 || p.heads <= 0 || p.heads_kv <= 0) return false;
  if (p.heads % p.heads_kv != 0 || p.batch > 65535 || p.heads > 65535) return false;  // grid y, z
  if (p.seqlen_q >= (int64_t(1) << 30) || p.seqlen_k >= (int64_t(1) << 30)) return false;
  if (!strides_ok(p.q) || !strides_ok(p.k) || !strides_ok(p.v) || !strides_ok(p.dout)) return false;
  // 16-byte accesses everywhere (bwd_prep, dq_convert; as the CUDA dispatch requires anyway)
  if (!strides_ok(p.dk) || !strides_ok(p.dv) || !strides_ok(p.dq) || !strides_ok(p.out)) return false;
  return device_is_sm90();
}

void backward(const detail::Params& p) {
  if (!supports_backward(p)) throw Error("flashattn sm90 backward: unsupported configuration");
  const bool f16 = p.dtype == DType::f16;
  const int d = int(p.head_dim);           // the tensors'
  const int kd = d == 96 ? 128 : d == 192 ? 256 : d;  // the kernel's (x_chunks, kCols)
  const int block_m = kd == 64 ? BwdTile<64>::kBlockM : kd == 128 ? BwdTile<128>::kBlockM : BwdTile<256>::kBlockM;
  const int block_n = kd == 256 ? BwdTile<256>::kBlockN : BwdTile<64>::kBlockN;
  cudaStream_t s = static_cast<cudaStream_t>(p.stream);
  // Rows per sequence: the longest one's with varlen (the tensors then hold the packed totals).
  const int64_t mq = p.max_rows_q(), mk = p.max_rows_k();
  const int64_t map_batch = p.varlen() ? 1 : p.batch;
  const int m_blocks = int((mq + block_m - 1) / block_m);
  // Statistics and the dQ accumulator (64-row blocks) padded to 128 rows at every query step.
  const int m_pad = int((mq + 127) / 128 * 128);
  const int n_blocks = int((mk + block_n - 1) / block_n);
  const long long rows = p.batch * p.heads * static_cast<long long>(m_pad);  // statistics rows
  DeviceScratch stats(size_t(2 * rows) * sizeof(float), s);
  DeviceScratch dq_accum(size_t(rows) * kd * sizeof(float), s);
  // Options::deterministic: a turn counter per 64 × 64 dQ block (bwd/dq_turns.cuh), zeroed.
  const size_t dq_blocks = p.deterministic ? size_t(rows / 64) * size_t(kd / 64) : 0;
  DeviceScratch dq_turn(dq_blocks * sizeof(int), s);
  if (dq_blocks > 0) check_cuda(cudaMemsetAsync(dq_turn.as<int>(), 0, dq_blocks * sizeof(int), s), "cudaMemsetAsync");

  PrepArgs pa{};
  pa.out = p.out.data;
  pa.dout = p.dout.data;
  pa.o_batch = p.out.batch_stride, pa.o_row = p.out.row_stride, pa.o_head = p.out.head_stride;
  pa.do_batch = p.dout.batch_stride, pa.do_row = p.dout.row_stride, pa.do_head = p.dout.head_stride;
  pa.lse = p.lse.data;
  pa.lse_batch = p.lse.batch_stride, pa.lse_head = p.lse.head_stride, pa.lse_row = p.lse.row_stride;
  pa.lse_log2 = stats.as<float>();
  pa.dsum = stats.as<float>() + rows;
  pa.dq_accum = dq_accum.as<float>();
  pa.heads = int(p.heads), pa.seqlen_q = int(p.seqlen_q), pa.m_pad = m_pad, pa.head_dim = d, pa.acc_dim = kd;
  pa.cu_seqlens_q = p.cu_seqlens_q;
  const int rows_per_block = 256 / (kd / kVec);  // 32, 16 or 8: divides m_pad
  const dim3 prep_grid(unsigned(m_pad / rows_per_block), unsigned(p.heads), unsigned(p.batch));
  if (f16) bwd_prep_kernel<__half><<<prep_grid, 256, 0, s>>>(pa);
  else bwd_prep_kernel<__nv_bfloat16><<<prep_grid, 256, 0, s>>>(pa);
  check_launch("sm90 bwd_prep_kernel");

  BwdArgs a{};
  a.tm_q = make_map(p.q, map_batch, p.seqlen_q, p.heads, d, block_m, d / 64, f16);
  a.tm_do = make_map(p.dout, map_batch, p.seqlen_q, p.heads, d, block_m, d / 64, f16);
  a.tm_k = make_map(p.k, map_batch, p.seqlen_k, p.heads_kv, d, block_n, d / 64, f16);
  a.tm_v = make_map(p.v, map_batch, p.seqlen_k, p.heads_kv, d, block_n, d / 64, f16);
  a.lse_log2 = pa.lse_log2;
  a.dsum = pa.dsum;
  a.dq_accum = dq_accum.as<float>();
  a.dk = p.dk.data;
  a.dv = p.dv.data;
  a.dk_batch_stride = p.dk.batch_stride, a.dk_row_stride = p.dk.row_stride, a.dk_head_stride = p.dk.head_stride;
  a.dv_batch_stride = p.dv.batch_stride, a.dv_row_stride = p.dv.row_stride, a.dv_head_stride = p.dv.head_stride;
  a.seqlen_q = int(p.seqlen_q), a.seqlen_k = int(p.seqlen_k), a.heads = int(p.heads);
  a.group = int(p.heads / p.heads_kv);
  a.m_blocks = m_blocks, a.m_pad = m_pad;
  // As the forward: with a softcap P = 2^(tanh(x·scale/cap)·cap·log2 e − LSE·log2 e).
  a.scale_log2 = float((p.softcap > 0.f ? double(p.softcap) : double(p.scale)) * 1.4426950408889634);
  a.softcap_scale = p.softcap > 0.f ? float(double(p.scale) / p.softcap) : 0.f;
  a.scale = p.scale;
  a.window_left = kernel_window_left(p);
  a.window_right = kernel_window_right(p);
  a.flags = bwd_flags(kd, causal_kernel(p), p.deterministic);
  a.dq_turn = dq_blocks > 0 ? dq_turn.as<int>() : nullptr;
  a.x_chunks = x_chunked(d);
  a.cu_seqlens_q = p.cu_seqlens_q;
  a.cu_seqlens_k = p.cu_seqlens_k;
  a.cols = d;
  a.n_blocks = n_blocks, a.heads_kv = int(p.heads_kv), a.batch = int(p.batch);
  const long long tiles = static_cast<long long>(n_blocks) * p.heads_kv * p.batch;
  if (tiles >= (1LL << 31)) throw Error("flashattn sm90 backward: too many key tiles for one grid");
  int dev = 0, sms = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  a.grid = int((a.flags & kBwdPersistent) && tiles > sms ? sms : tiles);
  cudaError_t e = kd == 64    ? (f16 ? launch_b<64, true>(a, p, s) : launch_b<64, false>(a, p, s))
                   : kd == 128 ? (f16 ? launch_b<128, true>(a, p, s) : launch_b<128, false>(a, p, s))
                   : d == 192  ? (f16 ? launch_b<192, true>(a, p, s) : launch_b<192, false>(a, p, s))
                              : (f16 ? launch_b<256, true>(a, p, s) : launch_b<256, false>(a, p, s));
  if (e != cudaSuccess) fail("backward kernel launch", e);

  ConvertArgs ca{};
  ca.dq_accum = dq_accum.as<float>();
  ca.dq = p.dq.data;
  ca.dq_batch = p.dq.batch_stride, ca.dq_row = p.dq.row_stride, ca.dq_head = p.dq.head_stride;
  ca.heads = int(p.heads), ca.seqlen_q = int(p.seqlen_q), ca.m_blocks = m_pad / 64, ca.head_dim = d, ca.acc_dim = kd;
  ca.scale = p.scale;
  ca.cu_seqlens_q = p.cu_seqlens_q;
  const dim3 conv_grid(unsigned((mq + rows_per_block - 1) / rows_per_block), unsigned(p.heads), unsigned(p.batch));
  if (f16) dq_convert_kernel<__half><<<conv_grid, 256, 0, s>>>(ca);
  else dq_convert_kernel<__nv_bfloat16><<<conv_grid, 256, 0, s>>>(ca);
  check_launch("sm90 dq_convert_kernel");
}

}  // namespace flashattn::cuda::sm90
