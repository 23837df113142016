#include "common/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmath>

namespace offloadd::common {

void FutexWait(const std::atomic<uint32_t>* word, uint32_t expected, double timeout_seconds) {
  struct timespec ts;
  struct timespec* timeout = nullptr;
  // Beyond a year is no limit (a timespec cannot hold every double: 1e300 would overflow it and
  // make the wait fail at once, turning a caller's sleep into a busy loop).
  if (timeout_seconds >= 0 && timeout_seconds < kFutexNoLimitSeconds) {
    const double whole = std::floor(timeout_seconds);
    ts.tv_sec = static_cast<time_t>(whole);
    ts.tv_nsec = static_cast<long>((timeout_seconds - whole) * 1e9);
    timeout = &ts;
  }
  // std::atomic<uint32_t> is a plain 32-bit word (static_assert in spsc_ring.h).
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT, expected, timeout,
          nullptr, 0);
}

int FutexWake(const std::atomic<uint32_t>* word, int waiters) {
  return static_cast<int>(syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAKE,
                                  waiters, nullptr, nullptr, 0));
}

}  // namespace offloadd::common
