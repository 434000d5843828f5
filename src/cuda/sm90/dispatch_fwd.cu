// Dispatch of the Hopper forward kernel (what it supports, the choice of explicit instantiation in
// src/cuda/inst/sm90_fwd_*.cu) and the host helpers both Hopper kernels share (host.hpp).
#include "cuda/sm90/sm90.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>

#include "cuda/sm90/host.hpp"
#include "cuda/sm90/args.hpp"
#include "cuda/sm90/tile_size.hpp"

namespace flashattn::cuda::sm90 {
namespace {

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda needed), §3.1.
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult q{};
    void* f = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  });
  if (!fn) throw Error("flashattn sm90: cuTensorMapEncodeTiled is not available from the driver");
  return fn;
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

}  // namespace

[[noreturn]] void fail(const std::string& what, cudaError_t e) {
  throw Error("flashattn sm90: " + what + ": " + cudaGetErrorString(e));
}

// A (batch, rows, heads, D) 16-bit tensor as a 5-D TMA map (64, rows, D/64, heads, batch): dim 0 is
// one 128-byte column chunk, dim 2 walks the chunks (stride 128 B), so a box of (64, box_rows,
// chunks) lands in smem as `chunks` consecutive (box_rows × 128 B) swizzled chunks (§3.2).
CUtensorMap make_map(const detail::TensorRef& t, int64_t batch, int64_t rows, int64_t heads, int64_t d,
                     int box_rows, int box_chunks, bool f16) {
  // A dimension of extent 1 never uses its stride; give it a legal one.
  auto stride_bytes = [](int64_t extent, int64_t elems) -> cuuint64_t {
    return extent == 1 ? cuuint64_t(128) : cuuint64_t(elems * 2);
  };
  CUtensorMap map;
  // d a multiple of 64: 64-element chunks as dimension 2, one box may take several. Otherwise
  // (d = 96) the row's d elements are dimension 0 and a tile loads chunk c on its own at x = 64·c;
  // the elements past d read as zeros and are not stored (FwdArgs::x_chunks).
  const bool x_chunks = x_chunked(d);
  const cuuint64_t dims[5] = {cuuint64_t(x_chunks ? d : 64), cuuint64_t(rows), cuuint64_t(x_chunks ? 1 : d / 64),
                              cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[4] = {stride_bytes(rows, t.row_stride), 128, stride_bytes(heads, t.head_stride),
                                 stride_bytes(batch, t.batch_stride)};
  const cuuint32_t box[5] = {64, cuuint32_t(box_rows), cuuint32_t(x_chunks ? 1 : box_chunks), 1, 1};
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode_fn()(&map, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                 5, t.data, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error("flashattn sm90: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ")");
  return map;
}

bool device_is_sm90() {
  // Per device, asked once each (a host may mix GPU generations; the answer for device 0 must not
  // decide for device 1). Unknown devices (>= 64) are asked every time.
  static std::atomic<uint64_t> known{0}, is90{0};
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t(1) << dev : 0;
  if (bit && (known.load(std::memory_order_acquire) & bit)) return (is90.load(std::memory_order_relaxed) & bit) != 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return false;
  const bool yes = major == 9 && minor == 0;
  if (bit) {
    if (yes) is90.fetch_or(bit, std::memory_order_relaxed);
    known.fetch_or(bit, std::memory_order_release);
  }
  return yes;
}

bool strides_ok(const detail::TensorRef& t) {  // TMA: global strides multiple of 16 B
  return aligned16(t.data) && t.row_stride % 8 == 0 && t.head_stride % 8 == 0 && t.batch_stride % 8 == 0 &&
         t.row_stride >= 0 && t.head_stride >= 0 && t.batch_stride >= 0;
}

#if FLASHATTN_DEV_KNOBS
int env_knob(const char* name, int unset) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : unset;
}
#endif

namespace {
// The head dim of the kernel a call runs: head_dim 96 runs the d128 kernels (FwdArgs::x_chunks).
int kernel_head_dim(const detail::Params& p) { return p.head_dim == 96 ? 128 : int(p.head_dim); }

// fwd_block_m, or FLASHATTN_SM90_FWD_BLOCK_M (128 or 192; 192 only at d64 without a softcap) for
// measurements.
int fwd_block_m_for(const detail::Params& p) {
  static const int forced = FLASHATTN_DEV_KNOB("FLASHATTN_SM90_FWD_BLOCK_M", 0);
  if (forced == 128 || (forced == 192 && p.head_dim == 64 && p.softcap == 0.f)) return forced;
  return fwd_block_m(kernel_head_dim(p), causal_kernel(p), p.max_rows_q(), p.max_rows_k(), p.softcap != 0.f);
}

// The tile schedule (scheduler.cuh) chosen per call, or FLASHATTN_SM90_FWD_SCHED = 0 (strided), 1 (one
// tile per CTA), 2 (snake), 3 (paired) or 4 (paired with a snake tail; causal only) for measurements.
int fwd_sched_forced() {
  static const int m = FLASHATTN_DEV_KNOB("FLASHATTN_SM90_FWD_SCHED", -1);
  return m >= 0 && m <= 4 ? m : -1;
}

template <int kHeadDim, bool kF16>
cudaError_t launch(const FwdArgs& a, const detail::Params& p, cudaStream_t s) {
  return causal_kernel(p) ? launch_fwd<kHeadDim, kF16, true>(a, s) : launch_fwd<kHeadDim, kF16, false>(a, s);
}

}  // namespace

bool supports(const detail::Params& p) {
  if (p.device != Device::cuda || p.algorithm != Algorithm::flash) return false;
  if (p.dtype != DType::bf16 && p.dtype != DType::f16) return false;
  // head_dim 96 runs the d128 kernels, its Q, K, V zero-padded to 128 by TMA (FwdArgs::x_chunks).
  if (p.head_dim != 64 && p.head_dim != 96 && p.head_dim != 128 && p.head_dim != 192 && p.head_dim != 256)
    return false;
  if (p.max_rows_q() <= 0) return false;  // varlen without query rows: nothing for this kernel
  if (p.seqused_k != nullptr) return false;  // the portable kernels take seqused_k (sm80/mask.cuh)
  if (!(p.scale > 0.f)) return false;  // max(s)·scale = max(s·scale) needs scale > 0
  if (p.seqlen_q <= 0 || p.seqlen_k <= 0 || p.batch <= 0 || p.heads <= 0 || p.heads_kv <= 0) return false;
  if (p.heads % p.heads_kv != 0) return false;
  if (p.seqlen_q >= (int64_t(1) << 31) || p.seqlen_k >= (int64_t(1) << 31)) return false;
  if (!window_bounds_fit(p)) return false;
  // tile slots (m_blocks · heads · batch, paired: m_blocks · (heads · batch + 1)) must fit an int
  if ((p.max_rows_q() + 127) / 128 * (p.heads * p.batch + 1) >= (int64_t(1) << 31)) return false;
  if (!strides_ok(p.q) || !strides_ok(p.k) || !strides_ok(p.v) || !strides_ok(p.out)) return false;
  return device_is_sm90();
}

void forward(const detail::Params& p) {
  if (!supports(p)) throw Error("flashattn sm90 forward: unsupported configuration");
  const bool f16 = p.dtype == DType::f16;
  const int d = int(p.head_dim);  // the tensors'; the kernel's is 128 for d = 96 (kernel_head_dim)
  const int block_m = fwd_block_m_for(p);
  const int block_n = fwd_default_block_n(kernel_head_dim(p));
  FwdArgs a{};
  // Varlen: the maps span the packed rows (seqlen_q/k are the totals), batch extent 1 (SeqRows).
  const int64_t map_batch = p.varlen() ? 1 : p.batch;
  a.tm_q = make_map(p.q, map_batch, p.seqlen_q, p.heads, d, block_m, d / 64, f16);
  a.tm_k = make_map(p.k, map_batch, p.seqlen_k, p.heads_kv, d, block_n, d / 64, f16);
  a.tm_v = make_map(p.v, map_batch, p.seqlen_k, p.heads_kv, d, block_n, d / 64, f16);
  a.tm_o = make_map(p.out, map_batch, p.seqlen_q, p.heads, d, 64, 1, f16);  // one 64-row WG, one chunk
  a.cu_seqlens_q = p.cu_seqlens_q;
  a.cu_seqlens_k = p.cu_seqlens_k;
  a.o = p.out.data;
  a.o_row_stride = p.out.row_stride;
  a.o_head_stride = p.out.head_stride;
  a.x_chunks = x_chunked(d);
  a.lse = p.lse.data;
  a.lse_batch_stride = p.lse.batch_stride;
  a.lse_head_stride = p.lse.head_stride;
  a.lse_row_stride = p.lse.row_stride;
  a.seqlen_q = int(p.seqlen_q);
  a.seqlen_k = int(p.seqlen_k);
  a.heads = int(p.heads);
  a.group = int(p.heads / p.heads_kv);
  // A left window that reaches past every key is no bound (−1), which keeps the kernel's bounds
  // within int: row i's bound i + diag − wl < 0 for every row once wl >= seqlen_k.
  a.window_left = kernel_window_left(p);
  a.window_right = kernel_window_right(p);
  // Folded once, here: p = 2^(s·scale_log2 − max); with a softcap s is cap·tanh(qk·scale/cap)
  // computed in the kernel as tanh(qk·softcap_scale), so scale_log2 = cap·log2(e).
  a.softcap_scale = p.softcap > 0.f ? float(double(p.scale) / p.softcap) : 0.f;
  a.scale_log2 = float((p.softcap > 0.f ? double(p.softcap) : double(p.scale)) * 1.4426950408889634);
  a.batch = int(p.batch);
  a.m_blocks = int((p.max_rows_q() + block_m - 1) / block_m);  // the longest sequence's (varlen)
  a.block_m = block_m;
  a.block_n = block_n;
  a.sched = fwd_sched_forced();
  static const bool serial = FLASHATTN_DEV_KNOB("FLASHATTN_SM90_FWD_SERIAL", 0) == 1;
  a.serial_softmax = serial;
  static const bool stream_k = FLASHATTN_DEV_KNOB("FLASHATTN_SM90_FWD_STREAMK", 1) == 1;  // scheduler.cuh, StreamKTail
  a.stream_k = stream_k;
  // The next tile's Q prefetched into L2: d64 non-causal only, where it shortens the call 3–6 % at
  // N = 512/1024; elsewhere within ±0.5 % but d256 causal N = 512 −3 % (docs/perf/log.md,
  // P-100, P-105). FLASHATTN_SM90_FWD_Q_PREFETCH = 0 / 1 turns it off / on everywhere.
  static const int q_prefetch = FLASHATTN_DEV_KNOB("FLASHATTN_SM90_FWD_Q_PREFETCH", -1);
  a.q_prefetch = q_prefetch >= 0 ? q_prefetch : kernel_head_dim(p) == 64 && !causal_kernel(p);
  cudaStream_t s = static_cast<cudaStream_t>(p.stream);
  cudaError_t e = cudaSuccess;
  switch (kernel_head_dim(p)) {
    case 64: e = f16 ? launch<64, true>(a, p, s) : launch<64, false>(a, p, s); break;
    case 128: e = f16 ? launch<128, true>(a, p, s) : launch<128, false>(a, p, s); break;
    case 192: e = f16 ? launch<192, true>(a, p, s) : launch<192, false>(a, p, s); break;
    default: e = f16 ? launch<256, true>(a, p, s) : launch<256, false>(a, p, s); break;
  }
  if (e != cudaSuccess) fail("kernel launch", e);
}

}  // namespace flashattn::cuda::sm90
