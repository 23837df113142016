// Core: the daemon's shared state below the RPC layer — the pool, the block store, the copy
// engine, one LinkScheduler per link and direction, and the registry of open sessions.
// rpc/ creates one Session per client stream on top of it; main wires it from the config.
#ifndef OFFLOADD_SERVER_SESSION_CORE_H_
#define OFFLOADD_SERVER_SESSION_CORE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "server/base/clock.h"
#include "server/copy/copy_engine.h"
#include "server/pool/arena.h"
#include "server/sched/host_link.h"
#include "server/sched/link_scheduler.h"
#include "server/session/peer.h"
#include "server/session/pid_watcher.h"
#include "server/spill/spill_tier.h"
#include "server/store/block_store.h"

namespace offloadd::session {

class Session;
enum class EndCause;

// A link as configured or discovered (sched/topology.h): the GPUs (device ids) that share it
// and its capacity per direction in bytes/s (0 = unpaced).
struct LinkSpec {
  std::string name;
  std::vector<std::string> gpus;
  double d2h_bytes_per_second = 0;
  double h2d_bytes_per_second = 0;
  // One scheduler and one capacity (d2h_bytes_per_second) for both directions: offloads and
  // reloads share its queue, so the priority classes and the offload minimum share apply
  // between them. Default (false): full duplex, one scheduler per direction.
  bool half_duplex = false;
  // From discovery, for stats only ("" / -1 / 0 when unknown).
  std::string uplink_bdf, root_port;
  int numa_node = -1;
  double pcie_bytes_per_second = 0;
};

// The level above links (sched/host_link.h): a root port or host memory node with a capacity
// of its own per direction (0 = no such level in that direction), shared fairly by its links.
struct HostLinkSpec {
  std::string name;
  std::vector<std::string> links;  // child link names (a GPU's default link has the GPU's name)
  double d2h_bytes_per_second = 0;
  double h2d_bytes_per_second = 0;
  int numa_node = -1;  // for stats; -1 = unknown
};

struct CoreOptions {
  uint64_t chunk_bytes = 8ull << 20;
  uint32_t copy_threads = 2;  // per link and direction
  // Chunks posted per GPU and direction when the engine is asynchronous (issue 16).
  uint32_t max_chunks_in_flight_per_gpu = 2;
  store::BlockStoreOptions store;
  std::vector<LinkSpec> links;
  // A GPU not named in `links` gets a link of its own, named after it, at this rate.
  double default_link_bytes_per_second = 0;
  std::map<std::string, uint32_t> gpu_weights;     // DRR weights, default 1
  std::vector<HostLinkSpec> host_links;            // each link under at most one
  double offload_min_share = 0.2;                  // see sched/drr.h
  std::map<std::string, std::string> gpu_bus_ids;  // device id -> PCI address, for stats

