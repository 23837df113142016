// LinkTable: the daemon's links (one sched::LinkScheduler per link and direction, one for both
// on a half-duplex link) and the host links above them. Links are admitted at Hello (Acquire:
// max_links accounting), made on a GPU's first copy (LinkFor) and, for a probe's device
// (Hello's transient_device), removed at its last user's Release. Thread-safe; one mutex
// (links_mu_), taken before a scheduler's mutex, never while calling back into a session.
#ifndef OFFLOADD_SERVER_SESSION_LINK_TABLE_H_
#define OFFLOADD_SERVER_SESSION_LINK_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/mutex.h"
#include "server/sched/host_link.h"
#include "server/sched/link_scheduler.h"
#include "server/session/core_options.h"
#include "server/session/core_stats.h"
#include "server/session/transfer_gate.h"

namespace offloadd::session {

class LinkTable {
 public:
  // A half-duplex link has one scheduler: d2h and h2d point to it.
  struct Link {
    std::string name;
    std::shared_ptr<sched::LinkScheduler> d2h, h2d;
  };

  // Makes the host links of `options.host_links` (links are made on use). `options` and `gate`
  // must outlive the table; a link made once `gate` stopped accepting starts shut down.
  LinkTable(const CoreOptions& options, const TransferGate& gate);
  ~LinkTable();  // Clear()

  // The name of the link a GPU's copies use (config, a UUID matched in any spelling, else the
  // GPU's own name).
  std::string LinkNameFor(const std::string& gpu) const;
  // Admits a session on `gpu` to its link in one step (so concurrent Hellos cannot pass
  // max_links together): OK when the link is configured, already in use or made, or when fewer
  // than max_links links are in use or made, or when a made link no session uses can be removed
  // to make room (its counters are dropped); then the session counts as a user of that link
  // until Release. RESOURCE_EXHAUSTED naming max_links otherwise.
  absl::Status Acquire(const std::string& gpu) EXCLUDES(links_mu_);
  // Ends one Acquire of `gpu`. With `remove_if_unused` (Hello's transient_device), when this
  // was the link's last user, the link was made on first use (not configured or discovered) and
  // it has nothing queued or in flight, the link is removed with its queue-wait series, so a
  // probe's device name (`offloadctl bench`) leaves nothing behind. A link any session without
  // the flag has used is never removed; a GPU's link otherwise persists (its counters stay
  // continuous across jobs). Must not be called from a transfer callback (it joins the link's
  // workers). True when the device is forgotten: `remove_if_unused`, this was its last user,
  // no session without the flag used its link, and the link (if one was made) was removed; the
  // caller then drops the device's other series.
  bool Release(const std::string& gpu, bool remove_if_unused) EXCLUDES(links_mu_);
  // The link a GPU's copies use, created on first use (so sessions that never copy, like
  // `offloadctl stats`, create none). Never null; call it only between Acquire and Release of
  // that GPU.
  std::shared_ptr<Link> LinkFor(const std::string& gpu) EXCLUDES(links_mu_);
  // Cancels the queued transfers `owner` submitted to `gpu`'s link (both directions); their
  // done callbacks get `status` on this thread. No-op when that link was never made.
  void CancelTransfers(uint64_t owner, const std::string& gpu, const absl::Status& status)
      EXCLUDES(links_mu_);

  // Paces link `name` at a measured capacity (session/link_calibration.h) in each direction
  // whose configured capacity is 0 (a configured one always wins): from its next chunk when the
  // link is made, else from when it is made. A rate <= 0 leaves that direction as it is. A
  // half-duplex link's one scheduler takes `d2h_bytes_per_second`.
  void SetCalibratedCapacity(const std::string& name, double d2h_bytes_per_second,
                             double h2d_bytes_per_second) EXCLUDES(links_mu_);

  // Stops every link's workers (each finishes the chunk it copies; nothing queued is left
  // when the gate's transfers are done). Idempotent.
  void Shutdown() EXCLUDES(links_mu_);
  // Destroys the links (and the transfers they still hold) after Shutdown.
  void Clear() EXCLUDES(links_mu_);

  // Configured and discovered links first (in config order, made or not), then the links made
  // on first use; each with its schedulers' counters.
  std::vector<LinkInfo> DescribeLinks() EXCLUDES(links_mu_);
  std::vector<HostLinkInfo> DescribeHostLinks() const;

 private:
  // Host links exist from the start (links reference them); two per spec, null for a direction
  // without capacity.
  struct Host {
    const HostLinkSpec* spec;
    std::unique_ptr<sched::HostLink> d2h, h2d;
  };

  const LinkSpec* FindSpec(const std::string& link_name) const;
  // The capacities a link is paced at: configured (LinkSpec, or the default link rate for a
  // GPU's own link) where > 0, else calibrated, else 0 (unpaced). `calibrated` says, per
  // direction, whether the measured one applies.
  struct Capacity {
    double d2h = 0, h2d = 0;
    bool d2h_calibrated = false, h2d_calibrated = false;
  };
  Capacity CapacityOf(const std::string& name) const REQUIRES(links_mu_);
  std::shared_ptr<Link> MakeLink(const std::string& name) const REQUIRES(links_mu_);
  // Removes from links_ one link made on first use that no session uses and that has nothing
  // queued or in flight (its series go); null when there is none. links_mu_ held; the caller
  // shuts the returned link's workers down after releasing it.
  std::shared_ptr<Link> TakeIdleLinkLocked() REQUIRES(links_mu_);
  // Drops the queue-wait histograms of a removed link; links_mu_ held.
  void ForgetLinkMetrics(const std::string& name) const REQUIRES(links_mu_);
  // Stats of one link, made or not; links_mu_ held.
  LinkInfo DescribeLink(const std::string& name, const Link* link) const REQUIRES(links_mu_);

  const CoreOptions& options_;
  const TransferGate& gate_;
  std::map<std::string, Host> hosts_;               // by host link name; fixed after the ctor
  std::map<std::string, std::string> link_parent_;  // link name -> host link name; fixed
  // gpu (copy::NormalizeGpuUuid) -> configured link name; fixed
  std::map<std::string, std::string> gpu_link_;

  base::Mutex links_mu_;
  std::map<std::string, std::shared_ptr<Link>> links_ GUARDED_BY(links_mu_);  // by link name
  // Link name -> sessions admitted to it.
  std::map<std::string, uint32_t> link_users_ GUARDED_BY(links_mu_);
  // Links in links_ used by a session without transient_device: never removed by a probe's
  // release (a subset of links_' keys; TakeIdleLinkLocked drops a name with its link).
  std::set<std::string> kept_links_ GUARDED_BY(links_mu_);
  // Link name -> measured capacity (d2h, h2d; 0 = none), from SetCalibratedCapacity.
  std::map<std::string, std::pair<double, double>> calibrated_ GUARDED_BY(links_mu_);
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_LINK_TABLE_H_
