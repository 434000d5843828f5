#include "core/scratch.hpp"

namespace flashattn::detail {
ScratchCounter& host_scratch_counter() {
  static ScratchCounter counter;
  return counter;
}
ScratchCounter& device_scratch_counter() {
  static ScratchCounter counter;
  return counter;
}
}  // namespace flashattn::detail