  // Isolation and failure handling (README "Failure modes").
  AccessPolicy access;  // who may open a session / call admin RPCs (session/peer.h)
  ConnectionLimits connections;  // applied by rpc/'s listener (session/peer.h)
  // Requests of one session accepted and not yet answered; more get RESOURCE_EXHAUSTED at once.
  // Bounds the daemon's memory under a flood. 0 = no limit.
  uint32_t max_requests_in_flight = 4096;
  uint32_t max_sessions = 1024;  // sessions open at once (after Hello); 0 = no limit
  // Sessions one non-admin uid may have open at once (admins are counted only in the total),
  // so one user cannot take every slot; 0 = no limit.
  uint32_t max_sessions_per_uid = 256;
  // Session streams opened that have not yet completed a Hello (each holds a Session): at most
  // max_pending_hello_total in all and max_pending_hello_per_uid per non-admin uid (admins are
  // counted only in the total); a stream past a bound ends at once with RESOURCE_EXHAUSTED
  // naming it. A stream with no successful Hello within hello_timeout_seconds ends with
  // DEADLINE_EXCEEDED (cause "hello_timeout"). 0 = no bound / no timeout.
  uint32_t max_pending_hello_total = 4096;
  uint32_t max_pending_hello_per_uid = 256;
  double hello_timeout_seconds = 10;
  // SIGTERM: how long copies already queued may keep the daemon up (rpc/server.h Shutdown);
  // after it, queued chunks are cancelled and their requests answered UNAVAILABLE.
  double shutdown_grace_seconds = 10;
  // Links made on first use (one per unconfigured device id, each with its copy threads): a
  // Hello naming a new device id beyond this many gets RESOURCE_EXHAUSTED. 0 = no limit.
  uint32_t max_links = 64;
  // A session whose process exited while its stream lingers ends this long after the exit is
  // noticed (pidfd; or /proc polled every pid_poll_interval_seconds where pidfd_open is
  // unavailable). watch_pids false: only a broken stream ends a session.
  bool watch_pids = true;
  double pid_exit_grace_seconds = 2.0;
  double pid_poll_interval_seconds = 1.0;
  // Shared pool (arena with a block table): how long blocks adopted from the previous daemon
  // wait for their session to resume before they are freed.
  double resume_grace_seconds = 60;
  // Spill tier (issue 18): directory "" = none. main creates the tier (SpillTier::Create) from
  // these and hands it to the Core.
  spill::SpillOptions spill;
  // The time of everything below the RPC layer that reads or waits for time: sessions'
  // transfer times and deadlines, the links' pacing, the store (unless store.clock is set),
  // the pid watcher's grace and the hello timeout. Not owned, must outlive the Core; null =
  // base::Clock::Real(). Tests pass a base::FakeClock.
  base::Clock* clock = nullptr;
};

struct LinkInfo {
  std::string name;
  std::vector<std::string> gpus;
  // Half duplex: d2h holds the one scheduler's stats (both directions), h2d is empty.
  sched::LinkSchedulerStats d2h, h2d;
  double d2h_bytes_per_second = 0, h2d_bytes_per_second = 0;
  bool half_duplex = false;
  std::string parent;  // host link name; "" = none
  std::string uplink_bdf, root_port;
  int numa_node = -1;
  double pcie_bytes_per_second = 0;
  std::map<std::string, std::string> gpu_bus_ids;  // of the member GPUs that have one
  // Copy time of one offload when every GPU that offloaded over this link copies at once,
  // measured vs planned (capacity_planner's model: the link's rate divided among the GPUs that
  // share it, client/plan/planner.h). mean_offload_bytes = offload bytes / offloads started.
  // measured = mean_offload_bytes * gpus_offloading / (d2h bytes / d2h busy seconds);
  // planned = mean_offload_bytes * gpus_offloading / d2h capacity (0 when unpaced or idle).
  double mean_offload_bytes = 0;
  double measured_offload_copy_seconds = 0;
  double planned_offload_copy_seconds = 0;
};

struct HostLinkInfo {
  std::string name;
  std::vector<std::string> links;
  double d2h_bytes_per_second = 0, h2d_bytes_per_second = 0;
  sched::HostLinkStats d2h, h2d;
  int numa_node = -1;
};

struct SessionInfo {
  uint64_t session_id = 0;
  std::string client_name, device_id;
  uint32_t pid = 0;  // the peer's pid in the daemon's PID namespace (Hello's where unknown)
  bool peer_known = false;
  uint32_t uid = 0, gid = 0;  // the peer's, when known
  uint64_t blocks = 0, used_bytes = 0;
  uint64_t requests_in_flight = 0;
};

struct CoreStats {
  std::string backend;
  store::StoreStats store;
  uint64_t sessions_open = 0;
  uint64_t offload_bytes_total = 0, reload_bytes_total = 0;
  uint64_t offloads_total = 0, reloads_total = 0, errors_total = 0;
  double uptime_seconds = 0;
  uint64_t chunk_bytes = 0;
  std::vector<LinkInfo> links;  // configured and discovered ones, and those made on first use
  std::vector<HostLinkInfo> host_links;
  std::vector<SessionInfo> sessions;
  uint64_t uid_quota_bytes = 0, session_quota_bytes = 0;
  std::map<uint32_t, uint64_t> uid_used_bytes;  // uids holding pool space
  bool spill_enabled = false;
  spill::SpillStats spill;  // with spill_enabled
};

class Core {
 public:
  // `arena` and `engine` are owned by the Core.
  // `spill`: the spill tier over this arena (SpillTier::Create), or null for none.
  Core(CoreOptions options, std::unique_ptr<pool::Arena> arena,
       std::unique_ptr<copy::CopyEngine> engine,
       std::unique_ptr<spill::SpillTier> spill = nullptr);
  ~Core();  // Drain()

  // A half-duplex link has one scheduler: d2h and h2d point to it.
  struct Link {
    std::string name;
    std::shared_ptr<sched::LinkScheduler> d2h, h2d;
  };
  // The name of the link a GPU's copies use (config, else the GPU's own name).
  std::string LinkNameFor(const std::string& gpu) const;
  // Admits a session on `gpu` to its link in one step (so concurrent Hellos cannot pass
  // max_links together): OK when the link is configured, already in use or made, or when fewer
  // than max_links links are in use or made, or when a made link no session uses can be removed
  // to make room (its counters are dropped); then the session counts as a user of that link
  // until ReleaseLink. RESOURCE_EXHAUSTED naming max_links otherwise.
  absl::Status AcquireLink(const std::string& gpu);
  // Ends one AcquireLink of `gpu`. With `remove_if_unused` (Hello's transient_device), when
  // this was the link's last user, the link was made on first use (not configured or
  // discovered) and it has nothing queued or in flight, the link is removed with its metric
  // series, so a probe's device name (`offloadctl bench`) leaves nothing behind. A link any
  // session without the flag has used is never removed; a GPU's link otherwise persists (its counters stay continuous across jobs). Must not be called from a
  // transfer callback (it joins the link's workers).
  void ReleaseLink(const std::string& gpu, bool remove_if_unused);
  // The link a GPU's copies use, created on first use (so sessions that never copy, like
  // `offloadctl stats`, create none). Never null; call it only between AcquireLink and
  // ReleaseLink of that GPU.
  std::shared_ptr<Link> LinkFor(const std::string& gpu);

