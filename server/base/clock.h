// Monotonic time as plain seconds: the time base of every deadline, wait and duration inside
// offloadd (admission deadlines, pacing, queue waits, refresh times) and of its tests and
// benchmarks. std::chrono::steady_clock, so it never jumps with the wall clock; its zero is
// arbitrary (boot, on Linux), so only differences and comparisons between its values mean
// anything — never compare it with wall-clock time or send it to another process.
#ifndef OFFLOADD_SERVER_BASE_CLOCK_H_
#define OFFLOADD_SERVER_BASE_CLOCK_H_

#include <chrono>
#include <functional>
#include <thread>

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

}  // namespace offloadd::base

#endif  // OFFLOADD_SERVER_BASE_CLOCK_H_
