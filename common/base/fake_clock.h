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
#ifndef OFFLOADD_COMMON_BASE_FAKE_CLOCK_H_
#define OFFLOADD_COMMON_BASE_FAKE_CLOCK_H_

#include <cstdint>
#include <map>

#include "common/base/clock.h"
#include "common/base/mutex.h"

namespace offloadd::base {

class FakeClock : public Clock {
 public:
  explicit FakeClock(double start_seconds = 0) : now_seconds_(start_seconds) {}

  double NowSeconds() override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return now_seconds_;
  }
  void SleepUntil(double t) override EXCLUDES(mu_) {
    MutexLock lock(mu_);
    ++sleeps_;
    if (t > now_seconds_) {
      now_seconds_ = t;
      NotifyWaitersLocked();
    }
  }
  // Takes this clock's own lock inside the caller's `mu` (never the other way round).
  void WaitUntil(Mutex& mu, CondVar& cv, double deadline_seconds) override REQUIRES(mu)
      EXCLUDES(mu_) {
    {
      MutexLock mine(mu_);
      if (now_seconds_ >= deadline_seconds) return;
      ++waiting_[&cv];
      ++waits_;
    }
    cv.WaitForSeconds(mu, 0.002);
    MutexLock mine(mu_);
    if (--waiting_[&cv] == 0) waiting_.erase(&cv);
  }
  void Advance(double dt_seconds) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    now_seconds_ += dt_seconds;
    NotifyWaitersLocked();
  }
  // Number of SleepUntil calls so far.
  uint64_t sleeps() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return sleeps_;
  }
  // Number of WaitUntil calls that waited (deadline not yet reached) so far.
  uint64_t waits() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return waits_;
  }

 private:
  void NotifyWaitersLocked() REQUIRES(mu_) {
    for (auto& [cv, n] : waiting_) cv->notify_all();
  }

  Mutex mu_;
  double now_seconds_ GUARDED_BY(mu_);
  uint64_t sleeps_ GUARDED_BY(mu_) = 0;
  uint64_t waits_ GUARDED_BY(mu_) = 0;
  std::map<CondVar*, int> waiting_ GUARDED_BY(mu_);  // cvs in WaitUntil now
};

}  // namespace offloadd::base

#endif  // OFFLOADD_COMMON_BASE_FAKE_CLOCK_H_
