// The flashattn program's pieces: trace (numbers of the worked example in docs/semantics.md, agreement with a direct
// softmax on random input) and the analytic byte model against hand-computed cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>

#include "commands.hpp"
#include "flashattn/online_softmax.hpp"
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



// Strict JSON (RFC 8259) by recursive descent: true when `text` is one JSON value, optionally
// surrounded by whitespace. Rejects what a lenient printer could emit: inf, -inf, nan, NaN, 1.,
// .5, 01, a trailing comma.
bool valid_json(const std::string& text) {
  size_t i = 0;
  const auto ws = [&] { while (i < text.size() && std::strchr(" \t\r\n", text[i])) ++i; };
  const auto digits = [&] {
    const size_t s = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i > s;
  };
  std::function<bool()> value = [&]() -> bool {
    ws();
    if (i >= text.size()) return false;
    const char c = text[i];
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++i;
      ws();
      if (i < text.size() && text[i] == close) return ++i, true;
      for (;;) {
        if (c == '{') {
          ws();
          if (i >= text.size() || text[i] != '"') return false;
          if (!value()) return false;  // the key, a string
          ws();
          if (i >= text.size() || text[i++] != ':') return false;
        }
        if (!value()) return false;
        ws();
        if (i >= text.size()) return false;
        if (text[i] == close) return ++i, true;
        if (text[i++] != ',') return false;
      }
    }
    if (c == '"') {
      for (++i; i < text.size(); ++i) {
        if (text[i] == '\\') { ++i; continue; }
        if (text[i] == '"') return ++i, true;
        if (static_cast<unsigned char>(text[i]) < 0x20) return false;
      }
      return false;
    }
    for (const char* word : {"true", "false", "null"})
      if (text.compare(i, std::strlen(word), word) == 0) return i += std::strlen(word), true;
    // number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    if (text[i] == '-') ++i;
    if (i < text.size() && text[i] == '0') ++i;
    else if (i >= text.size() || text[i] < '1' || text[i] > '9' || !digits()) return false;
    if (i < text.size() && text[i] == '.' && (++i, !digits())) return false;
    if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
      ++i;
      if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
      if (!digits()) return false;
    }
    return true;
  };
  if (!value()) return false;
  ws();
  return i == text.size();
}

// The values following every `"key":` in order, flattened: a number, each number of an array of
// numbers, and null as NaN.
std::vector<double> json_values(const std::string& text, const std::string& key) {
  std::vector<double> out;
  const std::string pat = "\"" + key + "\":";
  for (size_t pos = text.find(pat); pos != std::string::npos; pos = text.find(pat, pos + 1)) {
    const char* p = text.c_str() + pos + pat.size();
    const bool array = *p == '[';
    if (array) ++p;
    do {
      if (*p == ',') ++p;
      if (std::strncmp(p, "null", 4) == 0) {
        out.push_back(NAN);
        p += 4;
      } else if (*p != ']') {
        char* end = nullptr;
        out.push_back(std::strtod(p, &end));
        p = end;
      }
    } while (array && *p == ',');
  }
  return out;
}

uint64_t bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
// A random trace: 1 … 40 scores (about one in seven -inf), values of 1 … 5 columns, tiles of
// 1 … 9, as the --scores/--values text trace parses; *scores and *values get the parsed numbers.
TraceArgs random_trace(std::mt19937& rng, std::vector<double>* scores, std::vector<double>* values, int* dim) {
  std::normal_distribution<double> dist(0.0, 4.0);
  const int n = 1 + int(rng() % 40);
  *dim = 1 + int(rng() % 5);
  TraceArgs a;
  a.json = true;
  a.tile = 1 + int(rng() % 9);
  a.scores.clear();
  a.values.clear();
  for (int j = 0; j < n; ++j) {
    const std::string sc = (rng() % 7 == 0) ? "-inf" : strprintf("%.17g", dist(rng));
    scores->push_back(std::stod(sc));
    a.scores += (j ? "," : "") + sc;
    for (int c = 0; c < *dim; ++c) {
      const std::string v = strprintf("%.17g", dist(rng));
      values->push_back(std::stod(v));
      a.values += (c ? "," : "") + v;
    }
    if (j + 1 < n) a.values += ";";
  }
  return a;
}

}  // namespace

