#include "server/session/link_table.h"

#include <array>

#include "absl/strings/str_format.h"
#include "server/copy/cuda/cuda_api.h"
#include "server/metrics/metrics.h"

namespace offloadd::session {
namespace {

// A transfer queued or a chunk in flight in either direction.
bool LinkBusy(const LinkTable::Link& link) {
  const sched::LinkSchedulerStats d2h = link.d2h->stats();
  const sched::LinkSchedulerStats h2d = link.h2d->stats();
  return d2h.queued_transfers + d2h.chunks_in_flight + h2d.queued_transfers +
             h2d.chunks_in_flight >
         0;
}

void ShutdownLink(const LinkTable::Link& link) {
  link.d2h->Shutdown();
  if (link.h2d != link.d2h) link.h2d->Shutdown();
}

}  // namespace

LinkTable::LinkTable(const CoreOptions& options, const TransferGate& gate)
    : options_(options), gate_(gate) {
  for (const LinkSpec& spec : options_.links) {
    for (const std::string& gpu : spec.gpus) gpu_link_[copy::NormalizeGpuUuid(gpu)] = spec.name;
  }
  for (const HostLinkSpec& spec : options_.host_links) {
    Host& host = hosts_[spec.name];
    host.spec = &spec;
    auto make = [&](const char* direction, double rate) -> std::unique_ptr<sched::HostLink> {
      if (rate <= 0) return nullptr;
      sched::HostLinkOptions o;
      o.name = spec.name;
      o.direction = direction;
      o.bytes_per_second = rate;
      o.quantum_bytes = options_.chunk_bytes;
      return std::make_unique<sched::HostLink>(o, options_.clock);
    };
    host.d2h = make("d2h", spec.d2h_bytes_per_second);
    host.h2d = make("h2d", spec.h2d_bytes_per_second);
    for (const std::string& link : spec.links) link_parent_[link] = spec.name;
  }
}

LinkTable::~LinkTable() { Clear(); }

const LinkSpec* LinkTable::FindSpec(const std::string& link_name) const {
  for (const LinkSpec& spec : options_.links) {
    if (spec.name == link_name) return &spec;
  }
  return nullptr;
}

std::string LinkTable::LinkNameFor(const std::string& gpu) const {
  // A UUID in any spelling (case, "GPU-" or not), as the cuda engine finds a session's device.
  auto named = gpu_link_.find(copy::NormalizeGpuUuid(gpu));
  return named != gpu_link_.end() ? named->second : gpu;
}

std::shared_ptr<LinkTable::Link> LinkTable::TakeIdleLinkLocked() {
  for (auto it = links_.begin(); it != links_.end(); ++it) {
    const std::string& name = it->first;
    if (link_users_.count(name) != 0 || FindSpec(name) != nullptr || LinkBusy(*it->second)) {
      continue;
    }
    std::shared_ptr<Link> idle = std::move(it->second);
    kept_links_.erase(name);
    ForgetLinkMetrics(name);
    links_.erase(it);
    return idle;
  }
  return nullptr;
}

absl::Status LinkTable::Acquire(const std::string& gpu) {
  std::shared_ptr<Link> evicted;
  {
    base::MutexLock lock(links_mu_);
    const std::string name = LinkNameFor(gpu);
    const bool known = links_.count(name) != 0 || link_users_.count(name) != 0 ||
                       FindSpec(name) != nullptr;
    if (!known && options_.max_links > 0) {
      size_t in_use = links_.size();
      for (const auto& [user_link, users] : link_users_) in_use += links_.count(user_link) == 0;
      // A link no session uses any more makes room (its counters go): otherwise device ids of
      // sessions long ended would refuse every new GPU until the daemon restarts.
      if (in_use >= options_.max_links) {
        evicted = TakeIdleLinkLocked();
        if (evicted == nullptr) {
          return absl::ResourceExhaustedError(absl::StrFormat(
              "offloadd already schedules %d links (max_links) for sessions open now: "
              "device_id \"%s\" would add one; use the GPU's stable id (its UUID)",
              options_.max_links, gpu));
        }
      }
    }
    ++link_users_[name];
  }
  // Stop the evicted link's workers outside links_mu_: Shutdown joins threads.
  if (evicted != nullptr) ShutdownLink(*evicted);
  return absl::OkStatus();
}

bool LinkTable::Release(const std::string& gpu, bool remove_if_unused) {
  std::shared_ptr<Link> removed;
  {
    base::MutexLock lock(links_mu_);
    const std::string name = LinkNameFor(gpu);
    auto users = link_users_.find(name);
    if (users == link_users_.end()) return false;
    // A link a training session (no transient_device) used is never removed: a probe naming
    // the same device later must not drop that GPU's counters.
    // Only a link that exists is remembered, so the set stays within links_ (max_links): a
    // Hello naming a fresh device id and failing (e.g. a forged resume token) left its name
    // here for good, ~390 bytes each, without bound.
    if (!remove_if_unused && links_.count(name) != 0) kept_links_.insert(name);
    if (--users->second > 0) return false;
    link_users_.erase(users);
    if (!remove_if_unused || kept_links_.count(name) != 0 || FindSpec(name) != nullptr) {
      return false;
    }
    auto it = links_.find(name);
    if (it == links_.end()) return true;  // it never copied: no link was made
    // Busy: a later Acquire/Release of this name retries; the link stays usable.
    if (LinkBusy(*it->second)) return false;
    removed = std::move(it->second);
    links_.erase(it);
    ForgetLinkMetrics(name);
  }
  // Stop the workers outside links_mu_: Shutdown joins threads.
  ShutdownLink(*removed);
  return true;
}

void LinkTable::ForgetLinkMetrics(const std::string& name) const {
  // The link's other series are read from its schedulers at scrape time and go with it.
  auto& waits = *metrics::Get().link_queue_wait_seconds;
  for (const char* dir : {"d2h", "h2d", "both"}) {
    for (int c = 0; c < sched::kNumClasses; ++c) {
      const prometheus::Labels labels{
          {"link", name},
          {"direction", dir},
          {"class", sched::TrafficClassName(static_cast<sched::TrafficClass>(c))}};
      if (waits.Has(labels)) waits.Remove(&waits.Add(labels, metrics::DurationBuckets()));
    }
  }
}

LinkTable::Capacity LinkTable::CapacityOf(const std::string& name) const {
  Capacity c;
  c.d2h = c.h2d = options_.default_link_bytes_per_second;
  if (const LinkSpec* spec = FindSpec(name)) {
    c.d2h = spec->d2h_bytes_per_second;
    c.h2d = spec->h2d_bytes_per_second;
  }
  auto measured = calibrated_.find(name);
  if (measured != calibrated_.end()) {
    if (c.d2h <= 0 && measured->second.first > 0) {
      c.d2h = measured->second.first;
      c.d2h_calibrated = true;
    }
    if (c.h2d <= 0 && measured->second.second > 0) {
      c.h2d = measured->second.second;
      c.h2d_calibrated = true;
    }
  }
  return c;
}

void LinkTable::SetCalibratedCapacity(const std::string& name, double d2h_bytes_per_second,
                                      double h2d_bytes_per_second) {
  base::MutexLock lock(links_mu_);
  std::pair<double, double>& c = calibrated_[name];
  if (d2h_bytes_per_second > 0) c.first = d2h_bytes_per_second;
  if (h2d_bytes_per_second > 0) c.second = h2d_bytes_per_second;
  auto it = links_.find(name);
  if (it == links_.end()) return;
  const Capacity now = CapacityOf(name);
  it->second->d2h->SetBytesPerSecond(now.d2h);
  if (it->second->h2d != it->second->d2h) it->second->h2d->SetBytesPerSecond(now.h2d);
}

std::shared_ptr<LinkTable::Link> LinkTable::MakeLink(const std::string& name) const {
  const Capacity capacity = CapacityOf(name);
  const double d2h = capacity.d2h, h2d = capacity.h2d;
  bool half_duplex = false;
  if (const LinkSpec* spec = FindSpec(name)) half_duplex = spec->half_duplex;
  const Host* host = nullptr;
  if (auto p = link_parent_.find(name); p != link_parent_.end()) host = &hosts_.at(p->second);
  auto make = [&](const char* direction, double rate, sched::HostLink* parent) {
    sched::LinkSchedulerOptions o;
    o.link_name = name;
    o.direction = direction;
    o.chunk_bytes = options_.chunk_bytes;
    o.quantum_bytes = options_.chunk_bytes;
    o.worker_threads = options_.copy_threads;
    o.max_chunks_in_flight_per_gpu = options_.max_chunks_in_flight_per_gpu;
    o.bytes_per_second = rate;
    o.offload_min_share = options_.offload_min_share;
    o.gpu_weights = options_.gpu_weights;
    o.parent = parent;
    std::array<prometheus::Histogram*, sched::kNumClasses> waits;
    for (int c = 0; c < sched::kNumClasses; ++c) {
      waits[c] = &metrics::Get().link_queue_wait_seconds->Add(
          {{"link", name},
           {"direction", direction},
           {"class", sched::TrafficClassName(static_cast<sched::TrafficClass>(c))}},
          metrics::DurationBuckets());
    }
    o.on_queue_wait = [waits](sched::TrafficClass c, double seconds) {
      waits[static_cast<int>(c)]->Observe(seconds);
    };
    return std::make_shared<sched::LinkScheduler>(o, options_.clock);
  };
  auto link = std::make_shared<Link>();
  link->name = name;
  if (half_duplex) {
    link->d2h = make("both", d2h, host ? host->d2h.get() : nullptr);
    link->h2d = link->d2h;
  } else {
    link->d2h = make("d2h", d2h, host ? host->d2h.get() : nullptr);
    link->h2d = make("h2d", h2d, host ? host->h2d.get() : nullptr);
  }
  return link;
}

std::shared_ptr<LinkTable::Link> LinkTable::LinkFor(const std::string& gpu) {
  base::MutexLock lock(links_mu_);
  const std::string name = LinkNameFor(gpu);
  auto it = links_.find(name);
  if (it != links_.end()) return it->second;
  std::shared_ptr<Link> link = MakeLink(name);
  links_[name] = link;
  if (gate_.stopped()) ShutdownLink(*link);
  return link;
}

void LinkTable::CancelTransfers(uint64_t owner, const std::string& gpu,
                                const absl::Status& status) {
  std::shared_ptr<sched::LinkScheduler> d2h, h2d;
  {
    base::MutexLock lock(links_mu_);
    auto it = links_.find(LinkNameFor(gpu));
    if (it == links_.end()) return;
    d2h = it->second->d2h;
    h2d = it->second->h2d;
  }
  d2h->CancelOwner(owner, status);
  if (h2d != d2h) h2d->CancelOwner(owner, status);
}

void LinkTable::Shutdown() {
  base::MutexLock lock(links_mu_);
  for (auto& [name, link] : links_) ShutdownLink(*link);
}

void LinkTable::Clear() {
  std::map<std::string, std::shared_ptr<Link>> links;
  {
    base::MutexLock lock(links_mu_);
    links.swap(links_);
  }
  links.clear();  // outside links_mu_: a transfer's callbacks may hold the last Session
}

LinkInfo LinkTable::DescribeLink(const std::string& name, const Link* link) const {
  LinkInfo info;
  info.name = name;
  const Capacity capacity = CapacityOf(name);
  info.d2h_bytes_per_second = capacity.d2h;
  info.h2d_bytes_per_second = capacity.h2d;
  info.d2h_calibrated = capacity.d2h_calibrated;
  info.h2d_calibrated = capacity.h2d_calibrated;
  if (const LinkSpec* spec = FindSpec(name)) {
    info.gpus = spec->gpus;
    info.half_duplex = spec->half_duplex;
    info.uplink_bdf = spec->uplink_bdf;
    info.root_port = spec->root_port;
    info.numa_node = spec->numa_node;
    info.pcie_bytes_per_second = spec->pcie_bytes_per_second;
  } else {
    info.gpus.push_back(name);  // a GPU's default link, named after it
  }
  if (auto p = link_parent_.find(name); p != link_parent_.end()) info.parent = p->second;
  for (const std::string& g : info.gpus) {
    auto b = options_.gpu_bus_ids.find(g);
    if (b != options_.gpu_bus_ids.end()) info.gpu_bus_ids[g] = b->second;
  }
  if (link != nullptr) {
    info.d2h = link->d2h->stats();
    if (!info.half_duplex) info.h2d = link->h2d->stats();
  }
  const int offload = static_cast<int>(sched::TrafficClass::kOffload);
  const uint64_t offloads = info.d2h.started_transfers[offload];
  uint64_t gpus_offloading = 0;
  for (const auto& [gpu, bytes] : info.d2h.gpu_bytes) gpus_offloading += bytes > 0 ? 1 : 0;
  if (offloads > 0 && gpus_offloading > 0) {
    info.mean_offload_bytes = static_cast<double>(info.d2h.class_bytes[offload]) / offloads;
    const double per_layer_all = info.mean_offload_bytes * gpus_offloading;
    if (info.d2h.busy_seconds > 0 && info.d2h.bytes > 0) {
      info.measured_offload_copy_seconds = per_layer_all * info.d2h.busy_seconds / info.d2h.bytes;
    }
    if (info.d2h_bytes_per_second > 0) {
      info.planned_offload_copy_seconds = per_layer_all / info.d2h_bytes_per_second;
    }
  }
  return info;
}

std::vector<LinkInfo> LinkTable::DescribeLinks() {
  std::vector<LinkInfo> out;
  base::MutexLock lock(links_mu_);
  for (const LinkSpec& spec : options_.links) {
    auto it = links_.find(spec.name);
    out.push_back(DescribeLink(spec.name, it == links_.end() ? nullptr : it->second.get()));
  }
  for (auto& [name, link] : links_) {
    if (FindSpec(name) == nullptr) out.push_back(DescribeLink(name, link.get()));
  }
  return out;
}

std::vector<HostLinkInfo> LinkTable::DescribeHostLinks() const {
  std::vector<HostLinkInfo> out;
  for (const HostLinkSpec& spec : options_.host_links) {
    const Host& host = hosts_.at(spec.name);
    HostLinkInfo info;
    info.name = spec.name;
    info.links = spec.links;
    info.d2h_bytes_per_second = spec.d2h_bytes_per_second;
    info.h2d_bytes_per_second = spec.h2d_bytes_per_second;
    info.numa_node = spec.numa_node;
    if (host.d2h) info.d2h = host.d2h->stats();
    if (host.h2d) info.h2d = host.h2d->stats();
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace offloadd::session
