#include "server/session/link_calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_format.h"
#include "common/base/clock.h"
#include "glog/logging.h"
#include "server/base/log_text.h"
#include "server/copy/cuda/cuda_api.h"

namespace offloadd::session {
namespace {

using copy::Direction;

// Calibration copies are the daemon's chunks, but at least this large: smaller copies measure
// the host's cost per copy (the sim's modelled driver cost, a real driver's ~5 µs) more than
// the link, and pacing a link below what it moves loses throughput for good, while pacing it
// a little above loses only some control over the order of its chunks.
constexpr uint64_t kMinCopyBytes = 8ull << 20;

double UnixNowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Gbps(double bytes_per_second) {
  return bytes_per_second > 0 ? absl::StrFormat("%.2f GB/s", bytes_per_second / 1e9)
                              : std::string("not measured");
}

// A direction's configured capacity; a half-duplex link has one, for both.
bool Configured(const LinkSpec& spec, Direction d) {
  if (spec.half_duplex || d == Direction::kDeviceToHost) return spec.d2h_bytes_per_second > 0;
  return spec.h2d_bytes_per_second > 0;
}

std::string Paced(double rate, bool configured) {
  if (rate <= 0) return "unpaced";
  return absl::StrFormat("%s (%s)", Gbps(rate), configured ? "configured" : "measured");
}

}  // namespace

std::vector<copy::RateGroup> CalibrationGroups(const std::vector<LinkSpec>& links) {
  std::vector<copy::RateGroup> groups;
  for (const LinkSpec& spec : links) {
    if (spec.gpus.empty()) continue;
    if (Configured(spec, Direction::kDeviceToHost) && Configured(spec, Direction::kHostToDevice)) {
      continue;
    }
    groups.push_back({spec.name, spec.gpus});
  }
  return groups;
}

int AddLinksForUnlinkedGpus(const std::vector<std::string>& gpus, CoreOptions& options) {
  if (!options.link_calibration.at_start || options.default_link_bytes_per_second > 0) return 0;
  int added = 0;
  for (const std::string& gpu : gpus) {
    // In any spelling, as the LinkTable maps a session's GPU to its link.
    const std::string id = copy::NormalizeGpuUuid(gpu);
    const bool named = std::any_of(
        options.links.begin(), options.links.end(), [&](const LinkSpec& l) {
          return l.name == gpu || std::any_of(l.gpus.begin(), l.gpus.end(), [&](const auto& g) {
                   return copy::NormalizeGpuUuid(g) == id;
                 });
        });
    if (named) continue;
    LinkSpec spec;
    spec.name = gpu;
    spec.gpus = {gpu};
    options.links.push_back(std::move(spec));
    ++added;
  }
  return added;
}

LinkCalibrator::LinkCalibrator(const CoreOptions& options, LinkTable& links)
    : options_(options), links_(links) {}

CalibratedLink LinkCalibrator::Apply(const LinkSpec& spec, const copy::GroupRates& rates,
                                     double now_unix) {
  CalibratedLink c;
  c.name = spec.name;
  c.half_duplex = spec.half_duplex;
  for (size_t i = 0; i < rates.gpus.size(); ++i) {
    c.gpus.push_back({rates.gpus[i], rates.alone[i].of(Direction::kDeviceToHost),
                      rates.alone[i].of(Direction::kHostToDevice)});
  }
  c.d2h_bytes_per_second = rates.together.of(Direction::kDeviceToHost);
  c.h2d_bytes_per_second = rates.together.of(Direction::kHostToDevice);
  c.d2h_configured = Configured(spec, Direction::kDeviceToHost);
  c.h2d_configured = Configured(spec, Direction::kHostToDevice);
  c.measured_at_unix_seconds = now_unix;
  c.seconds = rates.seconds;
  const bool measured = rates.status.ok() && c.d2h_bytes_per_second > 0 &&
                        c.h2d_bytes_per_second > 0;
  if (!measured) {
    c.error = rates.status.ok() ? std::string("no figure came back")
                                : std::string(rates.status.message());
  } else if (spec.half_duplex) {
    links_.SetCalibratedCapacity(spec.name,
                                 std::min(c.d2h_bytes_per_second, c.h2d_bytes_per_second), 0);
  } else {
    links_.SetCalibratedCapacity(spec.name, c.d2h_configured ? 0 : c.d2h_bytes_per_second,
                                 c.h2d_configured ? 0 : c.h2d_bytes_per_second);
  }
  for (const LinkInfo& info : links_.DescribeLinks()) {
    if (info.name != spec.name) continue;
    c.paced_d2h_bytes_per_second = info.d2h_bytes_per_second;
    c.paced_h2d_bytes_per_second = info.half_duplex ? info.d2h_bytes_per_second
                                                    : info.h2d_bytes_per_second;
  }
  return c;
}

namespace {

void LogLink(const CalibratedLink& c) {
  for (const CalibratedGpu& g : c.gpus) {
    LOG(INFO) << "link calibration: link " << base::LogText(c.name) << ", GPU "
              << base::LogText(g.gpu) << " alone: d2h "
              << Gbps(g.d2h_bytes_per_second) << ", h2d " << Gbps(g.h2d_bytes_per_second);
  }
  const std::string paced =
      c.half_duplex ? "both directions " + Paced(c.paced_d2h_bytes_per_second, c.d2h_configured)
                    : "d2h " + Paced(c.paced_d2h_bytes_per_second, c.d2h_configured) +
                          ", h2d " + Paced(c.paced_h2d_bytes_per_second, c.h2d_configured);
  if (!c.error.empty()) {
    // Link names of GPUs no link names are device ids a client sent: escaped.
    LOG(WARNING) << "link calibration: link " << base::LogText(c.name) << " not measured ("
                 << base::LogText(c.error, 2048) << "); it keeps its capacity: " << paced
                 << ". Configure it (links { name: \"" << base::LogText(c.name)
                 << "\" d2h_bytes_per_second: ... h2d_bytes_per_second: ... }) or "
                 << "measure again with `offloadctl calibrate-links`";
    return;
  }
  LOG(INFO) << "link calibration: link " << base::LogText(c.name) << ", its " << c.gpus.size()
            << (c.gpus.size() == 1 ? " GPU" : " GPUs together") << ": d2h "
            << Gbps(c.d2h_bytes_per_second) << ", h2d " << Gbps(c.h2d_bytes_per_second)
            << " in " << absl::StrFormat("%.2f", c.seconds) << " s; paced at " << paced;
}

}  // namespace

absl::Status LinkCalibrator::Begin(double budget_seconds) {
  if (!(budget_seconds >= 0 && budget_seconds <= 600)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "budget_seconds %g is outside [0, 600]: give seconds, or 0 for the configured "
        "link_calibration_budget_seconds",
        budget_seconds));
  }
  if (options_.link_calibration.meter == nullptr) {
    return absl::FailedPreconditionError(
        "this backend has no copy hardware to measure (shm: its links are simulated, paced at "
        "the capacities in the config); link calibration needs backend cuda or cuda-sim");
  }
  base::MutexLock lock(mu_);
  if (running_) {
    return absl::AbortedError(
        "a link calibration is already running: wait for it (it ends within its budget)");
  }
  running_ = true;
  return absl::OkStatus();
}