TEST(Trace, DesignExampleNumbers) {
  std::ostringstream os;
  TraceArgs a;  // defaults: docs/semantics.md's example, tiles of 2
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
  for (int round = 0; round < 20; ++round) {
    std::vector<double> scores, values;
    int dim = 0;
    const TraceArgs a = random_trace(rng, &scores, &values, &dim);
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
  // CUDA flash backward: D (fp32, written + read) and the fp32 dQ accumulator (zeroed, read by the cast).
  EXPECT_EQ(backward_traffic(c, Algorithm::flash).write - compulsory_backward(c).write,
            4.0 * 32 * 8192 + 4.0 * 8192 * 32 * 128);
  EXPECT_EQ(backward_traffic(c, Algorithm::flash).read - compulsory_backward(c).read,
            4.0 * 32 * 8192 + 4.0 * 8192 * 32 * 128);
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

// With a window the visible pairs are counted: N = 8, causal, 2 keys left of the diagonal: rows 0
// and 1 see 1 and 2 keys, rows 2 … 7 three each (21 pairs); Nq 4 over Nk 10 without causal: row i
// sees keys i + 4 … 9 (6 + 5 + 4 + 3 = 18).
TEST(Flops, WindowCountsVisiblePairs) {
  Config c;
  c.batch = 1, c.heads = 2, c.head_dim = 16, c.seqlen_q = c.seqlen_k = 8, c.causal = true, c.window_left = 2;
  EXPECT_EQ(forward_flops(c), 4.0 * 2 * 21 * 16);
  c.causal = false, c.seqlen_q = 4, c.seqlen_k = 10;
  EXPECT_EQ(forward_flops(c), 4.0 * 2 * 18 * 16);
}

// ---- flashattn traffic: measured bytes beside the model (issue 5) ----------------------------------
// What CI can check without a GPU: the columns, the reason printed when nothing is measured, and the
// argument errors. The measurement itself (CUPTI) runs on the GPU machine (scripts/dev/gpu-physics).

namespace {

// Splits one CSV line (RFC 4180 quoting) into fields.
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted) {
      if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') out.back() += '"', ++i;
      else if (ch == '"') quoted = false;
      else out.back() += ch;
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      out.emplace_back();
    } else {
      out.back() += ch;
    }
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) out.push_back(line);
  return out;
}

// A small problem, so that a test never waits on a large one.
TrafficArgs small_traffic(const std::string& device, const std::string& format) {
  TrafficArgs a;
  a.device = device;
  a.format = format;
  a.seqlens = {64, 128};
  a.heads = 4;
  a.head_dim = 16;
  return a;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// What the program says when it has no CUDA device to measure on.
const char* kNoDeviceReason =
#if defined(FLASHATTN_TOOLS_CUDA)
    "no CUDA device on this machine";
#else
    "this build has no CUDA backend";
#endif

}  // namespace

TEST(ToolsTraffic, CsvHasMeasuredColumnsAndSaysWhyTheyAreEmpty) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present: the no-device reason cannot be shown";
  std::ostringstream os;
  ASSERT_EQ(run_traffic(small_traffic("cuda", "csv"), os), 0);
  const auto lines = lines_of(os.str());
  ASSERT_EQ(lines.size(), 1u + 2 * 6) << os.str();  // header + (standard, flash, compulsory) x 2 passes x 2 N
  EXPECT_EQ(lines[0],
            "seqlen,pass,algorithm,model_read_bytes,model_write_bytes,measured_read_bytes,measured_write_bytes,"
            "model_over_flash,measured_over_flash,measured");
  Config c;
  c.device = Device::cuda;
  c.dtype = DType::f16;
  c.heads = c.heads_kv = 4, c.head_dim = 16, c.seqlen_q = c.seqlen_k = 64;
  for (size_t i = 1; i < lines.size(); ++i) {
    const auto f = csv_fields(lines[i]);
    ASSERT_EQ(f.size(), 10u) << lines[i];
    EXPECT_TRUE(f[5].empty() && f[6].empty() && f[8].empty()) << "measured bytes without a device: " << lines[i];
    if (f[2] == "compulsory")
      EXPECT_EQ(f[9], "") << lines[i];
    else
      EXPECT_EQ(f[9], std::string("unavailable: ") + kNoDeviceReason) << lines[i];
  }
  // The first row is N = 64, forward, standard: the CUDA model (S in fp32), and its ratio to flash.
  const auto f = csv_fields(lines[1]);
  EXPECT_EQ(f[0], "64");
  EXPECT_EQ(f[1], "forward");
  EXPECT_EQ(f[2], "standard");
  EXPECT_EQ(std::stod(f[3]), forward_traffic(c, Algorithm::standard).read);
  EXPECT_EQ(std::stod(f[4]), forward_traffic(c, Algorithm::standard).write);
  EXPECT_NEAR(std::stod(f[7]),
              forward_traffic(c, Algorithm::standard).total() / forward_traffic(c, Algorithm::flash).total(), 1e-4);
}

