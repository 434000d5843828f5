// Every argument check of the library, in one place. A failed check throws before anything is
// written, with a message "flashattn::<call>: <argument>: expected <...>, got <...>".
#include "core/check.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "core/backend.hpp"
#include "core/checker.hpp"

namespace flashattn::detail {
namespace {
void check_cu_seqlens(const Checker& c, const char* name, const std::vector<int32_t>& cu, int64_t total,
                      const char* tensor, int64_t* max_len) {
  if (cu[0] != 0) c.fail(name, "first entry 0", std::to_string(cu[0]));
  int64_t longest = 0;
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    if (cu[b + 1] < cu[b])
      c.fail(name, "non-decreasing entries", "entry " + std::to_string(b + 1) + " = " + std::to_string(cu[b + 1]) +
                                                 " after " + std::to_string(cu[b]));
    longest = std::max<int64_t>(longest, cu[b + 1] - cu[b]);
  }
  if (cu.back() != total)
    c.fail(name, std::string("last entry equal to ") + tensor + "'s packed length " + std::to_string(total),
           std::to_string(cu.back()));
  *max_len = longest;
}

// Shared by forward and backward: q, k, v, out, lse, options -> Params.
Params check_common(const Checker& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor* lse, const Options& o) {
  c.inputs(q, "k", k, "v", v, out);
  if (o.algorithm != Algorithm::flash && o.algorithm != Algorithm::standard)
    c.fail("algorithm", "flash or standard", "an invalid Algorithm value");

  const int64_t B = q.shape[0], Nq = q.shape[1], H = q.shape[2], d = q.shape[3];
  const int64_t Nk = k.shape[1], Hkv = k.shape[2];
  if (d < 1 || d > Checker::kMaxHeadDim)
    c.fail("q", "head_dim (shape[3]) in 1.." + std::to_string(Checker::kMaxHeadDim), std::to_string(d));
  if (H < 1) c.fail("q", "at least one head (shape[2])", std::to_string(H));
  if (Hkv < 1) c.fail("k", "at least one head (shape[2])", std::to_string(Hkv));
  if (k.shape[0] != B || k.shape[3] != d)
    c.shape("k", k, {B, Nk, Hkv, d}, "(batch, seqlen_k, heads_kv, head_dim) matching q");
  if (H % Hkv != 0)
    c.fail("k", "heads_kv (shape[2]) dividing q's " + std::to_string(H) + " heads", std::to_string(Hkv));
  c.shape("v", v, {B, Nk, Hkv, d}, "(batch, seqlen_k, heads_kv, head_dim) as k");
  c.shape("out", out, {B, Nq, H, d}, "(batch, seqlen_q, heads, head_dim) as q");

  c.scores(o.scale, o.softcap, o.window_left, o.window_right, o.causal);

  Params p;
  p.dtype = q.dtype;
  p.device = q.device;
  p.algorithm = o.algorithm;
  p.batch = B;
  p.seqlen_q = Nq;
  p.seqlen_k = Nk;
  p.heads = H;
  p.heads_kv = Hkv;
  p.head_dim = d;
  auto ref = [](const Tensor& t) { return TensorRef{t.data, t.strides[0], t.strides[1], t.strides[2]}; };
  p.q = ref(q);
  p.k = ref(k);
  p.v = ref(v);
  p.out = ref(out);
  p.scale = o.scale != 0 ? o.scale : float(1.0 / std::sqrt(double(d)));
  p.softcap = o.softcap;
  p.causal = o.causal;
  p.window_left = o.window_left;
  p.window_right = o.causal ? 0 : o.window_right;
  p.deterministic = o.deterministic;
  p.stream = o.stream;
  p.max_seqlen_q = Nq;
  p.max_seqlen_k = Nk;

  // Variable length.
  c.together("cu_seqlens_q", o.cu_seqlens_q, "cu_seqlens_k", o.cu_seqlens_k, "the other cu_seqlens");
  std::vector<int32_t> ck;  // with varlen: the key sequences' prefix sums (for seqused_k below)
  if (o.cu_seqlens_q != nullptr) {
    if (o.varlen_batch < 1) c.fail("varlen_batch", "the number of sequences (>= 1) with cu_seqlens", std::to_string(o.varlen_batch));
    if (B != 1) c.fail("q", "batch 1 (packed tokens) with cu_seqlens", std::to_string(B));
    const auto cq = read_ints(o.cu_seqlens_q, o.varlen_batch + 1, p.device);
    ck = read_ints(o.cu_seqlens_k, o.varlen_batch + 1, p.device);
    int64_t max_q = 0, max_k = 0;
    check_cu_seqlens(c, "cu_seqlens_q", cq, Nq, "q", &max_q);
    check_cu_seqlens(c, "cu_seqlens_k", ck, Nk, "k", &max_k);
    if (o.max_seqlen_q < 0 || (o.max_seqlen_q > 0 && o.max_seqlen_q < max_q))
      c.fail("max_seqlen_q", "0 (computed) or >= the longest query sequence " + std::to_string(max_q),
             std::to_string(o.max_seqlen_q));
    if (o.max_seqlen_k < 0 || (o.max_seqlen_k > 0 && o.max_seqlen_k < max_k))
      c.fail("max_seqlen_k", "0 (computed) or >= the longest key sequence " + std::to_string(max_k),
             std::to_string(o.max_seqlen_k));
    p.batch = o.varlen_batch;
    p.cu_seqlens_q = o.cu_seqlens_q;
    p.cu_seqlens_k = o.cu_seqlens_k;
    p.max_seqlen_q = o.max_seqlen_q > 0 ? o.max_seqlen_q : max_q;
    p.max_seqlen_k = o.max_seqlen_k > 0 ? o.max_seqlen_k : max_k;
  } else if (o.varlen_batch != 0) {
    c.fail("varlen_batch", "0 without cu_seqlens", std::to_string(o.varlen_batch));
  }

  // Keys used per sequence: within the key rows the tensors hold for it (Nk, or its cu_seqlens_k
  // span), read where cu_seqlens are read.
  if (o.seqused_k != nullptr) {
    const auto used = read_ints(o.seqused_k, p.batch, p.device);
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t rows = ck.empty() ? Nk : int64_t(ck[size_t(b) + 1]) - ck[size_t(b)];
      if (used[size_t(b)] < 0 || used[size_t(b)] > rows)
        c.fail("seqused_k", "entries in 0.." + std::to_string(rows) + " (the key rows of sequence " + std::to_string(b) +
                                (ck.empty() ? ", Nk" : ", its cu_seqlens_k span") + ")",
               "entry " + std::to_string(b) + " = " + std::to_string(used[size_t(b)]));
    }
    p.seqused_k = o.seqused_k;
  }

