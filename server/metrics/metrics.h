// Process-wide Prometheus metrics of offloadd (prometheus-cpp 1.0).
//
// metrics/ is a leaf: any layer records into it; nothing here depends on other layers. Names
// follow docs/ARCHITECTURE.md: prefix `offloadd_`, base units (`_bytes`, `_seconds`), `_total` on
// counters, labels gpu / link / direction / class / cause / status — never a pid or client label.
// The README's "Metrics" section lists every series defined here.
#ifndef OFFLOADD_SERVER_METRICS_METRICS_H_
#define OFFLOADD_SERVER_METRICS_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/collectable.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace offloadd::metrics {

// Metrics recorded where their event happens, into `registry`.
struct Metrics {
  std::shared_ptr<prometheus::Registry> registry;

  prometheus::Family<prometheus::Gauge>* build_info;
  // GaLore projector refreshes (registered at start-up so the series exist before any refresh).
  prometheus::Family<prometheus::Histogram>* projector_refresh_duration_seconds;  // {method, backend}
  prometheus::Gauge* projector_queue_depth;
  prometheus::Family<prometheus::Counter>* projector_refreshes_total;  // {outcome}
  // {source}: computed | deduplicated (projector/refresh_service.h).
  prometheus::Family<prometheus::Counter>* projector_refresh_sources_total;
  prometheus::Counter* projector_content_mismatches_total;
  // Always 1; {isa, core, openblas_core, source}: the OpenBLAS kernels refreshes run on
  // (projector/blas_core.h). Set once at start-up when the projector is enabled.
  prometheus::Family<prometheus::Gauge>* projector_blas_info;
  // Transfers: {direction, gpu, status}.
  prometheus::Family<prometheus::Counter>* transfer_bytes_total;
  prometheus::Family<prometheus::Counter>* transfers_total;
  // {direction}; from the request's arrival to its completion.
  prometheus::Family<prometheus::Histogram>* transfer_duration_seconds;
  prometheus::Family<prometheus::Histogram>* transfer_size_bytes;
  // Sessions.
  prometheus::Gauge* sessions_open;
  prometheus::Family<prometheus::Counter>* sessions_ended_total;  // {cause}
  prometheus::Family<prometheus::Counter>* request_errors_total;  // {code}
  // Hello ring offers by result: attached, refused (the client's requests go on its stream).
  prometheus::Counter* ring_offers_attached_total;
  prometheus::Counter* ring_offers_refused_total;
  prometheus::Counter* ring_requests_total;  // entries taken from request rings
  // The rings' daemon threads (rpc::RingFrontEnd): running now; sleeps waiting for work, by
  // wait (poll: timed, at most poll_seconds; doorbell: until the client rings); 1 ms back-offs
  // after 64 rings in a row with no work; entries refused as malformed; answers waiting in
  // daemon memory because a client's completion ring is full.
  prometheus::Gauge* ring_threads;
  prometheus::Counter* ring_sleeps_poll_total;
  prometheus::Counter* ring_sleeps_doorbell_total;
  prometheus::Counter* ring_backoffs_total;
  prometheus::Counter* ring_malformed_entries_total;
  prometheus::Gauge* ring_completions_waiting;
  // {link, direction, class}: from a transfer's submission to its link to the start of its
  // first chunk.
  prometheus::Family<prometheus::Histogram>* link_queue_wait_seconds;
  // Restart survival (shared pool, docs/failure-modes.md).
  prometheus::Counter* adopted_blocks_total;  // taken from the previous daemon's pool at start
  // {reason}: records dropped at adoption (checksum, version, bounds, overlap, duplicate_id).
  prometheus::Family<prometheus::Counter>* adoption_dropped_blocks_total;
  prometheus::Gauge* start_to_serving_seconds;  // process start (main) to the socket serving
};

// The process-wide metrics, created on first use.
Metrics& Get();

// A family whose values are read from the daemon's state when Prometheus scrapes
// (session/core_metrics.h builds them from Core::Stats), not recorded into the registry.
struct StateFamily {
  const char* name;
  const char* help;
  prometheus::MetricType type;  // Counter or Gauge only
};

