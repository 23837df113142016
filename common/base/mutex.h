// A mutex, scoped lock and condition variable that Clang's thread-safety analysis understands
// (-Wthread-safety; `bazel build --config=tsa`), and the annotation macros for the members and
// functions they protect:
//
//   base::Mutex mu_;
//   std::map<...> regions_ GUARDED_BY(mu_);
//   void DropLocked() REQUIRES(mu_);     // caller holds mu_
//   void Close() EXCLUDES(mu_);          // takes mu_ itself
//
// A thin layer over std::mutex / std::condition_variable, not absl::Mutex: Debian's absl is not
// built with ThreadSanitizer, so TSan (make test-tsan) would not see absl::Mutex's lock
// operations and would report false races; std::mutex's inline calls reach pthread, which TSan
// intercepts. Under GCC the macros expand to nothing.
#ifndef OFFLOADD_COMMON_BASE_MUTEX_H_
#define OFFLOADD_COMMON_BASE_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

// Debian's absl defines GUARDED_BY, PT_GUARDED_BY, ACQUIRED_BEFORE/AFTER and
// NO_THREAD_SAFETY_ANALYSIS with these names and meanings (absl/base/internal/
// thread_annotations.h, included by every absl header that locks): take those, define the rest.
#include "absl/base/thread_annotations.h"

#if defined(__clang__)
#define OFFLOADD_TSA(x) __attribute__((x))
#else
#define OFFLOADD_TSA(x)
#endif

#ifndef GUARDED_BY
#define GUARDED_BY(x) OFFLOADD_TSA(guarded_by(x))
#endif
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) OFFLOADD_TSA(pt_guarded_by(x))
#endif
#ifndef ACQUIRED_BEFORE
#define ACQUIRED_BEFORE(...) OFFLOADD_TSA(acquired_before(__VA_ARGS__))
#endif
#ifndef ACQUIRED_AFTER
#define ACQUIRED_AFTER(...) OFFLOADD_TSA(acquired_after(__VA_ARGS__))
#endif
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS OFFLOADD_TSA(no_thread_safety_analysis)
#endif
#define CAPABILITY(x) OFFLOADD_TSA(capability(x))
#define SCOPED_CAPABILITY OFFLOADD_TSA(scoped_lockable)
#define REQUIRES(...) OFFLOADD_TSA(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) OFFLOADD_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) OFFLOADD_TSA(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) OFFLOADD_TSA(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) OFFLOADD_TSA(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) OFFLOADD_TSA(assert_capability(x))
#define RETURN_CAPABILITY(x) OFFLOADD_TSA(lock_returned(x))

namespace offloadd::base {

class CondVar;

// std::mutex with the analysis' annotations. Also BasicLockable (lock/unlock), for code that
// needs a standard lock type.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }

  // Tells the analysis that the caller holds the mutex (checks nothing at run time).
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope; Unlock()/Lock() release and retake it inside the scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_.Unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_.Lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// std::condition_variable over a base::Mutex the caller holds. Waits may wake spuriously: wait in
// a loop over the condition (`while (!ready_) cv_.Wait(mu_);`), which the analysis checks
// (a predicate lambda would be analysed without the lock).
class CondVar {
 public:
  void Wait(Mutex& mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // Returns false when `deadline` passed (the mutex is held again either way).
  template <class Clock, class Duration>
  bool WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  // Returns false when `seconds` passed.
  bool WaitForSeconds(Mutex& mu, double seconds) REQUIRES(mu) {
    return WaitUntil(mu, DeadlineIn(seconds));
  }
  // The steady-clock time `seconds` from now, for a predicate wait with a bound:
  //   const auto deadline = CondVar::DeadlineIn(seconds);
  //   while (!done_ && cv_.WaitUntil(mu_, deadline)) {}
  static std::chrono::steady_clock::time_point DeadlineIn(double seconds) {
    return std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
               std::chrono::duration<double>(seconds));
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }
  // std::condition_variable's spellings, so call sites read the same either way.
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace offloadd::base

#endif  // OFFLOADD_COMMON_BASE_MUTEX_H_
