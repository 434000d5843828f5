// Error statistics and FlashAttention's tolerance rule (style.md, "Tests and benchmarks").
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "test_util.hpp"

namespace fa_test {

ErrStats error_stats(const std::vector<double>& x, const std::vector<double>& ref) {
  ErrStats s;
  if (x.size() != ref.size()) {
    s.max = std::numeric_limits<double>::infinity();
    return s;
  }
  double total = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double e = std::abs(x[i] - ref[i]);
    if (x[i] == ref[i]) e = 0;             // equal infinities
    if (std::isnan(e)) e = std::numeric_limits<double>::infinity();  // NaN counts as the worst error
    total += e;
    if (e > s.max || s.argmax < 0) {
      s.max = e;
      s.argmax = int64_t(i);
    }
  }
  s.mean = x.empty() ? 0 : total / double(x.size());
  return s;
}

namespace {
double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}
// The reference's own rounding noise at the output precision: max|round_to_dtype(ref) − ref|.
double rounding_noise(const std::vector<double>& ref, DType dtype) {
  double n = 0;
  for (double r : ref)
    if (std::isfinite(r)) n = std::max(n, std::abs(round_to_dtype(r, dtype) - r));
  return n;
}
// The floor, in units of fp32 roundoff u = 2^-24 at the tensor's scale M = max(1, max|ref|) (our
// inputs are O(1)·magnitude, so intermediates are at least O(1)):
//   16·u·M        the plain implementation, the kernel and the reference's f32 rounding all err by
//                 a few ulps for f32, and "2 × plain" alone fails on an unlucky draw; gradients whose
//                 exact value is 0 (dq with a single key: dS = P·(dP − D) cancels exactly in the
//                 reference and in the plain autograd form, while a kernel computing D = rowsum(dO∘O)
//                 in another order leaves an fp32 residue) need an absolute term too.
//   4·u·S·M       S = max|scale·q·k| of the problem. Kernels may (docs/semantics.md) take exponentials as
//                 exp2 with scale·log2(e) folded into one fp32 constant: the constant, the product and
//                 the subtraction of the row maximum each round a value of size |s|·log2(e), so every
//                 score moves by up to ~3·1.44·u·|s| ≈ 4u·|s| against the plain fp32 computation, and
//                 outputs and gradients move by about that times their own magnitude. With inputs ×30 (|s| ~ 1e3) this is the
//                 dominant fp32 error of a correct kernel and is not present in the plain one.
// For f16/bf16 both terms are far below the rounding noise (u_bf16 = 2^-8 = 65536·u).
double floor_for(const std::vector<double>& ref, double score_max) {
  return (16.0 + 4.0 * score_max) / 16777216.0 * std::max(1.0, max_abs(ref));
}
}  // namespace

double rule_bound(const std::vector<double>& ref, const std::vector<double>& plain, DType dtype, double score_max) {
  return 2 * error_stats(plain, ref).max + rounding_noise(ref, dtype) + floor_for(ref, score_max);
}

::testing::AssertionResult within_rule(const std::string& what, const std::vector<double>& x,
                                       const std::vector<double>& ref, const std::vector<double>& plain, DType dtype,
                                       double score_max) {
  const ErrStats e = error_stats(x, ref), ep = error_stats(plain, ref);
  const double noise = rounding_noise(ref, dtype), floor = floor_for(ref, score_max);
  const double bound = 2 * ep.max + noise + floor;
  std::ostringstream os;
  os << what << " (" << dtype_name(dtype) << ", " << x.size() << " elements): max|x-ref| = " << e.max
     << " (at " << e.argmax << ": x = " << (e.argmax >= 0 ? x[size_t(e.argmax)] : 0.0)
     << ", ref = " << (e.argmax >= 0 ? ref[size_t(e.argmax)] : 0.0) << "), mean " << e.mean
     << "; plain same-precision: max " << ep.max << ", mean " << ep.mean << "; ref rounding noise " << noise
     << "; floor " << floor << "; bound 2*plain+noise+floor = " << bound << "; max|ref| = " << max_abs(ref);
  if (e.max <= bound) return ::testing::AssertionSuccess() << os.str();
  return ::testing::AssertionFailure() << os.str();
}

