// The runner behind the forward/backward tests (see attention_case.hpp).
#include "attention_case.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/check.hpp"
#include "cpu/reference.hpp"

namespace fa_test {

namespace {

// Cases whose work (Σ q_len·k_len·H·d) is at most this also run the test's own fp64 oracle and
// compare the library's reference with it (1e-9): the rule is only as good as the reference.
constexpr int64_t kOracleWork = 40'000'000;

// On CUDA the flash kernels cover only some dtypes, head dims, scales and layouts; the library
// then raises an Error of kind unsupported, which is a skip (counted and printed), not a failure.
// Any other Error is a failure.
bool unsupported_on_device(const Param& p, const flashattn::Error& e) {
  return p.device == Device::cuda && e.kind() == flashattn::Error::Kind::unsupported;
}

// Everything one run holds: host tensors (inputs and two sets of outputs for the determinism
// check), their device placement, options for the device and for the host reference.
struct Run {
  const Param& P;
  const Case& c;
  int64_t B, Nq, Nk;
  HostTensor q, k, v, dout;
  HostTensor out[2], lse[2], dq[2], dk[2], dv[2];
  Placement pl;
  Options opts, host_opts;
  Problem prob;
  Tensor tq, tk, tv, tdout;

  explicit Run(const Param& p) : P(p), c(p.c), pl(p.device) {
    const bool varlen = !c.cu_q.empty();
    B = varlen ? 1 : c.B;
    Nq = varlen ? c.cu_q.back() : c.Nq;
    Nk = varlen ? c.cu_k.back() : c.Nk;
    if (c.packed_qkv) {
      auto qkv = make_packed_qkv(P.dtype, B, Nq, c.H, c.Hkv, c.d);
      q = qkv[0];
      k = qkv[1];
      v = qkv[2];
    } else {
      q = make_tensor(P.dtype, {B, Nq, c.H, c.d}, c.in_layout);
      k = make_tensor(P.dtype, {B, Nk, c.Hkv, c.d}, c.in_layout);
      v = make_tensor(P.dtype, {B, Nk, c.Hkv, c.d}, c.in_layout);
    }
    dout = make_tensor(P.dtype, {B, Nq, c.H, c.d}, c.in_layout);
    for (int r = 0; r < 2; ++r) {
      out[r] = make_tensor(P.dtype, {B, Nq, c.H, c.d}, c.out_layout);
      dq[r] = make_tensor(P.dtype, {B, Nq, c.H, c.d}, c.out_layout);
      dk[r] = make_tensor(P.dtype, {B, Nk, c.Hkv, c.d}, c.out_layout);
      dv[r] = make_tensor(P.dtype, {B, Nk, c.Hkv, c.d}, c.out_layout);
      lse[r] = make_lse({B, c.H, Nq}, c.padded_lse);
    }
    std::mt19937_64 rng(test_seed());
    fill_uniform(q, rng, c.mag);
    fill_uniform(k, rng, c.mag);
    fill_uniform(v, rng, c.mag);
    fill_uniform(dout, rng, 1.0);

    opts.scale = c.scale;
    opts.causal = c.causal;
    opts.window_left = c.wl;
    opts.window_right = c.wr;
    opts.softcap = c.softcap;
    opts.algorithm = P.algo;
    opts.deterministic = c.deterministic;
    if (varlen) {
      opts.varlen_batch = int(c.cu_q.size()) - 1;
      opts.max_seqlen_q = c.max_q;
      opts.max_seqlen_k = c.max_k;
    }
    host_opts = opts;
    if (varlen) {
      host_opts.cu_seqlens_q = c.cu_q.data();
      host_opts.cu_seqlens_k = c.cu_k.data();
      opts.cu_seqlens_q = pl.put_ints(c.cu_q);
      opts.cu_seqlens_k = pl.put_ints(c.cu_k);
    }
    if (!c.seqused_k.empty()) {
      host_opts.seqused_k = c.seqused_k.data();
      opts.seqused_k = pl.put_ints(c.seqused_k);
    }
    prob = make_problem(B, Nq, Nk, c.H, c.Hkv, c.d, opts, c.cu_q, c.cu_k, c.seqused_k);
    if (c.nan_padding) {  // padding is never read: NaN there must not reach any result
      const double nan = std::numeric_limits<double>::quiet_NaN();
      for (const Seq& sq : prob.seqs)
        for (int64_t j = sq.k_len; j < sq.k_rows; ++j)
          for (int64_t h = 0; h < c.Hkv; ++h)
            for (int64_t e = 0; e < c.d; ++e) {
              k.set(k.index(sq.b, sq.k0 + j, h, e), nan);
              v.set(v.index(sq.b, sq.k0 + j, h, e), nan);
            }
    }
    tq = pl.put(q);
    tk = pl.put(k);
    tv = pl.put(v);
    tdout = pl.put(dout);
  }
};

std::string describe(const Run& r) {
  const Case& c = r.c;
  std::ostringstream os;
  os << "case " << param_name(r.P) << ": B " << r.B << " Nq " << r.Nq << " Nk " << r.Nk << " H " << c.H << " Hkv "
     << c.Hkv << " d " << c.d << " causal " << c.causal << " window (" << c.wl << "," << c.wr << ") softcap "
     << c.softcap << " scale " << c.scale << " (resolved " << r.prob.scale << ") mag " << c.mag << " layout in "
     << layout_name(c.in_layout) << " out " << layout_name(c.out_layout) << (c.packed_qkv ? " packed_qkv" : "")
     << (c.padded_lse ? " padded_lse" : "") << " deterministic " << c.deterministic;
  if (!c.seqused_k.empty()) {
    os << " seqused_k {";
    for (int32_t x : c.seqused_k) os << x << ",";
    os << "}" << (c.nan_padding ? " NaN padding" : "");
  }
  if (!c.cu_q.empty()) {
    os << " cu_seqlens_q {";
    for (int32_t x : c.cu_q) os << x << ",";
    os << "} cu_seqlens_k {";
    for (int32_t x : c.cu_k) os << x << ",";
    os << "}";
  }
  return os.str();
}

// Element rows (head_dim values each) flagged in `rows` must be exactly zero.
::testing::AssertionResult rows_exactly_zero(const std::string& what, const std::vector<double>& x,
                                             const std::vector<char>& rows, int64_t d) {
  int64_t flagged = 0, bad = 0, first = -1;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (!rows[r]) continue;
    ++flagged;
    for (int64_t c = 0; c < d; ++c)
      if (x[r * size_t(d) + size_t(c)] != 0.0) {
        ++bad;
        if (first < 0) first = int64_t(r);
        break;
      }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << flagged
                                       << " rows that must be exactly 0 are not (first: row " << first << ", value "
                                       << x[size_t(first) * size_t(d)] << " ...)";
}

// Runs the library's forward for the r-th output set. Returns false (after GTEST_SKIP or a
// failure) when the caller must stop.
bool call_forward(Run& R, int r, bool* skipped) {
  poison(R.out[r]);
  poison(R.lse[r]);
  const auto out_before = snapshot(R.out[r]);
  const auto lse_before = snapshot(R.lse[r]);
  R.pl.refresh(R.out[r]);
  R.pl.refresh(R.lse[r]);
  const Tensor tout = R.pl.put(R.out[r]);
  const Tensor tlse = R.pl.put(R.lse[r]);
  try {
    flashattn::forward(R.tq, R.tk, R.tv, tout, R.c.with_lse ? &tlse : nullptr, R.opts);
  } catch (const flashattn::Error& e) {
    if (unsupported_on_device(R.P, e)) {
      note_skip(std::string("unsupported on cuda: ") + e.what());
      *skipped = true;
      return false;
    }
    ADD_FAILURE() << "forward threw flashattn::Error on a valid call: " << e.what();
    return false;
  }
  R.pl.fetch(R.out[r]);
  R.pl.fetch(R.lse[r]);
  EXPECT_TRUE(written_exactly("forward out (run " + std::to_string(r) + ")", R.out[r], out_before));
  if (R.c.with_lse) {
    EXPECT_TRUE(written_exactly("forward lse (run " + std::to_string(r) + ")", R.lse[r], lse_before));
  } else {
    EXPECT_TRUE(snapshot(R.lse[r]) == lse_before) << "lse buffer written although lse = nullptr was passed";
  }
  return true;
}

bool call_backward(Run& R, int r, bool* skipped) {
  HostTensor* outs[3] = {&R.dq[r], &R.dk[r], &R.dv[r]};
  std::vector<uint64_t> before[3];
  for (int i = 0; i < 3; ++i) {
    poison(*outs[i]);
    before[i] = snapshot(*outs[i]);
    R.pl.refresh(*outs[i]);
  }
  try {
    flashattn::backward(R.tq, R.tk, R.tv, R.pl.put(R.out[0]), R.tdout, R.pl.put(R.lse[0]), R.pl.put(R.dq[r]),
                        R.pl.put(R.dk[r]), R.pl.put(R.dv[r]), R.opts);
  } catch (const flashattn::Error& e) {
    if (unsupported_on_device(R.P, e)) {
      note_skip(std::string("backward unsupported on cuda: ") + e.what());
      *skipped = true;
      return false;
    }
    ADD_FAILURE() << "backward threw flashattn::Error on a valid call: " << e.what();
    return false;
  }
  const char* names[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) {
    R.pl.fetch(*outs[i]);
    EXPECT_TRUE(written_exactly(std::string("backward ") + names[i] + " (run " + std::to_string(r) + ")", *outs[i],
                                before[i]));
  }
  return true;
}

}  // namespace

bool skip_without_device(Device d) {
  if (d != Device::cuda) return false;
  if (!flashattn::cuda_available()) {
    note_skip("no CUDA device (flashattn::cuda_available() is false)");
    return true;
  }
  if (!kTestsHaveCuda) {
    note_skip("the library has a CUDA device but the tests were built without FLASHATTN_TEST_CUDA");
    return true;
  }
  return false;
}

std::string param_name(const Param& p) {
  return p.c.name + "_" + dtype_name(p.dtype) + "_" + flashattn::to_string(p.algo) + "_" +
         flashattn::to_string(p.device);
}

std::vector<Param> cross(const std::vector<Case>& cases, const std::vector<DType>& dtypes,
                         const std::vector<Algorithm>& algos, const std::vector<Device>& devices) {
  std::vector<Param> out;
  for (const Device dev : devices)
    for (const Case& c : cases)
      for (const DType t : dtypes)
        for (const Algorithm a : algos) out.push_back({c, t, a, dev});
  return out;
}

void run_case(const Param& P) {
  FA_SEED_TRACE();
  if (skip_without_device(P.device)) GTEST_SKIP() << "no usable CUDA device: " << param_name(P);
  Run R(P);
  SCOPED_TRACE(describe(R));
  const Case& c = R.c;
  const DType dt = P.dtype;

  // ---- forward, twice: poison overwritten, gaps untouched, bitwise-equal results ----
  bool skipped = false;
  if (!call_forward(R, 0, &skipped) || !call_forward(R, 1, &skipped)) {
    if (skipped) GTEST_SKIP() << "unsupported combination on cuda (see the skip list)";
    return;
  }
  EXPECT_TRUE(bitwise_equal(R.out[0], R.out[1])) << "forward out differs between two identical calls";
  if (c.with_lse) {
    EXPECT_TRUE(bitwise_equal(R.lse[0], R.lse[1])) << "forward lse differs between two identical calls";
  }

  // ---- reference (the library's fp64 spec) and the plain same-precision implementation ----
  const Tensor hl = R.lse[1].view();
  const auto pf = flashattn::detail::check_forward(R.q.view(), R.k.view(), R.v.view(), R.out[1].view(), &hl,
                                                   R.host_opts);
  std::vector<double> out_ref(size_t(R.B * R.Nq * c.H * c.d)), lse_ref(size_t(R.B * c.H * R.Nq));
  flashattn::cpu::reference_forward(pf, out_ref.data(), lse_ref.data());
  const auto qd = R.q.dense(), kd = R.k.dense(), vd = R.v.dense();
  const FwdResult plain = plain_forward(R.prob, qd, kd, vd, dt, /*exact=*/false);
  // The reference's code path does not depend on the algorithm under test: check it once per
  // (case, dtype), on the flash runs.
  const bool oracle = R.prob.work() <= kOracleWork && P.algo == Algorithm::flash;
  if (oracle) {
    const FwdResult ex = plain_forward(R.prob, qd, kd, vd, dt, /*exact=*/true);
    EXPECT_TRUE(close_rel("library reference_forward out vs the test's fp64 oracle", out_ref, ex.out, 1e-9));
    EXPECT_TRUE(close_rel("library reference_forward lse vs the test's fp64 oracle", lse_ref, ex.lse, 1e-9));
  }
  const auto outx = R.out[0].dense();
  EXPECT_TRUE(within_rule("forward out", outx, out_ref, plain.out, dt, plain.score_max));
  if (c.with_lse) {
    EXPECT_TRUE(lse_within(R.lse[0].dense(), lse_ref, lse_bound(P.algo, P.dtype, plain), 0.0));
  }

  // Rows that see no key: out exactly 0, LSE exactly -inf (edge policy, docs/semantics.md).
  const auto masked = masked_query_rows(R.prob);
  EXPECT_TRUE(rows_exactly_zero("forward out on rows that see no key", outx, masked, c.d));
  if (c.with_lse) {
    const auto lx = R.lse[0].dense();
    int64_t bad = 0;
    for (int64_t b = 0; b < R.B; ++b)
      for (int64_t i = 0; i < R.Nq; ++i)
        for (int64_t h = 0; h < c.H; ++h)
          if (masked[size_t((b * R.Nq + i) * c.H + h)] &&
              lx[size_t(R.prob.li(b, h, i))] != -std::numeric_limits<double>::infinity())
            ++bad;
    EXPECT_EQ(bad, 0) << "rows that see no key must have LSE exactly -inf";
  }
  if (!c.backward || !c.with_lse) return;

  // ---- backward, twice ----
  if (!call_backward(R, 0, &skipped) || !call_backward(R, 1, &skipped)) {
    if (skipped) GTEST_SKIP() << "backward unsupported on cuda (see the skip list)";
    return;
  }
  // CPU: every backward is bitwise reproducible. CUDA: only with Options::deterministic (dq is
  // accumulated with atomics otherwise, as in FlashAttention).
  if (P.device == Device::cpu || c.deterministic) {
    EXPECT_TRUE(bitwise_equal(R.dq[0], R.dq[1])) << "backward dq differs between two identical calls";
    EXPECT_TRUE(bitwise_equal(R.dk[0], R.dk[1])) << "backward dk differs between two identical calls";
    EXPECT_TRUE(bitwise_equal(R.dv[0], R.dv[1])) << "backward dv differs between two identical calls";
  }
  const auto pb = flashattn::detail::check_backward(R.q.view(), R.k.view(), R.v.view(), R.out[1].view(),
                                                    R.dout.view(), R.lse[1].view(), R.dq[1].view(), R.dk[1].view(),
                                                    R.dv[1].view(), R.host_opts);
  const size_t nq = size_t(R.B * R.Nq * c.H * c.d), nk = size_t(R.B * R.Nk * c.Hkv * c.d);
  std::vector<double> dq_ref(nq), dk_ref(nk), dv_ref(nk);
  flashattn::cpu::reference_backward(pb, dq_ref.data(), dk_ref.data(), dv_ref.data());
  const auto dod = R.dout.dense();
  const BwdResult pg = plain_backward(R.prob, qd, kd, vd, dod, dt, /*exact=*/false);
  if (oracle) {
    const BwdResult ex = plain_backward(R.prob, qd, kd, vd, dod, dt, /*exact=*/true);
    EXPECT_TRUE(close_rel("library reference_backward dq vs the test's fp64 oracle", dq_ref, ex.dq, 1e-9));
    EXPECT_TRUE(close_rel("library reference_backward dk vs the test's fp64 oracle", dk_ref, ex.dk, 1e-9));
    EXPECT_TRUE(close_rel("library reference_backward dv vs the test's fp64 oracle", dv_ref, ex.dv, 1e-9));
  }
  const auto dqx = R.dq[0].dense(), dkx = R.dk[0].dense(), dvx = R.dv[0].dense();
  EXPECT_TRUE(within_rule("backward dq", dqx, dq_ref, pg.dq, dt, plain.score_max));
  EXPECT_TRUE(within_rule("backward dk", dkx, dk_ref, pg.dk, dt, plain.score_max));
  EXPECT_TRUE(within_rule("backward dv", dvx, dv_ref, pg.dv, dt, plain.score_max));
  // Gradients of rows that see no key, and of keys no row sees, are exactly 0.
  EXPECT_TRUE(rows_exactly_zero("backward dq on rows that see no key", dqx, masked, c.d));
  const auto unseen = unseen_keys(R.prob);
  EXPECT_TRUE(rows_exactly_zero("backward dk on keys that no row sees", dkx, unseen, c.d));
  EXPECT_TRUE(rows_exactly_zero("backward dv on keys that no row sees", dvx, unseen, c.d));
}

void run_repeat(const Param& P, int reps) {
  FA_SEED_TRACE();
  if (skip_without_device(P.device)) GTEST_SKIP() << "no usable CUDA device: " << param_name(P);
  Run R(P);
  SCOPED_TRACE(describe(R));
  bool skipped = false;
  if (!call_forward(R, 0, &skipped)) {
    if (skipped) GTEST_SKIP() << "unsupported combination on cuda (see the skip list)";
    return;
  }
  for (int rep = 1; rep < reps; ++rep) {
    if (!call_forward(R, 1, &skipped)) return;
    EXPECT_TRUE(bitwise_equal(R.out[0], R.out[1])) << "forward out of call " << rep << " differs from call 0";
    EXPECT_TRUE(bitwise_equal(R.lse[0], R.lse[1])) << "forward lse of call " << rep << " differs from call 0";
  }
  if (!call_backward(R, 0, &skipped)) {
    if (skipped) GTEST_SKIP() << "backward unsupported on cuda (see the skip list)";
    return;
  }
  if (P.device == Device::cuda && !R.c.deterministic) return;
  for (int rep = 1; rep < reps; ++rep) {
    if (!call_backward(R, 1, &skipped)) return;
    EXPECT_TRUE(bitwise_equal(R.dq[0], R.dq[1])) << "backward dq of call " << rep << " differs from call 0";
    EXPECT_TRUE(bitwise_equal(R.dk[0], R.dk[1])) << "backward dk of call " << rep << " differs from call 0";
    EXPECT_TRUE(bitwise_equal(R.dv[0], R.dv[1])) << "backward dv of call " << rep << " differs from call 0";
  }
}

void run_agreement(const Param& P) {
  FA_SEED_TRACE();
  if (skip_without_device(P.device)) GTEST_SKIP() << "no usable CUDA device: " << param_name(P);
  // Two runs over identical inputs (the seed depends only on the test name): one per algorithm.
  Param pf = P, ps = P;
  pf.algo = Algorithm::flash;
  ps.algo = Algorithm::standard;
  Run F(pf), S(ps);
  SCOPED_TRACE(describe(F));
  ASSERT_TRUE(bitwise_equal(F.q, S.q) && bitwise_equal(F.k, S.k) && bitwise_equal(F.v, S.v));
  bool skipped = false;
  if (!call_forward(F, 0, &skipped) || !call_forward(S, 0, &skipped)) {
    if (skipped) GTEST_SKIP() << "unsupported combination on cuda (see the skip list)";
    return;
  }
  const Tensor hl = F.lse[1].view();
  const auto pfw = flashattn::detail::check_forward(F.q.view(), F.k.view(), F.v.view(), F.out[1].view(), &hl,
                                                    F.host_opts);
  std::vector<double> out_ref(size_t(F.B * F.Nq * F.c.H * F.c.d)), lse_ref(size_t(F.B * F.c.H * F.Nq));
  flashattn::cpu::reference_forward(pfw, out_ref.data(), lse_ref.data());
  const auto qd = F.q.dense(), kd = F.k.dense(), vd = F.v.dense(), dod = F.dout.dense();
  const FwdResult plain = plain_forward(F.prob, qd, kd, vd, P.dtype, false);
  const auto of = F.out[0].dense(), os = S.out[0].dense();
  // Each is within the rule's bound of the reference, so they are within twice it of each other.
  const double bound = rule_bound(out_ref, plain.out, P.dtype, plain.score_max);
  const ErrStats e = error_stats(of, os);
  EXPECT_LE(e.max, 2 * bound) << "flash vs standard forward out: max diff " << e.max << " (mean " << e.mean
                              << "), allowed 2 x rule bound " << bound;
  EXPECT_TRUE(within_rule("flash forward out", of, out_ref, plain.out, P.dtype, plain.score_max));
  EXPECT_TRUE(within_rule("standard forward out", os, out_ref, plain.out, P.dtype, plain.score_max));
  const ErrStats el = error_stats(F.lse[0].dense(), S.lse[0].dense());
  double tol = 0;
  for (double t : plain.lse_tol) tol = std::max(tol, t);
  {
    double ts = 0;
    for (double t : lse_bound(ps.algo, ps.dtype, plain)) ts = std::max(ts, t);
    tol += ts;  // flash's bound + standard's bound
  }
  EXPECT_LE(el.max, tol) << "flash vs standard lse: max diff " << el.max << " (mean " << el.mean << ")";

  if (!call_backward(F, 0, &skipped) || !call_backward(S, 0, &skipped)) {
    if (skipped) GTEST_SKIP() << "backward unsupported on cuda (see the skip list)";
    return;
  }
  const auto pb = flashattn::detail::check_backward(F.q.view(), F.k.view(), F.v.view(), F.out[1].view(),
                                                    F.dout.view(), F.lse[1].view(), F.dq[1].view(), F.dk[1].view(),
                                                    F.dv[1].view(), F.host_opts);
  const size_t nq = size_t(F.B * F.Nq * F.c.H * F.c.d), nk = size_t(F.B * F.Nk * F.c.Hkv * F.c.d);
  std::vector<double> dq_ref(nq), dk_ref(nk), dv_ref(nk);
  flashattn::cpu::reference_backward(pb, dq_ref.data(), dk_ref.data(), dv_ref.data());
  const BwdResult pg = plain_backward(F.prob, qd, kd, vd, dod, P.dtype, false);
  const struct {
    const char* name;
    const HostTensor& f;
    const HostTensor& s;
    const std::vector<double>& ref;
    const std::vector<double>& plain;
  } grads[] = {{"dq", F.dq[0], S.dq[0], dq_ref, pg.dq}, {"dk", F.dk[0], S.dk[0], dk_ref, pg.dk},
               {"dv", F.dv[0], S.dv[0], dv_ref, pg.dv}};
  for (const auto& g : grads) {
    const double b = rule_bound(g.ref, g.plain, P.dtype, plain.score_max);
    const ErrStats eg = error_stats(g.f.dense(), g.s.dense());
    EXPECT_LE(eg.max, 2 * b) << "flash vs standard " << g.name << ": max diff " << eg.max << " (mean " << eg.mean
                             << "), allowed 2 x rule bound " << b;
  }
}

std::vector<Case> determinism_cases() {
  std::vector<Case> v;
  for (bool causal : {false, true})
    for (bool det : {false, true}) {
      Case c;
      c.name = std::string(causal ? "causal" : "full") + (det ? "_deterministic" : "");
      c.B = 2;
      c.Nq = 257;
      c.Nk = 513;
      c.H = 8;
      c.Hkv = 2;
      c.d = 64;
      c.causal = causal;
      c.deterministic = det;
      v.push_back(c);
    }
  Case w;
  w.name = "varlen_window_softcap";
  w.cu_q = {0, 200, 200, 457};
  w.cu_k = {0, 300, 333, 633};
  w.H = 8;
  w.Hkv = 1;
  w.wl = 64;
  w.wr = 32;
  w.softcap = 5.0f;
  w.mag = 10;
  v.push_back(w);
  return v;
}

}  // namespace fa_test
