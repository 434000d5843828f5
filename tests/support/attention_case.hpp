// One attention test case (shape, semantics, layout) and the runner that checks the library's
// forward and backward on it against the fp64 reference with FlashAttention's tolerance rule.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace fa_test {

struct Case {
  std::string name;
  int64_t B = 2, Nq = 97, Nk = 131, H = 4, Hkv = 2, d = 64;
  bool causal = false;
  int wl = -1, wr = -1;
  float softcap = 0, scale = 0;
  double mag = 1;  // q, k, v uniform in [-mag, mag]; dout in [-1, 1]
  Layout in_layout = Layout::dense, out_layout = Layout::dense;
  bool packed_qkv = false;   // q, k, v slices of one (B, N, H + 2·Hkv, d) buffer (needs Nq == Nk)
  bool padded_lse = false;   // lse with row stride 2 and gaps
  std::vector<int32_t> cu_q, cu_k;  // varlen when non-empty (B, Nq, Nk are then ignored)
  int max_q = 0, max_k = 0;          // Options::max_seqlen_q/k (0 = computed)
  std::vector<int32_t> seqused_k;    // Options::seqused_k when non-empty (one entry per sequence)
  bool nan_padding = false;          // the key rows past seqused_k hold NaN in k and v
  bool with_lse = true;              // false: forward with lse = nullptr (forward only)
  bool backward = true;
  bool deterministic = false;
};

struct Param {
  Case c;
  DType dtype;
  Algorithm algo;
  Device device;
};

std::string param_name(const Param& p);
inline void PrintTo(const Param& p, std::ostream* os) { *os << param_name(p); }
std::vector<Param> cross(const std::vector<Case>& cases, const std::vector<DType>& dtypes,
                         const std::vector<Algorithm>& algos, const std::vector<Device>& devices);
inline std::vector<DType> all_dtypes() { return {DType::f32, DType::f16, DType::bf16}; }
inline std::vector<Algorithm> all_algos() { return {Algorithm::flash, Algorithm::standard}; }
inline std::vector<Device> all_devices() { return {Device::cpu, Device::cuda}; }

// Forward (and backward unless c.backward is false): poison, determinism, reference + rule,
// LSE bound, exact zeros on rows that see no key, oracle cross-check of the library's reference.
void run_case(const Param& p);

// The same inputs through Algorithm::flash and Algorithm::standard: both within the rule, and
// within twice the rule of each other.
void run_agreement(const Param& p);

// The same forward and backward `reps` times: bitwise-equal outputs and gradients every time (on
// CUDA, gradients only with Options::deterministic). No reference: this hunts races.
void run_repeat(const Param& p, int reps);

// The shapes run_repeat is given: larger than the tiles in both directions, GQA, many threads'
// worth of work; causal or not × deterministic or not (B 2, Nq 257, Nk 513, H 8, Hkv 2, d 64),
// then one varlen case with a window and softcap.
std::vector<Case> determinism_cases();

// Skips the current test (with a counted, printed reason) when p.device is cuda and no device is
// usable; returns true when the caller must return.
bool skip_without_device(Device d);

}  // namespace fa_test
