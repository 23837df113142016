#include "server/session/core.h"

#include <array>
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "server/metrics/metrics.h"
#include "server/session/session.h"

namespace offloadd::session {
namespace {
// `options` with the clock defaulted to the steady clock and handed to the store.
CoreOptions WithClock(CoreOptions options) {
  if (options.clock == nullptr) options.clock = base::Clock::Real();
  if (options.store.clock == nullptr) options.store.clock = options.clock;
  return options;
}
}  // namespace

Core::Core(CoreOptions options, std::unique_ptr<pool::Arena> arena,
           std::unique_ptr<copy::CopyEngine> engine, std::unique_ptr<spill::SpillTier> spill)
    : options_(WithClock(std::move(options))),
      arena_(std::move(arena)),
      engine_(std::move(engine)),
      spill_(std::move(spill)),
      store_(arena_->size_bytes(), options_.store, arena_->block_table(), spill_.get()),
      start_seconds_(options_.clock->NowSeconds()) {
  if (arena_->block_table() != nullptr && arena_->adopted()) Adopt();
  for (const LinkSpec& spec : options_.links) {
    for (const std::string& gpu : spec.gpus) gpu_link_[gpu] = spec.name;
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
  metrics::Get()
      .pool_capacity_bytes->Add({{"numa_node", metrics::NumaNodeLabel(arena_->numa_node())}})
      .Set(static_cast<double>(store_.capacity_bytes()));
  if (options_.hello_timeout_seconds > 0) {
    hello_thread_ = std::thread([this] { HelloTimeoutLoop(); });
  }
  if (options_.watch_pids) {
    pid_watcher_ = std::make_unique<PidWatcher>(
        options_.pid_exit_grace_seconds, options_.pid_poll_interval_seconds, [this](uint64_t id) {
          (void)EndSession(id, EndCause::kPidExited,
                           absl::AbortedError("the client process exited while its session "
                                              "stream was still open (a child process holds "
                                              "the connection?): offloadd ended the session"));
        },
        /*force_proc_polling=*/false, options_.clock);
  }
}

void Core::Adopt() {
  adoption_ = arena_->block_table()->Adopt();
  const uint64_t adopted = store_.Adopt(adoption_.blocks, options_.resume_grace_seconds);
  store_.MarkLost(adoption_.dropped_blocks);
  auto& m = metrics::Get();
  m.adopted_blocks_total->Increment(static_cast<double>(adopted));
  for (int r = 0; r < pool::kNumDropReasons; ++r) {
    m.adoption_dropped_blocks_total
        ->Add({{"reason", pool::DropReasonName(static_cast<pool::DropReason>(r))}})
        .Increment(static_cast<double>(adoption_.dropped[r]));
  }
  if (adopted < adoption_.blocks.size()) {
    m.adoption_dropped_blocks_total->Add({{"reason", "extent"}})
        .Increment(static_cast<double>(adoption_.blocks.size() - adopted));
  }
  LOG(INFO) << "adopted " << adopted << " blocks from the previous daemon's pool ("
            << adoption_.dropped_total() << " records dropped); they wait "
            << options_.resume_grace_seconds << " s for their sessions to resume";
}

const LinkSpec* Core::FindSpec(const std::string& link_name) const {
  for (const LinkSpec& spec : options_.links) {
    if (spec.name == link_name) return &spec;
  }
  return nullptr;
}

Core::~Core() {
  {
    std::lock_guard<std::mutex> lock(hello_mu_);
    hello_stop_ = true;
  }
  hello_cv_.notify_all();
  if (hello_thread_.joinable()) hello_thread_.join();  // no EndSession from it past this point
  pid_watcher_.reset();  // no EndSession from its thread past this point
  Drain();
  // Destroy the schedulers (and the transfers they still reference, whose callbacks may hold
  // the last reference to a Session) while the session registry they call back into exists.
  std::map<std::string, std::shared_ptr<Link>> links;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    links.swap(links_);
  }
  links.clear();
}

std::string Core::LinkNameFor(const std::string& gpu) const {
  auto named = gpu_link_.find(gpu);
  return named != gpu_link_.end() ? named->second : gpu;
}

std::shared_ptr<Core::Link> Core::TakeIdleLinkLocked() {
  for (auto it = links_.begin(); it != links_.end(); ++it) {
    const std::string& name = it->first;
    if (link_users_.count(name) != 0 || FindSpec(name) != nullptr) continue;
    const sched::LinkSchedulerStats d2h = it->second->d2h->stats();
    const sched::LinkSchedulerStats h2d = it->second->h2d->stats();
    if (d2h.queued_transfers + d2h.chunks_in_flight + h2d.queued_transfers +
            h2d.chunks_in_flight > 0) {
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

absl::Status Core::AcquireLink(const std::string& gpu) {
  std::shared_ptr<Link> evicted;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
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
  if (evicted != nullptr) {
    evicted->d2h->Shutdown();
    if (evicted->h2d != evicted->d2h) evicted->h2d->Shutdown();
  }
  return absl::OkStatus();
}

void Core::ReleaseLink(const std::string& gpu, bool remove_if_unused) {
  std::shared_ptr<Link> removed;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    const std::string name = LinkNameFor(gpu);
    auto users = link_users_.find(name);
    if (users == link_users_.end()) return;
    // A link a training session (no transient_device) used is never removed: a probe naming
    // the same device later must not drop that GPU's counters.
    // Only a link that exists is remembered, so the set stays within links_ (max_links): a
    // Hello naming a fresh device id and failing (e.g. a forged resume token) left its name
    // here for good, ~390 bytes each, without bound.
    if (!remove_if_unused && links_.count(name) != 0) kept_links_.insert(name);
    if (--users->second > 0) return;
    link_users_.erase(users);
    if (!remove_if_unused || kept_links_.count(name) != 0) return;
    auto it = links_.find(name);
    if (it == links_.end() || FindSpec(name) != nullptr) return;
    const sched::LinkSchedulerStats d2h = it->second->d2h->stats();
    const sched::LinkSchedulerStats h2d = it->second->h2d->stats();
    if (d2h.queued_transfers + d2h.chunks_in_flight + h2d.queued_transfers +
            h2d.chunks_in_flight > 0) {
      return;  // a later Acquire/Release of this name retries; the link stays usable
    }
    removed = std::move(it->second);
    links_.erase(it);
    ForgetLinkMetrics(name);
  }
  // Stop the workers outside links_mu_: Shutdown joins threads.
  removed->d2h->Shutdown();
  removed->h2d->Shutdown();
}

void Core::ForgetLinkMetrics(const std::string& name) {
  auto& m = metrics::Get();
  for (const char* dir : {"d2h", "h2d", "both"}) {
    const std::string key = absl::StrCat(name, "/", dir);
    if (reported_.erase(key) == 0) continue;
    prometheus::Labels labels{{"link", name}, {"direction", dir}};
    m.link_capacity_bytes_per_second->Remove(&m.link_capacity_bytes_per_second->Add(labels));
    m.link_busy_seconds_total->Remove(&m.link_busy_seconds_total->Add(labels));
    m.link_bytes_total->Remove(&m.link_bytes_total->Add(labels));
    m.link_queued_transfers->Remove(&m.link_queued_transfers->Add(labels));
    m.link_chunks_in_flight->Remove(&m.link_chunks_in_flight->Add(labels));
    for (int c = 0; c < sched::kNumClasses; ++c) {
      prometheus::Labels l = labels;
      l["class"] = sched::TrafficClassName(static_cast<sched::TrafficClass>(c));
      m.link_queue_wait_seconds->Remove(
          &m.link_queue_wait_seconds->Add(l, metrics::DurationBuckets()));
    }
    const std::string prefix = key + "/";
    for (auto it = gpu_reported_.lower_bound(prefix);
         it != gpu_reported_.end() && it->first.rfind(prefix, 0) == 0;) {
      const std::string gpu = it->first.substr(prefix.size());
      m.link_gpu_bytes_total->Remove(
          &m.link_gpu_bytes_total->Add({{"link", name}, {"direction", dir}, {"gpu", gpu}}));
      m.reload_deadline_misses_total->Remove(
          &m.reload_deadline_misses_total->Add({{"gpu", gpu}, {"link", name}}));
      misses_reported_.erase(it->first);
      it = gpu_reported_.erase(it);
    }
  }
}

std::shared_ptr<Core::Link> Core::LinkFor(const std::string& gpu) {
  std::lock_guard<std::mutex> lock(links_mu_);
  const std::string name = LinkNameFor(gpu);
  auto it = links_.find(name);
  if (it != links_.end()) return it->second;
  double d2h = options_.default_link_bytes_per_second;
  double h2d = options_.default_link_bytes_per_second;
  bool half_duplex = false;
  if (const LinkSpec* spec = FindSpec(name)) {
    d2h = spec->d2h_bytes_per_second;
    h2d = spec->h2d_bytes_per_second;
    half_duplex = spec->half_duplex;
  }
  const Host* host = nullptr;
  if (auto p = link_parent_.find(name); p != link_parent_.end()) host = &hosts_.at(p->second);
  auto link = std::make_shared<Link>();
  link->name = name;
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
  if (half_duplex) {
    link->d2h = make("both", d2h, host ? host->d2h.get() : nullptr);
    link->h2d = link->d2h;
  } else {
    link->d2h = make("d2h", d2h, host ? host->d2h.get() : nullptr);
    link->h2d = make("h2d", h2d, host ? host->h2d.get() : nullptr);
  }
  links_[name] = link;
  if (draining_) {
    link->d2h->Shutdown();
    link->h2d->Shutdown();
  }
  return link;
}

void Core::CancelTransfers(uint64_t session_id, const std::string& gpu,
                           const absl::Status& status) {
  std::shared_ptr<sched::LinkScheduler> d2h, h2d;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    auto it = links_.find(LinkNameFor(gpu));
    if (it == links_.end()) return;
    d2h = it->second->d2h;
    h2d = it->second->h2d;
  }
  d2h->CancelOwner(session_id, status);
  if (h2d != d2h) h2d->CancelOwner(session_id, status);
}

void Core::AddSession(uint64_t id, std::weak_ptr<Session> session) {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_[id] = std::move(session);
}

void Core::RemoveSession(uint64_t id) {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_.erase(id);
}

absl::Status Core::TryOpenSessionSlot(const PeerCredentials& peer) {
  const bool per_uid = options_.max_sessions_per_uid > 0 && peer.known &&
                       !IsAdmin(options_.access, peer);
  std::lock_guard<std::mutex> lock(slots_mu_);
  if (per_uid && sessions_per_uid_[peer.uid] >= options_.max_sessions_per_uid) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "uid %d already has %d sessions open (max_sessions_per_uid): close idle clients of "
        "this user or raise max_sessions_per_uid in the daemon config",
        peer.uid, options_.max_sessions_per_uid));
  }
  if (options_.max_sessions > 0 && sessions_admitted_.load() >= options_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "offloadd already serves %d sessions (max_sessions): close idle clients or raise "
        "max_sessions in the daemon config",
        options_.max_sessions));
  }
  sessions_admitted_.fetch_add(1);
  if (per_uid) ++sessions_per_uid_[peer.uid];
  return absl::OkStatus();
}

