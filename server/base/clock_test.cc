#include "server/base/clock.h"

#include <chrono>

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

}  // namespace
}  // namespace offloadd::base