TEST(ToolsTraffic, JsonKeepsTheModelAndAddsRatioAndMeasured) {
  std::ostringstream os;
  ASSERT_EQ(run_traffic(small_traffic("cpu", "json"), os), 0);
  const std::string text = os.str();
  // The model's keys (tools/plot.py reads them) are still there, one per row.
  EXPECT_EQ(json_numbers(text, "seqlen"), (std::vector<double>{64, 128}));
  EXPECT_EQ(json_numbers(text, "compulsory").size(), 4u);
  Config c;
  c.device = Device::cpu;
  c.dtype = DType::f16;
  c.heads = c.heads_kv = 4, c.head_dim = 16, c.seqlen_q = c.seqlen_k = 64;
  // "forward":{...} (the bytes) reads as 0 here, "ratio":{"forward":x} as x.
  std::vector<double> ratios;
  for (double r : json_numbers(text, "forward"))
    if (r > 0) ratios.push_back(r);
  ASSERT_EQ(ratios.size(), 2u) << text;
  EXPECT_NEAR(ratios[0], forward_traffic(c, Algorithm::standard).total() / forward_traffic(c, Algorithm::flash).total(),
              1e-3);
  EXPECT_NE(text.find("\"measured\":{\"unavailable\":\"not on cpu"), std::string::npos) << text;
}

TEST(ToolsTraffic, JsonSaysWhyNothingWasMeasuredWithoutADevice) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  std::ostringstream os;
  ASSERT_EQ(run_traffic(small_traffic("cuda", "json"), os), 0);
  EXPECT_NE(os.str().find(std::string("\"measured\":{\"unavailable\":\"") + kNoDeviceReason + "\"}"), std::string::npos)
      << os.str();
}

TEST(ToolsTraffic, TablePrintsTheReasonLine) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  std::ostringstream os;
  ASSERT_EQ(run_traffic(small_traffic("cuda", "table"), os), 0);
  EXPECT_NE(os.str().find(std::string("measured: unavailable — ") + kNoDeviceReason), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("S and dP stored in f32"), std::string::npos) << os.str();  // the CUDA model

  TrafficArgs off = small_traffic("cpu", "table");
  off.measure = "off";
  std::ostringstream os_off;
  ASSERT_EQ(run_traffic(off, os_off), 0);
  EXPECT_NE(os_off.str().find("measured: unavailable — not asked for (--measure off)"), std::string::npos)
      << os_off.str();
}

TEST(ToolsTraffic, RejectsBadArgumentsNamingTheOption) {
  std::ostringstream os;
  auto run = [&](TrafficArgs a) { return error_of([&] { run_traffic(a, os); }); };
  TrafficArgs a = small_traffic("cpu", "xml");
  EXPECT_NE(run(a).find("--format: expected table, json or csv, got xml"), std::string::npos) << run(a);
  a = small_traffic("cpu", "table");
  a.measure = "always";
  EXPECT_NE(run(a).find("--measure: expected auto or off, got always"), std::string::npos) << run(a);
  a = small_traffic("cpu", "table");
  a.profile_call = "sideways:flash";
  EXPECT_NE(run(a).find("--profile-call: expected forward:standard"), std::string::npos) << run(a);
  a.profile_call = "forward:flash";
  EXPECT_NE(run(a).find("--profile-call: needs --device cuda"), std::string::npos) << run(a);
  if (!cuda_available()) {
    a.device = "cuda";
    EXPECT_NE(run(a).find("--profile-call: needs a CUDA device"), std::string::npos) << run(a);
  }
  a = small_traffic("cpu", "table");
  a.seqlens = {64, 0};
  EXPECT_NE(run(a).find("--seqlen: expected values >= 1, got 0"), std::string::npos) << run(a);
  a = small_traffic("cpu", "table");
  a.heads_kv = 3;
  EXPECT_NE(run(a).find("--heads-kv: expected a divisor of --heads"), std::string::npos) << run(a);
  a = small_traffic("tpu", "table");
  EXPECT_NE(run(a).find("--device: expected cpu, cuda or auto"), std::string::npos) << run(a);
}

