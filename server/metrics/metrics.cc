#include "server/metrics/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>

#include "absl/strings/str_format.h"
#include "prometheus/exposer.h"

namespace offloadd::metrics {

std::string NumaNodeLabel(int node) { return node < 0 ? "unknown" : std::to_string(node); }

prometheus::Histogram::BucketBoundaries DurationBuckets() {
  return {1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100};
}

namespace state {
using prometheus::MetricType;
const StateFamily kPoolCapacityBytes{"offloadd_pool_capacity_bytes", "Size of the host pool.",
                                     MetricType::Gauge};
const StateFamily kPoolUsedBytes{"offloadd_pool_used_bytes",
                                 "Pool bytes held by blocks (extents).", MetricType::Gauge};
const StateFamily kPoolPeakUsedBytes{"offloadd_pool_peak_used_bytes",
                                     "Highest pool_used_bytes since start.", MetricType::Gauge};
const StateFamily kPoolPinnedBytes{
    "offloadd_pool_pinned_bytes", "Pool bytes locked (mlock) or registered with the CUDA driver.",
    MetricType::Gauge};
const StateFamily kIpcHandlesOpen{
    "offloadd_ipc_handles_open",
    "Client memory handles held open (shm mappings, CUDA IPC memory handles).", MetricType::Gauge};
const StateFamily kIpcHandleOpensTotal{
    "offloadd_ipc_handle_opens_total",
    "Client memory handles opened (one per allocation, not per request).", MetricType::Counter};
const StateFamily kPoolBlocks{"offloadd_pool_blocks", "Blocks held in the pool.",
                              MetricType::Gauge};
const StateFamily kOffloadsWaiting{"offloadd_offloads_waiting",
                                   "Offloads queued waiting for pool space.", MetricType::Gauge};
const StateFamily kOffloadsRefusedTotal{
    "offloadd_offloads_refused_total",
    "Offloads refused with RESOURCE_EXHAUSTED (queue full or deadline passed).",
    MetricType::Counter};
const StateFamily kLinkCapacityBytesPerSecond{
    "offloadd_link_capacity_bytes_per_second",
    "Capacity a link direction is paced at, configured or calibrated (0 = unpaced).",
    MetricType::Gauge};
const StateFamily kLinkBusySecondsTotal{
    "offloadd_link_busy_seconds_total",
    "Seconds a link direction was copying; its rate is the link's saturation.",
    MetricType::Counter};
const StateFamily kLinkBytesTotal{"offloadd_link_bytes_total",
                                  "Bytes copied over a link direction.", MetricType::Counter};
const StateFamily kLinkQueuedTransfers{"offloadd_link_queued_transfers",
                                       "Transfers queued or copying on a link direction.",
                                       MetricType::Gauge};
const StateFamily kLinkChunksInFlight{"offloadd_link_chunks_in_flight",
                                      "Chunks being copied on a link direction.",
                                      MetricType::Gauge};
const StateFamily kLinkGpuBytesTotal{"offloadd_link_gpu_bytes_total",
                                     "Bytes one GPU copied over a link direction.",
                                     MetricType::Counter};
const StateFamily kReloadDeadlineMissesTotal{
    "offloadd_reload_deadline_misses_total",
    "Reloads completed after the deadline their client gave.", MetricType::Counter};
const StateFamily kLinkCalibratedBytesPerSecond{
    "offloadd_link_calibrated_bytes_per_second",
    "What a link's GPUs moved together in one direction at its latest calibration; the link is "
    "paced at it where the config gives no capacity.",
    MetricType::Gauge};
const StateFamily kGpuCalibratedBytesPerSecond{
    "offloadd_gpu_calibrated_bytes_per_second",
    "What one GPU moved alone in one direction at its link's latest calibration.",
    MetricType::Gauge};
const StateFamily kLinkCalibrationTimestampSeconds{
    "offloadd_link_calibration_timestamp_seconds",
    "Unix time of a link's latest successful calibration.", MetricType::Gauge};
const StateFamily kHostLinkCapacityBytesPerSecond{
    "offloadd_host_link_capacity_bytes_per_second",
    "Capacity of a host link (root port / memory node) direction.", MetricType::Gauge};
const StateFamily kHostLinkBusySecondsTotal{
    "offloadd_host_link_busy_seconds_total",
    "Seconds of a host link direction's capacity used (bytes / capacity).", MetricType::Counter};
const StateFamily kHostLinkBytesTotal{"offloadd_host_link_bytes_total",
                                      "Bytes moved through a host link direction.",
                                      MetricType::Counter};
const StateFamily kAdoptedBlocksWaiting{"offloadd_adopted_blocks_waiting",
                                        "Adopted blocks not yet taken by a resumed session.",
                                        MetricType::Gauge};
const StateFamily kAdoptedBlocksExpiredTotal{
    "offloadd_adopted_blocks_expired_total",
    "Adopted blocks freed because no session resumed them within resume_grace_seconds.",
    MetricType::Counter};
const StateFamily kSessionsResumedTotal{"offloadd_sessions_resumed_total",
                                        "Sessions resumed with a resume token.",
                                        MetricType::Counter};
const StateFamily kClientFallbacksTotal{
    "offloadd_client_fallbacks_total",
    "Saved tensors clients kept in their own process (daemon unreachable or refusing), as they "
    "reported them.",
    MetricType::Counter};
const StateFamily kClientHostWaitsTotal{
    "offloadd_client_host_waits_total",
    "Times clients' training threads blocked on an answer of the daemon, as they reported them.",
    MetricType::Counter};
const StateFamily kClientHostWaitSecondsTotal{
    "offloadd_client_host_wait_seconds_total",
    "Seconds clients' training threads blocked on the daemon, as they reported them.",
    MetricType::Counter};
const StateFamily kClientIdleStepsTotal{
    "offloadd_client_idle_steps_total",
    "Training steps that saved tensors but sent none to the daemon, as clients reported them.",
    MetricType::Counter};
const StateFamily kTierBytes{"offloadd_tier_bytes",
                             "Bytes held by blocks in each tier (pool, disk), rounded extents.",
                             MetricType::Gauge};
const StateFamily kSpillCapacityBytes{"offloadd_spill_capacity_bytes",
                                      "Bytes the spill files may take (0 = no spill tier).",
                                      MetricType::Gauge};
const StateFamily kSpillBytesTotal{"offloadd_spill_bytes_total",
                                   "Bytes written to (spill) and read back from (stage) disk.",
                                   MetricType::Counter};
const StateFamily kReloadsFromDiskTotal{
    "offloadd_reloads_from_disk_total",
    "Reloads whose block was on disk (or still being staged back) when they arrived.",
    MetricType::Counter};
const StateFamily kReloadDiskWaitSecondsTotal{
    "offloadd_reload_disk_wait_seconds_total",
    "Seconds those reloads waited for their block to be staged back.", MetricType::Counter};
const StateFamily kSpillFailuresTotal{"offloadd_spill_failures_total",
                                      "Spills not done (the block stayed in the pool), by cause.",
                                      MetricType::Counter};
const StateFamily kSpillBlocksLostTotal{
    "offloadd_spill_blocks_lost_total",
    "Spilled blocks whose file was removed, truncated, damaged or replaced (DATA_LOSS).",
    MetricType::Counter};
const StateFamily kStagesPromotedTotal{
    "offloadd_spill_stages_promoted_total",
    "Stage-backs queued ahead of need (PREFETCH) raised to URGENT because a reload came.",
    MetricType::Counter};
const StateFamily kStagesExpiredTotal{
    "offloadd_spill_stages_expired_total",
    "Urgent stage-backs that found no pool space within the admission deadline while nothing "
    "was being spilled; their reloads got RESOURCE_EXHAUSTED.",
    MetricType::Counter};
const StateFamily kStagesWaitingForPool{
    "offloadd_spill_stages_waiting",
    "Urgent stage-backs waiting for pool space now (offloads are held back meanwhile).",
    MetricType::Gauge};
const StateFamily kPoolNumaFallbackTotal{
    "offloadd_pool_numa_fallback_total",
    "Pool allocations placed on another NUMA node than their GPU's, by reason (slice_full, "
    "unknown_node, no_slice).",
    MetricType::Counter};
const StateFamily kPoolNumaSliceCapacityBytes{
    "offloadd_pool_numa_slice_capacity_bytes",
    "Bytes of the pool's slice bound to each NUMA node (\"unknown\": the pool is not sliced).",
    MetricType::Gauge};
const StateFamily kPoolNumaSliceUsedBytes{
    "offloadd_pool_numa_slice_used_bytes",
    "Bytes held by blocks (extents) in each NUMA node's slice of the pool.", MetricType::Gauge};
}  // namespace state

prometheus::MetricFamily NewFamily(const StateFamily& spec) {
  prometheus::MetricFamily family;
  family.name = spec.name;
  family.help = spec.help;
  family.type = spec.type;
  return family;
}

void AddSample(prometheus::MetricFamily& family, const prometheus::Labels& labels, double value) {
  prometheus::ClientMetric& metric = family.metric.emplace_back();
  for (const auto& [name, label_value] : labels) metric.label.push_back({name, label_value});
  if (family.type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
}

namespace {
prometheus::Family<prometheus::Counter>* CounterFamily(prometheus::Registry& r, const char* name,
                                                       const char* help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r);
}

prometheus::Family<prometheus::Histogram>* HistogramFamily(prometheus::Registry& r,
                                                           const char* name, const char* help) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Register(r);
}

// A gauge without labels.
prometheus::Gauge* PlainGauge(prometheus::Registry& r, const char* name, const char* help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

void RegisterProjectorMetrics(prometheus::Registry& r, Metrics* m) {
  m->projector_refresh_duration_seconds = HistogramFamily(
      r, "offloadd_projector_refresh_duration_seconds",
      "GaLore projector refresh time (SVD and checks), by method and backend.");
  m->projector_queue_depth =
      PlainGauge(r, "offloadd_projector_queue_depth", "Projector refreshes queued or running.");
  m->projector_refreshes_total = CounterFamily(r, "offloadd_projector_refreshes_total",
                                               "Projector refreshes finished, by outcome.");
  m->projector_refresh_sources_total = CounterFamily(
      r, "offloadd_projector_refresh_sources_total",
      "Projector refreshes by where their result came from: computed (an SVD ran) or "
      "deduplicated (a repeated key with a bitwise equal gradient took the first one's).");
  m->projector_content_mismatches_total =
      &CounterFamily(r, "offloadd_projector_content_mismatches_total",
                     "Repeated refresh keys whose gradient or parameters differed from the first "
                     "submission's, computed on their own.")
           ->Add({});
  m->projector_blas_info =
      &prometheus::BuildGauge()
           .Name("offloadd_projector_blas_info")
           .Help("Always 1; labels: the CPU's ISA level, the OpenBLAS core refreshes run on, the "
                 "core OpenBLAS picks by itself, and who chose (auto, selected, operator).")
           .Register(r);
  // Series that must exist before the first refresh (dashboards, alerts).
  m->projector_refresh_duration_seconds->Add({{"method", "exact"}, {"backend", "lapack"}},
                                             DurationBuckets());
  m->projector_refreshes_total->Add({{"outcome", "ok"}});
  m->projector_refresh_sources_total->Add({{"source", "computed"}});
  m->projector_refresh_sources_total->Add({{"source", "deduplicated"}});
}

void RegisterTransferMetrics(prometheus::Registry& r, Metrics* m) {
  m->transfer_bytes_total = CounterFamily(r, "offloadd_transfer_bytes_total",
                                          "Bytes moved by completed transfers.");
  m->transfers_total = CounterFamily(r, "offloadd_transfers_total",
                                     "Transfers (offloads, reloads) finished, by status.");
  m->transfer_duration_seconds =
      HistogramFamily(r, "offloadd_transfer_duration_seconds",
                      "Time from a transfer's request to its completion, including waits.");
  m->transfer_size_bytes =
      HistogramFamily(r, "offloadd_transfer_size_bytes", "Size of completed transfers.");
}

void RegisterRingThreadMetrics(prometheus::Registry& r, Metrics* m) {
  m->ring_threads = PlainGauge(r, "offloadd_ring_threads",
                               "Request rings' daemon threads running (one per attached ring).");
  auto* sleeps = CounterFamily(
      r, "offloadd_ring_sleeps_total",
      "Times a request ring's thread slept waiting for work, by wait: poll (timed, at most "
      "poll_seconds, so that clients need not ring), doorbell (until the client rings).");
  m->ring_sleeps_poll_total = &sleeps->Add({{"wait", "poll"}});
  m->ring_sleeps_doorbell_total = &sleeps->Add({{"wait", "doorbell"}});
  m->ring_backoffs_total =
      &CounterFamily(r, "offloadd_ring_backoffs_total",
                     "1 ms back-offs of a ring thread after 64 rings in a row with no work.")
           ->Add({});
  m->ring_malformed_entries_total =
      &CounterFamily(r, "offloadd_ring_malformed_entries_total",
                     "Ring entries refused as malformed (answered INVALID_ARGUMENT).")
           ->Add({});
  m->ring_completions_waiting =
      PlainGauge(r, "offloadd_ring_completions_waiting",
                 "Answers waiting in daemon memory because a client's completion ring is full.");
}

void RegisterSessionMetrics(prometheus::Registry& r, Metrics* m) {
  m->sessions_open = PlainGauge(r, "offloadd_sessions_open", "Client sessions open.");
  m->adopted_blocks_total =
      &CounterFamily(r, "offloadd_adopted_blocks_total",
                     "Blocks taken over from the previous daemon's shared pool at start-up.")
           ->Add({});
  m->adoption_dropped_blocks_total =
      CounterFamily(r, "offloadd_adoption_dropped_blocks_total",
                    "Block records of the previous daemon dropped at adoption, by reason.");
  m->start_to_serving_seconds = PlainGauge(r, "offloadd_start_to_serving_seconds",
                                      "Seconds from process start to serving (incl. adoption).");
  m->sessions_ended_total = CounterFamily(r, "offloadd_sessions_ended_total",
                                          "Sessions ended, by cause (closed, crashed, shutdown).");
  m->request_errors_total = CounterFamily(r, "offloadd_request_errors_total",
                                          "Requests answered with an error, by gRPC status code.");
  auto* offers = CounterFamily(r, "offloadd_ring_offers_total",
                               "Request rings offered in Hello, by result (attached, refused).");
  m->ring_offers_attached_total = &offers->Add({{"result", "attached"}});
  m->ring_offers_refused_total = &offers->Add({{"result", "refused"}});
  m->ring_requests_total =
      &CounterFamily(r, "offloadd_ring_requests_total",
                     "Requests taken from sessions' request rings (the rest came on streams).")
           ->Add({});
  RegisterRingThreadMetrics(r, m);
}

Metrics* Create() {
  auto* m = new Metrics();
  m->registry = std::make_shared<prometheus::Registry>();
  auto& r = *m->registry;
  m->build_info = &prometheus::BuildGauge()
                       .Name("offloadd_build_info")
                       .Help("Always 1; labels carry the version and backend.")
                       .Register(r);
  RegisterProjectorMetrics(r, m);
  RegisterTransferMetrics(r, m);
  RegisterSessionMetrics(r, m);
  m->link_queue_wait_seconds = HistogramFamily(
      r, "offloadd_link_queue_wait_seconds",
      "Time from a transfer's submission to its link until its first chunk starts.");
  return m;
}
}  // namespace

Metrics& Get() {
  static Metrics* m = Create();
  return *m;
}

namespace {

constexpr const char* kMetricsRemedy =
    "choose another port (metrics_address in the config, or --metrics_address=HOST:PORT), or "
    "pass --metrics_address= to serve no metrics";

// Splits "host:port", "[v6]:port" or "port" into host ("" for a port alone) and port.
void SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    host->clear();
    *port = address;
    return;
  }
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
}

