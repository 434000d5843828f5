// PTX wrappers for the Hopper kernels: mbarrier, TMA (cp.async.bulk.tensor), wgmma fences and
// shared-memory descriptors, setmaxnreg, named barriers, ex2. Every fact used here is written down
// with its source in docs/hopper-sm90.md (section numbers below refer to it).
// Compiles for sm_90a only (wgmma, setmaxnreg).
#pragma once

#include <cuda.h>  // CUtensorMap (header only; the encode function is fetched at run time)

#include <cstdint>

#include "cuda/sm90/primitives/smem_desc.hpp"

namespace flashattn::cuda::sm90::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Two floats to shared memory (an 8-byte aligned shared-window address).
__device__ __forceinline__ void st_shared_v2_f32(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// stmatrix .x4: four 8×8 b16 matrices; lane l gives the shared address of row l % 8 of matrix
// l / 8, and register k holds this lane's two elements (row lane / 4, columns 2·(lane % 4) + 0, 1)
// of matrix k — the layout of an mma/wgmma accumulator fragment packed to 16 bits (docs/hopper-sm90.md §1.3).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
// d[i] = s[i] for i < 4 where keep != 0, as predicated moves: d stays a live value up to here
// (mainloop.cuh, the speculative softmax's P fragment).
__device__ __forceinline__ void mov_if(uint32_t (&d)[4], const uint32_t (&s)[4], uint32_t keep) {
  asm volatile(
      "{\n .reg .pred q;\n setp.ne.u32 q, %8, 0;\n"
      " @q mov.b32 %0, %4;\n @q mov.b32 %1, %5;\n @q mov.b32 %2, %6;\n @q mov.b32 %3, %7;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(s[0]), "r"(s[1]), "r"(s[2]), "r"(s[3]), "r"(keep));
}
// A read-only global load the compiler may neither merge with an earlier one nor hoist: a value
// reloaded where it is needed instead of kept in a register across a main loop.
__device__ __forceinline__ int ld_global_nc_reload(const int* p) {
  int v;
  asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// ---- mbarrier (§4) ------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
// A ring of `stages` full/empty pairs: full[s] completes on one arrival (the producer's
// arrive_expect_tx; the transaction bytes finish it), empty[s] on one per consumer warpgroup.
__device__ __forceinline__ void mbar_init_ring(uint64_t* full, uint64_t* empty, int stages, uint32_t consumers) {
  for (int s = 0; s < stages; ++s) {
    mbar_init(full + s, 1);
    mbar_init(empty + s, consumers);
  }
}
// Makes the inits visible to the async proxy (TMA); follow with __syncthreads().
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Blocks until the phase with this parity has completed (a fresh barrier: parity 1 passes at once).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1, 0x989680;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// ---- TMA (§3) -----------------------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// 5-D box load into smem, completing `bytes` (counted by the caller's expect_tx) on bar.
__device__ __forceinline__ void tma_load_5d(void* sdst, const CUtensorMap* map, uint64_t* bar, int c0,
                                            int c1, int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(smem_addr(sdst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(c4)
      : "memory");
}
// One tile (kRows × D as 64-column chunks, chunk c at + c·kRows·128) from a 5-D map of
// make_map (dispatch_fwd.cu): one box over every chunk, or with x_chunks (head_dim 96 on the d128
// kernels, x_chunked) one box per chunk at x = 64·c, TMA filling the columns past 96 with zeros.
template <int kChunks, int kRows>
__device__ __forceinline__ void tma_load_tile(bool x_chunks, uint8_t* dst, const CUtensorMap* map, uint64_t* bar,
                                              int row, int head, int batch) {
  if (kChunks == 2 && x_chunks) {  // only the d128 kernels run head_dim 96
#pragma unroll
    for (int c = 0; c < kChunks; ++c) tma_load_5d(dst + c * kRows * 128, map, bar, 64 * c, row, 0, head, batch);
  } else {
    tma_load_5d(dst, map, bar, 0, row, 0, head, batch);
  }
}
// The same box(es) into L2 only (no smem, no barrier): the data is on chip when tma_load_tile
// asks for it later.
__device__ __forceinline__ void tma_prefetch_5d(const CUtensorMap* map, int c0, int c1, int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.prefetch.tensor.5d.L2.global.tile [%0, {%1, %2, %3, %4, %5}];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
               : "memory");
}
template <int kChunks>
__device__ __forceinline__ void tma_prefetch_tile(bool x_chunks, const CUtensorMap* map, int row, int head, int batch) {
  if (kChunks == 2 && x_chunks) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) tma_prefetch_5d(map, 64 * c, row, 0, head, batch);
  } else {
    tma_prefetch_5d(map, 0, row, 0, head, batch);
  }
}
// dst[i] += src[i] (fp32) for bytes/4 contiguous floats, done by the copy engine in L2 (one
// instruction instead of one atomic per element pair); completes as a bulk group (commit below).
// The first 1024-byte boundary at or after p: where a kernel's dynamic shared memory is carved from
// (128B-swizzled TMA tiles need 1024-byte alignment, docs/hopper-sm90.md §2).
__device__ __forceinline__ uint8_t* align_1024(uint8_t* p) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 1023) & ~uintptr_t(1023));
}
// Asks L2 to fetch `bytes` (a multiple of 16) from a 16-byte aligned global address; no completion.
__device__ __forceinline__ void bulk_prefetch_l2(const void* gsrc, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(gsrc), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_reduce_add_f32(float* gdst, const float* ssrc, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gdst),
               "r"(smem_addr(ssrc)), "r"(bytes)
               : "memory");
}
// Waits until at most kPending committed bulk groups still read their smem sources.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Waits until at most kPending committed bulk groups have not completed (writes included).
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// Waits until every committed bulk group has completed (writes included).
__device__ __forceinline__ void bulk_wait_all() { bulk_wait<0>(); }
// 5-D box store from smem; out-of-bounds rows of the box are not written (partial tiles).
__device__ __forceinline__ void tma_store_5d(const CUtensorMap* map, const void* ssrc, int c0, int c1,
                                             int c2, int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group"
      " [%0, {%2, %3, %4, %5, %6}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(smem_addr(ssrc)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until the smem sources of all committed stores have been read (the CTA may then exit or
// overwrite them; the global writes complete on their own).
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// Generic-proxy smem writes -> async-proxy reads (TMA store, wgmma): each writer, then a barrier.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// The same between the generic and the async proxy for global memory (a bulk reduction's completed
// writes before a release store; an acquire load before the next bulk reduction).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// ---- wgmma fences (§1.2) ------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// wgmma.wait_group kPending, predicated on `go` (nonzero at run time): an instruction that reads a
// value, so ptxas cannot move it above the code computing that value — unlike the plain wait, which
// it hoists (mainloop.cuh). Follow it with a plain wait_group: ptxas serializes every wgmma (C7514)
// if an accumulator may be read after a wait that might not have run.
template <int kPending>
__device__ __forceinline__ void wgmma_wait_after(int go) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p wgmma.wait_group.sync.aligned %1;\n}\n" ::"r"(go),
               "n"(kPending)
               : "memory");
}
// Pins accumulator registers so the compiler cannot move their reads/writes across the async
// wgmma (silent bug 4 of §8).
template <int N>
__device__ __forceinline__ void fence_operand(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operand(uint32_t (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
template <int M, int N>
__device__ __forceinline__ void fence_operand(uint32_t (&d)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i) fence_operand(d[i]);
}

// ---- shared-memory matrix descriptors: smem_desc.hpp -------------------------------------------

// ---- registers and barriers (§4, §5) ------------------------------------------------------------
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// A named barrier that also ORs a predicate over its threads: every thread gets the result.
__device__ __forceinline__ bool named_bar_or(int id, int threads, bool pred) {
  uint32_t r;
  asm volatile("{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\nselp.u32 %0, 1, 0, q;\n}\n"
               : "=r"(r)
               : "r"(uint32_t(pred)), "r"(id), "r"(threads)
               : "memory");
  return r != 0;
}

// ---- flags between CTAs (the forward's stream-K tail) ----------------------------------------------
// A pointer the compiler cannot see through: address arithmetic on it stays where it is written.
template <class T>
__device__ __forceinline__ T* opaque(T* p) {
  asm volatile("" : "+l"(p));
  return p;
}
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// ---- math ---------------------------------------------------------------------------------------
// 2^x, flushes subnormals; ex2(-inf) = 0 (§6).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashattn::cuda::sm90::ptx
