// What Core::Stats reports (GetStats, `offloadctl stats`, the scrape-time metrics): links and
// host links with their schedulers' counters, open sessions, store and spill figures. Plain
// structs; units in the field names.
#ifndef OFFLOADD_SERVER_SESSION_CORE_STATS_H_
#define OFFLOADD_SERVER_SESSION_CORE_STATS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "server/sched/host_link.h"
#include "server/sched/link_scheduler.h"
#include "server/spill/spill_tier.h"
#include "server/session/client_reports.h"
#include "server/session/request.h"
#include "server/store/block_store.h"

namespace offloadd::session {

struct LinkInfo {
  std::string name;
  std::vector<std::string> gpus;
  // Half duplex: d2h holds the one scheduler's stats (both directions), h2d is empty.
  sched::LinkSchedulerStats d2h, h2d;
  double d2h_bytes_per_second = 0, h2d_bytes_per_second = 0;  // the capacity paced at
  // Whether that capacity is a measured one (link_calibration.h), per direction.
  bool d2h_calibrated = false, h2d_calibrated = false;
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

// Link calibration (link_calibration.h): what one run measured and applied.
struct CalibratedGpu {
  std::string gpu;
  double d2h_bytes_per_second = 0, h2d_bytes_per_second = 0;  // alone; 0 = not measured
};

struct CalibratedLink {
  std::string name;
  std::vector<CalibratedGpu> gpus;  // each alone, in the link's order
  // All its GPUs at once (one GPU: its figures alone); 0 = not measured.
  double d2h_bytes_per_second = 0, h2d_bytes_per_second = 0;
  // What the link is paced at after this run, per direction (configured or measured; 0 =
  // unpaced), and whether the config gives that direction's capacity.
  double paced_d2h_bytes_per_second = 0, paced_h2d_bytes_per_second = 0;
  bool d2h_configured = false, h2d_configured = false;
  bool half_duplex = false;
  std::string error;  // "" when measured; else why not (the link kept its previous capacity)
  double measured_at_unix_seconds = 0;  // when this run measured it (wall clock)
  double seconds = 0;                   // time its measurement took
};

struct LinkCalibrationReport {
  double started_at_unix_seconds = 0;  // 0: no calibration has run
  double seconds = 0;                  // how long the run took
  double budget_seconds = 0;
  std::vector<CalibratedLink> links;   // the links measured (or tried), in config order
  std::string note;                    // when nothing was measured: why
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
  ClientCounters client_report;  // the client's latest report (zero before one)
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
  // Clients' reports summed by device id over the daemon's lifetime (every session's increase
  // between its reports; sessions that ended included).
  std::map<std::string, ClientCounters> client_reports_by_gpu;
  // The same by (device id, uid of the reporting sessions): the metrics' series.
  std::map<ReportSeries, ClientCounters> client_reports_by_series;
  uint64_t uid_quota_bytes = 0, session_quota_bytes = 0;
  std::map<uint32_t, uint64_t> uid_used_bytes;  // uids holding pool space
  bool spill_enabled = false;
  spill::SpillStats spill;  // with spill_enabled
  // The last link calibration, and per link its latest successful measurement.
  LinkCalibrationReport link_calibration;
  std::vector<CalibratedLink> calibrated_links;
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_CORE_STATS_H_
