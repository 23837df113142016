// LinkCalibrator: link capacities measured at start-up and on demand (docs/link-calibration.md),
// so the link scheduler can share a PCIe switch's uplink among its GPUs without
// an operator measuring and typing the figures.
//
// Which links: every link of CoreOptions::links (configured, discovered from sysfs, or the
// cuda-sim backend's simulated switches) with at least one GPU and a direction whose configured
// capacity is 0 (a half-duplex link: its one capacity, d2h_bytes_per_second). A GPU in no link
// gets a link of its own (AddLinksForUnlinkedGpus, at start-up on the cuda backend; on cuda-sim
// it keeps the unpaced default link of its own): measured like the others
// where no default_link_bytes_per_second is configured, else paced at that default.
//
// What: the backend's copy::CopyRateMeter (copy/timing/copy_rate_meter.h; the cuda
// backend's is copy/cuda/cuda_rate_meter.h) times each of the link's
// GPUs alone and then all of them together, per direction, within a budget; the link is paced
// at what its GPUs moved together (LinkTable::SetCalibratedCapacity) in each direction without
// a configured capacity — a configured capacity always wins. A half-duplex link is paced at the
// lower of the two directions. A link whose measurement failed keeps the capacity it had (a
// previous measurement's, or none), and its error is reported.
//
// Logged: a line per GPU (alone) and per link (together, and what it is now paced at), a
// warning per link left unmeasured. Kept: the last run's report (GetStats, `offloadctl
// calibrate-links`) and, per link, its latest successful measurement (the metrics
// offloadd_link_calibrated_bytes_per_second, offloadd_gpu_calibrated_bytes_per_second and
// offloadd_link_calibration_timestamp_seconds). Thread-safe; one run at a time.
#ifndef OFFLOADD_SERVER_SESSION_LINK_CALIBRATION_H_
#define OFFLOADD_SERVER_SESSION_LINK_CALIBRATION_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "server/copy/timing/copy_rate_meter.h"
#include "server/session/core_options.h"
#include "server/session/core_stats.h"
#include "server/session/link_table.h"

namespace offloadd::session {

// The links `links` asks to measure (see above), as the meter's groups, in order.
std::vector<copy::RateGroup> CalibrationGroups(const std::vector<LinkSpec>& links);

// Gives each of `gpus` (UUIDs, as the engine lists them) that no link of `options` names (in
// any spelling of its UUID, as LinkTable::LinkNameFor matches a session's device id) a
// link of its own, named after it and without a capacity, so that calibration measures it: a
// single GPU on a node, or GPUs sysfs placed under no switch (a VM's flat PCI bus), would
// otherwise stay unpaced. Only with start-up calibration on and no
// default_link_bytes_per_second (a configured default is a capacity). Returns how many it added.
int AddLinksForUnlinkedGpus(const std::vector<std::string>& gpus, CoreOptions& options);

class LinkCalibrator {
 public:
  // `options` and `links` must outlive the calibrator.
  LinkCalibrator(const CoreOptions& options, LinkTable& links);

  // Measures and applies (see above) within `budget_seconds` (0 = options'); blocks for about
  // that long. The report lists every link tried, each with its figures or its error.
  // Errors: FAILED_PRECONDITION when there is no meter (the shm backend: its links are
  // simulated, configure their capacities); ABORTED while another calibration runs;
  // INVALID_ARGUMENT for a budget outside [0, 600] seconds.
  absl::StatusOr<LinkCalibrationReport> Calibrate(double budget_seconds) EXCLUDES(mu_);

  LinkCalibrationReport last() const EXCLUDES(mu_);
  // Per link that has ever been measured, its latest successful measurement.
  std::vector<CalibratedLink> in_effect() const EXCLUDES(mu_);

 private:
  // Checks the call and marks a run as started (running_).
  absl::Status Begin(double budget_seconds) EXCLUDES(mu_);
  // Measures `groups` within report.budget_seconds and applies each link's figures.
  void MeasureInto(const std::vector<copy::RateGroup>& groups, LinkCalibrationReport& report);
  // One link's figures from the meter, applied to the link table.
  CalibratedLink Apply(const LinkSpec& spec, const copy::GroupRates& rates, double now_unix);

  const CoreOptions& options_;
  LinkTable& links_;
  mutable base::Mutex mu_;
  bool running_ GUARDED_BY(mu_) = false;
  LinkCalibrationReport last_ GUARDED_BY(mu_);
  std::map<std::string, CalibratedLink> in_effect_ GUARDED_BY(mu_);  // by link name
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_LINK_CALIBRATION_H_
