// TransferGate: counts the transfers (offloads, reloads) the daemon has accepted and not yet
// finished, so that shutdown can wait for them, and refuses new ones once shutdown has begun.
// Thread-safe; Begin/End are called from gRPC threads and transfer callbacks. The bounded wait
// (shutdown's `shutdown_grace_seconds`) runs on an injectable base::Clock, so tests drive it with
// a FakeClock instead of sleeping.
#ifndef OFFLOADD_SERVER_SESSION_TRANSFER_GATE_H_
#define OFFLOADD_SERVER_SESSION_TRANSFER_GATE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "server/base/clock.h"

namespace offloadd::session {

class TransferGate {
 public:
  // `clock`: the time base of WaitIdle(seconds); null = base::Clock::Real(). Not owned.
  explicit TransferGate(base::Clock* clock = nullptr)
      : clock_(clock != nullptr ? clock : base::Clock::Real()) {}
  // Counts one transfer and returns true, or returns false (nothing counted) once
  // StopAccepting was called. Each true is paired with one End.
  bool Begin();
  void End();
  // Begin fails from here on; transfers already counted go on. Idempotent.
  void StopAccepting();
  bool stopped() const { return stopped_.load(); }
  // Waits up to `seconds` (on the clock) until no counted transfer is left; true when none is.
  bool WaitIdle(double seconds);
  // Waits as long as it takes.
  void WaitIdle();
  uint64_t in_flight() const;

 private:
  base::Clock* const clock_;
  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  uint64_t in_flight_ = 0;
  std::atomic<bool> stopped_{false};  // written under mu_, read without it by stopped()
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_TRANSFER_GATE_H_
