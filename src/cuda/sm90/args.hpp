// What the dispatch (dispatch_fwd.cu) and the per-configuration instantiations (src/cuda/inst/sm90_*.cu)
// share: the kernel's argument block and the launcher's declaration.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/sm90/primitives/hd.hpp"

namespace flashattn::cuda::sm90 {

// cudaFuncSetAttribute(MaxDynamicSharedMemorySize) once per kernel and device rather than on every
// call (it goes to the driver each time: host time inside every timed call). Kernel is a
// function pointer; one static mask per instantiation of the caller's template.
template <class Kernel>
cudaError_t ensure_dynamic_smem(Kernel kernel, int bytes, std::atomic<uint64_t>& done_devices) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
  if (bit && (done_devices.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess && bit) done_devices.fetch_or(bit, std::memory_order_release);
  return e;
}

// n / d and n % d for 0 <= n < 2^31 and 1 <= d < 2^31 by a multiply-high, an add and a shift
// (Granlund & Montgomery, "Division by invariant integers using multiplication", PLDI 1994):
// with s = ceil(log2 d) and mul = floor(2^32·(2^s − d) / d) + 1, n / d = (umulhi(n, mul) + n) >> s.
// Set on the host; tests/kernels/test_tile_schedule.cpp checks the formula. A signed `/` by a run-time divisor
// is ~15 instructions (IABS, I2F, MUFU.RCP, F2I and fix-ups).
struct FastDiv {
  int d = 1, shift = 0;
  uint32_t mul = 1;
  FastDiv() = default;
  explicit FastDiv(int divisor) : d(divisor < 1 ? 1 : divisor) {
    while ((int64_t(1) << shift) < d) ++shift;
    mul = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - uint64_t(d))) / uint64_t(d) + 1);
  }
  FLASHATTN_HD int div(int n) const {
#if defined(__CUDA_ARCH__)
    return int((__umulhi(uint32_t(n), mul) + uint32_t(n)) >> shift);
#else  // the host (the CPU tests): umulhi as its definition, the high 32 bits of the 64-bit product
    return int((uint32_t((uint64_t(uint32_t(n)) * mul) >> 32) + uint32_t(n)) >> shift);
#endif
  }
  FLASHATTN_HD int mod(int n) const { return n - div(n) * d; }
};

struct FwdArgs {
  CUtensorMap tm_q, tm_k, tm_v, tm_o;  // 5-D maps (64, rows, D/64, heads, batch), see dispatch_fwd.cu
  float* lse;                          // may be null
  long long lse_batch_stride, lse_head_stride, lse_row_stride;
  int seqlen_q, seqlen_k, heads, group;  // group = heads / heads_kv
  float scale_log2;                      // scale · log2(e); with a softcap, cap · log2(e)
  int batch, m_blocks;                   // tiles = m_blocks · heads · batch (scheduler.cuh)
  int block_m;                           // query tile (tile_size.hpp, fwd_block_m)
  int block_n;                           // key tile (fwd_block_n)
  int serial_softmax;                    // measurements (FLASHATTN_SM90_FWD_SERIAL=1): P·V waited for
                                         // before the softmax (the order without the overlap)
  int q_prefetch;                        // the producer prefetches the next tile's Q into L2 (dispatch_fwd.cu
                                         // forward: d64 non-causal; FLASHATTN_SM90_FWD_Q_PREFETCH)
  int sched;                             // SchedMode (scheduler.cuh): set by launch_fwd unless the host
                                         // forces one (>= 0, FLASHATTN_SM90_FWD_SCHED, measurements)
  // The paired schedules' phase boundary, set on the host with the grid (scheduler.cuh, tail_split):
  // pairs [0, tail_u0) = head pairs [0, tail_hp0) run paired, the rest as a snake from position
  // tail_off = tail_u0 mod G.
  int tail_u0, tail_hp0, tail_off;
  int sched_total;  // tile slots the schedule walks (set_schedule): idx < sched_total is a tile
  // The schedule's divisors (set_schedule): m_blocks, heads, heads·batch, the grid, m_blocks / 2
  // and the phase-2 heads (heads·batch − 2·tail_hp0), the last two at least 1.
  FastDiv div_m, div_heads, div_hb, div_grid, div_half, div_nh2;
  int every_tile_has_keys;  // set_schedule: no virtual tile, no fully masked query block, so a
                            // CTA's last tile with keys is the last of its chain
  // Causal kernels only: the window, keys row + diag − window_left … row + diag + window_right,
  // diag = seqlen_k − seqlen_q; window_left −1 = unbounded (clamped below seqlen_k on the host),
  // window_right >= 0 (0 = causal; an unbounded right side comes as seqlen_q: sm90.hpp).
  int window_left, window_right;
  float softcap_scale;  // scale / cap; 0 = no softcap (FragmentSoftmax::softcap)
  // Varlen (both set, else null; device pointers): sequence b is rows [cu_seqlens_q[b],
  // cu_seqlens_q[b + 1]) of the packed tensors (the maps' batch extent 1); m_blocks counts the
  // longest sequence's query tiles (seq.cuh, SeqRows). The epilogue stores a warpgroup's rows
  // that end inside the sequence with plain stores through o (the TMA store's box would write
  // into the next sequence's rows).
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  void* o;
  long long o_row_stride, o_head_stride;  // elements
  int x_chunks;  // 1 for head_dim 96 (on the d128 kernels): the maps hold the row's 96 elements as
                 // dimension 0, each 64-column chunk its own TMA load/store at x = 64·c (dispatch_fwd.cu, make_map)
  // Stream-K tail of the non-causal schedule without varlen (scheduler.cuh, StreamKTail; set on
  // the host, set_stream_k): tiles [sk_begin, sk_total) are cut into key blocks (sk_blocks per
  // tile) spread evenly over the grid, and the strided chains end at sched_total = sk_begin;
  // sk_begin = sk_total: none. A tile cut between two CTAs is finished by the part that gets there
  // second (per consumer warpgroup): sk_sync holds a counter of the parts in and a ready flag per
  // split and warpgroup (zeroed per call), sk_part the first part's state (acc_o, row max and sum
  // per thread). Last in FwdArgs: placed before the window, they moved the other kernels' code.
  int stream_k;  // host: the tail is allowed (dispatch_fwd.cu; FLASHATTN_SM90_FWD_STREAMK=0: not)
  int sk_begin, sk_total, sk_blocks;
  float* sk_part;
  int* sk_sync;
};

