// FakeClock: a base::Clock for deterministic tests. Time moves only when a caller moves it:
// SleepUntil(t) sets now = max(now, t) and returns at once, Advance(dt) adds dt. Thread-safe,
// so worker threads (LinkScheduler's, BlockStore's deadline thread) can share it; with several
// sleepers the clock ends at the latest time any of them asked for.
//
// WaitUntil does not move time: it waits until the cv is notified or until Advance / SleepUntil
// moves time past the deadline (Advance notifies every cv waiting in WaitUntil). Because the
// notification cannot take the waiter's own mutex, one that lands between the waiter's check
// and its wait would be lost; each wait is therefore also bounded by 2 ms of real time, after
// which the caller re-checks (correctness never depends on real time, only promptness).
#ifndef OFFLOADD_SERVER_BASE_FAKE_CLOCK_H_
#define OFFLOADD_SERVER_BASE_FAKE_CLOCK_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>

#include "server/base/clock.h"

namespace offloadd::base {

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
    if (t > now_seconds_) {
      now_seconds_ = t;
      NotifyWaitersLocked();
    }
  }
  void WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                 double deadline_seconds) override {
    {
      std::lock_guard<std::mutex> mine(mu_);
      if (now_seconds_ >= deadline_seconds) return;
      ++waiting_[&cv];
      ++waits_;
    }
    cv.wait_for(lock, std::chrono::milliseconds(2));
    std::lock_guard<std::mutex> mine(mu_);
    if (--waiting_[&cv] == 0) waiting_.erase(&cv);
  }
  void Advance(double dt_seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    now_seconds_ += dt_seconds;
    NotifyWaitersLocked();
  }
  // Number of SleepUntil calls so far.
  uint64_t sleeps() {
    std::lock_guard<std::mutex> lock(mu_);
    return sleeps_;
  }
  // Number of WaitUntil calls that waited (deadline not yet reached) so far.
  uint64_t waits() {
    std::lock_guard<std::mutex> lock(mu_);
    return waits_;
  }

 private:
  void NotifyWaitersLocked() {
    for (auto& [cv, n] : waiting_) cv->notify_all();
  }

  std::mutex mu_;
  double now_seconds_;
  uint64_t sleeps_ = 0, waits_ = 0;
  std::map<std::condition_variable*, int> waiting_;  // cvs in WaitUntil now
};

}  // namespace offloadd::base

#endif  // OFFLOADD_SERVER_BASE_FAKE_CLOCK_H_
