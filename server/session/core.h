// Core: the daemon's shared state below the RPC layer. It owns the pool (arena), the copy
// engine, the block store and the spill tier, and composes three parts with files of their
// own: the LinkTable (links and host links, max_links), the SessionRegistry (open sessions,
// admission bounds, the pid watcher, ending sessions) and the TransferGate (accepted transfers,
// shutdown's wait). Its metrics are read from its stats when Prometheus scrapes
// (core_metrics.h). rpc/ creates one Session per client stream on top of it; main wires it from
// the config.
#ifndef OFFLOADD_SERVER_SESSION_CORE_H_
#define OFFLOADD_SERVER_SESSION_CORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "server/copy/copy_engine.h"
#include "server/pool/arena.h"
#include "server/session/client_reports.h"
#include "server/sched/link_scheduler.h"
#include "server/session/core_options.h"
#include "server/session/core_stats.h"
#include "server/session/link_calibration.h"
#include "server/session/link_table.h"
#include "server/session/peer.h"
#include "server/session/session_registry.h"
#include "server/session/transfer_gate.h"
#include "server/spill/spill_tier.h"
#include "server/store/block_store.h"

namespace offloadd::session {

class Session;
class CoreMetrics;
enum class EndCause;

class Core {
 public:
  // `arena` and `engine` are owned by the Core.
  // `spill`: the spill tier over this arena (SpillTier::Create), or null for none.
  Core(CoreOptions options, std::unique_ptr<pool::Arena> arena,
       std::unique_ptr<copy::CopyEngine> engine,
       std::unique_ptr<spill::SpillTier> spill = nullptr);
  // Detaches the metrics (a scrape from here on sees none of the Core's families), stops the
  // registry's threads, Drain()s and destroys the links.
  ~Core();

  using Link = LinkTable::Link;
  // Links (link_table.h): the link a GPU's copies use, admission at Hello against max_links
  // (AcquireLink, paired with ReleaseLink), the link made on a GPU's first copy (LinkFor,
  // between the two), and cancelling a session's queued transfers on it.
  std::string LinkNameFor(const std::string& gpu) const { return links_.LinkNameFor(gpu); }
  absl::Status AcquireLink(const std::string& gpu) { return links_.Acquire(gpu); }
  // With `remove_if_unused` (Hello's transient_device), the last user's release also drops the
  // device's transfer counters and handle counts, so a probe (`offloadctl bench`) leaves no
  // series labelled with its device id.
  void ReleaseLink(const std::string& gpu, bool remove_if_unused);
  std::shared_ptr<Link> LinkFor(const std::string& gpu) { return links_.LinkFor(gpu); }
  void CancelTransfers(uint64_t session_id, const std::string& gpu, const absl::Status& status) {
    links_.CancelTransfers(session_id, gpu, status);
  }
  // Copies `bytes` between `host` and `region` at `region_offset` through the link of
  // `device_id` (made on first use, as for a session on that device), as one transfer of class
  // `cls`: cut into chunk_bytes chunks, paced, DRR-fair with the device's other traffic and
  // counted in the link's stats and metrics. Blocks until the last chunk has landed (or the
  // first fails: its status). For callers outside the session layer (main wires the projector
  // refresh service to it, class PROJECTOR). A link made for the copy on a device id that no
  // session (other than a probe) used is removed with its series when the copy ends, as a
  // probe's (ReleaseLink with remove_if_unused). Errors: RESOURCE_EXHAUSTED naming max_links as
  // AcquireLink; UNAVAILABLE while draining; the engine's copy error. `engine` opened `region`
  // and must outlive the call. Not from a transfer callback. (link_copy.cc)
  absl::Status CopyOverLink(const std::string& device_id, sched::TrafficClass cls,
                            copy::CopyEngine& engine, copy::Direction direction,
                            std::shared_ptr<copy::Region> region, uint64_t region_offset,
                            uint8_t* host, uint64_t bytes);

  // Measures the links without a configured capacity and paces them at what their GPUs moved
  // together (link_calibration.h; main at start-up, `offloadctl calibrate-links` on demand),
  // within `budget_seconds` (0 = CoreOptions::link_calibration's). Blocks for about that long;
  // the GPUs of the link being measured hold their copies meanwhile. Counts as a transfer, so
  // shutdown waits for it. Errors: LinkCalibrator::Calibrate's; UNAVAILABLE while draining.
  absl::StatusOr<LinkCalibrationReport> CalibrateLinks(double budget_seconds = 0);

