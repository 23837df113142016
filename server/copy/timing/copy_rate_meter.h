// CopyRateMeter: the interface the session layer calibrates links through
// (session/link_calibration.h), and the figures it returns. The cuda backend's meter, and how it
// measures, is in cuda/cuda_rate_meter.h; tests give the session layer a fake one.
#ifndef OFFLOADD_SERVER_COPY_TIMING_COPY_RATE_METER_H_
#define OFFLOADD_SERVER_COPY_TIMING_COPY_RATE_METER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/copy/copy_engine.h"

namespace offloadd::copy {

// Bytes per second by Direction (index: kDeviceToHost, kHostToDevice); 0 = not measured.
struct CopyRates {
  double bytes_per_second[2] = {0, 0};
  double of(Direction d) const { return bytes_per_second[static_cast<int>(d)]; }
};

// GPUs (device ids, as RegionSpec::device_id) measured alone and together under one name.
struct RateGroup {
  std::string name;
  std::vector<std::string> gpus;
};

struct RateMeasurementOptions {
  double budget_seconds = 5;         // all groups, device set-up included; > 0
  double max_window_seconds = 0.1;   // per measurement
  double min_window_seconds = 0.01;  // a shorter one is not run
  uint64_t copy_bytes = 8ull << 20;  // per copy; >= 4096
  double queue_seconds = 0.05;       // copy work kept queued ahead (cuda/cuda_rate_meter.h)
};

struct GroupRates {
  std::string name;
  std::vector<std::string> gpus;
  std::vector<CopyRates> alone;  // per GPU, in `gpus` order
  CopyRates together;            // all at once; for one GPU, its alone figures
  // OK, or the first error (the figures measured before it are kept): the device's (e.g.
  // cudaMalloc's, naming the GPU), DEADLINE_EXCEEDED when the budget ran out before it.
  absl::Status status;
  double seconds = 0;  // wall time the group took
};

class CopyRateMeter {
 public:
  virtual ~CopyRateMeter() = default;
  // Measures `groups` in order (cuda/cuda_rate_meter.h: each GPU alone, then all together, per
  // direction); one GroupRates per group, in order. Blocks for at most about
  // options.budget_seconds. Not thread-safe: one Measure at a time (the caller serialises).
  virtual std::vector<GroupRates> Measure(const std::vector<RateGroup>& groups,
                                          const RateMeasurementOptions& options) = 0;
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_TIMING_COPY_RATE_METER_H_
