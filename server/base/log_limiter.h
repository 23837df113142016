// LogLimiter: at most one log line per interval for lines a client can cause on demand (a
// failure of its own request, a message that does not parse), with the count of those held
// back, so no client can flood the daemon's log. Thread-safe.
#ifndef OFFLOADD_SERVER_BASE_LOG_LIMITER_H_
#define OFFLOADD_SERVER_BASE_LOG_LIMITER_H_

#include <cstdint>

#include "common/base/clock.h"
#include "common/base/mutex.h"

namespace offloadd::base {

class LogLimiter {
 public:
  // `interval_seconds` between two lines let through; `clock` (not owned, outlives this; null:
  // the steady clock) reads the time.
  explicit LogLimiter(double interval_seconds, Clock* clock = nullptr)
      : interval_seconds_(interval_seconds), clock_(clock != nullptr ? clock : Clock::Real()) {}

  // True when a line may be written now (the first call, and the first one an interval after
  // the last line let through); then *held_back (may be null) is the number of calls refused
  // since that last line, and the count starts again. False: count this line as held back.
  bool Allow(uint64_t* held_back) EXCLUDES(mu_) {
    const double now = clock_->NowSeconds();
    MutexLock lock(mu_);
    if (any_ && now - last_seconds_ < interval_seconds_) {
      ++held_back_;
      return false;
    }
    any_ = true;
    last_seconds_ = now;
    if (held_back != nullptr) *held_back = held_back_;
    held_back_ = 0;
    return true;
  }

 private:
  const double interval_seconds_;
  Clock* const clock_;
  Mutex mu_;
  bool any_ GUARDED_BY(mu_) = false;
  double last_seconds_ GUARDED_BY(mu_) = 0;
  uint64_t held_back_ GUARDED_BY(mu_) = 0;
};

}  // namespace offloadd::base

#endif  // OFFLOADD_SERVER_BASE_LOG_LIMITER_H_
