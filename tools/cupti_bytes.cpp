// DRAM bytes of one call through CUPTI's Range Profiler. The sequence (CUPTI 13 documentation,
// "Range Profiling"): on the host, a profiler host object for the chip turns the metric names into
// a configuration image once; per measurement, the range profiler is enabled on the CUDA context,
// given that configuration and an empty counter-data image, started, one user range is pushed
// around the work and popped, the profiler is stopped (repeating the work while passes remain),
// the hardware data is decoded into the counter-data image, and the host object evaluates the
// metrics of range 0 from it.
#include "cupti_bytes.hpp"

#include <cuda.h>  // CUcontext, CUresult: types only, libcuda is not linked (see current_context)
#include <cuda_runtime.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_result.h>
#include <cupti_target.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace flashattn::tools {
namespace {

// A CUPTI or CUDA failure inside this file; measure() and the constructor turn it into a reason.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What a user can do about the errors that mean "this machine does not let us read counters".
const char* hint(CUptiResult r) {
  switch (r) {
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES:
      return " (the driver restricts GPU performance counters to administrators: run as root, or load "
             "the nvidia module with NVreg_RestrictProfilingToAdminUsers=0)";
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED:
      return " (a virtualized GPU without profiling support)";
    case CUPTI_ERROR_HARDWARE_BUSY:
      return " (another profiler, e.g. Nsight Compute or a second CUPTI client, holds the counters)";
    case CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED:
      return " (MIG instances do not expose DRAM counters to CUPTI)";
    case CUPTI_ERROR_NOT_INITIALIZED:
    case CUPTI_ERROR_UNKNOWN:
      return " (common in sandboxed runtimes such as gVisor, which do not pass the profiling interface through)";
    default:
      return "";
  }
}

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* name = nullptr;
  const char* message = nullptr;
  if (cuptiGetResultString(r, &name) != CUPTI_SUCCESS || name == nullptr) name = "unknown CUPTI error";
  std::string text = std::string(what) + " failed: " + name;
  if (cuptiGetErrorMessage(r, &message) == CUPTI_SUCCESS && message != nullptr && *message)
    text += std::string(" — ") + message;
  throw Failure(text + hint(r));
}

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so the library's next call starts clean
  throw Failure(std::string(what) + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// The current CUDA context, which the range profiler is enabled on. The program must start on
// machines without an NVIDIA driver (CI), so libcuda is not linked: the runtime hands out the
// driver's cuCtxGetCurrent.
CUcontext current_context() {
  check(cudaFree(nullptr), "cudaFree(nullptr) (creating the CUDA context)");
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found),
        "cudaGetDriverEntryPointByVersion(cuCtxGetCurrent)");
  if (found != cudaDriverEntryPointSuccess || fn == nullptr)
    throw Failure("the CUDA driver does not provide cuCtxGetCurrent");
  CUcontext ctx = nullptr;
  if (reinterpret_cast<CUresult (*)(CUcontext*)>(fn)(&ctx) != CUDA_SUCCESS || ctx == nullptr)
    throw Failure("no current CUDA context");
  return ctx;
}

// Why the device or configuration does not support range profiling, from CUPTI's own checklist.
std::string unsupported_because(const CUpti_Profiler_DeviceSupported_Params& s) {
  std::string why;
  auto add = [&](CUpti_Profiler_Support_Level level, const char* what) {
    if (level == CUPTI_PROFILER_CONFIGURATION_SUPPORTED) return;
    why += why.empty() ? "" : ", ";
    why += what;
    if (level == CUPTI_PROFILER_CONFIGURATION_DISABLED) why += " (disabled by the system)";
  };
  add(s.architecture, "GPU architecture (compute capability 7.0 or newer needed)");
  add(s.sli, "SLI");
  add(s.vGpu, "vGPU");
  add(s.confidentialCompute, "confidential computing");
  add(s.cmp, "CMP (crypto-mining) device");
  add(s.wsl, "WSL");
  return why.empty() ? "reason not given by CUPTI" : why;
}