void Core::ReleaseSessionSlot(const PeerCredentials& peer) {
  const bool per_uid = options_.max_sessions_per_uid > 0 && peer.known &&
                       !IsAdmin(options_.access, peer);
  std::lock_guard<std::mutex> lock(slots_mu_);
  sessions_admitted_.fetch_sub(1);
  if (!per_uid) return;
  auto it = sessions_per_uid_.find(peer.uid);
  if (it != sessions_per_uid_.end() && --it->second == 0) sessions_per_uid_.erase(it);
}

absl::Status Core::AdmitPendingHello(uint64_t session_id, const PeerCredentials& peer) {
  PendingHello p;
  p.per_uid = options_.max_pending_hello_per_uid > 0 && peer.known &&
              !IsAdmin(options_.access, peer);
  p.uid = peer.uid;
  p.deadline_seconds = options_.clock->NowSeconds() + options_.hello_timeout_seconds;
  std::lock_guard<std::mutex> lock(hello_mu_);
  if (p.per_uid && pending_per_uid_[peer.uid] >= options_.max_pending_hello_per_uid) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "uid %d already has %d session streams open that have not sent Hello "
        "(max_pending_hello_streams_per_uid): send Hello as the first request of each stream "
        "and close streams you do not use",
        peer.uid, options_.max_pending_hello_per_uid));
  }
  if (options_.max_pending_hello_total > 0 &&
      pending_hello_.size() >= options_.max_pending_hello_total) {
    if (p.per_uid && pending_per_uid_[peer.uid] == 0) pending_per_uid_.erase(peer.uid);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "offloadd already has %d session streams open that have not sent Hello "
        "(max_pending_hello_streams_total): retry shortly; send Hello as the first request of "
        "each stream",
        options_.max_pending_hello_total));
  }
  if (p.per_uid) ++pending_per_uid_[peer.uid];
  pending_hello_[session_id] = p;
  return absl::OkStatus();
}

