// Clients' reports of what they did without the daemon (ClientReport, proto/offload.proto):
// fallbacks, host waits and idle steps. Each session keeps its client's latest cumulative report
// (Session::info, `offloadctl sessions`); the Core sums every session's increases by device id
// over the daemon's lifetime (the offloadd_client_* counters, core_metrics.cc), so a client that
// fell back stays counted after its session ended.
#ifndef OFFLOADD_SERVER_SESSION_CLIENT_REPORTS_H_
#define OFFLOADD_SERVER_SESSION_CLIENT_REPORTS_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "server/session/request.h"

namespace offloadd::session {

// The most host-wait seconds a report may carry and a sum may reach (about 31,700 years).
inline constexpr double kMaxReportedSeconds = 1e12;

// A session's report is bounded by the session's age (seconds since its Hello): its
// host_wait_seconds_total by the age plus kReportSlackSeconds (the session's training thread
// cannot have waited longer), each count by kMaxClientEventsPerSecond per second of the same.
// So no session can claim more than its share of real time: the per-GPU sums cannot be
// saturated (1e12 seconds, 2^64 counts) by reports, from one session or from many.
inline constexpr double kReportSlackSeconds = 1.0;
inline constexpr double kMaxClientEventsPerSecond = 1e6;

// How much `now` (a session's new report) adds to `previous` (its last one; zero before one),
// for a session `session_age_seconds` old. INVALID_ARGUMENT, saying which count, when a count
// went down (the totals are cumulative since the session began), host_wait_seconds_total is
// negative or not finite, or a value is beyond the bound of a session of that age (above).
absl::StatusOr<ClientCounters> ReportIncrease(const ClientCounters& previous,
                                              const ClientCounters& now,
                                              double session_age_seconds);

// One series of reported increases: the device id a session named in Hello and the uid the
// session runs as (its peer credentials; kUnknownUid when the daemon could not read them). A
// device id is the client's word, so the uid keeps each user's reports apart: a session of one
// uid naming another user's GPU adds to a series of its own uid, never to that user's.
inline constexpr char kUnknownUid[] = "unknown";
struct ReportSeries {
  std::string gpu;  // device id
  std::string uid;  // decimal uid, or kUnknownUid
  bool operator<(const ReportSeries& o) const {
    return gpu != o.gpu ? gpu < o.gpu : uid < o.uid;
  }
  bool operator==(const ReportSeries& o) const { return gpu == o.gpu && uid == o.uid; }
};

// Increases summed by (device id, uid). Thread-safe. The pairs keep their own sums (they
// outlive the sessions and links that named them) within two bounds (0: none): each uid has at
// most `max_per_uid` pairs, its further device ids summed under {kOtherGpus, uid}, so one user
// naming many device ids uses up only its own share; and at most `max_series` pairs in all,
// further ones summed under {kOtherGpus, kOtherGpus}.
inline constexpr char kOtherGpus[] = "other";
struct ReportBounds {
  size_t max_per_uid = 0;
  size_t max_series = 0;
};
class ClientReports {
 public:
  void Add(const ReportSeries& series, const ClientCounters& increase, ReportBounds bounds = {})
      EXCLUDES(mu_);
  std::map<ReportSeries, ClientCounters> BySeries() const EXCLUDES(mu_);
  // The same sums added up over uids (saturating), by device id.
  std::map<std::string, ClientCounters> ByGpu() const EXCLUDES(mu_);

 private:
  mutable base::Mutex mu_;
  std::map<ReportSeries, ClientCounters> by_series_ GUARDED_BY(mu_);
  std::map<std::string, size_t> series_per_uid_ GUARDED_BY(mu_);  // kOtherGpus ones not counted
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_CLIENT_REPORTS_H_