TEST(ToolsTimeline, RejectsBadArgumentsNamingTheOption) {
  std::ostringstream os;
  auto run = [&](TimelineArgs a) { return error_of([&] { run_timeline(a, os); }); };
  TimelineArgs a;
  a.dtype = "int8";
  EXPECT_NE(run(a).find("--dtype: expected f32, f16, bf16"), std::string::npos) << run(a);
  a = TimelineArgs{};
  a.device = "tpu";
  EXPECT_NE(run(a).find("--device: expected cpu, cuda or auto"), std::string::npos) << run(a);
  a = TimelineArgs{};
  a.seqlen = 0;
  EXPECT_NE(run(a).find("--seqlen: expected >= 1"), std::string::npos) << run(a);
  if (!cuda_available()) {  // the CUDA timeline needs a device, and says so through --device
    a = TimelineArgs{};
    a.device = "cuda";
    EXPECT_NE(run(a).find("--device"), std::string::npos) << run(a);
  }
}

TEST(ToolsFormat, JsonAndCsvQuoting) {
  EXPECT_EQ(json_string("a \"b\"\\\n"), "\"a \\\"b\\\"\\\\\\n\"");
  EXPECT_EQ(json_string(std::string("\x01")), "\"\\u0001\"");
  EXPECT_EQ(csv_field("say \"hi\", twice"), "\"say \"\"hi\"\", twice\"");
  EXPECT_EQ(csv_fields(csv_field("a,\"b\"")), (std::vector<std::string>{"a,\"b\""}));
  EXPECT_EQ(strprintf("%d-%s", 7, "x"), "7-x");
}

