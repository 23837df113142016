// SessionRegistry: the open sessions of the daemon and their admission bounds — session ids,
// slots (max_sessions, max_sessions_per_uid), streams awaiting their Hello (bounded, ended
// after hello_timeout_seconds by a thread of its own), the pid watcher that ends a session
// whose process exited, and ending sessions from the daemon's side (EndSession, CloseSessions).
// Holds sessions weakly: a Session removes itself when it is destroyed. Thread-safe.
#ifndef OFFLOADD_SERVER_SESSION_SESSION_REGISTRY_H_
#define OFFLOADD_SERVER_SESSION_SESSION_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "server/session/core_options.h"
#include "server/session/core_stats.h"
#include "server/session/peer.h"
#include "server/session/pid_watcher.h"

namespace offloadd::session {

class Session;
enum class EndCause;

class SessionRegistry {
 public:
  // Starts the hello-timeout thread (hello_timeout_seconds > 0) and the pid watcher
  // (watch_pids). `options` must outlive the registry.
  explicit SessionRegistry(const CoreOptions& options);
  ~SessionRegistry();  // Stop()
  // Stops the hello-timeout thread and the pid watcher: neither ends a session after it
  // returns. Idempotent.
  void Stop() EXCLUDES(hello_mu_);

  uint64_t NewSessionId() { return next_session_id_.fetch_add(1); }
  void Add(uint64_t id, std::weak_ptr<Session> session) EXCLUDES(sessions_mu_);
  void Remove(uint64_t id) EXCLUDES(sessions_mu_);
  // The sessions alive now (Hello done or not).
  std::vector<std::shared_ptr<Session>> Live() EXCLUDES(sessions_mu_);

  // Admission of a session at Hello against max_sessions and, for a peer with known credentials
  // that is not an admin (IsAdmin), against max_sessions_per_uid. OK, or RESOURCE_EXHAUSTED
  // naming the bound that is full; each OK is paired with ReleaseSlot of the same peer.
  absl::Status TryOpenSlot(const PeerCredentials& peer) EXCLUDES(slots_mu_);
  void ReleaseSlot(const PeerCredentials& peer) EXCLUDES(slots_mu_);

  // A session stream awaiting its Hello: counted against max_pending_hello_total and, for a
  // non-admin peer with known credentials, max_pending_hello_per_uid (RESOURCE_EXHAUSTED naming
  // the bound that is full), and ended by EndSession(kHelloTimeout) once hello_timeout_seconds
  // pass. EndPendingHello (after a successful Hello, or when the session closes) releases it;
  // idempotent.
  absl::Status AdmitPendingHello(uint64_t session_id, const PeerCredentials& peer)
      EXCLUDES(hello_mu_);
  void EndPendingHello(uint64_t session_id) EXCLUDES(hello_mu_);
  size_t pending_hello() const EXCLUDES(hello_mu_);

  // Closes every open session with `cause` (Session::Close: queued chunks cancelled, running
  // ones waited for, unanswered requests answered); their streams stay open to carry the
  // answers. Returns how many were closed.
  size_t CloseSessions(EndCause cause);
  // Ends an open session from the daemon's side: releases everything it holds and ends its
  // stream with `status`. Returns what it held just before; NOT_FOUND for an id not open.
  absl::StatusOr<SessionInfo> EndSession(uint64_t id, EndCause cause, const absl::Status& status)
      EXCLUDES(sessions_mu_);

  // Pid liveness of sessions (no-ops without watch_pids or after Stop).
  void WatchPid(uint64_t session_id, int32_t pid);
  void UnwatchPid(uint64_t session_id);
  size_t pids_watched() const;

 private:
  struct PendingHello {
    double deadline_seconds = 0;  // steady clock (common/base/clock.h)
    bool per_uid = false;         // counted in pending_per_uid_
    uint32_t uid = 0;
  };
  void HelloTimeoutLoop() EXCLUDES(hello_mu_);
  // Ends each session of `ids` whose Hello did not come in time (no lock held).
  void EndHelloTimedOut(const std::vector<uint64_t>& ids) EXCLUDES(hello_mu_);
  void ErasePendingLocked(std::map<uint64_t, PendingHello>::iterator it) REQUIRES(hello_mu_);
  bool CountsPerUid(uint32_t bound, const PeerCredentials& peer) const;

  const CoreOptions& options_;

  base::Mutex sessions_mu_;
  std::map<uint64_t, std::weak_ptr<Session>> sessions_ GUARDED_BY(sessions_mu_);
  std::atomic<uint64_t> next_session_id_{1};

  base::Mutex slots_mu_;
  uint32_t sessions_admitted_ GUARDED_BY(slots_mu_) = 0;  // slots held
  // Slots of non-admin known peers.
  std::map<uint32_t, uint32_t> sessions_per_uid_ GUARDED_BY(slots_mu_);

  mutable base::Mutex hello_mu_;
  base::CondVar hello_cv_;
  bool hello_stop_ GUARDED_BY(hello_mu_) = false;
  std::map<uint64_t, PendingHello> pending_hello_ GUARDED_BY(hello_mu_);
  std::map<uint32_t, uint32_t> pending_per_uid_ GUARDED_BY(hello_mu_);
  std::thread hello_thread_;

  // Null without watch_pids; reset by Stop (the watcher's thread ends sessions, so it goes
  // before anything it reaches).
  std::unique_ptr<PidWatcher> pid_watcher_;
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_SESSION_REGISTRY_H_
