// TransferGate: counting, refusal after StopAccepting, and the bounded wait on an injected clock
// (shutdown_grace_seconds), driven by a FakeClock instead of real sleeps.
#include "server/session/transfer_gate.h"

#include <chrono>
#include <future>
#include <thread>

#include "common/base/fake_clock.h"
#include "gtest/gtest.h"

namespace offloadd::session {
namespace {

TEST(TransferGateTest, CountsAndRefusesAfterStop) {
  TransferGate gate;
  ASSERT_TRUE(gate.Begin());
  ASSERT_TRUE(gate.Begin());
  EXPECT_EQ(gate.in_flight(), 2u);
  gate.StopAccepting();
  EXPECT_TRUE(gate.stopped());
  EXPECT_FALSE(gate.Begin());
  EXPECT_EQ(gate.in_flight(), 2u);
  gate.End();
  gate.End();
  EXPECT_EQ(gate.in_flight(), 0u);
  EXPECT_TRUE(gate.WaitIdle(0));
}

TEST(TransferGateTest, BoundedWaitEndsWhenTheInjectedClockPassesTheGrace) {
  base::FakeClock clock(100);
  TransferGate gate(&clock);
  ASSERT_TRUE(gate.Begin());
  auto waited = std::async(std::launch::async, [&] { return gate.WaitIdle(5.0); });
  // Real time alone never ends the wait: only the fake clock's 5 s do.
  while (clock.waits() == 0) std::this_thread::yield();
  EXPECT_EQ(waited.wait_for(std::chrono::milliseconds(30)), std::future_status::timeout);
  clock.Advance(4.9);
  EXPECT_EQ(waited.wait_for(std::chrono::milliseconds(30)), std::future_status::timeout);
  clock.Advance(0.2);
  EXPECT_FALSE(waited.get());
  EXPECT_EQ(gate.in_flight(), 1u);
  gate.End();
}

TEST(TransferGateTest, BoundedWaitReturnsTrueWhenTheLastTransferEnds) {
  base::FakeClock clock(0);
  TransferGate gate(&clock);
  ASSERT_TRUE(gate.Begin());
  auto waited = std::async(std::launch::async, [&] { return gate.WaitIdle(5.0); });
  while (clock.waits() == 0) std::this_thread::yield();
  gate.End();
  EXPECT_TRUE(waited.get());
  EXPECT_DOUBLE_EQ(clock.NowSeconds(), 0.0);
}

}  // namespace
}  // namespace offloadd::session
