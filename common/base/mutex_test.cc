// base::Mutex / MutexLock / CondVar: a hand-off between two threads, relocking inside a scope,
// and WaitUntil reporting a passed deadline.
#include "common/base/mutex.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace offloadd::base {
namespace {

struct Box {
  Mutex mu;
  CondVar cv;
  int value GUARDED_BY(mu) = 0;
};

TEST(MutexTest, CondVarHandsAValueBetweenThreads) {
  Box box;
  std::thread producer([&] {
    MutexLock lock(box.mu);
    box.value = 42;
    box.cv.NotifyAll();
  });
  int seen;
  {
    MutexLock lock(box.mu);
    while (box.value == 0) box.cv.Wait(box.mu);
    seen = box.value;
  }
  producer.join();
  EXPECT_EQ(seen, 42);
}

TEST(MutexTest, MutexLockUnlocksAndRelocksInItsScope) {
  Box box;
  MutexLock lock(box.mu);
  box.value = 1;
  lock.Unlock();
  bool released = false;
  if (box.mu.TryLock()) {  // really released
    released = true;
    box.mu.Unlock();
  }
  EXPECT_TRUE(released);
  lock.Lock();
  box.value = 2;
  EXPECT_EQ(box.value, 2);
}

TEST(MutexTest, WaitUntilAPassedDeadlineReturnsFalseWithTheMutexHeld) {
  Box box;
  MutexLock lock(box.mu);
  EXPECT_FALSE(box.cv.WaitUntil(box.mu, std::chrono::steady_clock::now()));
  box.value = 3;  // still held
  EXPECT_EQ(box.value, 3);
}

}  // namespace
}  // namespace offloadd::base
