#include "server/session/client_reports.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace offloadd::session {
namespace {

absl::Status WentDown(const char* what, double before, double now) {
  return absl::InvalidArgumentError(absl::StrCat(
      "client report: ", what, " went down from ", before, " to ", now,
      " within one session; report cumulative totals since the client process started"));
}

// Sums of many sessions' reports stay at the largest value instead of wrapping (a counter that
// went down reads as a reset to Prometheus) or reaching +Inf (rate() is then NaN for good).
uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max()
                                                      : a + b;
}
double SaturatingAdd(double a, double b) { return std::min(a + b, kMaxReportedSeconds); }

}  // namespace

absl::StatusOr<ClientCounters> ReportIncrease(const ClientCounters& previous,
                                              const ClientCounters& now) {
  // Near DBL_MAX the exposition's 16 digits round past it: Prometheus then fails the scrape.
  if (!std::isfinite(now.host_wait_seconds_total) || now.host_wait_seconds_total < 0 ||
      now.host_wait_seconds_total > kMaxReportedSeconds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client report: host_wait_seconds_total is ", now.host_wait_seconds_total,
        "; send the seconds the training thread waited, a finite number >= 0 and <= ",
        kMaxReportedSeconds));
  }
  if (now.fallbacks_total < previous.fallbacks_total) {
    return WentDown("fallbacks_total", previous.fallbacks_total, now.fallbacks_total);
  }
  if (now.host_waits_total < previous.host_waits_total) {
    return WentDown("host_waits_total", previous.host_waits_total, now.host_waits_total);
  }
  if (now.host_wait_seconds_total < previous.host_wait_seconds_total) {
    return WentDown("host_wait_seconds_total", previous.host_wait_seconds_total,
                    now.host_wait_seconds_total);
  }
  if (now.idle_steps_total < previous.idle_steps_total) {
    return WentDown("idle_steps_total", previous.idle_steps_total, now.idle_steps_total);
  }
  ClientCounters inc;
  inc.fallbacks_total = now.fallbacks_total - previous.fallbacks_total;
  inc.host_waits_total = now.host_waits_total - previous.host_waits_total;
  inc.host_wait_seconds_total = now.host_wait_seconds_total - previous.host_wait_seconds_total;
  inc.idle_steps_total = now.idle_steps_total - previous.idle_steps_total;
  return inc;
}

void ClientReports::Add(const std::string& device_id, const ClientCounters& increase,
                        size_t max_gpus) {
  if (increase.fallbacks_total == 0 && increase.host_waits_total == 0 &&
      increase.host_wait_seconds_total == 0 && increase.idle_steps_total == 0) {
    return;  // no series for a GPU on which nothing was reported
  }
  base::MutexLock lock(mu_);
  const bool full = max_gpus > 0 && by_gpu_.size() >= max_gpus && by_gpu_.count(device_id) == 0;
  ClientCounters& sum = by_gpu_[full ? std::string(kOtherGpus) : device_id];
  sum.fallbacks_total = SaturatingAdd(sum.fallbacks_total, increase.fallbacks_total);
  sum.host_waits_total = SaturatingAdd(sum.host_waits_total, increase.host_waits_total);
  sum.host_wait_seconds_total =
      SaturatingAdd(sum.host_wait_seconds_total, increase.host_wait_seconds_total);
  sum.idle_steps_total = SaturatingAdd(sum.idle_steps_total, increase.idle_steps_total);
}

std::map<std::string, ClientCounters> ClientReports::ByGpu() const {
  base::MutexLock lock(mu_);
  return by_gpu_;
}

}  // namespace offloadd::session
