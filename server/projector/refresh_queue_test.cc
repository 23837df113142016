#include "server/projector/refresh_queue.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace offloadd::projector {
namespace {

std::string PopParameter(FairRefreshQueue& q, int64_t* step = nullptr, uint64_t* id = nullptr) {
  auto item = q.Pop();
  if (!item) return "<none>";
  if (step) *step = item->step;
  if (id) *id = item->id;
  return item->parameter;
}

TEST(FairRefreshQueueTest, OneParameterRunsInStepOrderOneAtATime) {
  FairRefreshQueue q;
  q.Push("w", 400, 3);
  q.Push("w", 200, 1);
  q.Push("w", 300, 2);
  EXPECT_EQ(q.queued(), 3u);
  int64_t step = 0;
  uint64_t id = 0;
  EXPECT_EQ(PopParameter(q, &step, &id), "w");
  EXPECT_EQ(step, 200);
  EXPECT_EQ(id, 1u);
  // While w's refresh runs, nothing else of w may start.
  EXPECT_FALSE(q.Pop().has_value());
  EXPECT_EQ(q.running(), 1u);
  q.Done("w");
  EXPECT_EQ(PopParameter(q, &step), "w");
  EXPECT_EQ(step, 300);
  q.Done("w");
  EXPECT_EQ(PopParameter(q, &step), "w");
  EXPECT_EQ(step, 400);
  q.Done("w");
  EXPECT_FALSE(q.Pop().has_value());
  EXPECT_EQ(q.queued(), 0u);
  EXPECT_EQ(q.running(), 0u);
}

TEST(FairRefreshQueueTest, RoundRobinAcrossParametersWithoutHeadOfLineBlocking) {
  FairRefreshQueue q;
  // "big" has a backlog of 4 queued before the others arrive.
  for (int s = 0; s < 4; ++s) q.Push("big", s, 10 + s);
  q.Push("a", 0, 20);
  q.Push("b", 0, 30);
  std::vector<std::string> order;
  for (int i = 0; i < 6; ++i) {
    auto item = q.Pop();
    ASSERT_TRUE(item.has_value()) << i;
    order.push_back(item->parameter);
    q.Done(item->parameter);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"big", "a", "b", "big", "big", "big"}));
}

TEST(FairRefreshQueueTest, TwoWorkersTakeDifferentParameters) {
  FairRefreshQueue q;
  q.Push("a", 1, 1);
  q.Push("a", 2, 2);
  q.Push("b", 1, 3);
  auto first = q.Pop(), second = q.Pop();
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->parameter, "a");
  EXPECT_EQ(second->parameter, "b");
  EXPECT_FALSE(q.Pop().has_value());  // a's second refresh waits for its first
  q.Done("a");
  auto third = q.Pop();
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->id, 2u);
}

TEST(FairRefreshQueueTest, TakeAllEmptiesTheQueueButKeepsRunningOnes) {
  FairRefreshQueue q;
  q.Push("a", 1, 1);
  q.Push("a", 2, 2);
  q.Push("b", 1, 3);
  auto running = q.Pop();
  ASSERT_TRUE(running.has_value());
  std::vector<uint64_t> ids = q.TakeAll();
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(q.queued(), 0u);
  EXPECT_EQ(q.running(), 1u);
  EXPECT_FALSE(q.Pop().has_value());
  q.Done(running->parameter);
  EXPECT_EQ(q.running(), 0u);
  EXPECT_FALSE(q.Pop().has_value());
}

TEST(FairRefreshQueueTest, ParameterPushedWhileRunningRejoinsAfterDone) {
  FairRefreshQueue q;
  q.Push("a", 1, 1);
  auto item = q.Pop();
  ASSERT_TRUE(item.has_value());
  q.Push("a", 2, 2);
  q.Push("b", 1, 3);
  EXPECT_EQ(PopParameter(q), "b");
  q.Done("a");
  uint64_t id = 0;
  EXPECT_EQ(PopParameter(q, nullptr, &id), "a");
  EXPECT_EQ(id, 2u);
}


// One owner (uid) with a backlog over many parameters delays another owner's single refresh by
// at most one of its jobs (it used to wait behind one job of every parameter of the first).
TEST(FairRefreshQueueTest, RoundRobinAcrossOwnersBoundsTheWaitToOneJob) {
  FairRefreshQueue q;
  for (int p = 0; p < 100; ++p) q.Push("1000:p" + std::to_string(p), 0, 100 + p, /*owner=*/1000);
  // The victim's refresh arrives after the attacker's first job started.
  auto first = q.Pop();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->owner, 1000);
  q.Push("2000:w", 0, 7, /*owner=*/2000);
  auto second = q.Pop();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->id, 7u);
  EXPECT_EQ(second->owner, 2000);
  // Alternation while both have work: attacker, victim, attacker, ...
  for (int s = 1; s <= 3; ++s) q.Push("2000:w" + std::to_string(s), 0, 7 + s, 2000);
  std::vector<int64_t> owners;
  for (int i = 0; i < 6; ++i) {
    auto item = q.Pop();
    ASSERT_TRUE(item.has_value());
    owners.push_back(item->owner);
  }
  EXPECT_EQ(owners, (std::vector<int64_t>{1000, 2000, 1000, 2000, 1000, 2000}));
  EXPECT_EQ(q.queued(), 100u - 4u);
}

}  // namespace
}  // namespace offloadd::projector
