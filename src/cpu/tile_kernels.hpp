// The vectorized building blocks of the CPU flash kernels, behind one ISA-neutral table.
//
// flash_forward.cpp / flash_backward.cpp hold the tiling, masking, threading and the per-row
// online-softmax bookkeeping (SoftmaxState); everything that touches a whole tile row or a tile
// product goes through this table. One implementation per instruction set:
//   tile_kernels_scalar.cpp  (always built; the one the others are tested against)
//   tile_kernels_avx2.cpp    (-mavx2 -mfma -mf16c)
//   tile_kernels_avx512.cpp  (-mavx512f/bw/vl/dq -mfma)
// isa.cpp picks one at start-up (FLASHATTN_CPU_ISA=scalar|avx2|avx512 forces one).
//
// Buffers are fp32. Tiles are padded to kPadN columns with zeros so that whole-vector row
// operations never read garbage; the GEMMs themselves take any m, n, k.
#pragma once

#include <cstdint>
#include <string>

#include "flashattn/flashattn.hpp"

namespace flashattn::cpu {

// Column padding of every tile that is a GEMM B operand or C (output) operand: one AVX-512 vector.
constexpr int kPadN = 16;
inline int64_t pad_n(int64_t n) { return (n + kPadN - 1) / kPadN * kPadN; }

struct TileKernels {
  const char* name;

  // C(m×n) = [C ∘ row_scale] + A(m×k) · B(k×n).
  //   A[i][p] = a[i*rsa + p*csa]  (any strides: row-major, or a transposed view of a tile)
  //   B[p][j] = b[p*ldb + j]      (row-major)
  //   C[i][j] = c[i*ldc + j]
  // accumulate = false: C is overwritten (row_scale ignored). accumulate = true: C is first
  // multiplied by row_scale[i] (when row_scale is not null), then A·B is added.
  void (*gemm)(int m, int n, int k, const float* a, int64_t rsa, int64_t csa, const float* b,
               int64_t ldb, float* c, int64_t ldc, const float* row_scale, bool accumulate);

  // C(m×n) = A(m×k) · B(n×k)ᵀ, C overwritten; A[i][p] = a[i*lda + p], B[j][p] = b[j*ldb + p].
  // S = Q Kᵀ with K read as it lies (rows of the caller's tensor, or a converted tile): no
  // transposed copy of K is ever built (OpenBLAS packs Bᵀ straight from the rows).
  void (*gemm_nt)(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
                  float* c, int64_t ldc);

  // max(x[0..n)); -inf for n == 0.
  float (*row_max)(const float* x, int n);

  // x[j] = exp2(x[j] - offset) for j < n; returns the sum. exp2(-inf) = 0 exactly.
  float (*exp2_sum)(float* x, int n, float offset);

  // x[j] = out_mult * cap * tanh(x[j] / cap); when t is not null, t[j] = tanh(x[j] / cap).
  void (*softcap)(float* x, int n, float cap, float out_mult, float* t);

  // dst[j] = mult * float(src[j]) for j < n, src of dtype `type`.
  void (*load)(const void* src, DType type, int n, float mult, float* dst);

  // dst[j] = round_to_dtype(mult * src[j]) for j < n.
  void (*store)(const float* src, int n, float mult, DType type, void* dst);

  // Σ a[j] * b[j].
  float (*dot)(const float* a, const float* b, int n);

  // ds[j] = p[j] * (dp[j] - d) * (t ? 1 - t[j]² : 1). ds may alias dp.
  void (*dsoftmax)(const float* p, const float* dp, float d, const float* t, int n, float* ds);
};

// The OpenBLAS the process loaded: its build string, the core kernel set it chose at run time,
// pthread/OpenMP build, and this process's OpenMP thread count (for `flashattn bench` and reports).
std::string blas_info();

// Whether the SIMD tables do their tile products with their own micro-kernel instead of OpenBLAS:
// when the loaded OpenBLAS runs a generic kernel set on this CPU (its core name is not one of the
// AVX2/AVX-512 ones), or when FLASHATTN_CPU_GEMM=own (=blas forces OpenBLAS). Decided once.
bool use_own_gemm();

// TileKernels::gemm through cblas_sgemm (gemm_blas.cpp); used by the SIMD tables.
void gemm_blas(int m, int n, int k, const float* a, int64_t rsa, int64_t csa, const float* b,
               int64_t ldb, float* c, int64_t ldc, const float* row_scale, bool accumulate);
void gemm_nt_blas(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
                  float* c, int64_t ldc);

extern const TileKernels kTileKernelsScalar;
#if defined(__x86_64__) || defined(_M_X64)
extern const TileKernels kTileKernelsAvx2;
extern const TileKernels kTileKernelsAvx512;
#endif

}  // namespace flashattn::cpu
