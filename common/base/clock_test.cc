#include "common/base/clock.h"

#include <chrono>
#include <thread>

#include "common/base/fake_clock.h"
#include "common/base/mutex.h"
#include "gtest/gtest.h"

namespace offloadd::base {
namespace {

TEST(SteadyClockTest, SecondsAreSteadyClockSecondsAndNeverGoBack) {
  const double before =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const double a = SteadyNowSeconds();
  const double b = SteadyNowSeconds();
  const double after =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  EXPECT_LE(before, a);
  EXPECT_LE(a, b);
  EXPECT_LE(b, after);
}

TEST(SteadyClockTest, SleepUntilReturnsNoEarlierThanTheTarget) {
  const double target = SteadyNowSeconds() + 0.002;
  SleepUntilSteadySeconds(target);
  EXPECT_GE(SteadyNowSeconds(), target);
  SleepUntilSteadySeconds(target - 10);  // past: returns at once
}

TEST(ClockTest, RealIsOneSteadyClock) {
  ASSERT_NE(Clock::Real(), nullptr);
  EXPECT_EQ(Clock::Real(), Clock::Real());
  const double a = SteadyNowSeconds();
  const double b = Clock::Real()->NowSeconds();
  EXPECT_LE(a, b);
  EXPECT_LE(b, SteadyNowSeconds());
}

// A timed-out wait and a past deadline both return with the caller's mutex held again.
TEST(ClockTest, RealWaitUntilReturnsHoldingTheMutex) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(mu);
  Clock& clock = *Clock::Real();
  const double deadline = clock.NowSeconds() + 0.002;
  while (clock.NowSeconds() < deadline) clock.WaitUntil(mu, cv, deadline);
  std::thread([&] { EXPECT_FALSE(mu.TryLock()); }).join();
  clock.WaitUntil(mu, cv, deadline - 10);
  std::thread([&] { EXPECT_FALSE(mu.TryLock()); }).join();
}

TEST(FakeClockTest, TimeMovesOnlyByAdvanceAndSleepUntil) {
  FakeClock clock(10);
  EXPECT_EQ(clock.NowSeconds(), 10);
  clock.Advance(2.5);
  EXPECT_EQ(clock.NowSeconds(), 12.5);
  clock.SleepUntil(20);
  EXPECT_EQ(clock.NowSeconds(), 20);
  clock.SleepUntil(15);  // the past: time does not go back
  EXPECT_EQ(clock.NowSeconds(), 20);
  EXPECT_EQ(clock.sleeps(), 2u);
}

TEST(FakeClockTest, WaitUntilReturnsOncePastTheDeadlineAndAdvanceWakesTheWaiter) {
  FakeClock clock(0);
  Mutex mu;
  CondVar cv;
  {
    MutexLock lock(mu);
    clock.WaitUntil(mu, cv, 0);  // deadline reached: returns without waiting
    std::thread([&] { EXPECT_FALSE(mu.TryLock()); }).join();  // still held by this thread
  }
  EXPECT_EQ(clock.waits(), 0u);
  double woke_at = -1;
  std::thread waiter([&] {
    MutexLock lock(mu);
    while (clock.NowSeconds() < 5) clock.WaitUntil(mu, cv, 5);
    woke_at = clock.NowSeconds();
  });
  while (clock.waits() == 0) std::this_thread::yield();
  clock.Advance(4);  // not yet: the waiter waits again
  clock.Advance(1);
  waiter.join();
  EXPECT_EQ(woke_at, 5);
}

}  // namespace
}  // namespace offloadd::base
