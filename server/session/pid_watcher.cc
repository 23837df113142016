#include "server/session/pid_watcher.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace offloadd::session {

uint64_t PidWatcher::ProcessStartTicks(int32_t pid) {
  std::ifstream in(absl::StrFormat("/proc/%d/stat", pid));
  std::string stat;
  if (!in || !std::getline(in, stat)) return 0;
  size_t close = stat.rfind(')');  // the command name may contain spaces and parentheses
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  uint64_t start = 0;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 3 && (field == "Z" || field == "X")) return 0;  // exited, not yet reaped
    if (i == 22) start = std::strtoull(field.c_str(), nullptr, 10);
  }
  return start;
}

PidWatcher::PidWatcher(double grace_seconds, double poll_interval_seconds, OnExit on_exit,
                       bool force_proc_polling, base::Clock* clock)
    : grace_seconds_(std::max(0.0, grace_seconds)),
      poll_interval_seconds_(std::max(0.01, poll_interval_seconds)),
      on_exit_(std::move(on_exit)),
      force_proc_polling_(force_proc_polling),
      clock_(clock != nullptr ? clock : base::Clock::Real()) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // key 0 is the wake-up; session ids start at 1
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { Loop(); });
}

PidWatcher::~PidWatcher() {
  {
    base::MutexLock lock(mu_);
    stopping_ = true;
  }
  Wake();
  thread_.join();
  for (auto& [key, e] : entries_) {
    if (e.pidfd >= 0) close(e.pidfd);
  }
  close(wake_fd_);
  close(epoll_fd_);
}

void PidWatcher::Wake() {
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void PidWatcher::Watch(uint64_t key, int32_t pid) {
  Unwatch(key);
  Entry e;
  e.pid = pid;
  if (!force_proc_polling_) {
    e.pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (e.pidfd < 0 && errno == ESRCH) e.exit_deadline = base::SteadyNowSeconds() + grace_seconds_;
  }
  if (e.pidfd < 0 && e.exit_deadline == 0) {
    e.start_ticks = ProcessStartTicks(pid);
    if (e.start_ticks == 0) e.exit_deadline = base::SteadyNowSeconds() + grace_seconds_;
  }
  base::MutexLock lock(mu_);
  if (e.pidfd >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = key;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, e.pidfd, &ev);
  }
  entries_[key] = e;
  Wake();
}

void PidWatcher::Unwatch(uint64_t key) {
  base::MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  if (it->second.pidfd >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.pidfd, nullptr);
    close(it->second.pidfd);
  }
  entries_.erase(it);
}

size_t PidWatcher::watched() const {
  base::MutexLock lock(mu_);
  return entries_.size();
}

size_t PidWatcher::exits_pending() const {
  base::MutexLock lock(mu_);
  size_t n = 0;
  for (const auto& [key, e] : entries_) n += e.exit_deadline > 0 ? 1 : 0;
  return n;
}

size_t PidWatcher::polled() const {
  base::MutexLock lock(mu_);
  size_t n = 0;
  for (const auto& [key, e] : entries_) n += e.pidfd < 0 && e.exit_deadline == 0;
  return n;
}

void PidWatcher::Loop() {
  double next_poll = base::SteadyNowSeconds() + poll_interval_seconds_;
  std::vector<epoll_event> events(64);
  while (true) {
    std::vector<uint64_t> exited;
    double timeout_seconds = -1;
    {
      base::MutexLock lock(mu_);
      if (stopping_) return;
      const double now = base::SteadyNowSeconds();
      const bool poll_now = now >= next_poll;
      if (poll_now) next_poll = now + poll_interval_seconds_;
      bool any_polled = false;
      for (auto it = entries_.begin(); it != entries_.end();) {
        Entry& e = it->second;
        if (e.exit_deadline == 0 && e.pidfd < 0) {
          any_polled = true;
          if (poll_now && ProcessStartTicks(e.pid) != e.start_ticks) {
            e.exit_deadline = now + grace_seconds_;
          }
        }
        if (e.exit_deadline > 0 && e.exit_deadline <= now) {
          exited.push_back(it->first);
          it = entries_.erase(it);
          continue;
        }
        if (e.exit_deadline > 0) {
          double wait = e.exit_deadline - now;
          if (timeout_seconds < 0 || wait < timeout_seconds) timeout_seconds = wait;
        }
        ++it;
      }
      if (any_polled) {
        double wait = std::max(0.0, next_poll - now);
        if (timeout_seconds < 0 || wait < timeout_seconds) timeout_seconds = wait;
      }
    }
    if (!exited.empty()) {
      for (uint64_t key : exited) on_exit_(key);
      continue;
    }
    int timeout_ms = timeout_seconds < 0 ? -1 : static_cast<int>(timeout_seconds * 1000) + 1;
    // Another clock's seconds are not real ones: re-read it every 2 ms (see the header).
    if (clock_ != base::Clock::Real() && (timeout_ms < 0 || timeout_ms > 2)) timeout_ms = 2;
    int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout_ms);
    base::MutexLock lock(mu_);
    for (int i = 0; i < n; ++i) {
      uint64_t key = events[i].data.u64;
      if (key == 0) {
        uint64_t drained;
        (void)!read(wake_fd_, &drained, sizeof(drained));
        continue;
      }
      auto it = entries_.find(key);
      if (it == entries_.end() || it->second.pidfd < 0) continue;
      // The process exited: stop watching its pidfd (it stays readable) and start the grace.
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.pidfd, nullptr);
      close(it->second.pidfd);
      it->second.pidfd = -1;
      it->second.exit_deadline = base::SteadyNowSeconds() + grace_seconds_;
    }
  }
}

}  // namespace offloadd::session
