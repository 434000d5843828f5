// The Hopper forward kernel: skeleton (shared memory, barriers, roles) and its host launcher.
//
//   warpgroup 0 (producer): setmaxnreg.dec 24; one thread issues the TMA loads of Q and of the
//                            K/V ring, tile after tile (mainloop.cuh, producer_tile)
//   warpgroups 1, 2 (consumers): setmaxnreg.inc 240; 64 query rows each; S = Q·Kᵀ (wgmma SS),
//                            online softmax in registers, O += P·V (wgmma RS), ping-pong between
//                            the two (mainloop.cuh, Consumer::run), then epilogue.cuh.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/runtime.hpp"
#include "cuda/sm90/fwd/epilogue.cuh"
#include "cuda/sm90/fwd/mainloop.cuh"
#include "cuda/sm90/fwd/scheduler.cuh"

namespace flashattn::cuda::sm90 {

template <int kHeadDim, int kBlockM, bool kF16, bool kCausal, bool kVarlen, bool kSoftcap>
__global__ void __launch_bounds__(FwdTile<kHeadDim, kBlockM>::kThreads, 1)
    fwd_kernel(const __grid_constant__ FwdArgs a) {
  using Tile = FwdTile<kHeadDim, kBlockM>;
  extern __shared__ uint8_t smem_raw[];
  Smem<Tile> sm = Smem<Tile>::carve(smem_raw);
  using Sched = TileScheduler<kCausal>;
  // Tiles without keys: causal (fully masked query blocks, the paired schedules' virtual tiles) and
  // varlen (tiles past their sequence's rows). The non-causal kernels without varlen have none
  // (every query block sees seqlen_k > 0 keys), and their code keeps no trace of them.
  constexpr bool kEmptyTiles = kCausal || kVarlen;
  // Those same kernels (non-causal, no varlen, no softcap) may end with a stream-K tail
  // (scheduler.cuh, StreamKTail): the strided chains stop at sk_begin (sched_total), and the
  // tail's items follow them in the same loops (below). Not d256: its consumer, at 240 registers,
  // has no room for the merge.
  constexpr bool kStreamK = !kEmptyTiles && !kSoftcap && kHeadDim != 256;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    ptx::tma_prefetch_desc(&a.tm_q);
    ptx::tma_prefetch_desc(&a.tm_k);
    ptx::tma_prefetch_desc(&a.tm_v);
    ptx::tma_prefetch_desc(&a.tm_o);
    sm.init_barriers();
  }
  __syncthreads();

