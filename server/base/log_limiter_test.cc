#include "server/base/log_limiter.h"

#include "common/base/fake_clock.h"
#include "gtest/gtest.h"

namespace offloadd::base {
namespace {

TEST(LogLimiterTest, OneLinePerIntervalWithTheCountHeldBack) {
  FakeClock clock(100);
  LogLimiter limiter(10, &clock);
  uint64_t held = 99;
  ASSERT_TRUE(limiter.Allow(&held));
  EXPECT_EQ(held, 0u);
  for (int i = 0; i < 5000; ++i) EXPECT_FALSE(limiter.Allow(&held));
  clock.SleepUntil(109.9);
  EXPECT_FALSE(limiter.Allow(&held));
  clock.SleepUntil(110);
  ASSERT_TRUE(limiter.Allow(&held));
  EXPECT_EQ(held, 5001u);
  clock.SleepUntil(200);
  ASSERT_TRUE(limiter.Allow(nullptr));
  clock.SleepUntil(300);
  ASSERT_TRUE(limiter.Allow(&held));
  EXPECT_EQ(held, 0u);
}

}  // namespace
}  // namespace offloadd::base
