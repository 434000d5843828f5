// Shared by the protocol tests (test_mbarrier_protocols.cpp, test_sync_protocols.cpp): the CTA
// tile sequences they run the kernels' hand-offs over.
#pragma once

#include <functional>
#include <vector>

namespace fa_test {

// Every sequence of 1 … max_tiles tiles, each with a key-block (step) count from `counts`.
inline std::vector<std::vector<int>> tile_patterns(int max_tiles, const std::vector<int>& counts) {
  std::vector<std::vector<int>> out;
  std::function<void(std::vector<int>&)> rec = [&](std::vector<int>& cur) {
    if (!cur.empty()) out.push_back(cur);
    if (int(cur.size()) == max_tiles) return;
    for (int c : counts) {
      cur.push_back(c);
      rec(cur);
      cur.pop_back();
    }
  };
  std::vector<int> cur;
  rec(cur);
  return out;
}

// Every per-tile choice vector with entry k in 0 … tiles[k] (a warpgroup's skipped key blocks).
inline std::vector<std::vector<int>> skip_vectors(const std::vector<int>& tiles) {
  std::vector<std::vector<int>> all = {{}};
  for (int b : tiles) {
    std::vector<std::vector<int>> next;
    for (const auto& s : all)
      for (int k = 0; k <= b; ++k) {
        next.push_back(s);
        next.back().push_back(k);
      }
    all = next;
  }
  return all;
}

}  // namespace fa_test
