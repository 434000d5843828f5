#include "traffic_model.hpp"

namespace flashattn::tools {
namespace {
double q_elems(const Config& c) { return double(c.batch) * double(c.seqlen_q) * double(c.heads) * double(c.head_dim); }
double k_elems(const Config& c) { return double(c.batch) * double(c.seqlen_k) * double(c.heads_kv) * double(c.head_dim); }
double lse_elems(const Config& c) { return double(c.batch) * double(c.heads) * double(c.seqlen_q); }
double score_elems(const Config& c) { return double(c.batch) * double(c.heads) * double(c.seqlen_q) * double(c.seqlen_k); }
}  // namespace

StoredBytes stored_bytes(const Config& c) {
  const double e = double(element_size(c.dtype));
  return c.device == Device::cpu ? StoredBytes{e, e, e, e} : StoredBytes{4, e, 4, e};
}

Traffic compulsory_forward(const Config& c) {
  const double e = double(element_size(c.dtype));
  return {e * (q_elems(c) + 2 * k_elems(c)),           // read Q, K, V
          e * q_elems(c) + 4 * lse_elems(c)};          // write O, LSE
}

Traffic compulsory_backward(const Config& c) {
  const double e = double(element_size(c.dtype));
  return {e * (3 * q_elems(c) + 2 * k_elems(c)) + 4 * lse_elems(c),  // read Q, O, dO, K, V, LSE
          e * (q_elems(c) + 2 * k_elems(c))};                          // write dQ, dK, dV
}

Traffic forward_traffic(const Config& c, Algorithm a) {
  Traffic t = compulsory_forward(c);
  if (a == Algorithm::standard) {
    // S written by the first GEMM and read by the softmax; P written by the softmax and read by
    // the second GEMM.
    const StoredBytes b = stored_bytes(c);
    t.read += (b.s + b.p) * score_elems(c);
    t.write += (b.s + b.p) * score_elems(c);
  }
  return t;
}

Traffic backward_traffic(const Config& c, Algorithm a) {
  Traffic t = compulsory_backward(c);
  if (a == Algorithm::flash) {
    // D = rowsum(dO ∘ O), fp32: written once by a pre-pass, read once by the main pass.
    t.write += 4 * lse_elems(c);
    t.read += 4 * lse_elems(c);
    // CUDA (the Hopper kernel): dQ is summed over key tiles in an fp32 accumulator, zeroed by the
    // pre-pass and read once by the final cast. The partial sums are assumed to meet in L2.
    if (c.device == Device::cuda) {
      t.write += 4 * q_elems(c);
      t.read += 4 * q_elems(c);
    }
  } else {
    // Recomputed S (write, read), P (write; read by dV = PᵀdO and by dS), dP (write, read),
    // dS (write; read by dQ = dS K and dK = dSᵀQ). D = rowsum(P ∘ dP) is formed inside the dS pass.
    const StoredBytes b = stored_bytes(c);
    t.write += (b.s + b.p + b.dp + b.ds) * score_elems(c);
    t.read += (b.s + 2 * b.p + b.dp + 2 * b.ds) * score_elems(c);
  }
  return t;
}

}  // namespace flashattn::tools