// Algorithm::standard materializes S in the working dtype (src/cpu/standard.cpp, as the naive
// framework that the plain implementation models), so its LSE carries S's rounding: each stored
// score is off by at most u_dtype·|s| (relative rounding, in natural or log2 units alike) and the
// LSE, a smooth maximum, by at most the largest of those, u_dtype·max_j|s_ij| per row (plus 2^-24
// for f16 subnormals). Algorithm::flash keeps S in fp32 (docs/semantics.md) and gets the fp32 bound alone.
std::vector<double> lse_bound(Algorithm algo, DType dtype, const FwdResult& plain) {
  std::vector<double> tol = plain.lse_tol;
  if (algo != Algorithm::standard) return tol;
  const double u = dtype == DType::f32 ? 0x1p-24 : dtype == DType::f16 ? 0x1p-11 : 0x1p-8;
  for (size_t i = 0; i < tol.size(); ++i) tol[i] += u * plain.row_score_max[i] + 0x1p-24;
  return tol;
}

::testing::AssertionResult lse_within(const std::vector<double>& x, const std::vector<double>& ref,
                                      const std::vector<double>& tol, double extra) {
  const double ninf = -std::numeric_limits<double>::infinity();
  int64_t bad = 0, first_bad = -1, inf_rows = 0, inf_mismatch = 0;
  double max_err = 0, sum_err = 0, worst_ratio = 0;
  int64_t finite = 0, worst = -1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (ref[i] == ninf) {
      ++inf_rows;
      if (x[i] != ninf) {
        ++inf_mismatch;
        if (first_bad < 0) first_bad = int64_t(i);
      }
      continue;
    }
    double e = std::abs(x[i] - ref[i]);
    if (std::isnan(e)) e = std::numeric_limits<double>::infinity();
    ++finite;
    sum_err += e;
    max_err = std::max(max_err, e);
    const double ratio = e / (tol[i] + extra);
    if (ratio > worst_ratio || worst < 0) {
      worst_ratio = ratio;
      worst = int64_t(i);
    }
    if (!(e <= tol[i] + extra)) {
      ++bad;
      if (first_bad < 0) first_bad = int64_t(i);
    }
  }
  std::ostringstream os;
  os << "lse (" << x.size() << " rows, " << inf_rows << " with no visible key): max err " << max_err << ", mean "
     << (finite ? sum_err / double(finite) : 0.0) << ", worst err/bound " << worst_ratio << " (bound: fp32 bound per row + "
     << extra << ")";
  if (worst >= 0) os << " (row " << worst << ": x = " << x[size_t(worst)] << ", ref = " << ref[size_t(worst)]
                     << ", bound " << tol[size_t(worst)] + extra << ")";
  if (bad == 0 && inf_mismatch == 0) return ::testing::AssertionSuccess() << os.str();
  os << "; " << bad << " rows over the bound, " << inf_mismatch << " rows that must be -inf are not (first bad row "
     << first_bad << ": x = " << x[size_t(first_bad)] << ", ref = " << ref[size_t(first_bad)] << ")";
  return ::testing::AssertionFailure() << os.str();
}

::testing::AssertionResult close_rel(const std::string& what, const std::vector<double>& x,
                                     const std::vector<double>& ref, double rel) {
  if (x.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": sizes differ " << x.size() << " vs " << ref.size();
  double worst = 0;
  int64_t at = -1, bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == ref[i]) continue;
    const double e = std::abs(x[i] - ref[i]) / std::max(1.0, std::abs(ref[i]));
    if (!(e <= rel)) {
      ++bad;
      if (at < 0 || !(e <= worst)) {
        worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
        at = int64_t(i);
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << x.size() << " elements differ by more than "
                                       << rel << " (relative to max(1,|ref|)); worst at " << at << ": " << x[size_t(at)]
                                       << " vs " << ref[size_t(at)];
}

}  // namespace fa_test
