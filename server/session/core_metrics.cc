#include "server/session/core_metrics.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "server/metrics/metrics.h"
#include "server/session/core.h"

namespace offloadd::session {
namespace {

namespace state = metrics::state;
using prometheus::Labels;
using prometheus::MetricFamily;

// The families of one scrape by spec, filled in any order, emitted in first-use order.
class Families {
 public:
  void Add(const metrics::StateFamily& spec, const Labels& labels, double value) {
    auto [it, added] = index_.emplace(spec.name, families_.size());
    if (added) families_.push_back(metrics::NewFamily(spec));
    metrics::AddSample(families_[it->second], labels, value);
  }
  // A counter's series appears once it has counted something.
  void AddIfCounted(const metrics::StateFamily& spec, const Labels& labels, double value) {
    if (value > 0) Add(spec, labels, value);
  }
  std::vector<MetricFamily> Take() { return std::move(families_); }

 private:
  std::map<std::string, size_t> index_;
  std::vector<MetricFamily> families_;
};

double D(uint64_t v) { return static_cast<double>(v); }

void AddPool(const store::StoreStats& s, const PoolFacts& pool, Families& f) {
  const Labels numa{{"numa_node", metrics::NumaNodeLabel(pool.numa_node)}};
  f.Add(state::kPoolCapacityBytes, numa, D(pool.capacity_bytes));
  f.Add(state::kPoolUsedBytes, numa, D(s.pool.used_bytes));
  f.Add(state::kPoolPeakUsedBytes, numa, D(s.pool.peak_used_bytes));
  f.Add(state::kPoolPinnedBytes, numa, D(pool.pinned_bytes));
  for (const auto& [gpu, counts] : pool.handles) {
    f.Add(state::kIpcHandlesOpen, {{"gpu", gpu}}, D(counts.open));
    f.Add(state::kIpcHandleOpensTotal, {{"gpu", gpu}}, D(counts.opens_total));
  }
  f.Add(state::kPoolBlocks, {}, D(s.blocks));
  f.Add(state::kOffloadsWaiting, {}, D(s.offloads_waiting));
  f.Add(state::kOffloadsRefusedTotal, {}, D(s.offloads_refused_total));
  f.Add(state::kAdoptedBlocksWaiting, {}, D(s.adopted_blocks_waiting));
  f.Add(state::kAdoptedBlocksExpiredTotal, {}, D(s.adopted_blocks_expired_total));
  f.Add(state::kSessionsResumedTotal, {}, D(s.sessions_resumed_total));
}

// Present (at 0) without a spill tier.
void AddSpill(const CoreStats& stats, Families& f) {
  const store::StoreStats& s = stats.store;
  f.Add(state::kTierBytes, {{"tier", "pool"}}, D(s.pool.used_bytes));
  f.Add(state::kTierBytes, {{"tier", "disk"}}, D(s.disk_bytes));
  f.Add(state::kSpillCapacityBytes, {}, stats.spill_enabled ? D(stats.spill.capacity_bytes) : 0);
  f.Add(state::kSpillBytesTotal, {{"direction", "spill"}},
        stats.spill_enabled ? D(stats.spill.spill_bytes_total) : 0);
  f.Add(state::kSpillBytesTotal, {{"direction", "stage"}},
        stats.spill_enabled ? D(stats.spill.stage_bytes_total) : 0);
  f.Add(state::kReloadsFromDiskTotal, {}, D(s.reloads_from_disk_total));
  f.Add(state::kReloadDiskWaitSecondsTotal, {}, s.reload_disk_wait_seconds_total);
  f.Add(state::kSpillFailuresTotal, {{"cause", "write_error"}}, D(s.spill_failures_total));
  f.Add(state::kSpillFailuresTotal, {{"cause", "disk_full"}},
        D(s.spill_refused_disk_full_total));
  f.Add(state::kSpillBlocksLostTotal, {}, D(s.blocks_lost_total));
  f.Add(state::kStagesPromotedTotal, {}, D(s.stages_promoted_total));
  f.Add(state::kStagesExpiredTotal, {}, D(s.stages_expired_total));
  f.Add(state::kStagesWaitingForPool, {}, D(s.stages_waiting));
}

// Present (fallbacks at 0) from the start, sliced pool or not.
void AddNumaPlacement(const store::StoreStats& s, Families& f) {
  f.Add(state::kPoolNumaFallbackTotal, {{"reason", "slice_full"}}, D(s.placement.slice_full));
  f.Add(state::kPoolNumaFallbackTotal, {{"reason", "unknown_node"}},
        D(s.placement.unknown_node));
  f.Add(state::kPoolNumaFallbackTotal, {{"reason", "no_slice"}}, D(s.placement.no_slice));
  for (const store::NumaSliceUsage& slice : s.numa_slices) {
    const Labels numa{{"numa_node", metrics::NumaNodeLabel(slice.numa_node)}};
    f.Add(state::kPoolNumaSliceCapacityBytes, numa, D(slice.capacity_bytes));
    f.Add(state::kPoolNumaSliceUsedBytes, numa, D(slice.used_bytes));
  }
}

void AddLink(const LinkInfo& link, Families& f) {
  std::map<std::string, double> misses;  // by gpu, over the link's directions
  for (int d = 0; d < (link.half_duplex ? 1 : 2); ++d) {
    const char* dir = link.half_duplex ? "both" : d == 0 ? "d2h" : "h2d";
    const sched::LinkSchedulerStats& now = d == 0 ? link.d2h : link.h2d;
    const Labels labels{{"link", link.name}, {"direction", dir}};
    f.Add(state::kLinkCapacityBytesPerSecond, labels,
          d == 0 ? link.d2h_bytes_per_second : link.h2d_bytes_per_second);
    f.AddIfCounted(state::kLinkBusySecondsTotal, labels, now.busy_seconds);
    f.AddIfCounted(state::kLinkBytesTotal, labels, D(now.bytes));
    for (const auto& [gpu, bytes] : now.gpu_bytes) {
      f.AddIfCounted(state::kLinkGpuBytesTotal,
                     {{"link", link.name}, {"direction", dir}, {"gpu", gpu}}, D(bytes));
      // Present (at 0) for every GPU that used the link, so rates and alerts have a series.
      auto miss = now.gpu_deadline_misses.find(gpu);
      misses[gpu] += miss == now.gpu_deadline_misses.end() ? 0 : D(miss->second);
    }
    f.Add(state::kLinkQueuedTransfers, labels, D(now.queued_transfers));
    f.Add(state::kLinkChunksInFlight, labels, D(now.chunks_in_flight));
  }
  for (const auto& [gpu, count] : misses) {
    f.Add(state::kReloadDeadlineMissesTotal, {{"gpu", gpu}, {"link", link.name}}, count);
  }
}

void AddCalibration(const CalibratedLink& c, Families& f) {
  const char* dirs[2] = {"d2h", "h2d"};
  const double together[2] = {c.d2h_bytes_per_second, c.h2d_bytes_per_second};
  for (int d = 0; d < 2; ++d) {
    f.Add(state::kLinkCalibratedBytesPerSecond, {{"link", c.name}, {"direction", dirs[d]}},
          together[d]);
    for (const CalibratedGpu& g : c.gpus) {
      f.Add(state::kGpuCalibratedBytesPerSecond,
            {{"link", c.name}, {"gpu", g.gpu}, {"direction", dirs[d]}},
            d == 0 ? g.d2h_bytes_per_second : g.h2d_bytes_per_second);
    }
  }
  f.Add(state::kLinkCalibrationTimestampSeconds, {{"link", c.name}}, c.measured_at_unix_seconds);
}

void AddHostLink(const HostLinkInfo& host, Families& f) {
  for (int d = 0; d < 2; ++d) {
    const double capacity = d == 0 ? host.d2h_bytes_per_second : host.h2d_bytes_per_second;
    if (capacity <= 0) continue;
    const sched::HostLinkStats& now = d == 0 ? host.d2h : host.h2d;
    const Labels labels{{"link", host.name}, {"direction", d == 0 ? "d2h" : "h2d"}};
    f.Add(state::kHostLinkCapacityBytesPerSecond, labels, capacity);
    f.AddIfCounted(state::kHostLinkBusySecondsTotal, labels, now.busy_seconds);
    f.AddIfCounted(state::kHostLinkBytesTotal, labels, D(now.bytes));
  }
}

// Every (GPU, uid) a client reported on; every (GPU, uid) of an open session at 0 before its
// first report, so rates and alerts have a series from the start.
void AddClientReports(const CoreStats& stats, Families& f) {
  for (const auto& [series, c] : stats.client_reports_by_series) {
    const Labels labels{{"gpu", series.gpu}, {"uid", series.uid}};
    f.Add(state::kClientFallbacksTotal, labels, D(c.fallbacks_total));
    f.Add(state::kClientHostWaitsTotal, labels, D(c.host_waits_total));
    f.Add(state::kClientHostWaitSecondsTotal, labels, c.host_wait_seconds_total);
    f.Add(state::kClientIdleStepsTotal, labels, D(c.idle_steps_total));
  }
  std::set<ReportSeries> unreported;
  for (const SessionInfo& s : stats.sessions) {
    ReportSeries series{s.device_id, s.peer_known ? std::to_string(s.uid) : kUnknownUid};
    if (stats.client_reports_by_series.count(series) == 0) unreported.insert(std::move(series));
  }
  for (const ReportSeries& series : unreported) {
    const Labels labels{{"gpu", series.gpu}, {"uid", series.uid}};
    f.Add(state::kClientFallbacksTotal, labels, 0);
    f.Add(state::kClientHostWaitsTotal, labels, 0);
    f.Add(state::kClientHostWaitSecondsTotal, labels, 0);
    f.Add(state::kClientIdleStepsTotal, labels, 0);
  }
}

}  // namespace

std::vector<prometheus::MetricFamily> StateFamilies(const CoreStats& stats,
                                                    const PoolFacts& pool) {
  Families f;
  AddPool(stats.store, pool, f);
  AddSpill(stats, f);
  AddNumaPlacement(stats.store, f);
  for (const LinkInfo& link : stats.links) AddLink(link, f);
  for (const CalibratedLink& c : stats.calibrated_links) AddCalibration(c, f);
  for (const HostLinkInfo& host : stats.host_links) AddHostLink(host, f);
  AddClientReports(stats, f);
  return f.Take();
}

std::vector<prometheus::MetricFamily> CoreMetrics::Collect() const {
  base::MutexLock lock(mu_);
  if (core_ == nullptr) return {};
  const pool::Arena& arena = core_->arena();
  PoolFacts pool;
  pool.numa_node = arena.numa_node();
  pool.capacity_bytes = core_->store().capacity_bytes();
  pool.pinned_bytes =
      std::max<uint64_t>(core_->engine().pinned_bytes(), arena.locked() ? arena.size_bytes() : 0);
  pool.handles = core_->engine().handle_counts();
  return StateFamilies(core_->Stats(), pool);
}

void CoreMetrics::Detach() {
  base::MutexLock lock(mu_);
  core_ = nullptr;
}

}  // namespace offloadd::session
