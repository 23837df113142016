// Monotonic time as plain seconds: the time base of every deadline, wait and duration inside
// offloadd (admission deadlines, pacing, queue waits, refresh times) and of its tests and
// benchmarks. std::chrono::steady_clock, so it never jumps with the wall clock; its zero is
// arbitrary (boot, on Linux), so only differences and comparisons between its values mean
// anything — never compare it with wall-clock time or send it to another process.
//
// Components that wait for time to pass (LinkScheduler and HostLink pacing, BlockStore's
// deadline thread, PidWatcher's grace, RefreshService's result expiry, the session layer's
// admission times) take a `Clock*` instead of calling these functions, so tests give them a
// FakeClock (fake_clock.h) and move time themselves instead of sleeping. Production passes
// Clock::Real(), the steady clock.
#ifndef OFFLOADD_COMMON_BASE_CLOCK_H_
#define OFFLOADD_COMMON_BASE_CLOCK_H_

#include <chrono>
#include <functional>
#include <thread>

#include "common/base/mutex.h"

namespace offloadd::base {

// Seconds on std::chrono::steady_clock (resolution as the clock's, nanoseconds on Linux).
inline double SteadyNowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sleeps the calling thread until SteadyNowSeconds() >= t (seconds on the same clock); returns
// at once when t has passed.
inline void SleepUntilSteadySeconds(double t) {
  const double dt = t - SteadyNowSeconds();
  if (dt > 0) std::this_thread::sleep_for(std::chrono::duration<double>(dt));
}

// Calls `pred` every `poll_seconds` until it returns true (then true) or `timeout_seconds` have
// passed (then false, after one last call). For tests and tools that wait for another thread or
// process; daemon code waits on condition variables instead.
inline bool PollUntil(const std::function<bool()>& pred, double timeout_seconds,
                      double poll_seconds = 0.005) {
  const double end = SteadyNowSeconds() + timeout_seconds;
  while (SteadyNowSeconds() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::duration<double>(poll_seconds));
  }
  return pred();
}

// An injectable monotonic time source, in seconds. Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual double NowSeconds() = 0;
  // Blocks (or, for a fake clock, advances time) until NowSeconds() >= t.
  virtual void SleepUntil(double t) = 0;
  // Waits on `cv`, with `mu` (held by the caller) released while waiting, until `cv` is
  // notified, the wait ends spuriously, or NowSeconds() >= deadline_seconds; returns with `mu`
  // held. Like CondVar::WaitUntil, so callers loop, re-checking their condition and the time:
  //   while (!done_ && clock->NowSeconds() < deadline) clock->WaitUntil(mu_, cv_, deadline);
  // A deadline more than an hour away waits at most an hour.
  virtual void WaitUntil(Mutex& mu, CondVar& cv, double deadline_seconds) REQUIRES(mu) = 0;
  // The steady clock (SteadyNowSeconds); never null, lives as long as the process.
  static Clock* Real();
};

class SteadyClock final : public Clock {
 public:
  double NowSeconds() override { return SteadyNowSeconds(); }
  void SleepUntil(double t) override { SleepUntilSteadySeconds(t); }
  void WaitUntil(Mutex& mu, CondVar& cv, double deadline_seconds) override REQUIRES(mu) {
    // Relative, capped: a huge deadline must not overflow the duration arithmetic.
    const double dt = deadline_seconds - SteadyNowSeconds();
    if (dt <= 0) return;
    cv.WaitForSeconds(mu, dt < 3600.0 ? dt : 3600.0);
  }
};

inline Clock* Clock::Real() {
  static SteadyClock* clock = new SteadyClock();  // never destroyed: used by detached work
  return clock;
}

}  // namespace offloadd::base

#endif  // OFFLOADD_COMMON_BASE_CLOCK_H_
