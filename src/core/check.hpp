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

}  // namespace flashattn::detail
