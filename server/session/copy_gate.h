// CopyGate: lets a session's chunk copies into (and out of) client memory run until the session
// ends, and lets the end wait for the copies already running.
//
// Every chunk copy of a session is bracketed by Enter()/Exit(); Enter() fails once Close() has
// started, so no copy begins after it, and CloseAndWait() returns only when every copy that did
// enter has exited. After it returns, the daemon touches the client's memory no more: the
// session may end its stream and the client may reuse that memory. Thread-safe. CopyGate::Pass
// is Enter()/Exit() as a scoped object.
#ifndef OFFLOADD_SERVER_SESSION_COPY_GATE_H_
#define OFFLOADD_SERVER_SESSION_COPY_GATE_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "common/base/mutex.h"

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
  // One chunk copy's passage: Enter() on construction, Exit() on destruction when it entered.
  // A copy runs only when the pass is true. Keep it alive (e.g. in a shared_ptr captured by an
  // asynchronous completion) until the copy no longer touches client memory.
  class Pass {
   public:
    explicit Pass(std::shared_ptr<CopyGate> gate)
        : gate_(gate->Enter() ? std::move(gate) : nullptr) {}
    ~Pass() {
      if (gate_) gate_->Exit();
    }
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
    explicit operator bool() const { return gate_ != nullptr; }

   private:
    std::shared_ptr<CopyGate> gate_;  // null when the gate was closed
  };

  bool closed() const {
    base::MutexLock lock(mu_);
    return closed_;
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
