// The timing model's arithmetic: completion times, engine order, stream dependencies and the two
// kinds of contention, at 1 GB/s so 1,000,000 bytes take exactly 1 ms.
#include "server/copy/timing/copy_timing_model.h"

#include "gtest/gtest.h"

namespace offloadd::copy {
namespace {

constexpr double kRate = 1e9;
constexpr uint64_t kMs = 1000000;  // bytes moved in 1 ms at kRate
constexpr double kEps = 1e-12;
constexpr Direction kD2H = Direction::kDeviceToHost;
constexpr Direction kH2D = Direction::kHostToDevice;

CopyModelOptions Opts(int gpus = 2, int per_switch = 1) {
  CopyModelOptions o;
  o.gpus = gpus;
  o.gpus_per_switch = per_switch;
  o.engine_bytes_per_second = kRate;
  return o;
}

TEST(CopyTimingModelTest, OneCopyTakesBytesOverRate) {
  CopyTimingModel m(Opts());
  auto op = m.Enqueue(10.0, 0, kD2H, 3 * kMs, {});
  m.AdvanceTo(10.002999);
  EXPECT_FALSE(m.Done(op));
  EXPECT_EQ(m.queued(0, kD2H), 1u);
  m.AdvanceTo(10.5);
  EXPECT_TRUE(m.Done(op));
  EXPECT_NEAR(m.CompletionSeconds(op), 10.003, kEps);
  ModelEngineStats s = m.engine_stats(0, kD2H);
  EXPECT_EQ(s.copies_done, 1u);
  EXPECT_EQ(s.bytes_done, 3 * kMs);
  EXPECT_NEAR(s.busy_seconds, 0.003, kEps);
  EXPECT_EQ(m.engine_stats(0, kH2D).bytes_done, 0u);
}

TEST(CopyTimingModelTest, AnEngineServesCopiesInQueueOrderOneAtATime) {
  CopyTimingModel m(Opts());
  // Three streams' copies on one engine: FIFO, back to back.
  auto a = m.Enqueue(0, 1, kH2D, 2 * kMs, {});
  auto b = m.Enqueue(0, 1, kH2D, 1 * kMs, {});
  auto c = m.Enqueue(0.0005, 1, kH2D, 1 * kMs, {});
  m.AdvanceTo(1);
  EXPECT_NEAR(m.CompletionSeconds(a), 0.002, kEps);
  EXPECT_NEAR(m.CompletionSeconds(b), 0.003, kEps);
  EXPECT_NEAR(m.CompletionSeconds(c), 0.004, kEps);
  // A copy queued after the engine went idle starts when queued.
  auto d = m.Enqueue(2, 1, kH2D, kMs, {});
  m.AdvanceTo(3);
  EXPECT_NEAR(m.CompletionSeconds(d), 2.001, kEps);
  EXPECT_NEAR(m.engine_stats(1, kH2D).busy_seconds, 0.005, kEps);
}

TEST(CopyTimingModelTest, DirectionsAndGpusAreIndependentWithoutContention) {
  CopyTimingModel m(Opts(2, 2));
  auto a = m.Enqueue(0, 0, kD2H, kMs, {});
  auto b = m.Enqueue(0, 0, kH2D, kMs, {});
  auto c = m.Enqueue(0, 1, kD2H, kMs, {});
  m.AdvanceTo(1);
  EXPECT_NEAR(m.CompletionSeconds(a), 0.001, kEps);
  EXPECT_NEAR(m.CompletionSeconds(b), 0.001, kEps);
  EXPECT_NEAR(m.CompletionSeconds(c), 0.001, kEps);
}

TEST(CopyTimingModelTest, AfterHoldsACopyAndItsEngineUntilTheOpCompletes) {
  CopyTimingModel m(Opts());
  auto d2h = m.Enqueue(0, 0, kD2H, 2 * kMs, {});
  auto h2d = m.Enqueue(0, 0, kH2D, kMs, {d2h});  // same stream, other engine
  auto next = m.Enqueue(0, 0, kH2D, kMs, {});    // behind it on the H2D engine
  m.AdvanceTo(0.0025);
  EXPECT_TRUE(m.Done(d2h));
  EXPECT_FALSE(m.Done(h2d));
  m.AdvanceTo(1);
  EXPECT_NEAR(m.CompletionSeconds(h2d), 0.003, kEps);
  EXPECT_NEAR(m.CompletionSeconds(next), 0.004, kEps);
  // An op that completed before the copy was queued does not delay it.
  auto late = m.Enqueue(1, 0, kH2D, kMs, {d2h});
  m.AdvanceTo(2);
  EXPECT_NEAR(m.CompletionSeconds(late), 1.001, kEps);
}

TEST(CopyTimingModelTest, H2dSlowsWhileD2hRuns) {
  CopyModelOptions o = Opts();
  o.h2d_share_while_d2h_busy = 0.5;  // nvbandwidth#11 on A100
  CopyTimingModel m(o);
  auto d2h = m.Enqueue(0, 0, kD2H, kMs, {});
  auto h2d = m.Enqueue(0, 0, kH2D, kMs, {});
  m.AdvanceTo(1);
  // D2H at full rate: 1 ms. H2D: half the bytes by then at half rate, the rest at full rate.
  EXPECT_NEAR(m.CompletionSeconds(d2h), 0.001, kEps);
  EXPECT_NEAR(m.CompletionSeconds(h2d), 0.0015, kEps);
  // GPU 1 is not slowed by GPU 0's D2H.
  auto d2h0 = m.Enqueue(2, 0, kD2H, kMs, {});
  auto h2d1 = m.Enqueue(2, 1, kH2D, kMs, {});
  m.AdvanceTo(3);
  EXPECT_NEAR(m.CompletionSeconds(d2h0), 2.001, kEps);
  EXPECT_NEAR(m.CompletionSeconds(h2d1), 2.001, kEps);
}

TEST(CopyTimingModelTest, GpusBehindOneSwitchShareItsUplink) {
  CopyModelOptions o = Opts(8, 4);
  o.switch_bytes_per_second = 2 * kRate;
  CopyTimingModel m(o);
  std::vector<CopyTimingModel::OpId> sw0, sw1;
  for (int g = 0; g < 4; ++g) sw0.push_back(m.Enqueue(0, g, kD2H, kMs, {}));
  sw1.push_back(m.Enqueue(0, 4, kD2H, kMs, {}));  // alone behind switch 1
  auto h2d = m.Enqueue(0, 0, kH2D, kMs, {});      // other direction: its own uplink share
  m.AdvanceTo(1);
  for (auto op : sw0) EXPECT_NEAR(m.CompletionSeconds(op), 0.002, kEps);  // 4 x 1 GB/s -> 2
  EXPECT_NEAR(m.CompletionSeconds(sw1[0]), 0.001, kEps);
  EXPECT_NEAR(m.CompletionSeconds(h2d), 0.001, kEps);
}

TEST(CopyTimingModelTest, RatesChangeWhenACopyEndsMidway) {
  CopyModelOptions o = Opts(2, 2);
  o.switch_bytes_per_second = kRate;  // two GPUs share 1 GB/s
  CopyTimingModel m(o);
  auto small = m.Enqueue(0, 0, kD2H, kMs, {});
  auto big = m.Enqueue(0, 1, kD2H, 3 * kMs, {});
  // Asked in small steps or in one: the same answer.
  for (int i = 1; i <= 100; ++i) m.AdvanceTo(i * 1e-4);
  m.AdvanceTo(1);
  // Both at 0.5 GB/s until `small` ends at 2 ms (1 MB each moved), then `big` alone at 1 GB/s
  // for its remaining 2 MB: 4 ms.
  EXPECT_NEAR(m.CompletionSeconds(small), 0.002, kEps);
  EXPECT_NEAR(m.CompletionSeconds(big), 0.004, kEps);
  EXPECT_NEAR(m.engine_stats(1, kD2H).busy_seconds, 0.004, kEps);
}

TEST(CopyTimingModelTest, ZeroBytesAndTimeGoingBack) {
  CopyTimingModel m(Opts());
  auto a = m.Enqueue(5, 0, kD2H, kMs, {});
  auto zero = m.Enqueue(5, 0, kD2H, 0, {});  // behind `a`: completes with it
  m.AdvanceTo(4);                            // ignored: time never goes back
  EXPECT_DOUBLE_EQ(m.now_seconds(), 5);
  m.AdvanceTo(6);
  EXPECT_NEAR(m.CompletionSeconds(a), 5.001, kEps);
  EXPECT_NEAR(m.CompletionSeconds(zero), 5.001, kEps);
  EXPECT_TRUE(m.Done(0));
  EXPECT_FALSE(m.Done(999));  // never issued
}

TEST(CopyTimingModelTest, ACrossNodeCopyMovesAtTheCrossNodeFactor) {
  CopyModelOptions o = Opts(4, 4);
  o.gpus_per_numa_node = 2;  // GPUs 0, 1 on node 0; 2, 3 on node 1
  o.cross_node_rate_factor = 0.25;
  CopyTimingModel m(o);
  EXPECT_EQ(m.numa_node_of_gpu(1), 0);
  EXPECT_EQ(m.numa_node_of_gpu(2), 1);
  auto local = m.Enqueue(0, 0, kD2H, kMs, {}, /*host_numa_node=*/0);
  auto cross = m.Enqueue(0, 1, kD2H, kMs, {}, /*host_numa_node=*/1);
  auto unknown = m.Enqueue(0, 2, kH2D, kMs, {}, /*host_numa_node=*/-1);
  auto cross_h2d = m.Enqueue(0, 3, kH2D, kMs, {}, /*host_numa_node=*/0);
  m.AdvanceTo(1);
  EXPECT_NEAR(m.CompletionSeconds(local), 0.001, kEps);
  EXPECT_NEAR(m.CompletionSeconds(cross), 0.004, kEps);
  EXPECT_NEAR(m.CompletionSeconds(unknown), 0.001, kEps);
  EXPECT_NEAR(m.CompletionSeconds(cross_h2d), 0.004, kEps);
  EXPECT_EQ(m.engine_stats(0, kD2H).cross_node_copies, 0u);
  EXPECT_EQ(m.engine_stats(1, kD2H).cross_node_copies, 1u);
  EXPECT_EQ(m.engine_stats(3, kH2D).cross_node_copies, 1u);
}

TEST(CopyTimingModelTest, WithoutNodesOrFactorNoCopyPaysAPenalty) {
  CopyTimingModel m(Opts(2, 2));  // defaults: one node, factor 1
  auto a = m.Enqueue(0, 1, kD2H, kMs, {}, /*host_numa_node=*/3);
  m.AdvanceTo(1);
  EXPECT_NEAR(m.CompletionSeconds(a), 0.001, kEps);
}

}  // namespace
}  // namespace offloadd::copy
