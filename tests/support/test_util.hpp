// Shared test machinery: seeds, host tensors with arbitrary strides, device mirrors, the plain
// same-precision attention used by the tolerance rule, an independent fp64 oracle, and the
// comparisons that apply FlashAttention's tolerance rule.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device_buffer.hpp"
#include "flashattn/flashattn.hpp"

namespace fa_test {

using flashattn::Algorithm;
using flashattn::Device;
using flashattn::DType;
using flashattn::Options;
using flashattn::Tensor;

// ---- seeds --------------------------------------------------------------------------------------
// One seed per process: FLASHATTN_TEST_SEED if set, else std::random_device. Each test draws from
// a generator seeded with (process seed, full test name), so FLASHATTN_TEST_SEED=<s> together with
// --gtest_filter=<test> reproduces one test's inputs exactly, whatever else runs.
uint64_t process_seed();
uint64_t test_seed();
std::string seed_banner();  // "FLASHATTN_TEST_SEED=<s>" plus how to rerun
#define FA_SEED_TRACE() SCOPED_TRACE(::fa_test::seed_banner())

// ---- skips (counted and printed at the end of the run by the test environment) -----------------
void note_skip(const std::string& why);
std::vector<std::string> skips();

// ---- host tensors -------------------------------------------------------------------------------
// Backing memory, 64-byte aligned, shared by the views cut from it (packed qkv).
struct Storage {
  explicit Storage(size_t bytes_) : bytes(bytes_), words((bytes_ + 63) / 8 + 8) {}
  void* data() { return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(words.data()) + 63) & ~uintptr_t(63)); }
  size_t bytes;
  std::vector<uint64_t> words;
};

size_t dtype_size(DType t);
const char* dtype_name(DType t);
double round_to_dtype(double x, DType t);  // through float, as the library stores results

// A strided 4-d view (shape (batch, seqlen, heads, head_dim) or (batch, heads, seqlen_q, 1)).
struct HostTensor {
  DType dtype = DType::f32;
  std::array<int64_t, 4> shape{0, 0, 0, 0};
  std::array<int64_t, 4> strides{0, 0, 0, 0};
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements, into storage

  int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  int64_t storage_elems() const { return int64_t(storage->bytes / dtype_size(dtype)); }
  int64_t index(int64_t a, int64_t b, int64_t c, int64_t e) const {
    return offset + a * strides[0] + b * strides[1] + c * strides[2] + e * strides[3];
  }
  void* data() const { return static_cast<char*>(storage->data()) + offset * int64_t(dtype_size(dtype)); }
  Tensor view() const;  // host view

  double get(int64_t storage_index) const;
  void set(int64_t storage_index, double x);  // rounds to dtype

  // Logical values in row-major (shape) order, as double.
  std::vector<double> dense() const;
  // Which storage elements belong to this view (for checking that gaps are never written).
  std::vector<char> membership() const;
};

enum class Layout {
  dense,        // row-major (B, N, H, d)
  heads_first,  // memory (B, H, N, d): strides (H·N·d, d, N·d, 1)
  row_padded,   // row stride 3·H·d (like one slice of a packed (B, N, 3, H, d) buffer), offset inside
};
const char* layout_name(Layout l);

HostTensor make_tensor(DType t, std::array<int64_t, 4> shape, Layout layout = Layout::dense);
// LSE (B, H, Nq, 1); padded = row stride 2 and a gap between heads.
HostTensor make_lse(std::array<int64_t, 3> bhn, bool padded = false);
// q, k, v as slices of one packed (B, N, H + 2·Hkv, d) buffer: heads [0,H) are q, then k, then v.
std::array<HostTensor, 3> make_packed_qkv(DType t, int64_t B, int64_t N, int64_t H, int64_t Hkv, int64_t d);

// Uniform in [-mag, mag], rounded to the dtype; values that round to 0 are redrawn (never zeros).
void fill_uniform(HostTensor& t, std::mt19937_64& rng, double mag);
// A paged cache's block table: the first `entries` of a random permutation of num_pages pages (the
// rest belong to no sequence).
std::vector<int32_t> shuffled_block_table(int64_t entries, int64_t num_pages, std::mt19937_64& rng);
// Fills the whole backing storage (view and gaps) with a NaN bit pattern.
void poison(HostTensor& t);
// Fills the whole backing storage with a non-NaN pattern (for the bad-input tests).
void fill_sentinel(HostTensor& t, uint8_t byte);

// Checks an output after a call: every element of the view is non-NaN (poison overwritten) and
// every storage element outside the view is bitwise equal to `before` (gaps never written).
::testing::AssertionResult written_exactly(const std::string& what, const HostTensor& t,
                                           const std::vector<uint64_t>& before);
bool bitwise_equal(const HostTensor& a, const HostTensor& b);  // the views' elements
std::vector<uint64_t> snapshot(const HostTensor& t);            // the whole backing storage