  store::BlockStore& store() { return store_; }
  copy::CopyEngine& engine() { return *engine_; }
  uint8_t* pool_base() const { return arena_->base(); }
  spill::SpillTier* spill() const { return spill_.get(); }  // null without a spill tier
  // What adoption found at start-up (empty without a shared pool or on a fresh one).
  const pool::AdoptionReport& adoption() const { return adoption_; }
  const CoreOptions& options() const { return options_; }
  base::Clock& clock() const { return *options_.clock; }  // options.clock, or the steady clock

  uint64_t NewSessionId() { return next_session_id_.fetch_add(1); }
  void AddSession(uint64_t id, std::weak_ptr<Session> session);
  void RemoveSession(uint64_t id);
  // Admission of a session at Hello against max_sessions and, for a peer with known credentials
  // that is not an admin (IsAdmin), against max_sessions_per_uid. OK, or RESOURCE_EXHAUSTED
  // naming the bound that is full; each OK is paired with ReleaseSessionSlot of the same peer.
  absl::Status TryOpenSessionSlot(const PeerCredentials& peer);
  void ReleaseSessionSlot(const PeerCredentials& peer);
  // A session stream awaiting its Hello: counted against max_pending_hello_total and, for a
  // non-admin peer with known credentials, max_pending_hello_per_uid (RESOURCE_EXHAUSTED naming
  // the bound that is full), and ended by EndSession(kHelloTimeout) once hello_timeout_seconds
  // pass. EndPendingHello (after a successful Hello, or when the session closes) releases it;
  // idempotent.
  absl::Status AdmitPendingHello(uint64_t session_id, const PeerCredentials& peer);
  void EndPendingHello(uint64_t session_id);
  size_t pending_hello() const;
  // Closes every open session (Hello done or not) with `cause` (Session::Close: queued chunks
  // cancelled, running ones waited for, unanswered requests answered); their streams stay open
  // to carry the answers. Returns how many were closed.
  size_t CloseSessions(EndCause cause);
  // Waits up to `seconds` for every accepted transfer to finish; true when none is left. Does
  // not stop accepting (see Drain).
  bool WaitTransfers(double seconds);
  // Stops accepting transfers (BeginTransfer fails from here on; queued offloads waiting for
  // space fail UNAVAILABLE). Drain() does this first.
  void StopAccepting();

  // Ends an open session from the daemon's side (an admin call; its process exited): releases
  // everything it holds and ends its stream with `status`. Returns what it held just before.
  // NOT_FOUND for an id that is not open.
  absl::StatusOr<SessionInfo> EndSession(uint64_t id, EndCause cause, const absl::Status& status);
  // Pid liveness of sessions (no-ops when options.watch_pids is false).
  void WatchPid(uint64_t session_id, int32_t pid);
  void UnwatchPid(uint64_t session_id);
  size_t pids_watched() const { return pid_watcher_ ? pid_watcher_->watched() : 0; }

  // Copies `bytes` between `host` and `region` at `region_offset` through the link of
  // `device_id` (made on first use, as for a session on that device), as one transfer of class
  // `cls`: cut into chunk_bytes chunks, paced, DRR-fair with the device's other traffic and
  // counted in the link's stats and metrics. Blocks until the last chunk has landed (or the
  // first fails: its status). For callers outside the session layer (main wires the projector
  // refresh service to it, class PROJECTOR). Errors: RESOURCE_EXHAUSTED naming max_links as
  // AcquireLink; UNAVAILABLE while draining; the engine's copy error. `engine` opened `region`
  // and must outlive the call. Not from a transfer callback.
  absl::Status CopyOverLink(const std::string& device_id, sched::TrafficClass cls,
                            copy::CopyEngine& engine, copy::Direction direction,
                            std::shared_ptr<copy::Region> region, uint64_t region_offset,
                            uint8_t* host, uint64_t bytes);

  // Cancels the queued transfers a session submitted to its GPU's link (both directions);
  // their done callbacks get `status`. No-op when that link was never created.
  void CancelTransfers(uint64_t session_id, const std::string& gpu, const absl::Status& status);

