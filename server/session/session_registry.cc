#include "server/session/session_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/clock.h"
#include "server/session/session.h"

namespace offloadd::session {

SessionRegistry::SessionRegistry(const CoreOptions& options) : options_(options) {
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

SessionRegistry::~SessionRegistry() { Stop(); }

void SessionRegistry::Stop() {
  {
    base::MutexLock lock(hello_mu_);
    hello_stop_ = true;
  }
  hello_cv_.notify_all();
  if (hello_thread_.joinable()) hello_thread_.join();  // no EndSession from it past this point
  pid_watcher_.reset();  // no EndSession from its thread past this point
}

void SessionRegistry::Add(uint64_t id, std::weak_ptr<Session> session) {
  base::MutexLock lock(sessions_mu_);
  sessions_[id] = std::move(session);
}

void SessionRegistry::Remove(uint64_t id) {
  base::MutexLock lock(sessions_mu_);
  sessions_.erase(id);
}

std::vector<std::shared_ptr<Session>> SessionRegistry::Live() {
  std::vector<std::shared_ptr<Session>> live;
  base::MutexLock lock(sessions_mu_);
  for (auto& [id, weak] : sessions_) {
    if (auto p = weak.lock()) live.push_back(std::move(p));
  }
  return live;
}

bool SessionRegistry::CountsPerUid(uint32_t bound, const PeerCredentials& peer) const {
  return bound > 0 && peer.known && !IsAdmin(options_.access, peer);
}

absl::Status SessionRegistry::TryOpenSlot(const PeerCredentials& peer) {
  const bool per_uid = CountsPerUid(options_.max_sessions_per_uid, peer);
  base::MutexLock lock(slots_mu_);
  if (per_uid && sessions_per_uid_[peer.uid] >= options_.max_sessions_per_uid) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "uid %d already has %d session%s open (max_sessions_per_uid): close idle clients of "
        "this user or raise max_sessions_per_uid in the daemon config",
        peer.uid, options_.max_sessions_per_uid, options_.max_sessions_per_uid == 1 ? "" : "s"));
  }
  if (options_.max_sessions > 0 && sessions_admitted_ >= options_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "offloadd already serves %d session%s (max_sessions): close idle clients or raise "
        "max_sessions in the daemon config",
        options_.max_sessions, options_.max_sessions == 1 ? "" : "s"));
  }
  ++sessions_admitted_;
  if (per_uid) ++sessions_per_uid_[peer.uid];
  return absl::OkStatus();
}

void SessionRegistry::ReleaseSlot(const PeerCredentials& peer) {
  const bool per_uid = CountsPerUid(options_.max_sessions_per_uid, peer);
  base::MutexLock lock(slots_mu_);
  --sessions_admitted_;
  if (!per_uid) return;
  auto it = sessions_per_uid_.find(peer.uid);
  if (it != sessions_per_uid_.end() && --it->second == 0) sessions_per_uid_.erase(it);
}

absl::Status SessionRegistry::AdmitPendingHello(uint64_t session_id,
                                                const PeerCredentials& peer) {
  PendingHello p;
  p.per_uid = CountsPerUid(options_.max_pending_hello_per_uid, peer);
  p.uid = peer.uid;
  p.deadline_seconds = options_.clock->NowSeconds() + options_.hello_timeout_seconds;
  base::MutexLock lock(hello_mu_);
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

void SessionRegistry::ErasePendingLocked(std::map<uint64_t, PendingHello>::iterator it) {
  if (it->second.per_uid) {
    auto uid = pending_per_uid_.find(it->second.uid);
    if (uid != pending_per_uid_.end() && --uid->second == 0) pending_per_uid_.erase(uid);
  }
  pending_hello_.erase(it);
}

void SessionRegistry::EndPendingHello(uint64_t session_id) {
  base::MutexLock lock(hello_mu_);
  auto it = pending_hello_.find(session_id);
  if (it != pending_hello_.end()) ErasePendingLocked(it);
}

size_t SessionRegistry::pending_hello() const {
  base::MutexLock lock(hello_mu_);
  return pending_hello_.size();
}

void SessionRegistry::HelloTimeoutLoop() {
  const double timeout = options_.hello_timeout_seconds;
  const double period_seconds = std::clamp(timeout / 4, 0.05, 1.0);
  base::Clock& clock = *options_.clock;
  base::MutexLock lock(hello_mu_);
  while (!hello_stop_) {
    const double wake = clock.NowSeconds() + period_seconds;
    while (!hello_stop_ && clock.NowSeconds() < wake) clock.WaitUntil(hello_mu_, hello_cv_, wake);
    if (hello_stop_) return;
    const double now = clock.NowSeconds();
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
    lock.Unlock();
    EndHelloTimedOut(expired);
    lock.Lock();
  }
}

void SessionRegistry::EndHelloTimedOut(const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) {
    (void)EndSession(id, EndCause::kHelloTimeout,
                     absl::DeadlineExceededError(absl::StrFormat(
                         "this session stream sent no successful Hello within %g s "
                         "(hello_timeout_seconds), so offloadd ended it: send Hello as the "
                         "first request right after opening the stream, then retry",
                         options_.hello_timeout_seconds)));
  }
}

size_t SessionRegistry::CloseSessions(EndCause cause) {
  std::vector<std::shared_ptr<Session>> live = Live();
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

absl::StatusOr<SessionInfo> SessionRegistry::EndSession(uint64_t id, EndCause cause,
                                                        const absl::Status& status) {
  std::shared_ptr<Session> session;
  {
    base::MutexLock lock(sessions_mu_);
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

void SessionRegistry::WatchPid(uint64_t session_id, int32_t pid) {
  if (pid_watcher_ && pid > 0) pid_watcher_->Watch(session_id, pid);
}

void SessionRegistry::UnwatchPid(uint64_t session_id) {
  if (pid_watcher_) pid_watcher_->Unwatch(session_id);
}

size_t SessionRegistry::pids_watched() const {
  return pid_watcher_ ? pid_watcher_->watched() : 0;
}

}  // namespace offloadd::session
