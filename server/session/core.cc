#include "server/session/core.h"

#include "common/base/clock.h"
#include "glog/logging.h"
#include "server/metrics/metrics.h"
#include "server/session/core_metrics.h"
#include "server/session/ops.h"
#include "server/session/session.h"

namespace offloadd::session {
namespace {
// `options` with the clock defaulted to the steady clock and handed to the store.
CoreOptions WithClock(CoreOptions options) {
  if (options.clock == nullptr) options.clock = base::Clock::Real();
  if (options.store.clock == nullptr) options.store.clock = options.clock;
  return options;
}
}  // namespace

Core::Core(CoreOptions options, std::unique_ptr<pool::Arena> arena,
           std::unique_ptr<copy::CopyEngine> engine, std::unique_ptr<spill::SpillTier> spill)
    : options_(WithClock(std::move(options))),
      arena_(std::move(arena)),
      engine_(std::move(engine)),
      spill_(std::move(spill)),
      store_(arena_->slices(), options_.store, arena_->block_table(), spill_.get()),
      start_seconds_(options_.clock->NowSeconds()),
      gate_(options_.clock),
      sessions_(options_),
      links_(options_, gate_),
      calibrator_(options_, links_),
      metrics_(std::make_shared<CoreMetrics>(this)) {
  // Every drop reason has a series (at 0 without a shared pool), so rates and alerts have one.
  for (int r = 0; r < pool::kNumDropReasons; ++r) {
    metrics::Get().adoption_dropped_blocks_total->Add(
        {{"reason", pool::DropReasonName(static_cast<pool::DropReason>(r))}});
  }
  if (arena_->block_table() != nullptr && arena_->adopted()) Adopt();
  // After adoption: spill files no adopted record names are a previous daemon's leftovers.
  store_.RemoveUnnamedSpillFiles();
}

void Core::Adopt() {
  const double start_seconds = base::SteadyNowSeconds();
  adoption_ = arena_->block_table()->Adopt(options_.pool_data_checksums ? arena_->base() : nullptr);
  if (options_.pool_data_checksums) {
    LOG(INFO) << "checked the data of " << adoption_.data_verified_blocks << " adopted blocks in "
              << base::SteadyNowSeconds() - start_seconds << " s ("
              << adoption_.dropped[static_cast<int>(pool::DropReason::kData)]
              << " changed, dropped; " << adoption_.data_unchecked_blocks
              << " stored without a data checksum, adopted unchecked)";
  }
  const uint64_t adopted = store_.Adopt(adoption_.blocks, options_.resume_grace_seconds);
  store_.MarkLost(adoption_.dropped_blocks);
  auto& m = metrics::Get();
  m.adopted_blocks_total->Increment(static_cast<double>(adopted));
  for (int r = 0; r < pool::kNumDropReasons; ++r) {
    m.adoption_dropped_blocks_total
        ->Add({{"reason", pool::DropReasonName(static_cast<pool::DropReason>(r))}})
        .Increment(static_cast<double>(adoption_.dropped[r]));
  }
  // Records that passed the table's checks but whose extent or id the store could not take.
  const uint64_t unplaced = adoption_.blocks.size() - adopted;
  if (unplaced > 0) {
    m.adoption_dropped_blocks_total->Add({{"reason", "extent"}})
        .Increment(static_cast<double>(unplaced));
  }
  LOG(INFO) << "adopted " << adopted << " blocks from the previous daemon's pool ("
            << adoption_.dropped_total() << " records dropped at the check, " << unplaced
            << " not placed); they wait " << options_.resume_grace_seconds
            << " s for their sessions to resume";
}

Core::~Core() {
  metrics_->Detach();  // waits for a scrape reading this Core
  sessions_.Stop();    // no EndSession from the registry's threads past this point
  Drain();
  // Destroy the schedulers (and the transfers they still reference, whose callbacks may hold
  // the last reference to a Session) while the session registry they call back into exists.
  links_.Clear();
}

std::shared_ptr<prometheus::Collectable> Core::collectable() const { return metrics_; }

int Core::GpuNumaNode(const std::string& gpu) const {
  auto it = options_.gpu_numa_nodes.find(gpu);
  return it == options_.gpu_numa_nodes.end() ? -1 : it->second;
}

void Core::ReleaseLink(const std::string& gpu, bool remove_if_unused) {
  if (!links_.Release(gpu, remove_if_unused)) return;
  ForgetTransferSeries(gpu);
  engine_->ForgetDevice(gpu);
}

void Core::CountTransfer(bool offload, uint64_t bytes, bool ok) {
  if (!ok) {
    errors_total_.fetch_add(1);
    return;
  }
  if (offload) {
    offloads_total_.fetch_add(1);
    offload_bytes_total_.fetch_add(bytes);
  } else {
    reloads_total_.fetch_add(1);
    reload_bytes_total_.fetch_add(bytes);
  }
}

void Core::StopAccepting() {
  gate_.StopAccepting();
  // Offloads still waiting for pool space fail now (UNAVAILABLE) rather than holding shutdown
  // for up to the admission deadline; this also ends the store's deadline thread, so no store
  // callback runs after Drain.
  store_.Stop();
}

void Core::Drain() {
  StopAccepting();
  gate_.WaitIdle();
  links_.Shutdown();
}

absl::StatusOr<LinkCalibrationReport> Core::CalibrateLinks(double budget_seconds) {
  if (!gate_.Begin()) {
    return absl::UnavailableError("offloadd is shutting down: no link calibration now");
  }
  absl::StatusOr<LinkCalibrationReport> report = calibrator_.Calibrate(budget_seconds);
  gate_.End();
  return report;
}

CoreStats Core::Stats() {
  CoreStats s;
  s.backend = options_.backend_label.empty() ? engine_->name() : options_.backend_label;
  s.store = store_.stats();
  if (spill_ != nullptr) {
    s.spill_enabled = true;
    s.spill = spill_->stats();
  }
  s.offload_bytes_total = offload_bytes_total_.load();
  s.reload_bytes_total = reload_bytes_total_.load();
  s.offloads_total = offloads_total_.load();
  s.reloads_total = reloads_total_.load();
  s.errors_total = errors_total_.load();
  s.uptime_seconds = options_.clock->NowSeconds() - start_seconds_;
  s.chunk_bytes = options_.chunk_bytes;
  s.links = links_.DescribeLinks();
  s.host_links = links_.DescribeHostLinks();
  for (auto& p : sessions_.Live()) {
    SessionInfo info = p->info();
    if (!info.device_id.empty()) s.sessions.push_back(std::move(info));
  }
  s.sessions_open = s.sessions.size();
  s.session_quota_bytes = options_.store.session_quota_bytes;
  s.uid_quota_bytes = options_.store.uid_quota_bytes;
  s.uid_used_bytes = store_.UidUsedBytes();
  s.link_calibration = calibrator_.last();
  s.calibrated_links = calibrator_.in_effect();
  s.client_reports_by_gpu = client_reports_.ByGpu();
  s.client_reports_by_series = client_reports_.BySeries();
  return s;
}

}  // namespace offloadd::session
