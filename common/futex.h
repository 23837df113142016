// Futex wait and wake on a 32-bit word that may lie in memory shared between processes (no
// FUTEX_PRIVATE_FLAG), and the doorbell the ring's two sides wake each other with.
#ifndef OFFLOADD_COMMON_FUTEX_H_
#define OFFLOADD_COMMON_FUTEX_H_

#include <atomic>
#include <cstdint>

namespace offloadd::common {

// Timeouts at or above this (and negative ones) mean no limit.
inline constexpr double kFutexNoLimitSeconds = 365.0 * 24 * 3600;

// Sleeps while *word == expected, for at most timeout_seconds (< 0: no limit). Returns at once
// when the word differs (the kernel compares atomically with the sleep, so a wake between the
// caller's check and the sleep is not lost), on a wake, on a signal, or on the timeout; the
// caller re-checks its condition in every case.
void FutexWait(const std::atomic<uint32_t>* word, uint32_t expected, double timeout_seconds);
// Wakes up to `waiters` threads (any process) sleeping on `word`. Returns how many woke.
int FutexWake(const std::atomic<uint32_t>* word, int waiters);

// One side's doorbell in shared memory: `waiting` counts that side's threads about to sleep or
// sleeping, `bell` is the futex word they sleep on.
//
// Wake protocol (no lost wake-ups): a waiter calls Arm() (waiting += 1, then reads bell: both
// sequentially consistent), re-checks its condition (ring non-empty, space free, closed) and
// only if it still holds sleeps with Sleep(seen); then Disarm(). A waker first publishes its
// change (a ring index, stored sequentially consistent), then calls Ring(): if waiting != 0 it
// increments bell and wakes every sleeper. In the single total order of sequentially
// consistent operations either the waker's read of `waiting` comes after the waiter's
// increment (then bell changes after the waiter read it: its futex wait returns at once or is
// woken), or the waiter's re-check comes after the waker's publication (then it sees the change
// and does not sleep). Ring() costs one load when nobody waits.
struct alignas(64) Doorbell {
  std::atomic<uint32_t> waiting{0};
  std::atomic<uint32_t> bell{0};

  uint32_t Arm() {
    waiting.fetch_add(1, std::memory_order_seq_cst);
    return bell.load(std::memory_order_seq_cst);
  }
  void Sleep(uint32_t seen, double timeout_seconds) { FutexWait(&bell, seen, timeout_seconds); }
  void Disarm() { waiting.fetch_sub(1, std::memory_order_seq_cst); }
  // Wakes the other side if it may be waiting.
  void Ring() {
    if (waiting.load(std::memory_order_seq_cst) != 0) RingAlways();
  }
  // Wakes whoever sleeps, armed or not (closing, stopping).
  void RingAlways() {
    bell.fetch_add(1, std::memory_order_seq_cst);
    FutexWake(&bell, 1 << 30);
  }
};
static_assert(sizeof(Doorbell) == 64, "one doorbell per cache line");

}  // namespace offloadd::common

#endif  // OFFLOADD_COMMON_FUTEX_H_