void LinkCalibrator::MeasureInto(const std::vector<copy::RateGroup>& groups,
                                 LinkCalibrationReport& report) {
  copy::RateMeasurementOptions mo;
  mo.budget_seconds = report.budget_seconds;
  mo.copy_bytes = std::max<uint64_t>(kMinCopyBytes, options_.chunk_bytes);
  LOG(INFO) << "link calibration: measuring " << groups.size() << " link(s) within "
            << mo.budget_seconds << " s (" << mo.copy_bytes << "-byte copies)";
  const std::vector<copy::GroupRates> rates =
      options_.link_calibration.meter->Measure(groups, mo);
  for (size_t i = 0; i < groups.size() && i < rates.size(); ++i) {
    for (const LinkSpec& spec : options_.links) {
      if (spec.name != groups[i].name) continue;
      report.links.push_back(Apply(spec, rates[i], UnixNowSeconds()));
      LogLink(report.links.back());
      break;
    }
  }
}

absl::StatusOr<LinkCalibrationReport> LinkCalibrator::Calibrate(double budget_seconds) {
  if (absl::Status st = Begin(budget_seconds); !st.ok()) return st;
  LinkCalibrationReport report;
  report.started_at_unix_seconds = UnixNowSeconds();
  report.budget_seconds =
      budget_seconds > 0 ? budget_seconds : options_.link_calibration.budget_seconds;
  const double t0 = base::SteadyNowSeconds();
  const std::vector<copy::RateGroup> groups = CalibrationGroups(options_.links);
  if (groups.empty()) {
    report.note = "every link has a configured capacity in both directions, or no link names a "
                  "GPU: nothing to measure";
    LOG(INFO) << "link calibration: " << report.note;
  } else {
    MeasureInto(groups, report);
  }
  report.seconds = base::SteadyNowSeconds() - t0;
  base::MutexLock lock(mu_);
  for (const CalibratedLink& c : report.links) {
    if (c.error.empty()) in_effect_[c.name] = c;
  }
  last_ = report;
  running_ = false;
  return report;
}

LinkCalibrationReport LinkCalibrator::last() const {
  base::MutexLock lock(mu_);
  return last_;
}

std::vector<CalibratedLink> LinkCalibrator::in_effect() const {
  base::MutexLock lock(mu_);
  std::vector<CalibratedLink> out;
  for (const auto& [name, c] : in_effect_) out.push_back(c);
  return out;
}

}  // namespace offloadd::session
