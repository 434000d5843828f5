// The micro-kernels of the KV-cache decode path (kvcache.cpp), behind one ISA-neutral table.
//
// A decode step has few query rows per KV head (group · Sq, e.g. 4) against thousands of keys, so
// every K and V element is used by only those few rows: the work is reading the cache. Each K row
// is read once, converted to fp32 in registers and dotted with all the rows' queries (which stay in
// L1); each V row is read once and added into all the rows' accumulators. No tile products, no
// staging copies of K or V. Rows are given by address (one per key, head 0), so a chunk of keys
// may span any number of cache pages.
// One implementation per instruction set, chosen with the tile-kernel table (isa.hpp):
//   decode_kernels_scalar.cpp  (always built; the one the others are tested against)
//   decode_kernels_avx2.cpp    (-mavx2 -mfma -mf16c)
//   decode_kernels_avx512.cpp  (-mavx512f/bw/vl/dq -mfma; scores_bf16 and accumulate_bf16 with
//                              AVX512_BF16 where the CPU has it)
// The two SIMD ones share decode_kernels_simd.inl.
#pragma once

#include <cstdint>

#include "flashattn/flashattn.hpp"

namespace flashattn::cpu {

// Rows that a kernel asks the memory system for while it streams its own, so that they arrive
// before the next kernel reads them: scores requests the V rows of its keys, accumulate the K rows
// of the next chunk. Row j — for each of `heads` heads, `bytes` at rows[j] + head·head_stride — is
// requested with the kernel's key j, the rest at the end. count = 0: none.
struct RowPrefetch {
  const char* const* rows = nullptr;
  int64_t head_stride = 0, bytes = 0;
  int heads = 0, count = 0;
};

// Both kernels take nh KV heads at once; scores walks the keys outermost (a key's rows of all heads
// are adjacent in a packed cache, Hkv · d elements per token, so K is read front to back),
// accumulate by blocks of 8 keys of every head (decode_kernels_simd.inl). Per head h
// the operands are offset by h times their head stride (q_head, s_head, acc_head in floats; k_head,
// v_head in bytes).
struct DecodeKernels {
  const char* name;

  // The column order of the fp32 rows (q into scores, acc of accumulate) for bf16 K and V: within
  // each whole block of bf16_block columns (c0 … c0 + bf16_block), the block's even columns first,
  // then its odd ones; columns past the last whole block in natural order. This is the order in
  // which a bf16 vector load splits into fp32 without a shuffle (the low and the high halves of
  // its 32-bit words). 0: natural order throughout. f32 and f16 rows are always in natural order.
  int bf16_block;

  // Scores of nr query rows per head against n keys read in place:
  //   s[h·s_head + r·lds + j] = Σ_{c<d} q[h·q_head + r·ldq + c] · K_{h,j}[c]   for h < nh, r < nr, j < n,
  // K_{h,j} the d elements of dtype `type` at k[j] + h·k_head. q is fp32 (in bf16_block order for
  // bf16) with pad_n(d) readable columns per row (zero beyond d); K is read for exactly d elements.
  void (*scores)(int nh, int nr, int n, int d, const float* q, int64_t q_head, int64_t ldq, const char* const* k,
                 int64_t k_head, DType type, float* s, int64_t s_head, int64_t lds, const RowPrefetch& also);

  // Optional (null where the CPU lacks it): the scores of a bf16 cache from bf16 queries by the
  // CPU's bf16 dot-product instruction (AVX512_BF16 vdpbf16ps: pairs of exact bf16 products summed
  // in fp32), without converting K to fp32:
  //   s[h·s_head + r·lds + j] = qmult · Σ_{c<d} q[h·q_head + r·ldq + c] · K_{h,j}[c],
  // q bf16 in natural column order with bf16_pad(d) readable columns per row (zero beyond d).
  void (*scores_bf16)(int nh, int nr, int n, int d, const uint16_t* q, int64_t q_head, int64_t ldq,
                      const char* const* k, int64_t k_head, float qmult, float* s, int64_t s_head, int64_t lds,
                      const RowPrefetch& also);

  // Optional (null where the CPU lacks it), for a bf16 cache with d a multiple of 32: accumulate's
  // sum by vdpbf16ps over pairs of keys, the probabilities given in bf16 (pb: (nh, nr, ldpb),
  // ldpb even, pb[n] = 0 after an odd n), acc in bf16_dot_column order; otherwise as accumulate.
  void (*accumulate_bf16)(int nh, int nr, int n, int d, const uint16_t* pb, int64_t pb_head, int64_t ldpb,
                          const char* const* v, int64_t v_head, const float* row_scale, float* acc,
                          int64_t acc_head, int64_t ldacc, const RowPrefetch& also);

  // The probabilities of n keys added into nr accumulators per head, values read in place:
  //   acc[h·acc_head + r·ldacc + c] = acc[…] · row_scale[h·nr + r] + Σ_{j<n} p[h·p_head + r·ldp + j] · V_{h,j}[c]
  // for c < d, V_{h,j} at v[j] + h·v_head as K_{h,j} above (n ≥ 1). acc (in bf16_block order for
  // bf16) has pad_n(d) columns per row; those past d are zero and stay zero.
  void (*accumulate)(int nh, int nr, int n, int d, const float* p, int64_t p_head, int64_t ldp, const char* const* v,
                     int64_t v_head, DType type, const float* row_scale, float* acc, int64_t acc_head, int64_t ldacc,
                     const RowPrefetch& also);
};

// The column order of acc for accumulate_bf16: within each block of 32 columns c0 …, the first 16
// positions hold columns c0 + {0–3, 8–11, 16–19, 24–27}, the next 16 c0 + {4–7, 12–15, 20–23,
// 28–31} (what interleaving two bf16 rows 16 bits at a time gives, per 128-bit lane).
inline int bf16_dot_column(int pos) {
  const int c0 = pos & ~31, i = pos & 31, hi = i >> 4, k = i & 15;
  return c0 + (k >> 2) * 8 + hi * 4 + (k & 3);
}

// Columns of a bf16 query row for scores_bf16: whole 32-element (64-byte) vectors.
inline int64_t bf16_pad(int64_t d) { return (d + 31) / 32 * 32; }

// The table of the instruction set tile_kernels() uses (so FLASHATTN_CPU_ISA and
// override_tile_kernels() select both); scalar for a table of any other name.
const DecodeKernels& decode_kernels();

// For tests: make decode_kernels() return `table` from now on (null: back to the choice above),
// e.g. the AVX-512 table without its bf16 dot-product kernels on a CPU that has them. Not for use
// while a kernel runs.
void override_decode_kernels(const DecodeKernels* table);

extern const DecodeKernels kDecodeKernelsScalar;
#if defined(__x86_64__) || defined(_M_X64)
extern const DecodeKernels kDecodeKernelsAvx2;
extern const DecodeKernels kDecodeKernelsAvx512;
extern const DecodeKernels kDecodeKernelsAvx512Bf16;  // kDecodeKernelsAvx512 with scores_bf16, accumulate_bf16
#endif

}  // namespace flashattn::cpu