// A CUPTI parameter struct: zeroed, with the size CUPTI checks for the version of the struct.
template <class Params>
Params params(size_t struct_size) {
  Params p{};
  p.structSize = struct_size;
  return p;
}
#define CUPTI_PARAMS(type) params<type>(type##_STRUCT_SIZE)

constexpr int kMaxPasses = 8;  // the two DRAM metrics need one; more would mean a broken config

}  // namespace

struct DramCounter::Impl {
  bool ok = false;
  std::string reason;
  bool profiler_initialized = false;
  CUcontext ctx = nullptr;
  std::string chip;
  std::vector<uint8_t> availability;  // which counters this device exposes now
  CUpti_Profiler_Host_Object* host = nullptr;
  std::vector<uint8_t> config;        // the metrics' scheduling, built once
  size_t passes = 0;
  const char* metrics[2] = {kDramReadMetric, kDramWriteMetric};

  void setup() {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      cudaGetLastError();
      throw Failure(std::string("no CUDA device (") + (e != cudaSuccess ? cudaGetErrorString(e) : "none found") + ")");
    }
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    ctx = current_context();

    auto init = CUPTI_PARAMS(CUpti_Profiler_Initialize_Params);
    check(cuptiProfilerInitialize(&init), "cuptiProfilerInitialize");
    profiler_initialized = true;

    auto support = CUPTI_PARAMS(CUpti_Profiler_DeviceSupported_Params);
    support.cuDevice = device;
    support.api = CUPTI_PROFILER_RANGE_PROFILING;
    check(cuptiProfilerDeviceSupported(&support), "cuptiProfilerDeviceSupported");
    if (support.isSupported != CUPTI_PROFILER_CONFIGURATION_SUPPORTED)
      throw Failure("CUPTI range profiling is not supported on CUDA device " + std::to_string(device) + ": " +
                    unsupported_because(support));

    auto chip_params = CUPTI_PARAMS(CUpti_Device_GetChipName_Params);
    chip_params.deviceIndex = size_t(device);
    check(cuptiDeviceGetChipName(&chip_params), "cuptiDeviceGetChipName");
    chip = chip_params.pChipName ? chip_params.pChipName : "?";

    // Two calls: the size, then the image.
    auto avail = CUPTI_PARAMS(CUpti_Profiler_GetCounterAvailability_Params);
    avail.ctx = ctx;
    check(cuptiProfilerGetCounterAvailability(&avail), "cuptiProfilerGetCounterAvailability (size)");
    availability.assign(avail.counterAvailabilityImageSize, 0);
    avail.pCounterAvailabilityImage = availability.data();
    check(cuptiProfilerGetCounterAvailability(&avail), "cuptiProfilerGetCounterAvailability");

    auto host_init = CUPTI_PARAMS(CUpti_Profiler_Host_Initialize_Params);
    host_init.profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER;
    host_init.pChipName = chip.c_str();
    host_init.pCounterAvailabilityImage = availability.data();
    check(cuptiProfilerHostInitialize(&host_init), "cuptiProfilerHostInitialize");
    host = host_init.pHostObject;

    auto add = CUPTI_PARAMS(CUpti_Profiler_Host_ConfigAddMetrics_Params);
    add.pHostObject = host;
    add.ppMetricNames = metrics;
    add.numMetrics = 2;
    check(cuptiProfilerHostConfigAddMetrics(&add),
          "cuptiProfilerHostConfigAddMetrics (dram__bytes_read.sum, dram__bytes_write.sum)");
    auto size = CUPTI_PARAMS(CUpti_Profiler_Host_GetConfigImageSize_Params);
    size.pHostObject = host;
    check(cuptiProfilerHostGetConfigImageSize(&size), "cuptiProfilerHostGetConfigImageSize");
    config.assign(size.configImageSize, 0);
    auto image = CUPTI_PARAMS(CUpti_Profiler_Host_GetConfigImage_Params);
    image.pHostObject = host;
    image.configImageSize = config.size();
    image.pConfigImage = config.data();
    check(cuptiProfilerHostGetConfigImage(&image), "cuptiProfilerHostGetConfigImage");
    auto npass = CUPTI_PARAMS(CUpti_Profiler_Host_GetNumOfPasses_Params);
    npass.configImageSize = config.size();
    npass.pConfigImage = config.data();
    check(cuptiProfilerHostGetNumOfPasses(&npass), "cuptiProfilerHostGetNumOfPasses");
    passes = npass.numOfPasses;
  }

  ~Impl() {
    if (host) {
      auto p = CUPTI_PARAMS(CUpti_Profiler_Host_Deinitialize_Params);
      p.pHostObject = host;
      cuptiProfilerHostDeinitialize(&p);
    }
    if (profiler_initialized) {
      auto p = CUPTI_PARAMS(CUpti_Profiler_DeInitialize_Params);
      cuptiProfilerDeInitialize(&p);
    }
  }
};