void Core::ErasePendingLocked(std::map<uint64_t, PendingHello>::iterator it) {
  if (it->second.per_uid) {
    auto uid = pending_per_uid_.find(it->second.uid);
    if (uid != pending_per_uid_.end() && --uid->second == 0) pending_per_uid_.erase(uid);
  }
  pending_hello_.erase(it);
}

void Core::EndPendingHello(uint64_t session_id) {
  std::lock_guard<std::mutex> lock(hello_mu_);
  auto it = pending_hello_.find(session_id);
  if (it != pending_hello_.end()) ErasePendingLocked(it);
}

size_t Core::pending_hello() const {
  std::lock_guard<std::mutex> lock(hello_mu_);
  return pending_hello_.size();
}

void Core::HelloTimeoutLoop() {
  const double timeout = options_.hello_timeout_seconds;
  const double period_seconds = std::clamp(timeout / 4, 0.05, 1.0);
  base::Clock& clock = *options_.clock;
  std::unique_lock<std::mutex> lock(hello_mu_);
  while (!hello_stop_) {
    const double wake = clock.NowSeconds() + period_seconds;
    while (!hello_stop_ && clock.NowSeconds() < wake) clock.WaitUntil(lock, hello_cv_, wake);
    if (hello_stop_) return;
    const double now = options_.clock->NowSeconds();
    std::vector<uint64_t> expired;
    for (auto it = pending_hello_.begin(); it != pending_hello_.end();) {
      if (it->second.deadline_seconds > now) {
        ++it;
        continue;
      }
      expired.push_back(it->first);
      ErasePendingLocked(it++);
    }
    if (expired.empty()) continue;
    lock.unlock();
    for (uint64_t id : expired) {
      (void)EndSession(id, EndCause::kHelloTimeout,
                       absl::DeadlineExceededError(absl::StrFormat(
                           "this session stream sent no successful Hello within %g s "
                           "(hello_timeout_seconds), so offloadd ended it: send Hello as the "
                           "first request right after opening the stream, then retry",
                           timeout)));
    }
    lock.lock();
  }
}

