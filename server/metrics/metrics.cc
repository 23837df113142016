#include "server/metrics/metrics.h"

#include <exception>

#include "absl/strings/str_format.h"
#include "prometheus/exposer.h"

namespace offloadd::metrics {

std::string NumaNodeLabel(int node) { return node < 0 ? "unknown" : std::to_string(node); }

prometheus::Histogram::BucketBoundaries DurationBuckets() {
  return {1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100};
}

namespace {
Metrics* Create() {
  using namespace prometheus;  // NOLINT: builder names read better unqualified
  auto* m = new Metrics();
  m->registry = std::make_shared<Registry>();
  auto& r = *m->registry;
  m->build_info = &BuildGauge()
                       .Name("offloadd_build_info")
                       .Help("Always 1; labels carry the version and backend.")
                       .Register(r);
  auto gauge = [&r](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Register(r).Add({});
  };
  auto gauges = [&r](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Register(r);
  };
  m->pool_capacity_bytes = gauges("offloadd_pool_capacity_bytes", "Size of the host pool.");
  m->pool_used_bytes = gauges("offloadd_pool_used_bytes", "Pool bytes held by blocks (extents).");
  m->pool_peak_used_bytes =
      gauges("offloadd_pool_peak_used_bytes", "Highest pool_used_bytes since start.");
  m->pool_pinned_bytes = gauges("offloadd_pool_pinned_bytes",
                                "Pool bytes locked (mlock) or registered with the CUDA driver.");
  m->ipc_handles_open = gauges(
      "offloadd_ipc_handles_open",
      "Client memory handles held open (shm mappings, CUDA IPC memory handles).");
  m->ipc_handle_opens_total =
      &BuildCounter()
           .Name("offloadd_ipc_handle_opens_total")
           .Help("Client memory handles opened (one per allocation, not per request).")
           .Register(r);
  m->projector_refresh_duration_seconds =
      &BuildHistogram()
           .Name("offloadd_projector_refresh_duration_seconds")
           .Help("GaLore projector refresh time (SVD and checks), by method and backend.")
           .Register(r);
  m->projector_queue_depth =
      gauge("offloadd_projector_queue_depth", "Projector refreshes queued or running.");
  m->projector_refreshes_total = &BuildCounter()
                                      .Name("offloadd_projector_refreshes_total")
                                      .Help("Projector refreshes finished, by outcome.")
                                      .Register(r);
  // Series that must exist before the first refresh (dashboards, alerts).
  m->projector_refresh_duration_seconds->Add({{"method", "exact"}, {"backend", "lapack"}},
                                             DurationBuckets());
  m->projector_refreshes_total->Add({{"outcome", "ok"}});
  m->pool_blocks = gauge("offloadd_pool_blocks", "Blocks held in the pool.");
  m->offloads_waiting =
      gauge("offloadd_offloads_waiting", "Offloads queued waiting for pool space.");
  m->offloads_refused_total =
      &BuildCounter()
           .Name("offloadd_offloads_refused_total")
           .Help("Offloads refused with RESOURCE_EXHAUSTED (queue full or deadline passed).")
           .Register(r)
           .Add({});
  m->transfer_bytes_total = &BuildCounter()
                                 .Name("offloadd_transfer_bytes_total")
                                 .Help("Bytes moved by completed transfers.")
                                 .Register(r);
  m->transfers_total = &BuildCounter()
                            .Name("offloadd_transfers_total")
                            .Help("Transfers (offloads, reloads) finished, by status.")
                            .Register(r);
  m->transfer_duration_seconds =
      &BuildHistogram()
           .Name("offloadd_transfer_duration_seconds")
           .Help("Time from a transfer's request to its completion, including waits.")
           .Register(r);
  m->transfer_size_bytes = &BuildHistogram()
                                .Name("offloadd_transfer_size_bytes")
                                .Help("Size of completed transfers.")
                                .Register(r);
  m->sessions_open = gauge("offloadd_sessions_open", "Client sessions open.");
  auto counter = [&r](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Register(r).Add({});
  };
  m->adopted_blocks_total = counter(
      "offloadd_adopted_blocks_total",
      "Blocks taken over from the previous daemon's shared pool at start-up.");
  m->adoption_dropped_blocks_total =
      &BuildCounter()
           .Name("offloadd_adoption_dropped_blocks_total")
           .Help("Block records of the previous daemon dropped at adoption, by reason.")
           .Register(r);
  m->adopted_blocks_waiting = gauge("offloadd_adopted_blocks_waiting",
                                    "Adopted blocks not yet taken by a resumed session.");
  m->adopted_blocks_expired_total =
      counter("offloadd_adopted_blocks_expired_total",
              "Adopted blocks freed because no session resumed them within resume_grace_seconds.");
  m->sessions_resumed_total =
      counter("offloadd_sessions_resumed_total", "Sessions resumed with a resume token.");
  m->tier_bytes = gauges("offloadd_tier_bytes",
                         "Bytes held by blocks in each tier (pool, disk), rounded extents.");
  m->tier_bytes->Add({{"tier", "pool"}});
  m->tier_bytes->Add({{"tier", "disk"}});
  m->spill_capacity_bytes =
      gauge("offloadd_spill_capacity_bytes", "Bytes the spill files may take (0 = no spill tier).");
  m->spill_bytes_total = &BuildCounter()
                              .Name("offloadd_spill_bytes_total")
                              .Help("Bytes written to (spill) and read back from (stage) disk.")
                              .Register(r);
  m->spill_bytes_total->Add({{"direction", "spill"}});
  m->spill_bytes_total->Add({{"direction", "stage"}});
  m->reloads_from_disk_total = counter(
      "offloadd_reloads_from_disk_total",
      "Reloads whose block was on disk (or still being staged back) when they arrived.");
  m->reload_disk_wait_seconds_total =
      counter("offloadd_reload_disk_wait_seconds_total",
              "Seconds those reloads waited for their block to be staged back.");
  m->spill_failures_total = &BuildCounter()
                                 .Name("offloadd_spill_failures_total")
                                 .Help("Spills not done (the block stayed in the pool), by cause.")
                                 .Register(r);
  m->spill_failures_total->Add({{"cause", "write_error"}});
  m->spill_failures_total->Add({{"cause", "disk_full"}});
  m->spill_blocks_lost_total =
      counter("offloadd_spill_blocks_lost_total",
              "Spilled blocks whose file was removed or truncated under the daemon (DATA_LOSS).");
  m->start_to_serving_seconds = gauge("offloadd_start_to_serving_seconds",
                                      "Seconds from process start to serving (incl. adoption).");
  m->sessions_ended_total = &BuildCounter()
                                 .Name("offloadd_sessions_ended_total")
                                 .Help("Sessions ended, by cause (closed, crashed, shutdown).")
                                 .Register(r);
  m->request_errors_total = &BuildCounter()
                                 .Name("offloadd_request_errors_total")
                                 .Help("Requests answered with an error, by gRPC status code.")
                                 .Register(r);
  m->link_capacity_bytes_per_second =
      &BuildGauge()
           .Name("offloadd_link_capacity_bytes_per_second")
           .Help("Configured capacity of a link direction (0 = unpaced).")
           .Register(r);
  m->link_busy_seconds_total =
      &BuildCounter()
           .Name("offloadd_link_busy_seconds_total")
           .Help("Seconds a link direction was copying; its rate is the link's saturation.")
           .Register(r);
  m->link_bytes_total = &BuildCounter()
                             .Name("offloadd_link_bytes_total")
                             .Help("Bytes copied over a link direction.")
                             .Register(r);
  m->link_queued_transfers = &BuildGauge()
                                  .Name("offloadd_link_queued_transfers")
                                  .Help("Transfers queued or copying on a link direction.")
                                  .Register(r);
  m->link_chunks_in_flight = &BuildGauge()
                                  .Name("offloadd_link_chunks_in_flight")
                                  .Help("Chunks being copied on a link direction.")
                                  .Register(r);
  m->link_gpu_bytes_total = &BuildCounter()
                                 .Name("offloadd_link_gpu_bytes_total")
                                 .Help("Bytes one GPU copied over a link direction.")
                                 .Register(r);
  m->link_queue_wait_seconds =
      &BuildHistogram()
           .Name("offloadd_link_queue_wait_seconds")
           .Help("Time from a transfer's submission to its link until its first chunk starts.")
           .Register(r);
  m->reload_deadline_misses_total =
      &BuildCounter()
           .Name("offloadd_reload_deadline_misses_total")
           .Help("Reloads completed after the deadline their client gave.")
           .Register(r);
  m->host_link_capacity_bytes_per_second =
      &BuildGauge()
           .Name("offloadd_host_link_capacity_bytes_per_second")
           .Help("Capacity of a host link (root port / memory node) direction.")
           .Register(r);
  m->host_link_busy_seconds_total =
      &BuildCounter()
           .Name("offloadd_host_link_busy_seconds_total")
           .Help("Seconds of a host link direction's capacity used (bytes / capacity).")
           .Register(r);
  m->host_link_bytes_total = &BuildCounter()
                                  .Name("offloadd_host_link_bytes_total")
                                  .Help("Bytes moved through a host link direction.")
                                  .Register(r);
  return m;
}
}  // namespace

Metrics& Get() {
  static Metrics* m = Create();
  return *m;
}

struct Exposer::Impl {
  std::unique_ptr<prometheus::Exposer> exposer;
};

absl::StatusOr<std::unique_ptr<Exposer>> Exposer::Start(const std::string& address) {
  auto impl = std::make_unique<Impl>();
  try {
    impl->exposer = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot serve metrics on %s (%s): free the port, or set metrics_address to another "
        "host:port or to \"\" to disable metrics",
        address, e.what()));
  }
  impl->exposer->RegisterCollectable(Get().registry);
  return std::unique_ptr<Exposer>(new Exposer(std::move(impl)));
}

Exposer::Exposer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Exposer::~Exposer() = default;

int Exposer::port() const {
  auto ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : ports[0];
}

}  // namespace offloadd::metrics
