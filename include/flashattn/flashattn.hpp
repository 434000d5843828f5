// flashattn — exact attention that moves less data.
//
//   O = softmax(scale · Q Kᵀ + mask) V
//
// Public API. No CUDA, SIMD or Python types appear here (docs/architecture.md).
// Semantics (one definition for every backend) are in docs/semantics.md.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>

// The library is compiled with hidden symbol visibility; only what this header declares is
// exported. Without it every function-local static of an inline or template function (the
// per-kernel "shared-memory attribute set" flags, the knob caches) becomes a GNU unique symbol,
// shared by every copy of the library loaded into one process: a second copy skips its own
// cudaFuncSetAttribute and its launches fail.
#if defined(__GNUC__) || defined(__clang__)
#define FLASHATTN_API __attribute__((visibility("default")))
#else
#define FLASHATTN_API
#endif

namespace flashattn {

enum class DType { f32, f16, bf16 };
enum class Device { cpu, cuda };
// flash    = tiled, online softmax, S and P never leave on-chip memory.
// standard = materialize S and P in main memory (the measured baseline).
enum class Algorithm { flash, standard };

// Non-owning view of a 4-d tensor. Shape is (batch, seqlen, heads, head_dim) for Q, K, V, O and
// their gradients; (batch, heads, seqlen_q, 1) for the fp32 log-sum-exp. Strides are in elements
// and the last dimension must be contiguous (stride 1).
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  std::array<int64_t, 4> shape{0, 0, 0, 0};
  std::array<int64_t, 4> strides{0, 0, 0, 0};
};

// A densely packed (row-major) view of `data` with the given shape.
FLASHATTN_API Tensor make_tensor(void* data, DType dtype, std::array<int64_t, 4> shape,
                   Device device = Device::cpu);

struct Options {
  float scale = 0;  // 0 -> 1/sqrt(head_dim)
  bool causal = false;  // bottom-right aligned: query i sees keys j <= i + Nk - Nq
                        // (Nk = seqused_k[b] when given)
  int window_left = -1, window_right = -1;  // sliding window, same alignment; -1 = unbounded
  float softcap = 0;  // > 0: s -> softcap * tanh(s / softcap) before masking
  // Variable length: int32 prefix sums with batch+1 entries (host memory for the CPU backend,
  // device memory for CUDA). Tensors then have batch 1 and seqlen = total packed tokens.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int varlen_batch = 0;  // number of sequences: cu_seqlens_q/k hold varlen_batch + 1 entries
  int max_seqlen_q = 0, max_seqlen_k = 0;  // 0 -> computed from cu_seqlens
  // Keys used per sequence: int32, one entry per sequence (batch, or varlen_batch with
  // cu_seqlens), in the same memory as cu_seqlens (host for the CPU backend, device for CUDA).
  // Sequence b attends to the first seqused_k[b] rows of its keys only (0 <= seqused_k[b] <= its
  // key rows: Nk, or its cu_seqlens_k span); the rows past them are padding, never read, and their
  // dK, dV are written as zeros. Causal and window align bottom-right to seqused_k[b] keys.
  // null = every key row is used. The CPU backend only: CUDA raises Error (unsupported).
  const int32_t* seqused_k = nullptr;
  Algorithm algorithm = Algorithm::flash;
  bool deterministic = false;  // bitwise-reproducible backward
  void* stream = nullptr;      // cudaStream_t for Device::cuda
};

// out (B, Nq, H, d) = attention(q, k, v); lse (B, H, Nq, 1) fp32, may be null.
FLASHATTN_API void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
             const Tensor* lse, const Options& options = {});

// Gradients of forward. `out` and `lse` are what forward returned for the same inputs.
FLASHATTN_API void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk,
              const Tensor& dv, const Options& options = {});

// Merges a partial attention result into an accumulator (ring attention, keys split across calls
// or devices). Both partials cover the same queries over disjoint sets of keys; each is a
// normalized output with its LSE, as forward returns them. On entry out_acc (B, S, H, d) and
// lse_acc (B, H, S, 1), both f32, hold one partial; part (B, S, H, d; f32, f16 or bf16) and
// lse_part (B, H, S, 1; f32) the other. On return out_acc and lse_acc hold the union's:
//   lse_acc = log(exp(lse_acc) + exp(lse_part)),
//   out_acc = exp(lse_acc_in − lse_acc) · out_acc + exp(lse_part − lse_acc) · part.
// A row with LSE −inf (it saw no key) adds nothing and its output is not read, so an accumulator
// may start as LSE −inf over any values; a row empty on both sides becomes out 0, LSE −inf. The
// sum is SoftmaxState::merge's, in fp32. All four on one device; `stream` is the
// cudaStream_t for Device::cuda. part and lse_part are only read.
FLASHATTN_API void merge_partial(const Tensor& out_acc, const Tensor& lse_acc, const Tensor& part,
                                 const Tensor& lse_part, void* stream = nullptr);

// Every rejected argument raises Error; its message names the argument, what was expected and
// what was given. Nothing is written when an Error is raised by argument checking.
// kind() tells a wrong dtype or device (type) from a wrong shape, stride or value (value), and
// both from a valid call that no kernel of this build and device takes (unsupported: e.g. float32
// with Algorithm::flash on CUDA; Algorithm::standard covers every valid call). The Python package
// maps them to TypeError, ValueError and flashattn.UnsupportedError (a ValueError).
class FLASHATTN_API Error : public std::runtime_error {
 public:
  enum class Kind { value, type, unsupported };
  explicit Error(const std::string& what, Kind kind = Kind::value) : std::runtime_error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

FLASHATTN_API const char* to_string(DType dtype);
FLASHATTN_API const char* to_string(Device device);
FLASHATTN_API const char* to_string(Algorithm algorithm);
FLASHATTN_API size_t element_size(DType dtype);

// The kernel path that this thread's last forward or backward call ran, once it returned normally:
// "cpu.flash", "cpu.standard", "cuda.sm90" (the Hopper kernels), "cuda.sm80" (the portable
// tensor-core kernels) or "cuda.standard"; "" before the first call. For tests and tools that must
// know which implementation answered.
FLASHATTN_API const char* last_kernel_path();

// Which backends this build holds and what they run on.
FLASHATTN_API bool cuda_available();  // built with CUDA and a device is present
FLASHATTN_API std::string build_info();

}  // namespace flashattn