size_t Core::CloseSessions(EndCause cause) {
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (auto& [id, weak] : sessions_) {
      if (auto p = weak.lock()) live.push_back(std::move(p));
    }
  }
  // Every session's copies stop first, so no session's chunks run while another is waited for.
  for (auto& s : live) s->StopCopies(cause);
  size_t closed = 0;
  for (auto& s : live) {
    if (s->closed()) continue;
    s->Close(cause);
    ++closed;
  }
  return closed;
}

absl::StatusOr<SessionInfo> Core::EndSession(uint64_t id, EndCause cause,
                                             const absl::Status& status) {
  std::shared_ptr<Session> session;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    auto it = sessions_.find(id);
    if (it != sessions_.end()) session = it->second.lock();
  }
  if (session == nullptr || session->closed()) {
    return absl::NotFoundError(absl::StrCat(
        "no open session has id ", id, ": `offloadctl sessions` lists the open ones"));
  }
  SessionInfo info = session->info();
  session->End(cause, status);
  return info;
}

void Core::WatchPid(uint64_t session_id, int32_t pid) {
  if (pid_watcher_ && pid > 0) pid_watcher_->Watch(session_id, pid);
}

void Core::UnwatchPid(uint64_t session_id) {
  if (pid_watcher_) pid_watcher_->Unwatch(session_id);
}

