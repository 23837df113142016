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
      " within one session; report cumulative totals since the session began"));
}

// Sums of many sessions' reports stay at the largest value instead of wrapping (a counter that
// went down reads as a reset to Prometheus) or reaching +Inf (rate() is then NaN for good).
uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max()
                                                      : a + b;
}
double SaturatingAdd(double a, double b) { return std::min(a + b, kMaxReportedSeconds); }

// The bounds of a report of a session `age_seconds` old (client_reports.h).
absl::Status CheckAgainstSessionAge(const ClientCounters& now, double age_seconds) {
  const double seconds = std::max(0.0, age_seconds) + kReportSlackSeconds;
  if (now.host_wait_seconds_total > seconds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client report: host_wait_seconds_total is ", now.host_wait_seconds_total,
        " but this session began ", age_seconds,
        " s ago; report the seconds the training thread waited since the session began"));
  }
  const double max_events = seconds * kMaxClientEventsPerSecond;
  const std::pair<const char*, uint64_t> counts[] = {{"fallbacks_total", now.fallbacks_total},
                                                     {"host_waits_total", now.host_waits_total},
                                                     {"idle_steps_total", now.idle_steps_total}};
  for (const auto& [name, count] : counts) {
    if (static_cast<double>(count) > max_events) {
      return absl::InvalidArgumentError(absl::StrCat(
          "client report: ", name, " is ", count, ", more than ", kMaxClientEventsPerSecond,
          " a second since this session began ", age_seconds,
          " s ago; report counts since the session began"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ClientCounters> ReportIncrease(const ClientCounters& previous,
                                              const ClientCounters& now,
                                              double session_age_seconds) {
  // Near DBL_MAX the exposition's 16 digits round past it: Prometheus then fails the scrape.
  if (!std::isfinite(now.host_wait_seconds_total) || now.host_wait_seconds_total < 0 ||
      now.host_wait_seconds_total > kMaxReportedSeconds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client report: host_wait_seconds_total is ", now.host_wait_seconds_total,
        "; send the seconds the training thread waited, a finite number >= 0 and <= ",
        kMaxReportedSeconds));
  }
  if (absl::Status st = CheckAgainstSessionAge(now, session_age_seconds); !st.ok()) return st;
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

namespace {

void AddInto(ClientCounters& sum, const ClientCounters& increase) {
  sum.fallbacks_total = SaturatingAdd(sum.fallbacks_total, increase.fallbacks_total);
  sum.host_waits_total = SaturatingAdd(sum.host_waits_total, increase.host_waits_total);
  sum.host_wait_seconds_total =
      SaturatingAdd(sum.host_wait_seconds_total, increase.host_wait_seconds_total);
  sum.idle_steps_total = SaturatingAdd(sum.idle_steps_total, increase.idle_steps_total);
}

}  // namespace

void ClientReports::Add(const ReportSeries& series, const ClientCounters& increase,
                        ReportBounds bounds) {
  if (increase.fallbacks_total == 0 && increase.host_waits_total == 0 &&
      increase.host_wait_seconds_total == 0 && increase.idle_steps_total == 0) {
    return;  // no series for a GPU on which nothing was reported
  }
  base::MutexLock lock(mu_);
  ReportSeries into = series;
  if (by_series_.count(series) == 0) {
    size_t& uids = series_per_uid_[series.uid];
    if (bounds.max_per_uid > 0 && uids >= bounds.max_per_uid) {
      into = {kOtherGpus, series.uid};
    } else if (bounds.max_series > 0 && by_series_.size() >= bounds.max_series) {
      into = {kOtherGpus, kOtherGpus};
    } else {
      ++uids;
    }
  }
  AddInto(by_series_[into], increase);
}

std::map<ReportSeries, ClientCounters> ClientReports::BySeries() const {
  base::MutexLock lock(mu_);
  return by_series_;
}

std::map<std::string, ClientCounters> ClientReports::ByGpu() const {
  base::MutexLock lock(mu_);
  std::map<std::string, ClientCounters> by_gpu;
  for (const auto& [series, sum] : by_series_) AddInto(by_gpu[series.gpu], sum);
  return by_gpu;
}

}  // namespace offloadd::session