// The measured columns, filled by a stand-in for CUPTI that runs each call on the CPU and reports
// made-up byte counts: call k (0-based, per row: forward standard, forward flash, backward standard,
// backward flash) "reads" 1000·(k+1) and "writes" 10·(k+1) bytes; the fourth fails.
TEST(ToolsTraffic, MeasuredColumnsFromAStandInMeasurer) {
  int calls = 0;
  const CallMeasurer fake = [&](const std::function<void()>& call) {
    call();  // the library call itself, on the CPU
    const int k = calls++ % 4;
    if (k == 3) return MeasuredCall{false, 0, 0, "stand-in failure"};
    return MeasuredCall{true, 1000.0 * (k + 1), 10.0 * (k + 1), ""};
  };
  TrafficArgs a = small_traffic("cpu", "csv");
  a.seqlens = {32};
  std::ostringstream csv;
  ASSERT_EQ(run_traffic_measured_by(a, csv, fake, "stand-in"), 0);
  EXPECT_EQ(calls, 4);
  const auto lines = lines_of(csv.str());
  ASSERT_EQ(lines.size(), 7u) << csv.str();
  const auto fwd_std = csv_fields(lines[1]), fwd_flash = csv_fields(lines[2]), bwd_std = csv_fields(lines[4]),
             bwd_flash = csv_fields(lines[5]);
  EXPECT_EQ(fwd_std[5], "1000");
  EXPECT_EQ(fwd_std[6], "10");
  EXPECT_EQ(fwd_std[9], "stand-in");
  EXPECT_EQ(fwd_flash[5], "2000");
  EXPECT_NEAR(std::stod(fwd_std[8]), 1010.0 / 2020.0, 1e-4);  // measured standard over measured flash
  EXPECT_EQ(bwd_std[5], "3000");
  EXPECT_EQ(bwd_std[8], "");  // flash backward has no measurement
  EXPECT_EQ(bwd_flash[5], "");
  EXPECT_EQ(bwd_flash[9], "unavailable: stand-in failure");

  calls = 0;
  a.format = "json";
  std::ostringstream json;
  ASSERT_EQ(run_traffic_measured_by(a, json, fake, "stand-in"), 0);
  EXPECT_NE(json.str().find("\"measured\":{\"source\":\"stand-in\",\"forward\":{\"standard\":{\"read\":1000,\"write\":10},"
                            "\"flash\":{\"read\":2000,\"write\":20}},\"backward\":{\"standard\":{\"read\":3000,\"write\":30},"
                            "\"flash\":{\"unavailable\":\"stand-in failure\"}},\"ratio\":{\"forward\":0.5,\"backward\":null}}"),
            std::string::npos)
      << json.str();

  calls = 0;
  a.format = "table";
  std::ostringstream table;
  ASSERT_EQ(run_traffic_measured_by(a, table, fake, "stand-in"), 0);
  EXPECT_NE(table.str().find("measured: stand-in; dram__bytes_read.sum and dram__bytes_write.sum"), std::string::npos)
      << table.str();
  EXPECT_NE(table.str().find("unavailable (note 1)"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("note 1: stand-in failure"), std::string::npos) << table.str();
}

TEST(ToolsFormat, PadRightCountsCharactersNotBytes) {
  EXPECT_EQ(pad_right("QKᵀ", 5), "QKᵀ  ");
  EXPECT_EQ(pad_right("abc", 2), "abc");
}

TEST(ToolsTraffic, NothingMeasuredFallsBackToTheModelWithTheReason) {
  const CallMeasurer refuse = [](const std::function<void()>&) {
    return MeasuredCall{false, 0, 0, "counters refused"};
  };
  std::ostringstream os;
  ASSERT_EQ(run_traffic_measured_by(small_traffic("cpu", "table"), os, refuse, "stand-in"), 0);
  EXPECT_NE(os.str().find("measured: unavailable — every measurement failed; the first: counters refused"),
            std::string::npos)
      << os.str();
}


TEST(ToolsFormat, JsonNumberReadsBackAsTheSameDouble) {
  EXPECT_EQ(json_number(0.5), "0.5");
  EXPECT_EQ(json_number(1000), "1000");
  EXPECT_EQ(json_number(0.1), "0.1");
  EXPECT_EQ(json_number(-0.0), "-0");
  EXPECT_EQ(json_number(-INFINITY), "null");
  EXPECT_EQ(json_number(INFINITY), "null");
  EXPECT_EQ(json_number(NAN), "null");
  EXPECT_EQ(csv_number(0.5), "0.5");
  EXPECT_EQ(csv_number(-INFINITY), "");
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<double> xs = {std::exp(-1.0), 1.0 / 3.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
                            0.1 + 0.2, 201326592.0, 1e21, 1e22, -123456789.012345678};
  for (int k = 0; k < 20000; ++k) {  // every kind of double: random bit patterns, then random magnitudes
    double x;
    const uint64_t b = rng();
    std::memcpy(&x, &b, sizeof x);
    xs.push_back(x);
    xs.push_back(std::ldexp(double(rng() >> 11) / double(1ull << 53), int(rng() % 200) - 100));
  }
  for (double x : xs) {
    if (!std::isfinite(x)) continue;
    const std::string s = json_number(x);
    ASSERT_TRUE(valid_json(s)) << s;
    ASSERT_EQ(bits(std::strtod(s.c_str(), nullptr)), bits(x)) << s;
    ASSERT_EQ(bits(std::strtod(csv_number(x).c_str(), nullptr)), bits(x)) << csv_number(x);
  }
}

// Every double trace --json prints parses back bit-identical to the one the library computed:
// the walk is redone here with the same SoftmaxState<double> on the same parsed inputs.
TEST(Trace, JsonNumbersReadBackBitIdentical) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int round = 0; round < 50; ++round) {
    std::vector<double> scores, flat;
    int dim = 0;
    const TraceArgs a = random_trace(rng, &scores, &flat, &dim);
    const int n = int(scores.size());
    std::ostringstream os;
    run_trace(a, os);
    const std::string text = os.str();
    ASSERT_TRUE(valid_json(text)) << text;

    SoftmaxState<double> state;
    std::vector<double> acc(size_t(dim), 0.0), row_max, row_sum, rescale, accs;
    for (int j0 = 0; j0 < n; j0 += a.tile) {
      const int len = std::min(a.tile, n - j0);
      rescale.push_back(state.update(scores.data() + j0, len, flat.data() + size_t(j0) * size_t(dim), dim, dim, acc.data()));
      row_max.push_back(state.row_max);
      row_sum.push_back(state.row_sum);
      accs.insert(accs.end(), acc.begin(), acc.end());
    }
    std::vector<double> out(static_cast<size_t>(dim));
    const double lse = state.finalize(acc.data(), dim, out.data());

    const auto same = [&](const char* key, const std::vector<double>& want) {
      const std::vector<double> got = json_values(text, key);
      ASSERT_EQ(got.size(), want.size()) << key << "\n" << text;
      for (size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(want[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << key << "[" << i << "] should be null\n" << text;  // null
        } else {
          EXPECT_EQ(bits(got[i]), bits(want[i])) << key << "[" << i << "]: " << strprintf("%.17g", want[i]) << "\n" << text;
        }
      }
    };
    same("row_max", row_max);
    same("row_sum", row_sum);
    same("rescale", rescale);
    same("acc", accs);
    same("out", out);
    same("lse", {lse});
  }
}