bool Core::BeginTransfer() {
  std::lock_guard<std::mutex> lock(transfers_mu_);
  if (draining_) return false;
  ++transfers_in_flight_;
  return true;
}

void Core::EndTransfer() {
  std::lock_guard<std::mutex> lock(transfers_mu_);
  if (--transfers_in_flight_ == 0) transfers_cv_.notify_all();
}

void Core::CountTransfer(bool offload, uint64_t bytes, bool ok) {
  if (!ok) {
    errors_total_.fetch_add(1);
    return;
  }
  if (offload) {
    offloads_total_.fetch_add(1);
    offload_bytes_total_.fetch_add(bytes);
  } else {
    reloads_total_.fetch_add(1);
    reload_bytes_total_.fetch_add(bytes);
  }
}

void Core::StopAccepting() {
  {
    std::lock_guard<std::mutex> lock(transfers_mu_);
    draining_ = true;
  }
  // Offloads still waiting for pool space fail now (UNAVAILABLE) rather than holding shutdown
  // for up to the admission deadline; this also ends the store's deadline thread, so no store
  // callback runs after Drain.
  store_.Stop();
}

bool Core::WaitTransfers(double seconds) {
  std::unique_lock<std::mutex> lock(transfers_mu_);
  return transfers_cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                                [this] { return transfers_in_flight_ == 0; });
}

void Core::Drain() {
  StopAccepting();
  {
    std::unique_lock<std::mutex> lock(transfers_mu_);
    transfers_cv_.wait(lock, [this] { return transfers_in_flight_ == 0; });
  }
  std::lock_guard<std::mutex> lock(links_mu_);
  for (auto& [name, link] : links_) {
    link->d2h->Shutdown();
    link->h2d->Shutdown();
  }
}

LinkInfo Core::DescribeLink(const std::string& name, const Link* link) const {
  LinkInfo info;
  info.name = name;
  info.d2h_bytes_per_second = info.h2d_bytes_per_second = options_.default_link_bytes_per_second;
  if (const LinkSpec* spec = FindSpec(name)) {
    info.gpus = spec->gpus;
    info.d2h_bytes_per_second = spec->d2h_bytes_per_second;
    info.h2d_bytes_per_second = spec->h2d_bytes_per_second;
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

CoreStats Core::Stats() {
  CoreStats s;
  s.backend = engine_->name();
  s.store = store_.stats();
  if (spill_ != nullptr) {
    s.spill_enabled = true;
    s.spill = spill_->stats();
  }
  s.offload_bytes_total = offload_bytes_total_.load();
  s.reload_bytes_total = reload_bytes_total_.load();
  s.offloads_total = offloads_total_.load();
  s.reloads_total = reloads_total_.load();
  s.errors_total = errors_total_.load();
  s.uptime_seconds = options_.clock->NowSeconds() - start_seconds_;
  s.chunk_bytes = options_.chunk_bytes;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    // Configured and discovered links first (in config order), then default links made on use.
    for (const LinkSpec& spec : options_.links) {
      auto it = links_.find(spec.name);
      s.links.push_back(DescribeLink(spec.name, it == links_.end() ? nullptr : it->second.get()));
    }
    for (auto& [name, link] : links_) {
      if (FindSpec(name) == nullptr) s.links.push_back(DescribeLink(name, link.get()));
    }
  }
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
    s.host_links.push_back(std::move(info));
  }
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (auto& [id, weak] : sessions_) {
      if (auto p = weak.lock()) live.push_back(std::move(p));
    }
  }
  for (auto& p : live) {
    SessionInfo info = p->info();
    if (!info.device_id.empty()) s.sessions.push_back(std::move(info));
  }
  s.sessions_open = s.sessions.size();
  s.session_quota_bytes = options_.store.session_quota_bytes;
  s.uid_quota_bytes = options_.store.uid_quota_bytes;
  s.uid_used_bytes = store_.UidUsedBytes();
  return s;
}

