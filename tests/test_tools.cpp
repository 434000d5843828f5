// The flashattn program's pieces: trace (numbers of design.md's example, agreement with a direct
// softmax on random input) and the analytic byte model against hand-computed cases.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>

#include "commands.hpp"
#include "traffic_model.hpp"

using namespace flashattn;
using namespace flashattn::tools;

namespace {

// Extracts the numbers following `"key":` in a JSON text, in order.
std::vector<double> json_numbers(const std::string& text, const std::string& key) {
  std::vector<double> out;
  const std::string pat = "\"" + key + "\":";
  for (size_t pos = text.find(pat); pos != std::string::npos; pos = text.find(pat, pos + 1))
    out.push_back(std::strtod(text.c_str() + pos + pat.size(), nullptr));
  return out;
}

}  // namespace

TEST(Trace, DesignExampleNumbers) {
  std::ostringstream os;
  TraceArgs a;  // defaults: design.md's example, tiles of 2
  a.json = true;
  ASSERT_EQ(run_trace(a, os), 0);
  const auto sums = json_numbers(os.str(), "row_sum");
  const auto maxes = json_numbers(os.str(), "row_max");
  ASSERT_EQ(sums.size(), 3u) << os.str();
  EXPECT_NEAR(sums[0], 1.368, 5e-4);
  EXPECT_NEAR(sums[1], 1.585, 5e-4);
  EXPECT_NEAR(sums[2], 2.415, 5e-4);
  EXPECT_DOUBLE_EQ(maxes[0], 2.0);
  EXPECT_DOUBLE_EQ(maxes[1], 3.0);
  EXPECT_DOUBLE_EQ(maxes[2], 3.0);
  const auto rescale = json_numbers(os.str(), "rescale");
  EXPECT_NEAR(rescale[1], std::exp(-1.0), 1e-9);  // the maximum grew from 2 to 3
  EXPECT_DOUBLE_EQ(rescale[2], 1.0);               // it did not grow
  EXPECT_LE(json_numbers(os.str(), "max_abs_diff").at(0), 1e-12);
}

TEST(Trace, AgreesWithDirectSoftmaxOnRandomInput) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, 4.0);
  for (int round = 0; round < 20; ++round) {
    const int n = 1 + int(rng() % 40), dim = 1 + int(rng() % 5);
    TraceArgs a;
    a.json = true;
    a.tile = 1 + int(rng() % 9);
    a.scores.clear();
    a.values.clear();
    for (int j = 0; j < n; ++j) {
      std::ostringstream s;
      s.precision(17);
      s << ((rng() % 7 == 0) ? -INFINITY : dist(rng));
      a.scores += (j ? "," : "") + s.str();
      for (int c = 0; c < dim; ++c) {
        std::ostringstream v;
        v.precision(17);
        v << dist(rng);
        a.values += (c ? "," : "") + v.str();
      }
      if (j + 1 < n) a.values += ";";
    }
    std::ostringstream os;
    run_trace(a, os);
    const auto diff = json_numbers(os.str(), "max_abs_diff");
    ASSERT_EQ(diff.size(), 1u) << os.str();
    EXPECT_LE(diff[0], 1e-12) << a.scores;
  }
}

TEST(Trace, RejectsBadArguments) {
  std::ostringstream os;
  TraceArgs a;
  a.tile = 0;
  EXPECT_THROW(run_trace(a, os), Error);
  a = TraceArgs{};
  a.scores = "1,2,x";
  try {
    run_trace(a, os);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--scores"), std::string::npos) << e.what();
  }
  a = TraceArgs{};
  a.values = "1;2";  // 6 scores, 2 rows
  try {
    run_trace(a, os);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--values"), std::string::npos) << e.what();
  }
}

TEST(TrafficModel, HandComputedCpuCase) {
  Config c;
  c.device = Device::cpu;
  c.dtype = DType::f32;
  c.batch = 2, c.heads = 4, c.heads_kv = 2, c.head_dim = 8, c.seqlen_q = c.seqlen_k = 16;
  // q elements 2·16·4·8 = 1024, k (and v) elements 2·16·2·8 = 512, LSE 2·4·16 = 128,
  // scores 2·4·16·16 = 2048 stored fp32 on the CPU.
  EXPECT_EQ(forward_traffic(c, Algorithm::flash).read, 4.0 * (1024 + 2 * 512));
  EXPECT_EQ(forward_traffic(c, Algorithm::flash).write, 4.0 * 1024 + 4 * 128);
  EXPECT_EQ(forward_traffic(c, Algorithm::standard).read, 4.0 * (1024 + 2 * 512) + 2 * 4 * 2048);
  EXPECT_EQ(forward_traffic(c, Algorithm::standard).write, 4.0 * 1024 + 4 * 128 + 2 * 4 * 2048);
  EXPECT_EQ(backward_traffic(c, Algorithm::flash).read, 4.0 * (3 * 1024 + 2 * 512) + 4 * 128 + 4 * 128);
  EXPECT_EQ(backward_traffic(c, Algorithm::flash).write, 4.0 * (1024 + 2 * 512) + 4 * 128);
  EXPECT_EQ(backward_traffic(c, Algorithm::standard).read, 4.0 * (3 * 1024 + 2 * 512) + 4 * 128 + 6 * 4 * 2048);
  EXPECT_EQ(backward_traffic(c, Algorithm::standard).write, 4.0 * (1024 + 2 * 512) + 4 * 4 * 2048);
}

TEST(TrafficModel, AnchorCaseF16) {
  // shared/anchors: fp16, 1 × 32 heads, d 128, N = 8192: compulsory Q+K+V read = 0.201 GB.
  Config c;
  c.device = Device::cuda;
  c.dtype = DType::f16;
  c.batch = 1, c.heads = c.heads_kv = 32, c.head_dim = 128, c.seqlen_q = c.seqlen_k = 8192;
  EXPECT_EQ(compulsory_forward(c).read, 201326592.0);
  EXPECT_EQ(forward_traffic(c, Algorithm::flash).write, 67108864.0 + 4.0 * 32 * 8192);
  // CUDA's standard path: S in fp32 (cuBLAS output), P in f16.
  EXPECT_EQ(forward_traffic(c, Algorithm::standard).read - compulsory_forward(c).read, (4.0 + 2) * 32 * 8192.0 * 8192);
  EXPECT_EQ(backward_traffic(c, Algorithm::standard).write - compulsory_backward(c).write,
            (4.0 + 2 + 4 + 2) * 32 * 8192.0 * 8192);
  c.causal = true;  // the mask changes no compulsory byte
  EXPECT_EQ(compulsory_forward(c).read, 201326592.0);
}

TEST(Flops, Convention) {
  Config c;
  c.batch = 2, c.heads = 3, c.head_dim = 64, c.seqlen_q = 100, c.seqlen_k = 200;
  EXPECT_EQ(forward_flops(c), 4.0 * 2 * 3 * 100 * 200 * 64);
  EXPECT_EQ(backward_flops(c), 2.5 * forward_flops(c));
  c.causal = true;
  EXPECT_EQ(forward_flops(c), 2.0 * 2 * 3 * 100 * 200 * 64);
}
