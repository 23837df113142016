// FakeClock: a Clock for deterministic tests. Time only moves when a caller moves it:
// SleepUntil(t) sets now = max(now, t) and returns at once, Advance(dt) adds dt. Thread-safe,
// so LinkScheduler's worker threads can share it; with several sleepers the clock ends at the
// latest time any of them asked for.
#ifndef OFFLOADD_SERVER_SCHED_FAKE_CLOCK_H_
#define OFFLOADD_SERVER_SCHED_FAKE_CLOCK_H_

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "server/sched/link_scheduler.h"

namespace offloadd::sched {

class FakeClock : public Clock {
 public:
  explicit FakeClock(double start_seconds = 0) : now_seconds_(start_seconds) {}

  double NowSeconds() override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_seconds_;
  }
  void SleepUntil(double t) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++sleeps_;
    now_seconds_ = std::max(now_seconds_, t);
  }
  void Advance(double dt_seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    now_seconds_ += dt_seconds;
  }
  // Number of SleepUntil calls so far.
  uint64_t sleeps() {
    std::lock_guard<std::mutex> lock(mu_);
    return sleeps_;
  }

 private:
  std::mutex mu_;
  double now_seconds_;
  uint64_t sleeps_ = 0;
};

}  // namespace offloadd::sched

#endif  // OFFLOADD_SERVER_SCHED_FAKE_CLOCK_H_