// ---- device placement ---------------------------------------------------------------------------
// Puts host tensors on a device: for cpu the host views themselves; for cuda a device copy of each
// backing storage (uploaded once, shared by the views cut from it).
class Placement {
 public:
  explicit Placement(Device d) : device_(d) {}
  Device device() const { return device_; }
  Tensor put(const HostTensor& t);            // uploads the storage on first use
  void refresh(const HostTensor& t);          // re-uploads (after a host-side poison)
  void fetch(HostTensor& t);                  // downloads the storage into the host tensor
  const int32_t* put_ints(const std::vector<int32_t>& v);  // cu_seqlens (host pointer for cpu)

 private:
  Device device_;
  std::map<const Storage*, DeviceBuffer> buffers_;
  std::vector<std::unique_ptr<DeviceBuffer>> int_buffers_;
};

// ---- the attention problem, independent of the library's Params ---------------------------------
struct Seq {
  int64_t b, q0, q_len, k0, k_len;  // tensor batch index, first rows, lengths
  int64_t k_rows;  // key rows the tensors hold for the sequence (k_len is less with seqused_k: the
                   // rows [k_len, k_rows) are padding, no key of the sequence)
};

struct Problem {
  int64_t B = 0, Nq = 0, Nk = 0, H = 0, Hkv = 0, d = 0;  // tensor dims (B = 1 with varlen)
  std::vector<Seq> seqs;
  double scale = 0;  // resolved as the library must: float(options.scale) or float(1/sqrt(d))
  double softcap = 0;
  int wl = -1, wr = -1;  // causal folded in as wr = 0
  // Key j of a sequence is visible to its query row i (bottom-right alignment). Written here
  // independently of src/core/params.hpp and of the library's reference.
  bool visible(int64_t i, int64_t j, int64_t q_len, int64_t k_len) const {
    const int64_t rel = j - (i + k_len - q_len);  // key position relative to the row's diagonal
    return (wl < 0 || rel >= -wl) && (wr < 0 || rel <= wr);
  }
  int64_t qi(int64_t b, int64_t i, int64_t h, int64_t c = 0) const { return ((b * Nq + i) * H + h) * d + c; }
  int64_t ki(int64_t b, int64_t j, int64_t h, int64_t c = 0) const { return ((b * Nk + j) * Hkv + h) * d + c; }
  int64_t li(int64_t b, int64_t h, int64_t i) const { return (b * H + h) * Nq + i; }
  int64_t work() const;  // sum over sequences of q_len·k_len·H·d
};

// seqused_k: empty, or the keys each sequence uses (its first ones; Options::seqused_k).
Problem make_problem(int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Hkv, int64_t d, const Options& o,
                     const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k,
                     const std::vector<int32_t>& seqused_k = {});

struct FwdResult {
  std::vector<double> out, lse;
  std::vector<double> lse_tol;  // the per-row LSE bound (see attention_oracle.cpp)
  double score_max = 0;         // max |scale·q·k| over visible pairs (before softcap)
  std::vector<double> row_score_max;  // per LSE row: max |s| over its visible keys (after softcap)
};
struct BwdResult {
  std::vector<double> dq, dk, dv;
};

// exact = true: everything in double, no rounding (the independent oracle).
// exact = false: the plain same-precision implementation of the tolerance rule.
FwdResult plain_forward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                        const std::vector<double>& v, DType dtype, bool exact);
BwdResult plain_backward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                         const std::vector<double>& v, const std::vector<double>& dout, DType dtype, bool exact);

// Which query rows see no key ((b, i, h) in dense order of out/dq, per element row) and which keys
// are seen by no query row (the padding rows past seqused_k among them); both from the problem's
// own mask.
std::vector<char> masked_query_rows(const Problem& p);  // size B·Nq·H
std::vector<char> unseen_keys(const Problem& p);        // size B·Nk·Hkv

// ---- comparisons --------------------------------------------------------------------------------
struct ErrStats {
  double max = 0, mean = 0;
  int64_t argmax = -1;
};
ErrStats error_stats(const std::vector<double>& x, const std::vector<double>& ref);

// FlashAttention's rule: max|x − ref| ≤ 2·max|plain − ref| + noise, with
// noise = max|round_to_dtype(ref) − ref| + floor (see compare.cpp for the floor, which uses the
// largest score magnitude of the problem, FwdResult::score_max).
::testing::AssertionResult within_rule(const std::string& what, const std::vector<double>& x,
                                       const std::vector<double>& ref, const std::vector<double>& plain, DType dtype,
                                       double score_max);
// The rule's bound, for comparisons between two implementations (flash vs standard).
double rule_bound(const std::vector<double>& ref, const std::vector<double>& plain, DType dtype, double score_max);

// The LSE bound per row of an algorithm's output: plain.lse_tol (fp32), plus for
// Algorithm::standard the rounding of S in the working dtype (compare.cpp).
std::vector<double> lse_bound(Algorithm algo, DType dtype, const FwdResult& plain);
// |x − ref| ≤ tol[i] + extra per row; rows with ref = -inf must be exactly -inf.
::testing::AssertionResult lse_within(const std::vector<double>& x, const std::vector<double>& ref,
                                      const std::vector<double>& tol, double extra);
// Two double vectors agree to rel·max(1, |ref|) elementwise (library reference vs our oracle).
::testing::AssertionResult close_rel(const std::string& what, const std::vector<double>& x,
                                     const std::vector<double>& ref, double rel);

}  // namespace fa_test
