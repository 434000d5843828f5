// All argument checks, once. Each failure throws flashattn::Error naming the argument, what was
// expected and what was given. On success the call is described by a resolved Params.
#pragma once

#include "core/params.hpp"

namespace flashattn::detail {

Params check_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor* lse, const Options& options);

Params check_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                      const Tensor& dv, const Options& options);

MergeParams check_merge(const Tensor& out_acc, const Tensor& lse_acc, const Tensor& part, const Tensor& lse_part,
                        void* stream);

}  // namespace flashattn::detail
