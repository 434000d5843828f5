// flashattn trace: the online-softmax state after every key tile for one query row, computed by
// the library's own SoftmaxState (include/flashattn/online_softmax.hpp), checked against a
// direct softmax. --json prints every number exactly (json_number: the shortest decimal that
// reads back as the same double); row_max and lse of a row whose keys are all masked are -inf,
// which JSON lacks, and print as null.
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "commands.hpp"
#include "flashattn/online_softmax.hpp"

namespace flashattn::tools {
namespace {

std::vector<double> parse_list(const std::string& text, const char* option) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const double x = std::stod(item, &used);
      if (item.find_first_not_of(" \t", used) != std::string::npos) throw std::invalid_argument(item);
      out.push_back(x);
    } catch (const std::exception&) {
      throw Error(std::string("flashattn trace: ") + option + ": expected comma-separated numbers, got '" + item + "'");
    }
  }
  if (out.empty()) throw Error(std::string("flashattn trace: ") + option + ": expected at least one number, got none");
  return out;
}

// For the table: 10 significant digits, -inf and inf spelled out.
std::string fmt(double x) {
  std::ostringstream os;
  if (std::isinf(x)) os << (x < 0 ? "-inf" : "inf");
  else os << std::setprecision(10) << x;
  return os.str();
}
// For --json: exact numbers, null for the non-finite ones.
std::string json_list(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + json_number(v[i]);
  return s + "]";
}

}  // namespace

int run_trace(const TraceArgs& a, std::ostream& os) {
  const std::vector<double> scores = parse_list(a.scores, "--scores");
  const int n = int(scores.size());
  if (a.tile < 1) throw Error("flashattn trace: --tile: expected >= 1, got " + std::to_string(a.tile));
  for (double s : scores)
    if (std::isnan(s) || s == INFINITY) throw Error("flashattn trace: --scores: expected finite values or -inf (masked), got " + fmt(s));

  // values: n rows of dim components (default one-hot: out then equals the probabilities).
  std::vector<std::vector<double>> values;
  if (a.values.empty()) {
    for (int j = 0; j < n; ++j) {
      values.emplace_back(size_t(n), 0.0);
      values.back()[size_t(j)] = 1.0;
    }
  } else {
    std::stringstream ss(a.values);
    std::string row;
    while (std::getline(ss, row, ';')) values.push_back(parse_list(row, "--values"));
    if (int(values.size()) != n)
      throw Error("flashattn trace: --values: expected " + std::to_string(n) + " rows (one per score), got " +
                  std::to_string(values.size()));
    for (const auto& r : values)
      if (r.size() != values[0].size())
        throw Error("flashattn trace: --values: expected rows of equal length " + std::to_string(values[0].size()) +
                    ", got one of " + std::to_string(r.size()));
  }
  const int dim = int(values[0].size());
  std::vector<double> flat;
  for (const auto& r : values) flat.insert(flat.end(), r.begin(), r.end());

  // The walk, tile by tile, with the library's state.
  SoftmaxState<double> state;
  std::vector<double> acc(size_t(dim), 0.0);
  struct Step {
    int tile;
    double row_max, row_sum, rescale;
    std::vector<double> acc;
  };
  std::vector<Step> steps;
  for (int t = 0, j0 = 0; j0 < n; ++t, j0 += a.tile) {
    const int len = std::min(a.tile, n - j0);
    const double rescale = state.update(scores.data() + j0, len, flat.data() + size_t(j0) * size_t(dim), dim, dim, acc.data());
    steps.push_back({t, state.row_max, state.row_sum, rescale, acc});
  }
  std::vector<double> out(static_cast<size_t>(dim));
  const double lse = state.finalize(acc.data(), dim, out.data());

  // Direct softmax for the check.
  double m = -INFINITY;
  for (double s : scores) m = std::max(m, s);
  std::vector<double> direct(size_t(dim), 0.0);
  double direct_lse = -INFINITY, max_diff = 0;
  if (m != -INFINITY) {
    double sum = 0;
    for (double s : scores) sum += std::exp(s - m);
    for (int j = 0; j < n; ++j)
      for (int c = 0; c < dim; ++c) direct[size_t(c)] += std::exp(scores[size_t(j)] - m) / sum * flat[size_t(j * dim + c)];
    direct_lse = m + std::log(sum);
  }
  for (int c = 0; c < dim; ++c) max_diff = std::max(max_diff, std::fabs(out[size_t(c)] - direct[size_t(c)]));
  const double lse_diff = (std::isinf(lse) && std::isinf(direct_lse)) ? 0.0 : std::fabs(lse - direct_lse);

  if (a.json) {
    os << "{\"steps\":[";
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& s = steps[i];
      os << (i ? "," : "") << "{\"tile\":" << s.tile << ",\"row_max\":" << json_number(s.row_max)
         << ",\"row_sum\":" << json_number(s.row_sum) << ",\"rescale\":" << json_number(s.rescale)
         << ",\"acc\":" << json_list(s.acc) << "}";
    }
    os << "],\"out\":" << json_list(out) << ",\"lse\":" << json_number(lse) << ",\"direct_out\":" << json_list(direct)
       << ",\"max_abs_diff\":" << json_number(std::max(max_diff, lse_diff)) << "}\n";
    return 0;
  }
  os << "Online softmax for one query row: " << n << " keys in tiles of " << a.tile << ".\n"
     << "Each tile: m_new = max(row_max, max(s)); rescale = exp(row_max - m_new);\n"
     << "           row_sum = row_sum*rescale + sum(exp(s - m_new)); acc = acc*rescale + exp(s - m_new)·V\n\n";
  os << std::left << std::setw(6) << "tile" << std::setw(22) << "scores" << std::setw(10) << "row_max" << std::setw(10)
     << "rescale" << std::setw(10) << "row_sum" << "acc\n";
  for (const Step& s : steps) {
    std::ostringstream sc;
    for (int j = s.tile * a.tile; j < std::min(n, (s.tile + 1) * a.tile); ++j) sc << fmt(scores[size_t(j)]) << ' ';
    std::ostringstream accs;
    accs << std::fixed << std::setprecision(3);
    for (double x : s.acc) accs << x << ' ';
    std::ostringstream nums;
    nums << std::fixed << std::setprecision(3);
    os << std::setw(6) << s.tile << std::setw(22) << sc.str();
    os << std::setw(10) << (std::isinf(s.row_max) ? std::string("-inf") : (nums.str(""), nums << s.row_max, nums.str()));
    os << std::setw(10) << (nums.str(""), nums << s.rescale, nums.str());
    os << std::setw(10) << (nums.str(""), nums << s.row_sum, nums.str()) << accs.str() << "\n";
  }
  os << std::fixed << std::setprecision(4) << "\nout = acc / row_sum = [";
  for (int c = 0; c < dim; ++c) os << (c ? ", " : "") << out[size_t(c)];
  os << "]\nlse = row_max + log(row_sum) = " << (std::isinf(lse) ? std::string("-inf") : fmt(lse)) << "\n";
  os << std::scientific << std::setprecision(1) << "direct softmax agrees: max |difference| = "
     << std::max(max_diff, lse_diff) << (std::max(max_diff, lse_diff) <= 1e-12 ? " [ok]" : " [MISMATCH]") << "\n";
  return std::max(max_diff, lse_diff) <= 1e-12 ? 0 : 1;
}

}  // namespace flashattn::tools
