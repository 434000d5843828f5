// flashattn traffic: the bytes each algorithm moves through main memory, forward and backward,
// for a sweep of N — the analytic count of docs/traffic-model.md and, on a CUDA device where the
// hardware counters can be read, the DRAM bytes measured for one call (CUPTI range profiler,
// tools/cupti_bytes.hpp) beside it.
#include <algorithm>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "traffic_model.hpp"

#if defined(FLASHATTN_TOOLS_CUPTI)
#include "cupti_bytes.hpp"
#endif

namespace flashattn::tools {
namespace {

// Printed beside the measurement's source: what exactly was counted.
constexpr const char* kMetricsLine = "dram__bytes_read.sum and dram__bytes_write.sum over one range around one call";

using Measured = MeasuredCall;
Traffic bytes(const Measured& m) { return {m.read, m.write}; }

struct Row {
  int64_t n = 0;
  Traffic sf, ff, sb, fb, cf, cb;  // analytic: standard/flash forward, standard/flash backward, compulsory
  Measured msf, mff, msb, mfb;     // measured, same order
};

using Measurer = CallMeasurer;

// One call of the library on pb's tensors.
void run_call(Problem& pb, bool backward, Algorithm alg) {
  Options opt;
  opt.causal = pb.cfg.causal;
  opt.algorithm = alg;
  if (backward)
    flashattn::backward(pb.tq, pb.tk, pb.tv, pb.tout, pb.tdout, pb.tlse, pb.tdq, pb.tdk, pb.tdv, opt);
  else
    flashattn::forward(pb.tq, pb.tk, pb.tv, pb.tout, &pb.tlse, opt);
}

// A warm-up call (first-use costs: cuBLAS handles, module loading, the memory pool; and a call
// the backend cannot run is rejected here, outside the range), then the measured, identical call.
Measured warm_then_measure(Problem& pb, bool backward, Algorithm alg, const Measurer& measure) {
  try {
    run_call(pb, backward, alg);
    device_synchronize(pb.cfg.device);
  } catch (const std::exception& e) {
    return {false, 0, 0, e.what()};
  }
  return measure([&] { run_call(pb, backward, alg); });
}

// The measured calls of one sequence length; `only` ("pass:algorithm") restricts them to one.
void measure_row(const Config& c, Row& r, const Measurer& measure, const std::string& only) {
  const auto wanted = [&](const char* pass, Algorithm alg) {
    return only.empty() || only == std::string(pass) + ":" + to_string(alg);
  };
  const std::string skipped = "not run (--profile-call " + only + ")";
  r.msf = r.mff = r.msb = r.mfb = Measured{false, 0, 0, skipped};
  try {
    Problem pb(c, /*backward=*/true, fresh_seed());  // random inputs: zeros would compress
    if (wanted("forward", Algorithm::standard)) r.msf = warm_then_measure(pb, false, Algorithm::standard, measure);
    if (wanted("forward", Algorithm::flash)) r.mff = warm_then_measure(pb, false, Algorithm::flash, measure);
    if (wanted("backward", Algorithm::standard) || wanted("backward", Algorithm::flash)) {
      // The backward reads the forward's out and lse; flash where it runs (f16/bf16), else standard.
      try {
        run_call(pb, false, Algorithm::flash);
      } catch (const Error&) {
        run_call(pb, false, Algorithm::standard);
      }
      if (wanted("backward", Algorithm::standard)) r.msb = warm_then_measure(pb, true, Algorithm::standard, measure);
      if (wanted("backward", Algorithm::flash)) r.mfb = warm_then_measure(pb, true, Algorithm::flash, measure);
    }
  } catch (const std::exception& e) {  // allocation or the backward's forward: the rest of this N is not measured
    for (Measured* m : {&r.msf, &r.mff, &r.msb, &r.mfb})
      if (!m->ok) *m = Measured{false, 0, 0, e.what()};
  }
}

double ratio(const Traffic& num, const Traffic& den) { return den.total() > 0 ? num.total() / den.total() : 0; }

// JSON and CSV numbers are exact (json_number, csv_number): byte counts print as integers, ratios
// with every digit a double holds.
std::string traffic_json(const Traffic& t) {
  return "{\"read\":" + json_number(t.read) + ",\"write\":" + json_number(t.write) + "}";
}
std::string measured_json(const Measured& m) {
  return m.ok ? traffic_json(bytes(m)) : "{\"unavailable\":" + json_string(m.reason) + "}";
}
std::string measured_ratio_json(const Measured& s, const Measured& f) {
  return s.ok && f.ok ? json_number(ratio(bytes(s), bytes(f))) : "null";
}

void print_json(std::ostream& os, const std::vector<Row>& rows, const std::string& unavailable,
                const std::string& source) {
  os << "[\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    os << strprintf("  {\"seqlen\":%lld,\"source\":\"model\",", (long long)r.n)
       << "\"forward\":{\"standard\":" << traffic_json(r.sf) << ",\"flash\":" << traffic_json(r.ff)
       << ",\"compulsory\":" << traffic_json(r.cf) << "},"
       << "\"backward\":{\"standard\":" << traffic_json(r.sb) << ",\"flash\":" << traffic_json(r.fb)
       << ",\"compulsory\":" << traffic_json(r.cb) << "},"
       << "\"ratio\":{\"forward\":" << json_number(ratio(r.sf, r.ff)) << ",\"backward\":" << json_number(ratio(r.sb, r.fb))
       << "},"
       << "\"measured\":";
    if (!unavailable.empty()) {
      os << "{\"unavailable\":" << json_string(unavailable) << "}";
    } else {
      os << "{\"source\":" << json_string(source) << ",\"forward\":{\"standard\":" << measured_json(r.msf)
         << ",\"flash\":" << measured_json(r.mff) << "},\"backward\":{\"standard\":" << measured_json(r.msb)
         << ",\"flash\":" << measured_json(r.mfb) << "},\"ratio\":{\"forward\":" << measured_ratio_json(r.msf, r.mff)
         << ",\"backward\":" << measured_ratio_json(r.msb, r.mfb) << "}}";
    }
    os << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  os << "]\n";
}

void print_csv(std::ostream& os, const std::vector<Row>& rows, const std::string& unavailable, const std::string& tag) {
  // One line per (seqlen, pass, algorithm): the model's bytes, the measured bytes beside them
  // (empty when not measured, with the reason in `measured`), and each line's total over flash's.
  os << "seqlen,pass,algorithm,model_read_bytes,model_write_bytes,measured_read_bytes,measured_write_bytes,"
        "model_over_flash,measured_over_flash,measured\n";
  for (const Row& r : rows) {
    const struct {
      const char* pass;
      const char* alg;
      const Traffic* model;
      const Traffic* model_flash;
      const Measured* m;  // null: compulsory bytes are no call
      const Measured* m_flash;
    } items[] = {{"forward", "standard", &r.sf, &r.ff, &r.msf, &r.mff},
                 {"forward", "flash", &r.ff, &r.ff, &r.mff, &r.mff},
                 {"forward", "compulsory", &r.cf, &r.ff, nullptr, &r.mff},
                 {"backward", "standard", &r.sb, &r.fb, &r.msb, &r.mfb},
                 {"backward", "flash", &r.fb, &r.fb, &r.mfb, &r.mfb},
                 {"backward", "compulsory", &r.cb, &r.fb, nullptr, &r.mfb}};
    for (const auto& it : items) {
      os << strprintf("%lld,%s,%s,", (long long)r.n, it.pass, it.alg) << csv_number(it.model->read) << ","
         << csv_number(it.model->write) << ",";
      const bool have = unavailable.empty() && it.m && it.m->ok;
      os << (have ? csv_number(it.m->read) + "," + csv_number(it.m->write) + "," : std::string(",,"));
      os << csv_number(ratio(*it.model, *it.model_flash)) << ",";
      os << (have && it.m_flash->ok ? csv_number(ratio(bytes(*it.m), bytes(*it.m_flash))) : std::string()) << ",";
      if (!it.m)
        os << csv_field("") << "\n";
      else if (!unavailable.empty())
        os << csv_field("unavailable: " + unavailable) << "\n";
      else
        os << csv_field(it.m->ok ? tag : "unavailable: " + it.m->reason) << "\n";
    }
  }
}

std::string rstrip(std::string s) {
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string rw(const Traffic& t) { return human_bytes(t.read) + " / " + human_bytes(t.write); }

void print_table(std::ostream& os, const std::vector<Row>& rows, const Config& c, const std::string& unavailable,
                 const std::string& source) {
  const StoredBytes sb = stored_bytes(c);
  const std::string storage =
      sb.s == sb.p ? std::string("S and P stored in ") + to_string(c.dtype)
                   : std::string("S and dP stored in f32 (cuBLAS output), P and dS in ") + to_string(c.dtype);
  const std::string shape =
      strprintf("%s, batch %lld, %lld heads", to_string(c.dtype), (long long)c.batch, (long long)c.heads) +
      (c.heads_kv != c.heads ? strprintf(" (%lld KV heads)", (long long)c.heads_kv) : std::string()) +
      strprintf(", head_dim %lld, %s, %s; %s", (long long)c.head_dim, c.causal ? "causal" : "no mask",
                to_string(c.device), storage.c_str());
  if (!unavailable.empty()) {
    os << "Bytes moved through main memory by one call (analytic model, docs/traffic-model.md)\n" << shape << "\n\n";
    os << strprintf("%7s | %-28s %-28s %9s | %-28s %-28s %9s\n", "", "forward standard (read/write)", "forward flash",
                    "std/flash", "backward standard", "backward flash", "std/flash");
    for (const Row& r : rows)
      os << strprintf("%7lld | %-28s %-28s %8.0fx | %-28s %-28s %8.0fx\n", (long long)r.n, rw(r.sf).c_str(),
                      rw(r.ff).c_str(), ratio(r.sf, r.ff), rw(r.sb).c_str(), rw(r.fb).c_str(), ratio(r.sb, r.fb));
    os << "\nflash moves the compulsory bytes (Q, K, V read once; O, LSE written once) and nothing that grows as N².\n";
    os << "measured: unavailable — " << unavailable << "\n";
    return;
  }
  os << "Bytes moved through main memory by one call: the analytic model (docs/traffic-model.md) beside the\n"
        "DRAM bytes measured on this GPU for one call after a warm-up call\n"
     << shape << "\nmeasured: " << source << "; " << kMetricsLine << "\n\n";
  os << strprintf("%7s  %-8s  %-10s  %-26s  %-26s  %s\n", "N", "pass", "algorithm", "analytic read / write",
                  "measured read / write", "measured/analytic");
  std::vector<std::string> notes;  // one per distinct reason (a CUPTI failure repeats for every call)
  auto note_of = [&](const std::string& reason) {
    const auto it = std::find(notes.begin(), notes.end(), reason);
    if (it != notes.end()) return size_t(it - notes.begin()) + 1;
    notes.push_back(reason);
    return notes.size();
  };
  auto line = [&](const Row& r, const char* pass, const char* alg, const Traffic& model, const Measured& m) {
    const std::string meas = m.ok ? rw(bytes(m)) : "unavailable (note " + std::to_string(note_of(m.reason)) + ")";
    os << rstrip(strprintf("%7lld  %-8s  %-10s  %-26s  %-26s  %s", (long long)r.n, pass, alg, rw(model).c_str(),
                           meas.c_str(), m.ok ? strprintf("%.2fx", ratio(bytes(m), model)).c_str() : ""))
       << "\n";
  };
  auto ratio_line = [&](const Row& r, const char* pass, const Traffic& s, const Traffic& f, const Measured& ms,
                        const Measured& mf) {
    const std::string meas = ms.ok && mf.ok ? strprintf("%.1fx", ratio(bytes(ms), bytes(mf))) : "-";
    os << strprintf("%7lld  %-8s  %-10s  %-26s  %s\n", (long long)r.n, pass, "std/flash",
                    strprintf("%.1fx", ratio(s, f)).c_str(), meas.c_str());
  };
  for (const Row& r : rows) {
    line(r, "forward", "standard", r.sf, r.msf);
    line(r, "forward", "flash", r.ff, r.mff);
    ratio_line(r, "forward", r.sf, r.ff, r.msf, r.mff);
    line(r, "backward", "standard", r.sb, r.msb);
    line(r, "backward", "flash", r.fb, r.mfb);
    ratio_line(r, "backward", r.sb, r.fb, r.msb, r.mfb);
  }
  os << "\nThe analytic count assumes every byte goes to DRAM; the measured one sees L2 hits (a smaller count) and\n"
        "write-backs of dirty L2 lines, which may leave the chip after the range ends (docs/traffic-model.md).\n";
  for (size_t i = 0; i < notes.size(); ++i) os << "note " << i + 1 << ": " << notes[i] << "\n";
}

}  // namespace

namespace {

// run_traffic and run_traffic_measured_by: `injected`, when set, measures the calls on any device.
int traffic(const TrafficArgs& a, std::ostream& os, const CallMeasurer* injected, const std::string& injected_source) {
  // The analytic counts need no device: `--device cuda` without one (or in a build without CUDA)
  // still prints the model of the CUDA path, and says why nothing was measured.
  std::string unavailable;
  Device device;
  if (a.device == "cuda") {
    device = Device::cuda;
#if defined(FLASHATTN_TOOLS_CUDA)
    if (!cuda_available()) unavailable = "no CUDA device on this machine";
#else
    unavailable = "this build has no CUDA backend";
#endif
  } else {
    device = parse_device(a.device);
  }
  if (a.format != "table" && a.format != "json" && a.format != "csv")
    throw Error("flashattn traffic: --format: expected table, json or csv, got " + a.format);
  if (a.measure != "auto" && a.measure != "off")
    throw Error("flashattn traffic: --measure: expected auto or off, got " + a.measure);
  const std::string& only = a.profile_call;
  if (!only.empty()) {
    if (only != "forward:standard" && only != "forward:flash" && only != "backward:standard" && only != "backward:flash")
      throw Error("flashattn traffic: --profile-call: expected forward:standard, forward:flash, backward:standard or "
                  "backward:flash, got " + only);
    if (device != Device::cuda)
      throw Error("flashattn traffic: --profile-call: needs --device cuda, got --device " + a.device);
    if (!unavailable.empty()) throw Error("flashattn traffic: --profile-call: needs a CUDA device: " + unavailable);
    if (a.measure == "off") throw Error("flashattn traffic: --profile-call: runs a call, which --measure off forbids");
  }
  if (a.heads_kv < 0 || (a.heads_kv > 0 && a.heads % a.heads_kv != 0))
    throw Error("flashattn traffic: --heads-kv: expected a divisor of --heads (" + std::to_string(a.heads) + "), got " +
                std::to_string(a.heads_kv));

  Config base;
  base.device = device;
  base.dtype = parse_dtype(a.dtype, device);
  base.batch = a.batch;
  base.heads = a.heads;
  base.heads_kv = a.heads_kv > 0 ? a.heads_kv : a.heads;
  base.head_dim = a.head_dim;
  base.causal = a.causal;
  std::vector<Row> rows;
  for (int64_t n : a.seqlens) {
    if (n < 1) throw Error("flashattn traffic: --seqlen: expected values >= 1, got " + std::to_string(n));
    Config c = base;
    c.seqlen_q = c.seqlen_k = n;
    Row r;
    r.n = n;
    r.sf = forward_traffic(c, Algorithm::standard);
    r.ff = forward_traffic(c, Algorithm::flash);
    r.sb = backward_traffic(c, Algorithm::standard);
    r.fb = backward_traffic(c, Algorithm::flash);
    r.cf = compulsory_forward(c);
    r.cb = compulsory_backward(c);
    rows.push_back(r);
  }

  // What measures the calls, if anything can here.
  std::string source, tag;  // tag: the CSV's short name of the source
  Measurer measure;
#if defined(FLASHATTN_TOOLS_CUPTI)
  std::unique_ptr<DramCounter> counter;
#endif
  if (injected && unavailable.empty()) {
    measure = *injected;
    source = tag = injected_source;
  } else if (unavailable.empty()) {
    if (a.measure == "off") {
      unavailable = "not asked for (--measure off)";
    } else if (device != Device::cuda) {
      unavailable = "not on cpu: the program reads DRAM counters of CUDA devices only (CUPTI)";
    } else if (!only.empty()) {
      unavailable = "left to an external profiler: --profile-call " + only +
                    " ran that call between cudaProfilerStart and cudaProfilerStop";
      source = "external profiler";
      measure = [](const std::function<void()>& call) {
        external_profiler_start();
        call();
        external_profiler_stop();
        return Measured{false, 0, 0, "measured by the external profiler"};
      };
    } else {
#if defined(FLASHATTN_TOOLS_CUPTI)
      counter = std::make_unique<DramCounter>();
      if (!counter->available()) {
        unavailable = "CUPTI cannot read the DRAM counters here: " + counter->reason();
      } else {
        source = counter->description();
        tag = "cupti";
        measure = [&counter](const std::function<void()>& call) {
          const DramMeasurement d = counter->measure(call);
          return d.ok ? Measured{true, d.read, d.write, ""} : Measured{false, 0, 0, d.reason};
        };
      }
#else
      unavailable = "this build has no CUPTI (CMake did not find cupti_range_profiler.h, libcupti and "
                    "libnvperf_host of CUDA >= 12.6; see the configure output)";
#endif
    }
  }
  if (measure) {
    for (Row& r : rows) {
      Config c = base;
      c.seqlen_q = c.seqlen_k = r.n;
      measure_row(c, r, measure, only);
    }
    // Nothing measured at all (e.g. the counters refused every range): say so once, as when the
    // counters cannot be read, and print the model alone.
    bool any = false;
    for (const Row& r : rows) any = any || r.msf.ok || r.mff.ok || r.msb.ok || r.mfb.ok;
    if (!any && unavailable.empty() && !rows.empty())
      unavailable = "every measurement failed; the first: " + rows[0].msf.reason;
  }

  if (a.format == "json")
    print_json(os, rows, unavailable, source);
  else if (a.format == "csv")
    print_csv(os, rows, unavailable, tag);
  else
    print_table(os, rows, base, unavailable, source);
  return 0;
}

}  // namespace

int run_traffic(const TrafficArgs& a, std::ostream& os) { return traffic(a, os, nullptr, ""); }

int run_traffic_measured_by(const TrafficArgs& a, std::ostream& os, const CallMeasurer& measurer,
                            const std::string& source) {
  return traffic(a, os, &measurer, source);
}

}  // namespace flashattn::tools