  // NUMA node of a GPU (CoreOptions::gpu_numa_nodes); -1 when unknown.
  int GpuNumaNode(const std::string& gpu) const;
  store::BlockStore& store() { return store_; }
  copy::CopyEngine& engine() { return *engine_; }
  const pool::Arena& arena() const { return *arena_; }
  uint8_t* pool_base() const { return arena_->base(); }
  spill::SpillTier* spill() const { return spill_.get(); }  // null without a spill tier
  // What adoption found at start-up (empty without a shared pool or on a fresh one).
  const pool::AdoptionReport& adoption() const { return adoption_; }
  const CoreOptions& options() const { return options_; }
  base::Clock& clock() const { return *options_.clock; }  // options.clock, or the steady clock

  // Sessions (session_registry.h has the contracts).
  uint64_t NewSessionId() { return sessions_.NewSessionId(); }
  void AddSession(uint64_t id, std::weak_ptr<Session> session) {
    sessions_.Add(id, std::move(session));
  }
  void RemoveSession(uint64_t id) { sessions_.Remove(id); }
  absl::Status TryOpenSessionSlot(const PeerCredentials& peer) {
    return sessions_.TryOpenSlot(peer);
  }
  void ReleaseSessionSlot(const PeerCredentials& peer) { sessions_.ReleaseSlot(peer); }
  absl::Status AdmitPendingHello(uint64_t session_id, const PeerCredentials& peer) {
    return sessions_.AdmitPendingHello(session_id, peer);
  }
  void EndPendingHello(uint64_t session_id) { sessions_.EndPendingHello(session_id); }
  size_t pending_hello() const { return sessions_.pending_hello(); }
  size_t CloseSessions(EndCause cause) { return sessions_.CloseSessions(cause); }
  absl::StatusOr<SessionInfo> EndSession(uint64_t id, EndCause cause,
                                         const absl::Status& status) {
    return sessions_.EndSession(id, cause, status);
  }
  void WatchPid(uint64_t session_id, int32_t pid) { sessions_.WatchPid(session_id, pid); }
  void UnwatchPid(uint64_t session_id) { sessions_.UnwatchPid(session_id); }
  size_t pids_watched() const { return sessions_.pids_watched(); }

  // Transfer accounting (transfer_gate.h): BeginTransfer fails (returns false) once shutdown
  // has begun; each true is paired with EndTransfer. WaitTransfers waits up to `seconds` for
  // every accepted transfer to finish (true when none is left) and does not stop accepting.
  bool BeginTransfer() { return gate_.Begin(); }
  void EndTransfer() { gate_.End(); }
  bool WaitTransfers(double seconds) { return gate_.WaitIdle(seconds); }
  bool draining() const { return gate_.stopped(); }
  // Stops accepting transfers (BeginTransfer fails from here on; queued offloads waiting for
  // space fail UNAVAILABLE). Drain() does this first.
  void StopAccepting();
  // Stops accepting transfers, waits for those accepted to finish (copies in flight complete,
  // completions are emitted), then stops the schedulers' workers. Idempotent.
  void Drain();

  // Daemon counters of finished transfers (CoreStats).
  void CountTransfer(bool offload, uint64_t bytes, bool ok);
  void CountError() { errors_total_.fetch_add(1); }
  // A session of `uid` (decimal, or kUnknownUid) reported `increase` more fallbacks, host waits
  // or idle steps on `device_id` (client_reports.h); summed into
  // CoreStats::client_reports_by_series (and, over uids, client_reports_by_gpu). At most
  // max_links (device id, uid) series per uid and 16 x max_links in all.
  void AddClientReport(const std::string& device_id, const std::string& uid,
                       const ClientCounters& increase) {
    const size_t links = options().max_links;
    client_reports_.Add({device_id, uid}, increase, ReportBounds{links, 16 * links});
  }

  CoreStats Stats();
  // The Core's scrape-time metric families (core_metrics.h), for metrics::Exposer::Register.
  // Valid as long as the caller holds it; empty once the Core is destroyed.
  std::shared_ptr<prometheus::Collectable> collectable() const;

 private:
  // Takes the previous daemon's blocks from the shared pool (constructor).
  void Adopt();

  const CoreOptions options_;
  std::unique_ptr<pool::Arena> arena_;
  std::unique_ptr<copy::CopyEngine> engine_;
  std::unique_ptr<spill::SpillTier> spill_;  // before store_: the store uses it until destroyed
  store::BlockStore store_;
  const double start_seconds_;
  pool::AdoptionReport adoption_;
  TransferGate gate_;
  // Before links_: a transfer the links still hold may drop the last reference to a Session,
  // whose destructor removes it from the registry.
  SessionRegistry sessions_;
  LinkTable links_;  // uses options_ and gate_
  LinkCalibrator calibrator_;  // uses options_ and links_

  std::atomic<uint64_t> offload_bytes_total_{0}, reload_bytes_total_{0};
  std::atomic<uint64_t> offloads_total_{0}, reloads_total_{0}, errors_total_{0};
  ClientReports client_reports_;
  std::shared_ptr<CoreMetrics> metrics_;  // detached first in ~Core
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_CORE_H_
