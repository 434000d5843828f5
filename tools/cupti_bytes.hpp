// DRAM bytes of one library call, read from the GPU's hardware counters through CUPTI's Range
// Profiler (cupti_range_profiler.h + cupti_profiler_host.h, the API CUDA 13 documents; the older
// cupti_profiler_target.h session calls are deprecated there). docs/traffic-model.md, "Measured
// bytes", says what is counted and why it differs from the analytic count.
//
// Compiled only when the CUDA backend is built and CMake found CUPTI (FLASHATTN_TOOLS_CUPTI);
// linked to the tools only, never to libflashattn.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace flashattn::tools {

// The two metrics, as Nsight Compute names them too.
inline constexpr const char* kDramReadMetric = "dram__bytes_read.sum";
inline constexpr const char* kDramWriteMetric = "dram__bytes_write.sum";

struct DramMeasurement {
  bool ok = false;
  double read = 0, write = 0;  // bytes, when ok
  int passes = 0;              // times the call ran inside the range (1 for these two metrics)
  std::string reason;          // why not, when !ok
};

// One profiler for the current CUDA device. Construction never throws: when the counters cannot
// be read (no device, no permission, a virtualized GPU, gVisor, an unknown chip) available() is
// false and reason() says why, in one line.
class DramCounter {
 public:
  DramCounter();
  ~DramCounter();
  DramCounter(const DramCounter&) = delete;
  DramCounter& operator=(const DramCounter&) = delete;

  bool available() const;
  const std::string& reason() const;
  // e.g. "CUPTI range profiler, chip GH100, 1 pass"
  std::string description() const;

  // Runs `call` (work enqueued on the current device; it need not synchronize) inside one
  // profiled range and returns the DRAM bytes the device read and wrote during that range: the
  // call's kernels, memsets and copies, nothing before or after it (the device is synchronized
  // on both sides). Were the metrics to need several passes, the call would run once per pass.
  // Never throws: a failure of CUPTI or of the call comes back as !ok with its reason.
  DramMeasurement measure(const std::function<void()>& call);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashattn::tools