// A fully masked row: row_max and lse are -inf, which JSON lacks; the output is valid JSON with
// null there, and no inf or nan token anywhere.
TEST(Trace, FullyMaskedRowPrintsValidJson) {
  for (const char* scores : {"-inf", "-inf,-inf,-inf", "-inf,-inf,-inf,2.5,-inf"}) {
    SCOPED_TRACE(scores);
    TraceArgs a;
    a.json = true;
    a.tile = 2;
    a.scores = scores;
    std::ostringstream os;
    ASSERT_EQ(run_trace(a, os), 0);
    const std::string text = os.str();
    EXPECT_TRUE(valid_json(text)) << text;
    EXPECT_EQ(text.find("inf"), std::string::npos) << text;
    EXPECT_EQ(text.find("nan"), std::string::npos) << text;
    const auto maxes = json_values(text, "row_max");
    ASSERT_FALSE(maxes.empty()) << text;
    EXPECT_TRUE(std::isnan(maxes[0])) << text;  // the first tile sees masked keys only: null
    const bool all_masked = std::string(scores).find("2.5") == std::string::npos;
    if (all_masked) {
      EXPECT_NE(text.find("\"lse\":null"), std::string::npos) << text;
      for (double o : json_values(text, "out")) EXPECT_EQ(o, 0.0) << text;
    } else {
      EXPECT_EQ(json_values(text, "lse"), (std::vector<double>{2.5})) << text;  // one key: lse = its score
    }
  }
}

// traffic --json stays valid JSON when a measurement is not finite (null), and its ratios are exact.
TEST(ToolsTraffic, JsonIsValidAndExact) {
  int calls = 0;
  const CallMeasurer fake = [&](const std::function<void()>& call) {
    call();
    const int k = calls++ % 4;
    if (k == 2) return MeasuredCall{true, INFINITY, 30.0, ""};
    return MeasuredCall{true, 1000.0 * (k + 1), 10.0 * (k + 1), ""};
  };
  TrafficArgs a;
  a.device = "cpu";
  a.dtype = "f16";
  a.seqlens = {32, 64};
  a.heads = a.heads_kv = 4;
  a.head_dim = 16;
  a.format = "json";
  std::ostringstream os;
  ASSERT_EQ(run_traffic_measured_by(a, os, fake, "stand-in"), 0);
  const std::string text = os.str();
  EXPECT_TRUE(valid_json(text)) << text;
  EXPECT_NE(text.find("\"standard\":{\"read\":null,\"write\":30}"), std::string::npos) << text;
  EXPECT_NE(text.find("\"ratio\":{\"forward\":0.5,"), std::string::npos) << text;  // 1010 / 2020, exactly
  Config c;
  c.device = Device::cpu;
  c.dtype = DType::f16;
  c.heads = c.heads_kv = 4, c.head_dim = 16, c.seqlen_q = c.seqlen_k = 32;
  const double want = forward_traffic(c, Algorithm::standard).total() / forward_traffic(c, Algorithm::flash).total();
  const std::vector<double> got = json_values(text, "forward");  // the model's ratio is the first number there
  bool found = false;
  for (double r : got) found = found || bits(r) == bits(want);
  EXPECT_TRUE(found) << strprintf("%.17g", want) << "\n" << text;
}

// ---- flashattn decode: the serving benchmark --------------------------------------------------------

namespace {

// A tiny sweep on the CPU: B 1 and 2 over caches of 64, 300 and 1K tokens, H 4 over 2 KV heads, d 32.
DecodeArgs small_decode() {
  DecodeArgs a;
  a.device = "cpu";
  a.batches = {1, 2};
  a.caches = {"64", "300", "1K"};
  a.heads = 4;
  a.heads_kv = 2;
  a.head_dim = 32;
  a.reps = 2;
  a.check_rows = 3;
  a.json = true;
  a.progress = false;
  return a;
}

// The JSON string following `"key":` in each row, in order.
std::vector<std::string> json_strings(const std::string& text, const std::string& key) {
  std::vector<std::string> out;
  const std::string pat = "\"" + key + "\":\"";
  for (size_t pos = text.find(pat); pos != std::string::npos; pos = text.find(pat, pos + 1)) {
    const size_t start = pos + pat.size();
    out.push_back(text.substr(start, text.find('"', start) - start));
  }
  return out;
}

}  // namespace

