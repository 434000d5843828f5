// The analytic count of bytes each algorithm moves through main memory (docs/traffic-model.md
// gives the formulas and their assumptions). Measured counters replace it where they exist.
#pragma once

#include "common.hpp"

namespace flashattn::tools {

struct Traffic {
  double read = 0, write = 0;
  double total() const { return read + write; }
};

// Bytes of one element of each N×N matrix as the standard path stores it. CPU: the working dtype
// for all four. CUDA: cuBLAS writes S and dP in fp32, the softmax writes P (and dS over it) in the
// working dtype.
struct StoredBytes {
  double s, p, dp, ds;
};
StoredBytes stored_bytes(const Config& c);

// Compulsory: every input read once, every output written once.
Traffic compulsory_forward(const Config& c);
Traffic compulsory_backward(const Config& c);

Traffic forward_traffic(const Config& c, Algorithm a);
Traffic backward_traffic(const Config& c, Algorithm a);

}  // namespace flashattn::tools