  PipeState ps;  // ring positions, carried across this CTA's tiles
  if (wg == 0) {
    ptx::setmaxnreg_dec<Tile::kProducerRegs>();
    if (threadIdx.x != 0) {
    } else if constexpr (kStreamK) {
      // The strided tiles, then the tail's items, in one loop (two loops, each with its own
      // producer_tile, made the producer spill at 24 and at 32 registers).
      const bool tail = a.sk_begin < a.sk_total;
      const StreamKTail st = tail ? StreamKTail::of(a) : StreamKTail{0, 0};
      for (int idx = Sched::first(a), t = tail ? st.first(a) : 0, t_end = tail ? st.end(a) : 0;;) {
        const bool strided = Sched::valid(a, idx);
        if (!strided && t == t_end) break;
        const SkItem it = strided ? SkItem{idx, 0, a.sk_blocks, -1} : st.item(a, t);
        if (strided) {
          idx = Sched::next(a, idx);
          if (a.q_prefetch && Sched::valid(a, idx)) {  // as below
            const TileCoord tn = Sched::coord(a, idx);
            ptx::tma_prefetch_tile<Tile::kChunks>(a.x_chunks, &a.tm_q, tn.m_block * Tile::kBlockM, tn.head, tn.batch);
          }
        } else {
          ++t;
        }
        const TileCoord tc = Sched::coord(a, it.idx);
        producer_tile<Tile, kEmptyTiles>(a, sm, ps, tc.m_block, tc.head, seq_rows<false>(a, tc.batch),
                                         KeyTiles{it.kb_begin, it.kb_end});
      }
    } else {
      for (int idx = Sched::first(a), next_idx; Sched::valid(a, idx); idx = next_idx) {
        // The next tile's Q into L2 now: a tile's Q is read from DRAM once (K/V are shared by the
        // head's query blocks and mostly hit L2), and its load waits for this tile's last Q·Kᵀ, a
        // softmax, a P·V and an epilogue before the consumers need it.
        next_idx = Sched::next(a, idx);
        if (a.q_prefetch && Sched::valid(a, next_idx)) {
          const TileCoord tn = Sched::coord(a, next_idx);
          const SeqRows sn = seq_rows<kVarlen>(a, tn.batch);
          if (tile_has_rows<Tile, kVarlen>(a, tn, sn))
            ptx::tma_prefetch_tile<Tile::kChunks>(a.x_chunks, &a.tm_q, sn.q_start + tn.m_block * Tile::kBlockM, tn.head,
                                                  sn.batch);
        }
        const TileCoord tc = Sched::coord(a, idx);
        const SeqRows s = seq_rows<kVarlen>(a, tc.batch);
        producer_tile<Tile, kEmptyTiles>(a, sm, ps, tc.m_block, tc.head, s, tile_keys<Tile, kCausal, kVarlen>(a, tc, s));
      }
    }
  } else {
    ptx::setmaxnreg_inc<Tile::kConsumerRegs>();
    // The ping-pong turns run across tiles (mainloop.cuh): find this CTA's last tile with keys.
    // Its tile index; without empty tiles (FwdArgs::every_tile_has_keys) the chain's last, found
    // without each tile's coordinates and key range (their index arithmetic, per tile, was ~5 % of
    // the instructions of a short tile, as ncu counts them).
    int last_work = -1;
    auto has_keys = [&](int idx) {
      const TileCoord tc = Sched::coord(a, idx);
      return tile_keys<Tile, kCausal, kVarlen>(a, tc, seq_rows<kVarlen>(a, tc.batch)).count() > 0;
    };
    for (int idx = Sched::first(a); Sched::valid(a, idx); idx = Sched::next(a, idx))
      if (a.every_tile_has_keys || has_keys(idx)) last_work = idx;
    if (kStreamK && a.sk_begin < a.sk_total) last_work = -1;  // the tail's last item is the last
    bool first_work = true;
    if constexpr (kStreamK) {
      // The strided chain, then the tail's items t < t_end, in one loop: a second call site of run()
      // took the main loops' descriptor math out of the uniform registers (R2UR 0 → 32 per loop
      // body). Only t stays live across run(); the item is formed again where it is needed. The
      // other kernels keep the loop below, whose code this one would have moved.
      // Keep the form below even where it looks redundant (the strided keys from tile_keys, the
      // steps for a tile without keys, which cannot occur here): the plainer version — keys from
      // the item, those steps dropped — brought R2UR 0 → 32 back into the d128 loop body.
      int t = 0, t_end = 0;
      if (a.sk_begin < a.sk_total) {
        const StreamKTail st = StreamKTail::of(a);
        t = st.first(a);
        t_end = st.end(a);
      }
      for (int idx = Sched::first(a);;) {
        const bool strided = Sched::valid(a, idx);
        if (!strided && t == t_end) break;
        const SkItem it = strided ? SkItem{idx, 0, 0, -1} : StreamKTail::of(a).item(a, t);
        const TileCoord tc = Sched::coord(a, it.idx);
        const SeqRows s = seq_rows<false>(a, tc.batch);
        const KeyTiles keys = strided ? tile_keys<Tile, false, false>(a, tc, s) : KeyTiles{it.kb_begin, it.kb_end};
        const int n_blocks = keys.count();
        Consumer<Tile, kF16, kCausal, kHeadDim, kSoftcap> c;
        c.run(a, sm, ps, wg - 1, tc.m_block, keys, first_work, strided ? idx == last_work : t == t_end - 1, s.q_len, s.k_len);
        if (n_blocks > 0) first_work = false;
        if (n_blocks == 0) ptx::named_bar_sync(1 + (wg - 1), 128);  // as below
        // A tail tile cut between two CTAs: the part that finishes second stores it (stream_k_meet).
        const int slot = strided ? -1 : StreamKTail::of(a).item(a, t).slot;
        if (slot < 0 || stream_k_meet<Tile>(a, c, wg - 1, slot)) {
          const TileCoord dc = strided ? tc : Sched::coord(a, StreamKTail::of(a).item(a, t).idx);
          epilogue<Tile, kF16, kCausal, kHeadDim, false, kSoftcap>(a, sm, c, wg - 1, dc.m_block, dc.head, seq_rows<false>(a, dc.batch));
        }
        // O staged in sQ (d192), or no keys: release sQ (as below); a first part releases it too.
        if ((!Tile::kSeparateO || n_blocks == 0) && threadIdx.x % 128 == 0) ptx::mbar_arrive(sm.empty_q);
        if (strided) idx = Sched::next(a, idx);
        else ++t;  // idx stays past the chain
      }
    } else {
      for (int idx = Sched::first(a), next_idx = 0; Sched::valid(a, idx); idx = next_idx) {
        // The causal chains take next() here, where few registers are live (taken after run(), the
        // d256 consumer spills); the strided one after the tile (taken here, it costs d128
        // non-causal 2–3 %).
        if (kCausal) next_idx = Sched::next(a, idx);
        const TileCoord tc = Sched::coord(a, idx);
        const SeqRows s = seq_rows<kVarlen>(a, tc.batch);
        const KeyTiles keys = tile_keys<Tile, kCausal, kVarlen>(a, tc, s);
        const int n_blocks = keys.count();
        Consumer<Tile, kF16, kCausal, kHeadDim, kSoftcap> c;
        c.run(a, sm, ps, wg - 1, tc.m_block, keys, first_work, idx == last_work, s.q_len, s.k_len);
        if (n_blocks > 0) first_work = false;
        // A tile with no keys skipped the ping-pong barriers: make sure the previous tile's TMA
        // store has finished reading sO (thread 0 waits for it) before this epilogue overwrites it.
        // Otherwise the ping-pong barriers in run() already ordered thread 0's wait before these writes.
        if (n_blocks == 0) {
          // The producer's arrival for this tile (producer_tile): this tile's release of sQ comes
          // after the producer has seen the previous one's, so empty_q never runs two phases ahead.
          if (kEmptyTiles) ptx::mbar_wait(sm.full_q, ps.q_loads++ & 1);
          ptx::named_bar_sync(1 + (wg - 1), 128);
        }
        epilogue<Tile, kF16, kCausal, kHeadDim, kVarlen, kSoftcap>(a, sm, c, wg - 1, tc.m_block, tc.head, seq_rows<kVarlen>(a, tc.batch));
        // O was staged in sQ (d256) or the tile had no keys (run() released nothing): release sQ
        // now, after thread 0's wait for the TMA store's smem reads and (O in sQ) every thread's
        // reads of the varlen epilogue's plain stores.
        if (kVarlen && !Tile::kSeparateO) ptx::named_bar_sync(1 + (wg - 1), 128);
        if ((!Tile::kSeparateO || n_blocks == 0) && threadIdx.x % 128 == 0) ptx::mbar_arrive(sm.empty_q);
        if (!kCausal) next_idx = Sched::next(a, idx);
      }
    }
  }
}