TEST(ToolsDecode, JsonRowsParseWithSmallErrorsAndEveryField) {
  struct Variant {
    int64_t page_size;
    int splits;
    bool append, heads_first;
    const char* flush;
  };
  // heads_first: the cache's strides put each KV head's rows together; the float64 reference
  // reads the cache back through the same layout, so a misread stride fails the error bound.
  for (const Variant& v : {Variant{0, 0, false, false, "read"}, Variant{7, 3, true, false, "write"},
                           Variant{0, 2, false, true, "read"}, Variant{16, 0, true, true, "write"}}) {
    SCOPED_TRACE(strprintf("page_size %lld splits %d append %d heads_first %d flush %s", (long long)v.page_size,
                           v.splits, int(v.append), int(v.heads_first), v.flush));
    DecodeArgs a = small_decode();
    a.page_size = v.page_size;
    a.splits = v.splits;
    a.append = v.append;
    a.heads_first = v.heads_first;
    a.flush = v.flush;
    std::ostringstream os;
    ASSERT_EQ(run_decode(a, os), 0) << os.str();
    const std::string text = os.str();
    ASSERT_TRUE(valid_json(text)) << text;
    EXPECT_EQ(json_numbers(text, "batch"), (std::vector<double>{1, 1, 1, 2, 2, 2})) << text;
    EXPECT_EQ(json_numbers(text, "cache_len"), (std::vector<double>{64, 300, 1024, 64, 300, 1024})) << text;
    const auto kv_bytes = json_numbers(text, "kv_bytes"), ms = json_numbers(text, "time_ms"),
               rate = json_numbers(text, "kv_bytes_per_s"), bw = json_numbers(text, "read_bw_bytes_per_s"),
               fraction = json_numbers(text, "read_bw_fraction"), err = json_numbers(text, "max_err"),
               splits = json_numbers(text, "num_splits");
    ASSERT_EQ(ms.size(), 6u) << text;
    ASSERT_EQ(err.size(), 6u) << text;
    ASSERT_EQ(splits.size(), 6u) << text;
    const double lens[] = {64, 300, 1024};
    for (size_t i = 0; i < 6; ++i) {
      const double batch = i < 3 ? 1 : 2, len = lens[i % 3];
      EXPECT_EQ(kv_bytes[i], 2 * batch * len * 2 * 32 * 4) << text;  // 2·B·len·Hkv·d·sizeof(f32)
      EXPECT_GT(ms[i], 0) << text;
      EXPECT_NEAR(rate[i], kv_bytes[i] / (ms[i] * 1e-3), 1e-9 * rate[i]) << text;
      EXPECT_GT(bw[i], 1e8) << text;  // any machine reads faster than 100 MB/s
      EXPECT_NEAR(fraction[i], rate[i] / bw[i], 1e-12 * fraction[i]) << text;
      EXPECT_LE(err[i], 1e-5) << text;
      if (v.splits > 0) EXPECT_EQ(splits[i], v.splits) << text;
      else EXPECT_GE(splits[i], 1) << text;
    }
    EXPECT_EQ(json_strings(text, "layout"), std::vector<std::string>(6, v.page_size > 0 ? "paged" : "contiguous"));
    EXPECT_EQ(json_numbers(text, "page_size"), std::vector<double>(6, double(v.page_size)));
    EXPECT_EQ(json_strings(text, "kernel_path"), std::vector<std::string>(6, "cpu.kvcache"));
    EXPECT_EQ(json_strings(text, "machine"), std::vector<std::string>(6, cpu_model_name()));
    for (const char* key : {"\"seqlen_q\":1,", "\"heads\":4,", "\"heads_kv\":2,", "\"head_dim\":32,", "\"ok\":true",
                            "\"threads\":", "\"read_bw_method\":", "\"dtype\":\"f32\""})
      EXPECT_NE(text.find(key), std::string::npos) << key << "\n" << text;
    EXPECT_EQ(text.find("\"ok\":false"), std::string::npos) << text;
    EXPECT_NE(text.find(v.append ? "\"append\":true" : "\"append\":false"), std::string::npos) << text;
    EXPECT_NE(text.find(v.heads_first ? "\"heads_first\":true" : "\"heads_first\":false"), std::string::npos) << text;
    EXPECT_EQ(json_strings(text, "flush"), std::vector<std::string>(6, v.flush));
    EXPECT_EQ(json_numbers(text, "queue_ahead_us"), std::vector<double>(6, 0.0)) << text;  // CUDA only
  }
}

