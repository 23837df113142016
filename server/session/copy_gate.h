// CopyGate: lets a session's chunk copies into (and out of) client memory run until the session
// ends, and lets the end wait for the copies already running.
//
// Every chunk copy of a session is bracketed by Enter()/Exit(); Enter() fails once Close() has
// started, so no copy begins after it, and CloseAndWait() returns only when every copy that did
// enter has exited. After it returns, the daemon touches the client's memory no more: the
// session may end its stream and the client may reuse that memory. Thread-safe.
#ifndef OFFLOADD_SERVER_SESSION_COPY_GATE_H_
#define OFFLOADD_SERVER_SESSION_COPY_GATE_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "server/base/mutex.h"

namespace offloadd::session {

class CopyGate {
 public:
  // True: the copy may run and must call Exit() when done. False: the gate is closed.
  bool Enter() {
    base::MutexLock lock(mu_);
    if (closed_) return false;
    ++running_;
    return true;
  }
  void Exit() {
    base::MutexLock lock(mu_);
    if (--running_ == 0) idle_.notify_all();
  }
  // Closes the gate without waiting: no copy begins from now on. Idempotent.
  void Close() {
    base::MutexLock lock(mu_);
    closed_ = true;
  }
  // Closes the gate and waits for the copies running now (each at most one chunk). Idempotent.
  void CloseAndWait() {
    base::MutexLock lock(mu_);
    closed_ = true;
    while (running_ != 0) idle_.Wait(mu_);
  }
  uint64_t running() const {
    base::MutexLock lock(mu_);
    return running_;
  }

 private:
  mutable base::Mutex mu_;
  base::CondVar idle_;
  uint64_t running_ GUARDED_BY(mu_) = 0;
  bool closed_ GUARDED_BY(mu_) = false;
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_COPY_GATE_H_