// Host side: launches fwd_kernel for one (head_dim, query tile, dtype, causal; the key tile follows
// from the head dim, fwd_default_block_n); args encoded.
template <int kHeadDim, int kBlockM, bool kF16, bool kCausal>
cudaError_t launch_fwd_tile(const FwdArgs& args, cudaStream_t stream) {
  using Tile = FwdTile<kHeadDim, kBlockM>;
  constexpr int kBlockN = Tile::kBlockN;
  // Varlen and softcap are the kernel's own instances: varlen's per-sequence rows and clipped
  // stores would cost the kernel without them 1–3 % at d64 causal; the softcap's code in the main
  // loop, skipped by a uniform branch, 1–2 % at d64 non-causal and a third of the d128 loop body's
  // instructions (docs/perf/log.md, P-091, P-077, P-112).
  // No softcap instance with 192-row tiles (its consumers spilled): fwd_block_m takes 128 rows then.
  constexpr bool kSoftcapTile = kBlockM != 192;
  const bool varlen = args.cu_seqlens_q != nullptr, softcap = args.softcap_scale > 0.f;
  if (softcap && !kSoftcapTile) return cudaErrorInvalidValue;
  auto kernel = varlen ? (softcap ? fwd_kernel<kHeadDim, kBlockM, kF16, kCausal, true, kSoftcapTile>
                                  : fwd_kernel<kHeadDim, kBlockM, kF16, kCausal, true, false>)
                       : (softcap ? fwd_kernel<kHeadDim, kBlockM, kF16, kCausal, false, kSoftcapTile>
                                  : fwd_kernel<kHeadDim, kBlockM, kF16, kCausal, false, false>);
  constexpr int smem = Smem<Tile>::kBytes;
  static std::atomic<uint64_t> smem_set[4];  // devices each kernel's attribute is set on (static: zeroed)
  cudaError_t e = ensure_dynamic_smem(kernel, smem, smem_set[2 * varlen + softcap]);
  if (e != cudaSuccess) return e;
  int dev = 0, sms = 0;
  if ((e = cudaGetDevice(&dev)) != cudaSuccess) return e;
  if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return e;
  FwdArgs a = args;
  const long long heads_batch = (long long)a.heads * a.batch;
  if (a.sched < 0 || (!kCausal && a.sched != kStrided && a.sched != kOnePerCta)) a.sched = sched_mode(kCausal, a.m_blocks, heads_batch, sms);
  const int grid = grid_size(a.sched, a.m_blocks, heads_batch, sms);
  set_schedule(a, kCausal, heads_batch, grid);
  // The stream-K tail (fwd_kernel's kStreamK, strided schedule): its split slots' partial states
  // and counters, from the stream-ordered scratch pool, the counters zeroed on the stream.
  const bool stream_k = !kCausal && !varlen && !softcap && kHeadDim != 256 && a.sched == kStrided && a.stream_k;
  const int slots = set_stream_k(a, a.sched_total, grid, (a.seqlen_k + kBlockN - 1) / kBlockN, stream_k);
  const size_t part_floats = size_t(slots) * Tile::kConsumerWGs * (kHeadDim / 2 + 4) * 128;
  const size_t sync_bytes = size_t(2) * slots * Tile::kConsumerWGs * sizeof(int);
  DeviceScratch scratch(slots ? part_floats * sizeof(float) + sync_bytes : 0, stream);
  if (slots) {
    a.sk_part = scratch.as<float>();
    a.sk_sync = reinterpret_cast<int*>(a.sk_part + part_floats);
    if ((e = cudaMemsetAsync(a.sk_sync, 0, sync_bytes, stream)) != cudaSuccess) return e;
  }
  kernel<<<grid, Tile::kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

// The tiles were chosen on the host (fwd_block_m, fwd_block_n; FwdArgs::block_m/block_n, the
// boxes of the Q and K/V maps).
template <int kHeadDim, bool kF16, bool kCausal>
cudaError_t launch_fwd(const FwdArgs& a, cudaStream_t stream) {
  constexpr int kBlockN = FwdTile<kHeadDim>::kBlockN;
  if constexpr (kHeadDim == 64)
    if (a.block_m == 192 && a.block_n == kBlockN) return launch_fwd_tile<kHeadDim, 192, kF16, kCausal>(a, stream);
  if (a.block_m != 128 || a.block_n != kBlockN) return cudaErrorInvalidValue;
  return launch_fwd_tile<kHeadDim, 128, kF16, kCausal>(a, stream);
}

}  // namespace flashattn::cuda::sm90
