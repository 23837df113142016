#include "server/sched/host_link.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/base/fake_clock.h"
#include "gtest/gtest.h"

namespace offloadd::sched {
namespace {

using base::FakeClock;

constexpr uint64_t kMiB = 1ull << 20;

// Runs `turns` turns on a queue where every child in `chunk_bytes` always has a chunk waiting
// (it rejoins right after each of its turns, as a backlogged LinkScheduler does); returns the
// bytes each child moved.
std::map<std::string, uint64_t> RunBacklogged(TurnQueue& q,
                                              const std::map<std::string, uint64_t>& chunk_bytes,
                                              int turns) {
  for (const auto& [child, len] : chunk_bytes) q.Join(child);
  std::map<std::string, uint64_t> moved;
  for (int i = 0; i < turns; ++i) {
    std::optional<std::string> c = q.Next();
    EXPECT_TRUE(c.has_value());
    if (!c) break;
    const uint64_t len = chunk_bytes.at(*c);
    q.Charge(*c, len);
    moved[*c] += len;
    q.Join(*c);
  }
  return moved;
}

TEST(TurnQueueTest, EqualChildrenAlternateAndMoveEqualBytes) {
  TurnQueue q(8 * kMiB, {});
  std::vector<std::string> order;
  q.Join("a");
  q.Join("b");
  for (int i = 0; i < 6; ++i) {
    std::string c = *q.Next();
    order.push_back(c);
    q.Charge(c, 8 * kMiB);
    q.Join(c);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b", "a", "b", "a", "b"}));
  EXPECT_EQ(q.waiting("a"), 1u);
  EXPECT_EQ(q.deficit_bytes("a"), 0);
}

TEST(TurnQueueTest, UnequalChunkSizesStillGiveEqualBytes) {
  // SRR charges what was sent after the fact: a child with 1 MiB chunks gets 8 turns for each
  // turn of a child with 8 MiB chunks, and one of 3 MiB chunks carries its overshoot as debt.
  TurnQueue q(8 * kMiB, {});
  auto moved = RunBacklogged(q, {{"small", 1 * kMiB}, {"big", 8 * kMiB}, {"odd", 3 * kMiB}}, 3000);
  const double total = static_cast<double>(moved["small"] + moved["big"] + moved["odd"]);
  for (const char* c : {"small", "big", "odd"}) {
    // Within one quantum plus one chunk of an exact third.
    EXPECT_NEAR(static_cast<double>(moved[c]), total / 3, 16.0 * kMiB) << c;
  }
}

TEST(TurnQueueTest, WeightsTwoToOneGiveTwiceTheBytes) {
  TurnQueue q(4 * kMiB, {{"heavy", 2}, {"light", 1}});
  auto moved = RunBacklogged(q, {{"heavy", 4 * kMiB}, {"light", 4 * kMiB}}, 300);
  // 300 turns = 100 rounds of (heavy, heavy, light).
  EXPECT_EQ(moved["heavy"], 200 * 4 * kMiB);
  EXPECT_EQ(moved["light"], 100 * 4 * kMiB);
}

TEST(TurnQueueTest, IdleChildLeavesTheRoundAndBanksNothing) {
  TurnQueue q(8 * kMiB, {});
  q.Join("a");
  q.Join("b");
  q.Join("c");
  // a and c stay backlogged; b sends one chunk and then has nothing.
  for (int i = 0; i < 3; ++i) {
    std::string c = *q.Next();
    q.Charge(c, 8 * kMiB);
    if (c != "b") q.Join(c);
  }
  std::map<std::string, int> turns;
  for (int i = 0; i < 10; ++i) {
    std::string c = *q.Next();
    ++turns[c];
    q.Charge(c, 8 * kMiB);
    q.Join(c);
  }
  EXPECT_EQ(turns["a"], 5);
  EXPECT_EQ(turns["c"], 5);
  EXPECT_EQ(turns.count("b"), 0u);
  EXPECT_EQ(q.deficit_bytes("b"), 0);  // left the round
  // Back after a long idle time: one quantum's worth, like everybody, then its turn ends.
  q.Join("b");
  q.Join("b");
  std::vector<std::string> order;
  for (int i = 0; i < 6; ++i) {
    std::string c = *q.Next();
    order.push_back(c);
    q.Charge(c, 8 * kMiB);
    if (c != "b") q.Join(c);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"a", "c", "b", "a", "c", "b"}));
}

TEST(TurnQueueTest, DebtIsPaidBeforeTheNextTurn) {
  TurnQueue q(1 * kMiB, {});
  q.Join("a");
  q.Join("b");
  EXPECT_EQ(*q.Next(), "a");
  q.Charge("a", 3 * kMiB);  // 2 MiB over its quantum
  EXPECT_EQ(q.deficit_bytes("a"), -2 * static_cast<int64_t>(kMiB));
  q.Join("a");
  std::vector<std::string> order;
  for (int i = 0; i < 4; ++i) {
    std::string c = *q.Next();
    order.push_back(c);
    q.Charge(c, 1 * kMiB);
    q.Join(c);
  }
  // a's next two visits only pay its debt: b is served three times before a again.
  EXPECT_EQ(order, (std::vector<std::string>{"b", "b", "b", "a"}));
  EXPECT_EQ(q.Next(), std::optional<std::string>("b"));
}

TEST(TurnQueueTest, NobodyWaitingIsNullopt) {
  TurnQueue q(0, {});
  EXPECT_FALSE(q.Next().has_value());
  q.Join("a");
  EXPECT_EQ(*q.Next(), "a");
  q.Charge("a", 100);
  EXPECT_FALSE(q.Next().has_value());
}

TEST(HostLinkTest, TurnsArePacedAtTheLevelsRate) {
  FakeClock clock(10.0);
  HostLinkOptions o;
  o.name = "numa0";
  o.bytes_per_second = 1e9;
  HostLink host(o, &clock);
  EXPECT_DOUBLE_EQ(host.WaitTurn("a"), 10.0);
  EXPECT_DOUBLE_EQ(host.Commit("a", 4000000), 10.004);
  // The next turn waits (sleeps on the clock) until the level has moved those bytes.
  EXPECT_DOUBLE_EQ(host.WaitTurn("b"), 10.004);
  EXPECT_DOUBLE_EQ(clock.NowSeconds(), 10.004);
  EXPECT_DOUBLE_EQ(host.Commit("b", 0), 10.004);  // unused turn: the level stays free
  EXPECT_DOUBLE_EQ(host.WaitTurn("a"), 10.004);
  EXPECT_DOUBLE_EQ(host.Commit("a", 1000000), 10.005);
  // Idle for a while: the next turn starts now, not at the old finish.
  clock.Advance(1.0);
  EXPECT_DOUBLE_EQ(host.WaitTurn("b"), 11.004);
  EXPECT_DOUBLE_EQ(host.Commit("b", 2000000), 11.006);
  HostLinkStats s = host.stats();
  EXPECT_EQ(s.bytes, 7000000u);
  EXPECT_EQ(s.child_bytes["a"], 5000000u);
  EXPECT_EQ(s.child_bytes["b"], 2000000u);
  EXPECT_NEAR(s.busy_seconds, 0.007, 1e-12);
  EXPECT_EQ(s.turns, 4u);
}

TEST(HostLinkTest, UnpacedLevelNeverWaits) {
  FakeClock clock(5.0);
  HostLink host(HostLinkOptions{}, &clock);
  EXPECT_DOUBLE_EQ(host.WaitTurn("a"), 5.0);
  EXPECT_DOUBLE_EQ(host.Commit("a", 1 << 30), 5.0);
  EXPECT_DOUBLE_EQ(host.WaitTurn("a"), 5.0);
  EXPECT_DOUBLE_EQ(host.Commit("a", 1), 5.0);
  EXPECT_EQ(clock.sleeps(), 0u);
  EXPECT_DOUBLE_EQ(host.stats().busy_seconds, 0.0);
}

// Two unpaced links under one paced host link, each with backlogged transfers: the host link
// is the bottleneck, never idle in virtual time, and splits its bytes evenly.
TEST(HostLinkTest, LinkSchedulersUnderOneHostLinkShareItsCapacity) {
  FakeClock clock;
  HostLinkOptions ho;
  ho.name = "numa0";
  ho.direction = "d2h";
  ho.bytes_per_second = 1e9;
  ho.quantum_bytes = 1 * kMiB;
  HostLink host(ho, &clock);
  std::vector<std::unique_ptr<LinkScheduler>> links;
  uint64_t total = 0;
  std::mutex mu;
  std::map<std::string, uint64_t> copied;
  for (const char* name : {"sw0", "sw1"}) {
    LinkSchedulerOptions o;
    o.link_name = name;
    o.direction = "d2h";
    o.chunk_bytes = 1 * kMiB;
    o.quantum_bytes = 1 * kMiB;
    o.worker_threads = 2;
    o.parent = &host;
    links.push_back(std::make_unique<LinkScheduler>(o, &clock));
  }
  for (int i = 0; i < 8; ++i) {
    auto t = std::make_shared<Transfer>();
    t->gpu = "gpu" + std::to_string(i);
    t->bytes = 5 * kMiB + 4096 * i;
    total += t->bytes;
    const std::string link = i % 2 ? "sw1" : "sw0";
    t->copy_chunk = [&, link](uint64_t, uint64_t len) {
      std::lock_guard<std::mutex> lock(mu);
      copied[link] += len;
      return absl::OkStatus();
    };
    links[i % 2]->Submit(t);
  }
  for (auto& l : links) l->Shutdown();
  HostLinkStats s = host.stats();
  EXPECT_EQ(s.bytes, total);
  EXPECT_EQ(s.child_bytes["sw0"], copied["sw0"]);
  EXPECT_EQ(s.child_bytes["sw1"], copied["sw1"]);
  EXPECT_EQ(links[0]->stats().bytes + links[1]->stats().bytes, total);
  // Every byte went through the host link at its rate, one turn after another.
  EXPECT_NEAR(s.busy_seconds, static_cast<double>(total) / 1e9, 1e-9);
  EXPECT_GE(clock.NowSeconds(), static_cast<double>(total) / 1e9 - 1e-9);
}

}  // namespace
}  // namespace offloadd::sched
