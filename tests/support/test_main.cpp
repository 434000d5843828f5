// main() of the test binary: prints the seed before and after the run (so that any failure log
// shows how to reproduce it) and lists every skipped case with its reason.
#include <gtest/gtest.h>

#include <cstdio>

#include "flashattn/flashattn.hpp"
#include "test_util.hpp"

namespace {

class SeedEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    std::printf("[flashattn] FLASHATTN_TEST_SEED=%llu  (%s)\n", static_cast<unsigned long long>(fa_test::process_seed()),
                flashattn::build_info().c_str());
  }
  void TearDown() override {
    const auto s = fa_test::skips();
    if (!s.empty()) {
      std::printf("[flashattn] %zu case(s) skipped:\n", s.size());
      for (const auto& line : s) std::printf("[flashattn]   SKIPPED %s\n", line.c_str());
    }
    std::printf("[flashattn] FLASHATTN_TEST_SEED=%llu\n", static_cast<unsigned long long>(fa_test::process_seed()));
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new SeedEnvironment);
  return RUN_ALL_TESTS();
}
