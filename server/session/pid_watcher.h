// PidWatcher: notices that a client process has exited while its session stream may still be
// open (e.g. a forked child inherited the connection and keeps it alive), so the daemon can end
// the session and return its extents within a bounded time.
//
// Each watched pid gets a pidfd (pidfd_open(2), Linux >= 5.3), which becomes readable when the
// process exits; one thread waits on all of them with epoll. Where pidfd_open is unavailable
// (ENOSYS, or refused by a seccomp filter) the watcher falls back to checking /proc/<pid>/stat
// every `poll_interval_seconds`, comparing the process start time so a reused pid is seen as an
// exit. An exit is reported `grace_seconds` after it is noticed (so a stream that breaks at
// the same moment ends the session first, with its own cause); Unwatch() before then cancels
// it. Bound on the time from exit to on_exit: grace_seconds (pidfd) or grace_seconds +
// poll_interval_seconds (fallback), plus scheduling delay.
//
// Known limit: the pid is opened when Watch() is called (at Hello), not when the connection was
// accepted; a process that exits and whose pid is reused in between would be mistaken for the
// new one (both events within one client's Hello round trip).
//
// Time (the grace, the poll interval) is read from a base::Clock, the steady clock unless one is
// given; with any other (a test's FakeClock) the thread re-reads it at least every 2 ms of real
// time, so advancing a fake clock is noticed without the watcher sleeping on real time.
//
// Thread-safety: all methods are thread-safe; on_exit runs on the watcher thread without any
// watcher lock held (it may call Unwatch).
#ifndef OFFLOADD_SERVER_SESSION_PID_WATCHER_H_
#define OFFLOADD_SERVER_SESSION_PID_WATCHER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "common/base/clock.h"
#include "common/base/mutex.h"

namespace offloadd::session {

class PidWatcher {
 public:
  using OnExit = std::function<void(uint64_t key)>;
  // force_proc_polling: skip pidfd_open (tests of the fallback). `clock`: not owned, must
  // outlive the watcher; null = base::Clock::Real().
  PidWatcher(double grace_seconds, double poll_interval_seconds, OnExit on_exit,
             bool force_proc_polling = false, base::Clock* clock = nullptr);
  ~PidWatcher();  // stops the thread; pending exits are not reported

  // Watches `pid` for `key` (one pid per key; a second Watch replaces the first). A pid that
  // does not exist is reported as exited (after the grace time).
  void Watch(uint64_t key, int32_t pid);
  void Unwatch(uint64_t key);

  // Keys watched (including those whose exit is pending), and how many use the /proc fallback.
  size_t watched() const;
  size_t polled() const;
  // Keys whose process's exit was noticed and whose report waits for the grace to pass.
  size_t exits_pending() const;

  // Start time of `pid` in clock ticks since boot (/proc/<pid>/stat field 22), or 0 when the
  // process does not exist.
  static uint64_t ProcessStartTicks(int32_t pid);

 private:
  struct Entry {
    int32_t pid = 0;
    int pidfd = -1;            // -1: polled through /proc
    uint64_t start_ticks = 0;  // polled entries
    double exit_deadline = 0;  // > 0: exit noticed, report at this time
  };
  void Loop();
  void Wake();
  double Now() const { return clock_->NowSeconds(); }

  const double grace_seconds_, poll_interval_seconds_;
  const OnExit on_exit_;
  const bool force_proc_polling_;
  base::Clock* const clock_;
  int epoll_fd_ = -1, wake_fd_ = -1;
  mutable base::Mutex mu_;
  std::map<uint64_t, Entry> entries_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_PID_WATCHER_H_
