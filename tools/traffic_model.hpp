// The analytic count of bytes each algorithm moves through main memory (docs/traffic-model.md
// gives the formulas and their assumptions). Measured counters replace it where they exist.
#pragma once

#include "common.hpp"

namespace flashattn::tools {

struct Traffic {
  double read = 0, write = 0;
  double total() const { return read + write; }
};

// Bytes of one element of S, P, dP, dS as the standard path stores them: the working dtype
// (on every device, as a framework computing in that dtype stores them).
size_t score_element_size(const Config& c);

// Compulsory: every input read once, every output written once.
Traffic compulsory_forward(const Config& c);
Traffic compulsory_backward(const Config& c);

Traffic forward_traffic(const Config& c, Algorithm a);
Traffic backward_traffic(const Config& c, Algorithm a);

}  // namespace flashattn::tools