TEST(ToolsDecode, TableNamesTheMachineAndTheReadBandwidth) {
  DecodeArgs a = small_decode();
  a.json = false;
  a.batches = {2};
  a.caches = {"300"};
  a.dtype = "bf16";
  a.page_size = 16;
  std::ostringstream os;
  ASSERT_EQ(run_decode(a, os), 0) << os.str();
  const std::string text = os.str();
  EXPECT_NE(text.find("flashattn decode — cpu (" + cpu_model_name()), std::string::npos) << text;
  EXPECT_NE(text.find("bf16 H=4/2 d=32"), std::string::npos) << text;
  EXPECT_NE(text.find("paged 16 cache"), std::string::npos) << text;
  EXPECT_NE(text.find("read bandwidth measured now: "), std::string::npos) << text;
  EXPECT_NE(text.find("of read BW"), std::string::npos) << text;
  EXPECT_NE(text.find("[ok]"), std::string::npos) << text;
  EXPECT_EQ(text.find("FAIL"), std::string::npos) << text;
}

TEST(ToolsDecode, RejectsBadArgumentsNamingTheOption) {
  std::ostringstream os;
  auto run = [&](const std::function<void(DecodeArgs&)>& change) {
    DecodeArgs a = small_decode();
    change(a);
    return error_of([&] { run_decode(a, os); });
  };
  const std::pair<std::function<void(DecodeArgs&)>, std::string> cases[] = {
      {[](DecodeArgs& a) { a.batches = {1, 0}; }, "flashattn decode: --batch: expected values >= 1, got 0"},
      {[](DecodeArgs& a) { a.caches = {"12x"}; }, "--cache: expected token counts from 1 to 2147483647 such as 4096 or "
                                                  "32K (K = 1024), got 12x"},
      {[](DecodeArgs& a) { a.caches = {"0"}; }, "--cache: expected token counts"},
      {[](DecodeArgs& a) { a.caches = {"4096M"}; }, "--cache: expected token counts"},
      {[](DecodeArgs& a) { a.caches = {"K"}; }, "--cache: expected token counts"},
      {[](DecodeArgs& a) { a.heads_kv = 3; }, "--heads-kv: expected a divisor of --heads 4, got 3"},
      {[](DecodeArgs& a) { a.heads = 0; }, "--heads: expected >= 1, got 0"},
      {[](DecodeArgs& a) { a.head_dim = 300; }, "--head-dim: expected 1..256, got 300"},
      {[](DecodeArgs& a) { a.page_size = -1; }, "--paged: expected a page size >= 1 (or 0: a contiguous cache), got -1"},
      {[](DecodeArgs& a) { a.splits = -2; }, "--splits: expected 0 (the library's choice) or >= 1, got -2"},
      {[](DecodeArgs& a) { a.reps = 0; }, "--reps: expected >= 1, got 0"},
      {[](DecodeArgs& a) { a.check_rows = -1; }, "--check-rows: expected >= 0, got -1"},
      {[](DecodeArgs& a) { a.dtype = "int8"; }, "--dtype: expected f32, f16, bf16 or auto, got int8"},
      {[](DecodeArgs& a) { a.device = "tpu"; }, "--device: expected cpu, cuda or auto, got tpu"},
      {[](DecodeArgs& a) { a.append = true, a.caches = {"1"}; }, "--cache: expected lengths >= 2 with --append"},
  };
  for (const auto& [change, want] : cases) {
    const std::string got = run(change);
    EXPECT_NE(got.find(want), std::string::npos) << got;
    EXPECT_EQ(got.rfind("flashattn", 0), 0u) << got;
  }
  if (!cuda_available())  // no device: --device cuda is refused by name
    EXPECT_NE(run([](DecodeArgs& a) { a.device = "cuda"; }).find("--device"), std::string::npos);
}

// On a CUDA device: valid JSON either way; each row measured and checked, or, while the build's CUDA
// backend lacks KV-cache kernels, one row carrying the library's unsupported error.
TEST(ToolsDecode, CudaRowsOrTheUnsupportedError) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  DecodeArgs a = small_decode();
  a.device = "cuda";
  a.dtype = "bf16";
  a.page_size = 16;
  a.queue_us = 50;
  std::ostringstream os;
  const int rc = run_decode(a, os);
  const std::string text = os.str();
  ASSERT_TRUE(valid_json(text)) << text;
  if (text.find("\"error\":") != std::string::npos) {
    EXPECT_EQ(rc, 1);
    EXPECT_NE(text.find("forward_kvcache"), std::string::npos) << text;
  } else {
    EXPECT_EQ(rc, 0) << text;
    EXPECT_EQ(json_numbers(text, "max_err").size(), 6u) << text;
    EXPECT_EQ(text.find("\"ok\":false"), std::string::npos) << text;
    EXPECT_EQ(json_numbers(text, "queue_ahead_us"), std::vector<double>(6, 50.0)) << text;
  }
}
