// The options a Core is built from (main fills them from the DaemonConfig, config.cc
// ToCoreOptions): links and host links, scheduling, admission bounds, pid watching, the shared
// pool's resume grace and the spill tier. Plain structs, no behaviour.
#ifndef OFFLOADD_SERVER_SESSION_CORE_OPTIONS_H_
#define OFFLOADD_SERVER_SESSION_CORE_OPTIONS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "server/session/peer.h"
#include "server/spill/spill_tier.h"
#include "server/store/block_store.h"

namespace offloadd::copy {
class CopyRateMeter;
}

namespace offloadd::session {

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

// Link calibration (link_calibration.h): links without a configured capacity are paced at what
// their GPUs measured together.
struct LinkCalibrationOptions {
  // Measure once at start-up (main calls Core::CalibrateLinks before serving; config
  // link_calibration). Either way `offloadctl calibrate-links` measures on demand.
  bool at_start = false;
  double budget_seconds = 5;  // per calibration, everything included (> 0)
  // The backend's meter (copy/cuda/cuda_rate_meter.h), not owned, must outlive the Core; null: the
  // backend has no copy hardware to measure (shm), and calibration is refused.
  copy::CopyRateMeter* meter = nullptr;
};

struct CoreOptions {
  // What Stats call the backend (config `backend`: "cuda-sim" for the timing model, whose engine
  // is the cuda one); empty = the engine's name. HelloReply keeps the engine's name, which tells
  // clients the kind of regions to register.
  std::string backend_label;
  uint64_t chunk_bytes = 8ull << 20;
  uint32_t copy_threads = 2;  // per link and direction
  // Chunks posted per GPU and direction when the engine is asynchronous.
  uint32_t max_chunks_in_flight_per_gpu = 2;
  store::BlockStoreOptions store;
  std::vector<LinkSpec> links;
  // A GPU not named in `links` gets a link of its own, named after it, at this rate.
  double default_link_bytes_per_second = 0;
  LinkCalibrationOptions link_calibration;
  std::map<std::string, uint32_t> gpu_weights;     // DRR weights, default 1
  std::vector<HostLinkSpec> host_links;            // each link under at most one
  double offload_min_share = 0.2;                  // see sched/drr.h
  std::map<std::string, std::string> gpu_bus_ids;  // device id -> PCI address, for stats
  // Device id -> NUMA node of the GPU (sched::TopologyGpu; GPUs of unknown node left out). A
  // session's offloads go to its GPU's node's slice when the arena is sliced (README
  // Configuration, numa_placement); a GPU not named here places as "unknown_node".
  std::map<std::string, int> gpu_numa_nodes;

  // Isolation and failure handling (docs/failure-modes.md).
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
  // Request rings (rpc/ring_frontend.h): a ring thread's timed polls for a second after its
  // last work; clients defer their wake-ups meanwhile. 0 = none.
  double ring_poll_seconds = 0.0005;
  // Shared pool only (config pool_data_checksums): CRC32C of each offloaded block's data in its
  // record, and adopted blocks' data checked against it at start-up (pool/block_table.h).
  bool pool_data_checksums = false;
  // Spill tier: directory "" = none. main creates the tier (SpillTier::Create) from
  // these and hands it to the Core.
  spill::SpillOptions spill;
  // The time of everything below the RPC layer that reads or waits for time: sessions'
  // transfer times and deadlines, the links' pacing, the store (unless store.clock is set),
  // the pid watcher's grace and the hello timeout. Not owned, must outlive the Core; null =
  // base::Clock::Real() (the Core fills it in). Tests pass a base::FakeClock.
  base::Clock* clock = nullptr;
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_CORE_OPTIONS_H_
