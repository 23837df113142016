#include "server/session/core.h"

#include <chrono>

#include "server/metrics/metrics.h"
#include "server/session/session.h"

namespace offloadd::session {
namespace {
double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Core::Core(CoreOptions options, std::unique_ptr<pool::Arena> arena,
           std::unique_ptr<copy::CopyEngine> engine)
    : options_(std::move(options)),
      arena_(std::move(arena)),
      engine_(std::move(engine)),
      store_(arena_->size_bytes(), options_.store),
      start_seconds_(NowSeconds()) {
  for (const LinkSpec& spec : options_.links) {
    for (const std::string& gpu : spec.gpus) gpu_link_[gpu] = spec.name;
  }
  metrics::Get().pool_capacity_bytes->Set(static_cast<double>(store_.capacity_bytes()));
}

Core::~Core() { Drain(); }

std::string Core::LinkNameFor(const std::string& gpu) const {
  auto named = gpu_link_.find(gpu);
  return named != gpu_link_.end() ? named->second : gpu;
}

Core::Link* Core::LinkFor(const std::string& gpu) {
  std::lock_guard<std::mutex> lock(links_mu_);
  const std::string name = LinkNameFor(gpu);
  auto it = links_.find(name);
  if (it != links_.end()) return it->second.get();
  double d2h = options_.default_link_bytes_per_second;
  double h2d = options_.default_link_bytes_per_second;
  for (const LinkSpec& spec : options_.links) {
    if (spec.name == name) {
      d2h = spec.d2h_bytes_per_second;
      h2d = spec.h2d_bytes_per_second;
    }
  }
  auto link = std::make_unique<Link>();
  link->name = name;
  auto make = [&](const char* direction, double rate) {
    sched::LinkSchedulerOptions o;
    o.link_name = name;
    o.direction = direction;
    o.chunk_bytes = options_.chunk_bytes;
    o.quantum_bytes = options_.chunk_bytes;
    o.worker_threads = options_.copy_threads;
    o.bytes_per_second = rate;
    o.gpu_weights = options_.gpu_weights;
    metrics::Get()
        .link_capacity_bytes_per_second->Add({{"link", name}, {"direction", direction}})
        .Set(rate);
    return std::make_unique<sched::LinkScheduler>(o);
  };
  link->d2h = make("d2h", d2h);
  link->h2d = make("h2d", h2d);
  Link* raw = link.get();
  links_[name] = std::move(link);
  if (draining_) {
    raw->d2h->Shutdown();
    raw->h2d->Shutdown();
  }
  return raw;
}

void Core::AddSession(uint64_t id, std::weak_ptr<Session> session) {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_[id] = std::move(session);
}

void Core::RemoveSession(uint64_t id) {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_.erase(id);
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

void Core::Drain() {
  {
    std::unique_lock<std::mutex> lock(transfers_mu_);
    draining_ = true;
    transfers_cv_.wait(lock, [this] { return transfers_in_flight_ == 0; });
  }
  std::lock_guard<std::mutex> lock(links_mu_);
  for (auto& [name, link] : links_) {
    link->d2h->Shutdown();
    link->h2d->Shutdown();
  }
}

CoreStats Core::Stats() {
  CoreStats s;
  s.backend = engine_->name();
  s.store = store_.stats();
  s.offload_bytes_total = offload_bytes_total_.load();
  s.reload_bytes_total = reload_bytes_total_.load();
  s.offloads_total = offloads_total_.load();
  s.reloads_total = reloads_total_.load();
  s.errors_total = errors_total_.load();
  s.uptime_seconds = NowSeconds() - start_seconds_;
  s.chunk_bytes = options_.chunk_bytes;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    for (auto& [name, link] : links_) {
      LinkInfo info;
      info.name = name;
      for (auto& [gpu, l] : gpu_link_) {
        if (l == name) info.gpus.push_back(gpu);
      }
      if (info.gpus.empty()) info.gpus.push_back(name);
      info.d2h = link->d2h->stats();
      info.h2d = link->h2d->stats();
      info.d2h_bytes_per_second = link->d2h->options().bytes_per_second;
      info.h2d_bytes_per_second = link->h2d->options().bytes_per_second;
      s.links.push_back(std::move(info));
    }
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
  return s;
}

void Core::RefreshMetrics() {
  CoreStats s = Stats();
  auto& m = metrics::Get();
  m.pool_used_bytes->Set(static_cast<double>(s.store.pool.used_bytes));
  m.pool_peak_used_bytes->Set(static_cast<double>(s.store.pool.peak_used_bytes));
  m.pool_blocks->Set(static_cast<double>(s.store.blocks));
  m.offloads_waiting->Set(static_cast<double>(s.store.offloads_waiting));
  double refused = static_cast<double>(s.store.offloads_refused_total);
  if (refused > m.offloads_refused_total->Value()) {
    m.offloads_refused_total->Increment(refused - m.offloads_refused_total->Value());
  }
  std::lock_guard<std::mutex> lock(links_mu_);  // serialises counter deltas
  for (const LinkInfo& link : s.links) {
    for (int d = 0; d < 2; ++d) {
      const char* dir = d == 0 ? "d2h" : "h2d";
      const sched::LinkSchedulerStats& now = d == 0 ? link.d2h : link.h2d;
      sched::LinkSchedulerStats& before = reported_[link.name + "/" + dir];
      prometheus::Labels labels{{"link", link.name}, {"direction", dir}};
      if (now.busy_seconds > before.busy_seconds) {
        m.link_busy_seconds_total->Add(labels).Increment(now.busy_seconds - before.busy_seconds);
      }
      if (now.bytes > before.bytes) {
        m.link_bytes_total->Add(labels).Increment(static_cast<double>(now.bytes - before.bytes));
      }
      m.link_queued_transfers->Add(labels).Set(static_cast<double>(now.queued_transfers));
      before = now;
    }
  }
}

}  // namespace offloadd::session
