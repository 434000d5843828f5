// The tile products of the SIMD tables through OpenBLAS's cblas_sgemm (Debian's OpenMP build,
// libopenblas-openmp-dev). Measured faster than the hand-written AVX2/AVX-512 micro-kernels it
// replaced on every bar shape (docs/perf/log.md, P-011), so the micro-kernels were removed; the
// scalar table keeps its plain loops as the correctness baseline.
//
// Threading: every call comes from inside the kernels' own `omp parallel` regions. OpenBLAS's
// OpenMP build runs a call single-threaded when omp_in_parallel() is true (num_cpu_avail() in its
// common_thread.h), so nothing process-wide (openblas_set_num_threads) is touched. That needs the
// OpenMP build to be the one loaded at run time: Debian's alternatives point libopenblas.so.0 at
// the pthread build by default, so CMake links the OpenMP build by its full path (its directory
// is then in the RUNPATH of what links it). openblas_get_parallel() tells which one is loaded.
#include <cblas.h>

#include <omp.h>

#include <strings.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "cpu/isa.hpp"
#include "cpu/tile_kernels.hpp"

namespace flashattn::cpu {

namespace {
// The tile products are called from inside our OpenMP parallel regions, where Debian's OpenMP
// build of OpenBLAS runs single-threaded by itself. A process may load a pthread build instead
// (another libopenblas.so.0 found first: the H200 machine's image has one), and that build would
// start its own pool of threads on every call, on top of ours; it is told once to use one thread.
void guard_blas_threads() {
  static const bool once = [] {
    if (openblas_get_parallel() == 1) openblas_set_num_threads(1);  // 1 = pthreads, 2 = OpenMP
    return true;
  }();
  (void)once;
}
}  // namespace

std::string info() {
  return std::string("tile kernels ") + isa_name() + "; " + blas_info() + "; tile products by " +
         (use_own_gemm() ? "the library's micro-kernel" : "OpenBLAS");
}

bool use_own_gemm() {
  static const bool own = [] {
    if (const char* v = std::getenv("FLASHATTN_CPU_GEMM")) {
      if (std::strcmp(v, "own") == 0) return true;
      if (std::strcmp(v, "blas") == 0) return false;
    }
    // OpenBLAS's run-time core names with AVX2/FMA or AVX-512 kernels (x86-64, 0.3.x). Any other
    // (Prescott, Nehalem, Sandybridge, ...) on a CPU where our table is AVX2 or AVX-512 means
    // OpenBLAS did not recognize it and fell back to older kernels.
    static const char* const kGood[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"};
    const std::string core = openblas_get_corename();
    const std::string isa = isa_name();
    if (isa != "avx2" && isa != "avx512") return false;
    for (const char* g : kGood)
      if (strcasecmp(core.c_str(), g) == 0) return false;
    return true;
  }();
  return own;
}

std::string blas_info() {
  std::string config = openblas_get_config();
  while (!config.empty() && config.back() == ' ') config.pop_back();
  return config + ", core " + openblas_get_corename() +
         (openblas_get_parallel() == 2 ? " (OpenMP build)" : openblas_get_parallel() == 1 ? " (pthread build)" : " (serial build)") +
         ", " + std::to_string(omp_get_max_threads()) + " OpenMP threads";
}

void gemm_blas(int m, int n, int k, const float* a, int64_t rsa, int64_t csa, const float* b,
               int64_t ldb, float* c, int64_t ldc, const float* row_scale, bool accumulate) {
  guard_blas_threads();
  if (m <= 0 || n <= 0) return;
  if (accumulate && row_scale)  // the online-softmax rescale of acc: one pass over C
    for (int i = 0; i < m; ++i) {
      float* ci = c + i * ldc;
      const float s = row_scale[i];
      if (s == 1.0f) continue;  // the row max did not move (most tiles after the first few)
      for (int j = 0; j < n; ++j) ci[j] *= s;
    }
  if (k <= 0) {
    if (!accumulate)
      for (int i = 0; i < m; ++i) std::memset(c + i * ldc, 0, sizeof(float) * size_t(n));
    return;
  }
  const float beta = accumulate ? 1.0f : 0.0f;
  // cblas checks every leading dimension against the matrix width even when only one row is read.
  const blasint ldb_ = k == 1 ? n : blasint(ldb);
  const blasint ldc_ = m == 1 ? n : blasint(ldc);
  if (csa == 1 && (rsa >= k || m == 1)) {  // row-major A
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a,
                m == 1 ? k : blasint(rsa), b, ldb_, beta, c, ldc_);
  } else if (rsa == 1 && (csa >= m || k == 1)) {  // A is the transposed view of a row-major (k, m) tile
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1.0f, a,
                k == 1 ? m : blasint(csa), b, ldb_, beta, c, ldc_);
  } else {  // any other strides (no caller uses them): pack A row-major first
    thread_local std::vector<float> packed;
    packed.resize(size_t(m) * size_t(k));
    for (int i = 0; i < m; ++i)
      for (int p = 0; p < k; ++p) packed[size_t(i) * k + p] = a[i * rsa + p * csa];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, packed.data(), k, b,
                ldb_, beta, c, ldc_);
  }
}

void gemm_nt_blas(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
                  float* c, int64_t ldc) {
  guard_blas_threads();
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int i = 0; i < m; ++i) std::memset(c + i * ldc, 0, sizeof(float) * size_t(n));
    return;
  }
  // Same leading-dimension checks as above: a single row may have any stride.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, m == 1 ? k : blasint(lda),
              b, n == 1 ? k : blasint(ldb), 0.0f, c, m == 1 ? n : blasint(ldc));
}

}  // namespace flashattn::cpu