// The state families (one exposition per scrape; labels in the comments).
namespace state {
// Pool, {numa_node}: the node of the pool's arena, "unknown" when the kernel cannot tell.
extern const StateFamily kPoolCapacityBytes, kPoolUsedBytes, kPoolPeakUsedBytes;
extern const StateFamily kPoolPinnedBytes;  // {numa_node}: locked (mlock) or CUDA-registered
// Client memory handles by {gpu}: shm mappings or CUDA IPC memory handles (deduplicated).
extern const StateFamily kIpcHandlesOpen, kIpcHandleOpensTotal;
extern const StateFamily kPoolBlocks, kOffloadsWaiting, kOffloadsRefusedTotal;  // no labels
// Links, {link, direction}; per GPU {link, direction, gpu}; deadline misses {gpu, link}.
extern const StateFamily kLinkCapacityBytesPerSecond, kLinkBusySecondsTotal, kLinkBytesTotal;
extern const StateFamily kLinkQueuedTransfers, kLinkChunksInFlight, kLinkGpuBytesTotal;
extern const StateFamily kReloadDeadlineMissesTotal;
// Link calibration (session/link_calibration.h), per link's latest successful measurement:
// {link, direction} what its GPUs moved together, {link, gpu, direction} one GPU alone, {link}
// when (Unix seconds).
extern const StateFamily kLinkCalibratedBytesPerSecond, kGpuCalibratedBytesPerSecond;
extern const StateFamily kLinkCalibrationTimestampSeconds;
// Host links (root port / host memory node above several links): {link, direction}.
extern const StateFamily kHostLinkCapacityBytesPerSecond, kHostLinkBusySecondsTotal;
extern const StateFamily kHostLinkBytesTotal;
// Restart survival, no labels.
extern const StateFamily kAdoptedBlocksWaiting, kAdoptedBlocksExpiredTotal;
extern const StateFamily kSessionsResumedTotal;
// Clients' reports (session/client_reports.h), summed over the daemon's lifetime by {gpu}
// (per session: GetStats, `offloadctl sessions`; no session or client label).
extern const StateFamily kClientFallbacksTotal, kClientHostWaitsTotal;
extern const StateFamily kClientHostWaitSecondsTotal, kClientIdleStepsTotal;
// Spill tier (docs/spill.md); present (at 0) without one.
extern const StateFamily kTierBytes;         // {tier}: pool, disk
extern const StateFamily kSpillCapacityBytes;
extern const StateFamily kSpillBytesTotal;   // {direction}: spill, stage
extern const StateFamily kReloadsFromDiskTotal, kReloadDiskWaitSecondsTotal;
extern const StateFamily kSpillFailuresTotal;  // {cause}: write_error, disk_full
extern const StateFamily kSpillBlocksLostTotal;
extern const StateFamily kStagesPromotedTotal, kStagesExpiredTotal;  // no labels
extern const StateFamily kStagesWaitingForPool;                       // no labels
// NUMA placement: pool allocations that left their GPU's node, by {reason}:
// slice_full, unknown_node, no_slice; the bytes of each slice by {numa_node}.
extern const StateFamily kPoolNumaFallbackTotal;
extern const StateFamily kPoolNumaSliceCapacityBytes, kPoolNumaSliceUsedBytes;
}  // namespace state

// An empty family for `spec`, to fill with AddSample.
prometheus::MetricFamily NewFamily(const StateFamily& spec);
// Appends one series to `family`: `value` as its counter or gauge value (by the family's type).
void AddSample(prometheus::MetricFamily& family, const prometheus::Labels& labels, double value);

// The value of a numa_node label: the node number, or "unknown" for a negative node (the kernel
// could not tell), so an unknown node never reads as node 0.
std::string NumaNodeLabel(int node);

// Histogram buckets (seconds) for transfers: 100 µs .. ~100 s, x~3 per bucket.
prometheus::Histogram::BucketBoundaries DurationBuckets();

// OK when a TCP socket can bind `address` (host:port, [v6 host]:port, or a port alone for every
// address) now: binds it with SO_REUSEADDR and closes it at once, so the port stays free.
// FAILED_PRECONDITION starting "cannot serve metrics on <address>: " otherwise, saying why (the
// address is in use by another process, the host does not resolve, or bind's errno text) and the
// remedy: another port in metrics_address (or --metrics_address=HOST:PORT), or
// --metrics_address= to serve no metrics.
absl::Status CheckAddressFree(const std::string& address);

// Serves Get().registry, and the collectables given to Register, at http://<address>/metrics.
// Errors: UNAVAILABLE when the address cannot be bound, with CheckAddressFree's sentence (the
// address in use, and the remedy).
class Exposer {
 public:
  static absl::StatusOr<std::unique_ptr<Exposer>> Start(const std::string& address);
  ~Exposer();
  // Adds `collectable` to every scrape from now on (held weakly: once it is destroyed it is
  // skipped). Its families must not share a name with the registry's.
  void Register(const std::shared_ptr<prometheus::Collectable>& collectable);
  // Bound port (useful with port 0).
  int port() const;

 private:
  struct Impl;
  explicit Exposer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace offloadd::metrics

#endif  // OFFLOADD_SERVER_METRICS_METRICS_H_