// 0 when a socket bound one of `addresses` (SO_REUSEADDR, then closed), else the last errno.
int TryBind(const addrinfo* addresses) {
  int err = EADDRNOTAVAIL;
  for (const addrinfo* ai = addresses; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    const bool bound = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    err = bound ? 0 : errno;
    close(fd);
    if (bound) return 0;
  }
  return err;
}

}  // namespace

absl::Status CheckAddressFree(const std::string& address) {
  std::string host, port;
  SplitHostPort(address, &host, &port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  const int rc =
      getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &addresses);
  if (rc != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot serve metrics on %s: it is not a host:port of this machine (%s): %s", address,
        gai_strerror(rc), kMetricsRemedy));
  }
  const int err = TryBind(addresses);
  freeaddrinfo(addresses);
  if (err == 0) return absl::OkStatus();
  if (err == EADDRINUSE) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot serve metrics on %s: the address is in use (another process listens on it): %s",
        address, kMetricsRemedy));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "cannot serve metrics on %s: binding it fails (%s): %s", address, std::strerror(err),
      kMetricsRemedy));
}

struct Exposer::Impl {
  std::unique_ptr<prometheus::Exposer> exposer;
};

absl::StatusOr<std::unique_ptr<Exposer>> Exposer::Start(const std::string& address) {
  auto impl = std::make_unique<Impl>();
  try {
    impl->exposer = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    // The HTTP server's own text ("null context when constructing CivetServer...") does not say
    // why: probe the address for the reason.
    absl::Status why = CheckAddressFree(address);
    if (!why.ok()) return absl::UnavailableError(why.message());
    return absl::UnavailableError(absl::StrFormat(
        "cannot serve metrics on %s: the HTTP server did not start (%s): %s", address, e.what(),
        kMetricsRemedy));
  }
  impl->exposer->RegisterCollectable(Get().registry);
  return std::unique_ptr<Exposer>(new Exposer(std::move(impl)));
}

void Exposer::Register(const std::shared_ptr<prometheus::Collectable>& collectable) {
  impl_->exposer->RegisterCollectable(collectable);
}

Exposer::Exposer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Exposer::~Exposer() = default;

int Exposer::port() const {
  auto ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : ports[0];
}

}  // namespace offloadd::metrics