void Core::RefreshSpillMetrics(const store::StoreStats& s) {
  auto& m = metrics::Get();
  // Counters follow the stats' totals (one store and tier per process).
  auto advance = [](prometheus::Counter& c, double total) {
    if (total > c.Value()) c.Increment(total - c.Value());
  };
  m.tier_bytes->Add({{"tier", "pool"}}).Set(static_cast<double>(s.pool.used_bytes));
  m.tier_bytes->Add({{"tier", "disk"}}).Set(static_cast<double>(s.disk_bytes));
  advance(*m.reloads_from_disk_total, static_cast<double>(s.reloads_from_disk_total));
  advance(*m.reload_disk_wait_seconds_total, s.reload_disk_wait_seconds_total);
  advance(m.spill_failures_total->Add({{"cause", "write_error"}}),
          static_cast<double>(s.spill_failures_total));
  advance(m.spill_failures_total->Add({{"cause", "disk_full"}}),
          static_cast<double>(s.spill_refused_disk_full_total));
  advance(*m.spill_blocks_lost_total, static_cast<double>(s.blocks_lost_total));
  if (spill_ == nullptr) return;
  const spill::SpillStats d = spill_->stats();
  m.spill_capacity_bytes->Set(static_cast<double>(d.capacity_bytes));
  advance(m.spill_bytes_total->Add({{"direction", "spill"}}),
          static_cast<double>(d.spill_bytes_total));
  advance(m.spill_bytes_total->Add({{"direction", "stage"}}),
          static_cast<double>(d.stage_bytes_total));
}

