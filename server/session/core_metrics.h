// CoreMetrics: the metric families read from a Core's state when Prometheus scrapes, rather
// than copied into the registry on a timer: pool, client handles, store admission, restart
// survival, spill tier, links and host links (metrics::state in metrics/metrics.h names them).
// A scrape right after a transfer shows it. main registers it with the exposer
// (metrics::Exposer::Register(core.collectable())).
//
// Series follow the stats: a link's counters appear once they are non-zero, its gauges and
// every other family's series from the Core's start; a removed link's series go with it.
#ifndef OFFLOADD_SERVER_SESSION_CORE_METRICS_H_
#define OFFLOADD_SERVER_SESSION_CORE_METRICS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/copy/copy_engine.h"
#include "server/session/core_stats.h"

namespace offloadd::session {

class Core;

// What the families need besides CoreStats: facts of the pool's arena and the copy engine.
struct PoolFacts {
  int numa_node = -1;  // -1: unknown (label "unknown")
  uint64_t capacity_bytes = 0;
  uint64_t pinned_bytes = 0;  // mlock'ed arena or the engine's registered bytes, the larger
  std::map<std::string, copy::HandleCounts> handles;  // by gpu
};

// The state families of one scrape from a snapshot; families without a series are left out.
std::vector<prometheus::MetricFamily> StateFamilies(const CoreStats& stats,
                                                    const PoolFacts& pool);

class CoreMetrics : public prometheus::Collectable {
 public:
  explicit CoreMetrics(Core* core) : core_(core) {}
  // StateFamilies of the Core now (Core::Stats, its arena and engine); nothing once detached.
  // Called on the exposer's threads.
  std::vector<prometheus::MetricFamily> Collect() const override EXCLUDES(mu_);
  // Waits for a Collect in progress; later ones return nothing. The Core calls it first in its
  // destructor, as the exposer may hold this object longer.
  void Detach() EXCLUDES(mu_);

 private:
  mutable base::Mutex mu_;  // held while reading core_
  Core* core_ GUARDED_BY(mu_);
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_CORE_METRICS_H_