// The backward kernel's arguments (bwd/kernel.cuh). The per-query-row statistics and the fp32 dQ
// accumulator are scratch buffers laid out (batch, heads, m_pad[, D]), m_pad = seqlen_q rounded up
// to 128 (≥ m_blocks·kBlockM at either query step).
struct BwdArgs {
  CUtensorMap tm_q, tm_k, tm_v, tm_do;  // 5-D maps as in FwdArgs
  const float* lse_log2;  // LSE·log2(e); +inf for rows that see no key and for padding rows (P = 0)
  const float* dsum;      // D_i = rowsum(dO_i ∘ O_i); 0 for padding rows
  float* dq_accum;        // Σ dS·K over key tiles, fp32, zeroed before the kernel; scaled and cast
                          // after. Tiled: (batch, heads, m_pad/64, D/64) blocks of 64 × 64, each
                          // block contiguous so one bulk reduction adds it (bwd/kernel.cuh),
                          // its rows permuted (acc_layout.hpp dq_block_offset)
  void* dk;               // caller's dK, dV: (batch, seqlen_k, heads_kv, D), element strides below
  void* dv;
  long long dk_batch_stride, dk_row_stride, dk_head_stride;
  long long dv_batch_stride, dv_row_stride, dv_head_stride;
  int seqlen_q, seqlen_k, heads, group;  // group = heads / heads_kv
  int window_left, window_right;         // the causal kernels' window, as FwdArgs (sm90.hpp, kernel_window_*)
  int m_blocks, m_pad;                   // query tiles (BwdTile::kBlockM rows) per (batch, head); padded rows
  int n_blocks, heads_kv, batch;         // work tiles = n_blocks · heads_kv · batch (bwd/kernel.cuh)
  int grid;                              // CTAs: every tile (one each) or min(tiles, SMs) (persistent)
  float scale_log2;                      // scale · log2(e)
  float scale;
  int flags;                             // BwdFlags
  // head_dim 96 on the d128 kernel: maps as FwdArgs::x_chunks (one TMA load per 64-column chunk,
  // columns 96–127 read as zeros, so they add nothing and their dK, dV, dQ are zero), and dK/dV
  // stored up to cols = 96 (the tensors' head dim; the kernel's otherwise).
  int x_chunks, cols;
  // Softcap (the d128 kernel only, bwd/kernel.cuh): scale / cap, 0 = none; scale_log2 is then
  // cap · log2(e) as in the forward.
  float softcap_scale;
  // Varlen (the d64/d128 kernel; both set, else null): sequence b is rows [cu_seqlens_q[b],
  // cu_seqlens_q[b + 1]) of the packed tensors (maps of batch extent 1); n_blocks and m_blocks
  // count the longest sequence's tiles, batch the sequences (seq.cuh, SeqRows).
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  // kBwdDeterministic: one counter per dQ block (dq_accum's 64 × 64 blocks, same index), zeroed
  // before the kernel: the number of key tiles that have added to the block so far.
  int* dq_turn;
};

// Variants of the backward kernel (BwdArgs::flags), chosen per call in dispatch_bwd.cu (a build with
// FLASHATTN_DEV_KNOBS lets FLASHATTN_SM90_BWD_FLAGS force kBwdPersistent for measurements).
enum BwdFlags : int {
  kBwdPersistent = 8,  // min(tiles, SMs) CTAs looping over tiles: the next tile's K/V and Q/dO
                       // load while the current tile's epilogue runs (else one CTA per tile)
  kBwdDeterministic = 64,  // Options::deterministic: each dQ block takes the key tiles' additions in
                           // a fixed order (bwd/query_tiles.hpp dq_turn, bwd/dq_turns.cuh)
};

template <int kHeadDim, bool kF16, bool kCausal>
cudaError_t launch_bwd(const BwdArgs& a, cudaStream_t stream);

// Defined in fwd/kernel.cuh; one explicit instantiation per src/cuda/inst/sm90_fwd_*.cu.
template <int kHeadDim, bool kF16, bool kCausal>
cudaError_t launch_fwd(const FwdArgs& a, cudaStream_t stream);

}  // namespace flashattn::cuda::sm90