  if (lse != nullptr) {
    c.lse("lse", *lse, q, B, H, Nq);
    p.lse = LseRef{static_cast<float*>(lse->data), lse->strides[0], lse->strides[1], lse->strides[2]};
  }
  return p;
}

}  // namespace

Params check_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor* lse,
                     const Options& options) {
  const Checker c("forward");
  Params p = check_common(c, q, k, v, out, lse, options);
  c.distinct_elements("out", out);
  if (lse) c.distinct_elements("lse", *lse);
  for (auto [name, in] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}}) {
    c.no_overlap("out", out, name, *in);
    if (lse) c.no_overlap("lse", *lse, name, *in);
  }
  if (lse) c.no_overlap("lse", *lse, "out", out);
  return p;
}

Params check_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                      const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                      const Options& options) {
  const Checker c("backward");
  Params p = check_common(c, q, k, v, out, &lse, options);
  const struct {
    const char* name;
    const Tensor* t;
    const Tensor* like;
    const char* like_name;
  } grads[] = {{"dout", &dout, &q, "q"}, {"dq", &dq, &q, "q"}, {"dk", &dk, &k, "k"}, {"dv", &dv, &k, "k"}};
  for (const auto& g : grads) {
    c.tensor(g.name, *g.t);
    c.same_kind(g.name, *g.t, "q", q);
    c.shape(g.name, *g.t, g.like->shape, g.like == &q ? "(batch, seqlen_q, heads, head_dim) as q"
                                                      : "(batch, seqlen_k, heads_kv, head_dim) as k");
  }
  const std::pair<const char*, const Tensor*> inputs[] = {{"q", &q}, {"k", &k}, {"v", &v},
                                                          {"out", &out}, {"dout", &dout}, {"lse", &lse}};
  const std::pair<const char*, const Tensor*> outputs[] = {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
  for (const auto& [oname, ot] : outputs)
    for (const auto& [iname, it] : inputs) c.no_overlap(oname, *ot, iname, *it);
  for (const auto& [oname, ot] : outputs) c.distinct_elements(oname, *ot);
  c.no_overlap("dk", dk, "dq", dq);
  c.no_overlap("dv", dv, "dq", dq);
  c.no_overlap("dv", dv, "dk", dk);

  auto ref = [](const Tensor& t) { return TensorRef{t.data, t.strides[0], t.strides[1], t.strides[2]}; };
  p.dout = ref(dout);
  p.dq = ref(dq);
  p.dk = ref(dk);
  p.dv = ref(dv);
  return p;
}

MergeParams check_merge(const Tensor& out_acc, const Tensor& lse_acc, const Tensor& part, const Tensor& lse_part,
                        void* stream) {
  const Checker c("merge_partial");
  c.tensor("out_acc", out_acc);
  if (out_acc.dtype != DType::f32) c.fail_type("out_acc", "dtype f32 (the accumulator)", dtype_name(out_acc.dtype));
  c.tensor("part", part);
  if (part.device != out_acc.device)
    c.fail_type("part", std::string("device ") + device_name(out_acc.device) + " (as out_acc)", device_name(part.device));
#if !defined(FLASHATTN_WITH_CUDA)
  if (out_acc.device == Device::cuda) c.fail_type("out_acc", "device cpu (this build has no CUDA backend)", "cuda");
#endif
  c.shape("part", part, out_acc.shape, "(batch, seqlen, heads, head_dim) as out_acc");
  const int64_t B = out_acc.shape[0], S = out_acc.shape[1], H = out_acc.shape[2];
  c.lse("lse_acc", lse_acc, out_acc, B, H, S);
  c.lse("lse_part", lse_part, out_acc, B, H, S);
  // The accumulators are written: each element its own memory, apart from every input.
  c.distinct_elements("out_acc", out_acc);
  c.distinct_elements("lse_acc", lse_acc);
  c.no_overlap("out_acc", out_acc, "part", part);
  c.no_overlap("out_acc", out_acc, "lse_part", lse_part);
  c.no_overlap("lse_acc", lse_acc, "part", part);
  c.no_overlap("lse_acc", lse_acc, "lse_part", lse_part);
  c.no_overlap("lse_acc", lse_acc, "out_acc", out_acc);

  MergeParams p;
  p.device = out_acc.device;
  p.part_dtype = part.dtype;
  p.batch = B, p.seqlen = S, p.heads = H, p.head_dim = out_acc.shape[3];
  auto ref = [](const Tensor& t) { return TensorRef{t.data, t.strides[0], t.strides[1], t.strides[2]}; };
  auto lref = [](const Tensor& t) {
    return LseRef{static_cast<float*>(t.data), t.strides[0], t.strides[1], t.strides[2]};
  };
  p.out = ref(out_acc);
  p.part = ref(part);
  p.lse = lref(lse_acc);
  p.lse_part = lref(lse_part);
  p.stream = stream;
  return p;
}

}  // namespace flashattn::detail