DramCounter::DramCounter() : impl_(std::make_unique<Impl>()) {
  try {
    impl_->setup();
    impl_->ok = true;
  } catch (const std::exception& e) {
    impl_->reason = e.what();
  }
}

DramCounter::~DramCounter() = default;

bool DramCounter::available() const { return impl_->ok; }
const std::string& DramCounter::reason() const { return impl_->reason; }

std::string DramCounter::description() const {
  if (!impl_->ok) return "unavailable: " + impl_->reason;
  return "CUPTI range profiler, chip " + impl_->chip + ", " + std::to_string(impl_->passes) +
         (impl_->passes == 1 ? " pass" : " passes");
}

DramMeasurement DramCounter::measure(const std::function<void()>& call) {
  DramMeasurement m;
  if (!impl_->ok) {
    m.reason = impl_->reason;
    return m;
  }
  CUpti_RangeProfiler_Object* profiler = nullptr;
  bool started = false, pushed = false;
  try {
    // Work enqueued before the range (the warm-up call) must finish outside it.
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before the range)");
    auto enable = CUPTI_PARAMS(CUpti_RangeProfiler_Enable_Params);
    enable.ctx = impl_->ctx;
    check(cuptiRangeProfilerEnable(&enable), "cuptiRangeProfilerEnable");
    profiler = enable.pRangeProfilerObject;

    auto size = CUPTI_PARAMS(CUpti_RangeProfiler_GetCounterDataSize_Params);
    size.pRangeProfilerObject = profiler;
    size.pMetricNames = impl_->metrics;
    size.numMetrics = 2;
    size.maxNumOfRanges = 1;
    size.maxNumRangeTreeNodes = 1;
    check(cuptiRangeProfilerGetCounterDataSize(&size), "cuptiRangeProfilerGetCounterDataSize");
    std::vector<uint8_t> counter_data(size.counterDataSize, 0);
    auto init = CUPTI_PARAMS(CUpti_RangeProfiler_CounterDataImage_Initialize_Params);
    init.pRangeProfilerObject = profiler;
    init.counterDataSize = counter_data.size();
    init.pCounterData = counter_data.data();
    check(cuptiRangeProfilerCounterDataImageInitialize(&init), "cuptiRangeProfilerCounterDataImageInitialize");

    // One user-delimited range, replayed by us (the call runs again per pass) rather than by
    // kernel replay, which would save and restore memory around every kernel and count that too.
    auto config = CUPTI_PARAMS(CUpti_RangeProfiler_SetConfig_Params);
    config.pRangeProfilerObject = profiler;
    config.configSize = impl_->config.size();
    config.pConfig = impl_->config.data();
    config.counterDataImageSize = counter_data.size();
    config.pCounterDataImage = counter_data.data();
    config.range = CUPTI_UserRange;
    config.replayMode = CUPTI_UserReplay;
    config.maxRangesPerPass = 1;
    config.numNestingLevels = 1;
    config.minNestingLevel = 1;
    config.passIndex = 0;
    config.targetNestingLevel = 1;
    check(cuptiRangeProfilerSetConfig(&config), "cuptiRangeProfilerSetConfig");

    bool all_submitted = false;
    while (!all_submitted) {
      if (m.passes == kMaxPasses)
        throw Failure("the metrics still needed passes after " + std::to_string(kMaxPasses) + " runs of the call");
      auto start = CUPTI_PARAMS(CUpti_RangeProfiler_Start_Params);
      start.pRangeProfilerObject = profiler;
      check(cuptiRangeProfilerStart(&start), "cuptiRangeProfilerStart");
      started = true;
      auto push = CUPTI_PARAMS(CUpti_RangeProfiler_PushRange_Params);
      push.pRangeProfilerObject = profiler;
      push.pRangeName = "flashattn call";
      check(cuptiRangeProfilerPushRange(&push), "cuptiRangeProfilerPushRange");
      pushed = true;
      call();
      // The range must close after the call's last kernel, not after its last launch.
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (end of the profiled call)");
      auto pop = CUPTI_PARAMS(CUpti_RangeProfiler_PopRange_Params);
      pop.pRangeProfilerObject = profiler;
      check(cuptiRangeProfilerPopRange(&pop), "cuptiRangeProfilerPopRange");
      pushed = false;
      auto stop = CUPTI_PARAMS(CUpti_RangeProfiler_Stop_Params);
      stop.pRangeProfilerObject = profiler;
      check(cuptiRangeProfilerStop(&stop), "cuptiRangeProfilerStop");
      started = false;
      all_submitted = stop.isAllPassSubmitted != 0;
      ++m.passes;
    }

    auto decode = CUPTI_PARAMS(CUpti_RangeProfiler_DecodeData_Params);
    decode.pRangeProfilerObject = profiler;
    check(cuptiRangeProfilerDecodeData(&decode), "cuptiRangeProfilerDecodeData");
    if (decode.numOfRangeDropped > 0)
      throw Failure("CUPTI dropped the range (" + std::to_string(decode.numOfRangeDropped) + " dropped)");
    auto info = CUPTI_PARAMS(CUpti_RangeProfiler_GetCounterDataInfo_Params);
    info.pCounterDataImage = counter_data.data();
    info.counterDataImageSize = counter_data.size();
    check(cuptiRangeProfilerGetCounterDataInfo(&info), "cuptiRangeProfilerGetCounterDataInfo");
    if (info.numTotalRanges < 1) throw Failure("CUPTI recorded no range");

    double values[2] = {NAN, NAN};
    auto eval = CUPTI_PARAMS(CUpti_Profiler_Host_EvaluateToGpuValues_Params);
    eval.pHostObject = impl_->host;
    eval.pCounterDataImage = counter_data.data();
    eval.counterDataImageSize = counter_data.size();
    eval.rangeIndex = 0;
    eval.ppMetricNames = impl_->metrics;
    eval.numMetrics = 2;
    eval.pMetricValues = values;
    check(cuptiProfilerHostEvaluateToGpuValues(&eval), "cuptiProfilerHostEvaluateToGpuValues");

    auto disable = CUPTI_PARAMS(CUpti_RangeProfiler_Disable_Params);
    disable.pRangeProfilerObject = profiler;
    profiler = nullptr;
    check(cuptiRangeProfilerDisable(&disable), "cuptiRangeProfilerDisable");

    if (!std::isfinite(values[0]) || !std::isfinite(values[1]) || values[0] < 0 || values[1] < 0)
      throw Failure("CUPTI returned no valid value for the DRAM metrics");
    m.ok = true;
    m.read = values[0];
    m.write = values[1];
  } catch (const std::exception& e) {
    // Leave the context as found (ignoring errors of the clean-up itself), so that the next
    // measurement or the next library call starts clean.
    if (pushed) {
      auto pop = CUPTI_PARAMS(CUpti_RangeProfiler_PopRange_Params);
      pop.pRangeProfilerObject = profiler;
      cuptiRangeProfilerPopRange(&pop);
    }
    if (started) {
      auto stop = CUPTI_PARAMS(CUpti_RangeProfiler_Stop_Params);
      stop.pRangeProfilerObject = profiler;
      cuptiRangeProfilerStop(&stop);
    }
    if (profiler) {
      auto disable = CUPTI_PARAMS(CUpti_RangeProfiler_Disable_Params);
      disable.pRangeProfilerObject = profiler;
      cuptiRangeProfilerDisable(&disable);
    }
    m = DramMeasurement{};
    m.reason = e.what();
  }
  return m;
}

}  // namespace flashattn::tools
