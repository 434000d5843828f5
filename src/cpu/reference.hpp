// The float64 reference: materializes S and P, computes everything in double. It is the spec that
// every test compares against. Its mask is written independently of the kernels' (a shared wrong
// mask would hide bugs in both).
//
// Outputs are dense double arrays indexed by the tensors' logical coordinates:
//   out/dq: [(b * seqlen_q + i) * heads + h] * head_dim + c      (b = 0 with varlen)
//   dk/dv:  [(b * seqlen_k + j) * heads_kv + h] * head_dim + c      (0 for key rows past seqused_k)
//   lse:    [(b * heads + h) * seqlen_q + i]                     (-inf for rows that see no key)
#pragma once

#include "core/kv_params.hpp"
#include "core/params.hpp"

namespace flashattn::cpu {

void reference_forward(const detail::Params& p, double* out, double* lse);

// One query row: sequence b, head h, row i counted from the sequence's first query.
// out[head_dim] and *lse as above. Cost O(k_len · head_dim) plus converting that K/V slice.
void reference_row(const detail::Params& p, int64_t b, int64_t h, int64_t i, double* out, double* lse);

// Gradients from q, k, v and p.dout only (out and lse are recomputed in double).
void reference_backward(const detail::Params& p, double* dq, double* dk, double* dv);

// forward_kvcache's reference, from the cache as it is before the call (it writes no cache):
//   out: [((b * seqlen_q + i) * heads + h) * head_dim + c]   lse: [(b * heads + h) * seqlen_q + i]
void reference_kvcache(const detail::KVParams& p, double* out, double* lse);

}  // namespace flashattn::cpu
