// TransferGate: counts the transfers (offloads, reloads) the daemon has accepted and not yet
// finished, so that shutdown can wait for them, and refuses new ones once shutdown has begun.
// Thread-safe; Begin/End are called from gRPC threads and transfer callbacks. The bounded wait
// (shutdown's `shutdown_grace_seconds`) runs on an injectable base::Clock, so tests drive it with
// a FakeClock instead of sleeping.
#ifndef OFFLOADD_SERVER_SESSION_TRANSFER_GATE_H_
#define OFFLOADD_SERVER_SESSION_TRANSFER_GATE_H_

#include <atomic>
#include <cstdint>

#include "common/base/clock.h"
#include "common/base/mutex.h"

namespace offloadd::session {

class TransferGate {
 public:
  // `clock`: the time base of WaitIdle(seconds); null = base::Clock::Real(). Not owned.
  explicit TransferGate(base::Clock* clock = nullptr)
      : clock_(clock != nullptr ? clock : base::Clock::Real()) {}
  // Counts one transfer and returns true, or returns false (nothing counted) once
  // StopAccepting was called. Each true is paired with one End.
  bool Begin() EXCLUDES(mu_);
  void End() EXCLUDES(mu_);
  // Begin fails from here on; transfers already counted go on. Idempotent.
  void StopAccepting() EXCLUDES(mu_);
  bool stopped() const { return stopped_.load(); }
  // Waits up to `seconds` (on the clock) until no counted transfer is left; true when none is.
  bool WaitIdle(double seconds) EXCLUDES(mu_);
  // Waits as long as it takes.
  void WaitIdle() EXCLUDES(mu_);
  uint64_t in_flight() const EXCLUDES(mu_);

 private:
  base::Clock* const clock_;
  mutable base::Mutex mu_;
  base::CondVar idle_cv_;
  uint64_t in_flight_ GUARDED_BY(mu_) = 0;
  std::atomic<bool> stopped_{false};  // written under mu_, read without it by stopped()
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_TRANSFER_GATE_H_