  // Transfer accounting; Drain waits for every accepted transfer to complete.
  // BeginTransfer fails (returns false) once draining has started.
  bool BeginTransfer();
  void EndTransfer();
  void CountTransfer(bool offload, uint64_t bytes, bool ok);
  void CountError() { errors_total_.fetch_add(1); }
  bool draining() const { return draining_.load(); }

  // Stops accepting transfers, waits for those accepted to finish (copies in flight complete,
  // completions are emitted), then stops the schedulers' workers. Idempotent.
  void Drain();

  CoreStats Stats();
  // Copies pool, session and link state into the Prometheus gauges/counters.
  void RefreshMetrics();

 private:
  // The spill tier's part of RefreshMetrics (tier bytes, disk traffic, losses).
  void RefreshSpillMetrics(const store::StoreStats& s);
  const CoreOptions options_;
  std::unique_ptr<pool::Arena> arena_;
  std::unique_ptr<copy::CopyEngine> engine_;
  std::unique_ptr<spill::SpillTier> spill_;  // before store_: the store uses it until destroyed
  store::BlockStore store_;
  const double start_seconds_;
  pool::AdoptionReport adoption_;
  // Store counters last exported (RefreshMetrics).
  uint64_t expired_reported_ = 0, resumed_reported_ = 0;

  // Host links exist from the start (links reference them); two per spec, null for a
  // direction without capacity.
  struct Host {
    const HostLinkSpec* spec;
    std::unique_ptr<sched::HostLink> d2h, h2d;
  };
  std::map<std::string, Host> hosts_;               // by host link name
  std::map<std::string, std::string> link_parent_;  // link name -> host link name

  std::mutex links_mu_;
  std::map<std::string, std::shared_ptr<Link>> links_;  // by link name
  std::map<std::string, uint32_t> link_users_;          // link name -> sessions admitted to it
  // Links in links_ used by a session without transient_device: never removed by a probe's
  // release (a subset of links_' keys; TakeIdleLinkLocked drops a name with its link).
  std::set<std::string> kept_links_;
  std::map<std::string, std::string> gpu_link_;         // gpu -> link name
  // Counter values last exported, by "link/direction" and "link/direction/gpu".
  std::map<std::string, sched::LinkSchedulerStats> reported_;
  std::map<std::string, uint64_t> gpu_reported_, misses_reported_;
  std::map<std::string, sched::HostLinkStats> host_reported_;

  const LinkSpec* FindSpec(const std::string& link_name) const;
  // Drops the exported series of a link removed by ReleaseLink; links_mu_ held.
  void ForgetLinkMetrics(const std::string& name);
  // Removes from links_ one link made on first use that no session uses and that has nothing
  // queued or in flight (its metric series go); null when there is none. links_mu_ held; the
  // caller shuts the returned link's workers down after releasing it.
  std::shared_ptr<Link> TakeIdleLinkLocked();
  // Takes the previous daemon's blocks from the shared pool (constructor).
  void Adopt();
  // Stats of one link, created or not; links_mu_ held.
  LinkInfo DescribeLink(const std::string& name, const Link* link) const;

  std::mutex sessions_mu_;
  std::map<uint64_t, std::weak_ptr<Session>> sessions_;
  std::atomic<uint64_t> next_session_id_{1};
  std::atomic<uint64_t> sessions_admitted_{0};
  std::mutex slots_mu_;                          // guards sessions_per_uid_
  std::map<uint32_t, uint32_t> sessions_per_uid_;  // open sessions of non-admin known peers
  std::unique_ptr<PidWatcher> pid_watcher_;  // null without watch_pids; reset first in ~Core

  // Streams awaiting Hello (AdmitPendingHello), and the thread that ends those past
  // hello_timeout_seconds (stopped first in ~Core).
  struct PendingHello {
    double deadline_seconds = 0;
    bool per_uid = false;  // counted in pending_per_uid_
    uint32_t uid = 0;
  };
  void HelloTimeoutLoop();
  void ErasePendingLocked(std::map<uint64_t, PendingHello>::iterator it);
  mutable std::mutex hello_mu_;
  std::condition_variable hello_cv_;
  bool hello_stop_ = false;
  std::map<uint64_t, PendingHello> pending_hello_;
  std::map<uint32_t, uint32_t> pending_per_uid_;
  std::thread hello_thread_;

  std::mutex transfers_mu_;
  std::condition_variable transfers_cv_;
  uint64_t transfers_in_flight_ = 0;
  std::atomic<bool> draining_{false};

  std::atomic<uint64_t> offload_bytes_total_{0}, reload_bytes_total_{0};
  std::atomic<uint64_t> offloads_total_{0}, reloads_total_{0}, errors_total_{0};
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_CORE_H_