void Core::RefreshMetrics() {
  CoreStats s = Stats();
  auto& m = metrics::Get();
  const prometheus::Labels numa{{"numa_node", metrics::NumaNodeLabel(arena_->numa_node())}};
  m.pool_used_bytes->Add(numa).Set(static_cast<double>(s.store.pool.used_bytes));
  m.pool_peak_used_bytes->Add(numa).Set(static_cast<double>(s.store.pool.peak_used_bytes));
  const uint64_t pinned =
      std::max<uint64_t>(engine_->pinned_bytes(), arena_->locked() ? arena_->size_bytes() : 0);
  m.pool_pinned_bytes->Add(numa).Set(static_cast<double>(pinned));
  for (const auto& [gpu, counts] : engine_->handle_counts()) {
    m.ipc_handles_open->Add({{"gpu", gpu}}).Set(static_cast<double>(counts.open));
    prometheus::Counter& opens = m.ipc_handle_opens_total->Add({{"gpu", gpu}});
    if (counts.opens_total > opens.Value()) opens.Increment(counts.opens_total - opens.Value());
  }
  m.pool_blocks->Set(static_cast<double>(s.store.blocks));
  m.adopted_blocks_waiting->Set(static_cast<double>(s.store.adopted_blocks_waiting));
  {
    std::lock_guard<std::mutex> lock(links_mu_);  // serialises counter deltas
    if (s.store.adopted_blocks_expired_total > expired_reported_) {
      m.adopted_blocks_expired_total->Increment(
          static_cast<double>(s.store.adopted_blocks_expired_total - expired_reported_));
      expired_reported_ = s.store.adopted_blocks_expired_total;
    }
    if (s.store.sessions_resumed_total > resumed_reported_) {
      m.sessions_resumed_total->Increment(
          static_cast<double>(s.store.sessions_resumed_total - resumed_reported_));
      resumed_reported_ = s.store.sessions_resumed_total;
    }
  }
  m.offloads_waiting->Set(static_cast<double>(s.store.offloads_waiting));
  RefreshSpillMetrics(s.store);
  double refused = static_cast<double>(s.store.offloads_refused_total);
  if (refused > m.offloads_refused_total->Value()) {
    m.offloads_refused_total->Increment(refused - m.offloads_refused_total->Value());
  }
  std::lock_guard<std::mutex> lock(links_mu_);  // serialises counter deltas
  for (const LinkInfo& link : s.links) {
    // A link ReleaseLink removed after Stats() read it: export nothing more for it.
    if (links_.count(link.name) == 0 && FindSpec(link.name) == nullptr) continue;
    for (int d = 0; d < (link.half_duplex ? 1 : 2); ++d) {
      const char* dir = link.half_duplex ? "both" : d == 0 ? "d2h" : "h2d";
      const sched::LinkSchedulerStats& now = d == 0 ? link.d2h : link.h2d;
      const double capacity = d == 0 ? link.d2h_bytes_per_second : link.h2d_bytes_per_second;
      const std::string key = absl::StrCat(link.name, "/", dir);
      sched::LinkSchedulerStats& before = reported_[key];
      prometheus::Labels labels{{"link", link.name}, {"direction", dir}};
      m.link_capacity_bytes_per_second->Add(labels).Set(capacity);
      if (now.busy_seconds > before.busy_seconds) {
        m.link_busy_seconds_total->Add(labels).Increment(now.busy_seconds - before.busy_seconds);
      }
      if (now.bytes > before.bytes) {
        m.link_bytes_total->Add(labels).Increment(static_cast<double>(now.bytes - before.bytes));
      }
      for (const auto& [gpu, bytes] : now.gpu_bytes) {
        uint64_t& gpu_before = gpu_reported_[absl::StrCat(key, "/", gpu)];
        if (bytes > gpu_before) {
          m.link_gpu_bytes_total->Add({{"link", link.name}, {"direction", dir}, {"gpu", gpu}})
              .Increment(static_cast<double>(bytes - gpu_before));
          gpu_before = bytes;
        }
      }
      for (const auto& [gpu, bytes] : now.gpu_bytes) {
        // Present (at 0) for every GPU that used the link, so rates and alerts have a series.
        prometheus::Counter& c =
            m.reload_deadline_misses_total->Add({{"gpu", gpu}, {"link", link.name}});
        auto miss = now.gpu_deadline_misses.find(gpu);
        uint64_t& miss_before = misses_reported_[absl::StrCat(key, "/", gpu)];
        if (miss != now.gpu_deadline_misses.end() && miss->second > miss_before) {
          c.Increment(static_cast<double>(miss->second - miss_before));
          miss_before = miss->second;
        }
      }
      m.link_queued_transfers->Add(labels).Set(static_cast<double>(now.queued_transfers));
      m.link_chunks_in_flight->Add(labels).Set(static_cast<double>(now.chunks_in_flight));
      before = now;
    }
  }
  for (const HostLinkInfo& host : s.host_links) {
    for (int d = 0; d < 2; ++d) {
      const char* dir = d == 0 ? "d2h" : "h2d";
      const double capacity = d == 0 ? host.d2h_bytes_per_second : host.h2d_bytes_per_second;
      if (capacity <= 0) continue;
      const sched::HostLinkStats& now = d == 0 ? host.d2h : host.h2d;
      sched::HostLinkStats& before = host_reported_[absl::StrCat(host.name, "/", dir)];
      prometheus::Labels labels{{"link", host.name}, {"direction", dir}};
      m.host_link_capacity_bytes_per_second->Add(labels).Set(capacity);
      if (now.busy_seconds > before.busy_seconds) {
        m.host_link_busy_seconds_total->Add(labels).Increment(now.busy_seconds -
                                                              before.busy_seconds);
      }
      if (now.bytes > before.bytes) {
        m.host_link_bytes_total->Add(labels).Increment(
            static_cast<double>(now.bytes - before.bytes));
      }
      before = now;
    }
  }
}

}  // namespace offloadd::session
