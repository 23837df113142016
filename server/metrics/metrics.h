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
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace offloadd::metrics {

struct Metrics {
  std::shared_ptr<prometheus::Registry> registry;

  prometheus::Family<prometheus::Gauge>* build_info;
  // Pool.
  // {numa_node}: the node of the pool's arena (one arena today; per-GPU placement is not done),
  // "unknown" when the kernel cannot tell (NumaNodeLabel).
  prometheus::Family<prometheus::Gauge>* pool_capacity_bytes;
  prometheus::Family<prometheus::Gauge>* pool_used_bytes;
  prometheus::Family<prometheus::Gauge>* pool_peak_used_bytes;
  // {numa_node}: pool bytes locked (mlock) or registered with the CUDA driver.
  prometheus::Family<prometheus::Gauge>* pool_pinned_bytes;
  // Client memory handles by {gpu}: shm mappings or CUDA IPC memory handles (deduplicated).
  prometheus::Family<prometheus::Gauge>* ipc_handles_open;
  prometheus::Family<prometheus::Counter>* ipc_handle_opens_total;
  // GaLore projector refreshes (registered at start-up so the series exist before any refresh).
  prometheus::Family<prometheus::Histogram>* projector_refresh_duration_seconds;  // {method, backend}
  prometheus::Gauge* projector_queue_depth;
  prometheus::Family<prometheus::Counter>* projector_refreshes_total;  // {outcome}
  prometheus::Gauge* pool_blocks;
  prometheus::Gauge* offloads_waiting;
  prometheus::Counter* offloads_refused_total;
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
  // Links: {link, direction}.
  prometheus::Family<prometheus::Gauge>* link_capacity_bytes_per_second;
  prometheus::Family<prometheus::Counter>* link_busy_seconds_total;
  prometheus::Family<prometheus::Counter>* link_bytes_total;
  prometheus::Family<prometheus::Gauge>* link_queued_transfers;
  prometheus::Family<prometheus::Gauge>* link_chunks_in_flight;
  // {link, direction, gpu}: bytes each GPU moved over a link direction (fairness).
  prometheus::Family<prometheus::Counter>* link_gpu_bytes_total;
  // {link, direction, class}: from a transfer's submission to its link to the start of its
  // first chunk.
  prometheus::Family<prometheus::Histogram>* link_queue_wait_seconds;
  // {gpu, link}: reloads that completed after the deadline their client gave.
  prometheus::Family<prometheus::Counter>* reload_deadline_misses_total;
  // Host links (root port / host memory node above several links): {link, direction}.
  prometheus::Family<prometheus::Gauge>* host_link_capacity_bytes_per_second;
  prometheus::Family<prometheus::Counter>* host_link_busy_seconds_total;
  prometheus::Family<prometheus::Counter>* host_link_bytes_total;
  // Restart survival (shared pool, README "Failure modes").
  prometheus::Counter* adopted_blocks_total;  // taken from the previous daemon's pool at start
  // {reason}: records dropped at adoption (checksum, version, bounds, overlap, duplicate_id).
  prometheus::Family<prometheus::Counter>* adoption_dropped_blocks_total;
  prometheus::Gauge* adopted_blocks_waiting;           // adopted, not yet resumed
  prometheus::Counter* adopted_blocks_expired_total;   // freed: resume_grace_seconds passed
  prometheus::Counter* sessions_resumed_total;         // Hellos that presented a resume token
  prometheus::Gauge* start_to_serving_seconds;  // process start (main) to the socket serving
  // Spill tier (issue 18; README "Spill tier"); the families exist without one (at 0).
  prometheus::Family<prometheus::Gauge>* tier_bytes;  // {tier}: pool, disk
  prometheus::Gauge* spill_capacity_bytes;
  prometheus::Family<prometheus::Counter>* spill_bytes_total;  // {direction}: spill, stage
  prometheus::Counter* reloads_from_disk_total;
  prometheus::Counter* reload_disk_wait_seconds_total;
  prometheus::Family<prometheus::Counter>* spill_failures_total;  // {cause}: write_error, disk_full
  prometheus::Counter* spill_blocks_lost_total;
};

// The process-wide metrics, created on first use.
Metrics& Get();

// The value of a numa_node label: the node number, or "unknown" for a negative node (the kernel
// could not tell), so an unknown node never reads as node 0.
std::string NumaNodeLabel(int node);

// Histogram buckets (seconds) for transfers: 100 µs .. ~100 s, x~3 per bucket.
prometheus::Histogram::BucketBoundaries DurationBuckets();

// Serves Get().registry at http://<address>/metrics. Errors: UNAVAILABLE when the address
// cannot be bound (message names it and says to change metrics_address or free the port).
class Exposer {
 public:
  static absl::StatusOr<std::unique_ptr<Exposer>> Start(const std::string& address);
  ~Exposer();
  // Bound port (useful with port 0).
  int port() const;

 private:
  struct Impl;
  explicit Exposer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace offloadd::metrics

#endif  // OFFLOADD_SERVER_METRICS_METRICS_H_
