#include "server/sched/drr.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace offloadd::sched {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::shared_ptr<Transfer> MakeTransfer(const std::string& gpu, TrafficClass cls, uint64_t bytes,
                                       double deadline_at_seconds = 0) {
  auto t = std::make_shared<Transfer>();
  t->gpu = gpu;
  t->cls = cls;
  t->bytes = bytes;
  t->deadline_at_seconds = deadline_at_seconds;
  return t;
}

ChunkQueueOptions Options(uint64_t chunk_bytes = 8 * kMiB, uint64_t quantum_bytes = 8 * kMiB) {
  ChunkQueueOptions o;
  o.chunk_bytes = chunk_bytes;
  o.quantum_bytes = quantum_bytes;
  return o;
}

uint64_t PushOk(ChunkQueue& q, std::shared_ptr<Transfer> t) {
  absl::StatusOr<uint64_t> id = q.Push(std::move(t));
  EXPECT_TRUE(id.ok()) << id.status();
  return id.ok() ? *id : 0;
}

// Pops n chunks and returns the GPU of each.
std::vector<std::string> PopGpus(ChunkQueue& q, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::optional<Chunk> c = q.Pop();
    if (!c) break;
    out.push_back(c->transfer->gpu);
  }
  return out;
}

TEST(ChunkQueueTest, ChunksTransferIntoFullChunksAndRemainder) {
  ChunkQueue q(Options());
  const uint64_t id = PushOk(q, MakeTransfer("g0", TrafficClass::kOffload, 20 * kMiB));
  EXPECT_EQ(q.queued_bytes(TrafficClass::kOffload), 20 * kMiB);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<bool> last;
  while (std::optional<Chunk> c = q.Pop()) {
    EXPECT_EQ(c->transfer_id, id);
    ranges.push_back({c->offset, c->len});
    last.push_back(c->last);
  }
  const std::vector<std::pair<uint64_t, uint64_t>> want = {
      {0, 8 * kMiB}, {8 * kMiB, 8 * kMiB}, {16 * kMiB, 4 * kMiB}};
  EXPECT_EQ(ranges, want);
  EXPECT_EQ(last, (std::vector<bool>{false, false, true}));
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.queued_bytes(TrafficClass::kOffload), 0u);
}

TEST(ChunkQueueTest, RejectsEmptyTransfers) {
  ChunkQueue q(Options());
  EXPECT_EQ(q.Push(MakeTransfer("g0", TrafficClass::kOffload, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q.Push(nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(q.empty());
  EXPECT_FALSE(q.Pop().has_value());
}

TEST(ChunkQueueTest, EqualWeightsAlternate) {
  ChunkQueue q(Options());
  PushOk(q, MakeTransfer("a", TrafficClass::kPrefetch, 64 * kMiB));
  PushOk(q, MakeTransfer("b", TrafficClass::kPrefetch, 64 * kMiB));
  const std::vector<std::string> want = {"a", "b", "a", "b", "a", "b", "a", "b"};
  EXPECT_EQ(PopGpus(q, 8), want);
}

// A GPU at its limit of posted chunks is passed over, keeping its deficit, and the
// class order holds among the GPUs that may be served.
TEST(ChunkQueueTest, FilteredGpusArePassedOverAndKeepTheirDeficit) {
  ChunkQueueOptions o = Options(8 * kMiB, 16 * kMiB);  // two chunks per visit
  ChunkQueue q(o);
  PushOk(q, MakeTransfer("a", TrafficClass::kOffload, 64 * kMiB));
  PushOk(q, MakeTransfer("b", TrafficClass::kOffload, 64 * kMiB));
  ASSERT_EQ(q.Pop()->transfer->gpu, "a");  // a's visit: 16 MiB of credit, 8 used
  EXPECT_EQ(q.deficit_bytes(TrafficClass::kOffload, "a"), 8 * kMiB);
  auto not_a = [](TrafficClass, const std::string& gpu) { return gpu != "a"; };
  auto none = [](TrafficClass, const std::string&) { return false; };
  EXPECT_TRUE(q.HasEligible(not_a));
  EXPECT_FALSE(q.HasEligible(none));
  EXPECT_FALSE(q.Pop(none).has_value());
  EXPECT_EQ(q.Pop(not_a)->transfer->gpu, "b");
  EXPECT_EQ(q.Pop(not_a)->transfer->gpu, "b");
  EXPECT_EQ(q.Pop(not_a)->transfer->gpu, "b");
  EXPECT_EQ(q.deficit_bytes(TrafficClass::kOffload, "a"), 8 * kMiB);  // kept while passed over
  // An URGENT chunk of the filtered GPU waits; offload of the other GPU goes meanwhile.
  PushOk(q, MakeTransfer("a", TrafficClass::kUrgent, 8 * kMiB));
  std::optional<Chunk> c = q.Pop(not_a);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->transfer->gpu, "b");
  EXPECT_EQ(c->transfer->cls, TrafficClass::kOffload);
  // Once "a" may be served again, its URGENT chunk is next.
  c = q.Pop();
  EXPECT_EQ(c->transfer->gpu, "a");
  EXPECT_EQ(c->transfer->cls, TrafficClass::kUrgent);
}

TEST(ChunkQueueTest, Weights2To1GiveExactByteShares) {
  ChunkQueueOptions o = Options();
  o.gpu_weights = {{"a", 2}};
  ChunkQueue q(o);
  PushOk(q, MakeTransfer("a", TrafficClass::kOffload, 1024 * kMiB));
  PushOk(q, MakeTransfer("b", TrafficClass::kOffload, 1024 * kMiB));
  std::map<std::string, uint64_t> bytes;
  for (int i = 0; i < 60; ++i) {  // 20 rounds of 3 chunks, both backlogged throughout
    std::optional<Chunk> c = q.Pop();
    ASSERT_TRUE(c.has_value());
    bytes[c->transfer->gpu] += c->len;
  }
  EXPECT_EQ(bytes["a"], 40 * 8 * kMiB);
  EXPECT_EQ(bytes["b"], 20 * 8 * kMiB);
}

TEST(ChunkQueueTest, Weights2To1WithUnevenChunksStayWithinOneQuantum) {
  // 3 MiB chunks against an 8 MiB quantum: deficits carry over between visits.
  ChunkQueueOptions o = Options(3 * kMiB, 8 * kMiB);
  o.gpu_weights = {{"a", 2}, {"b", 1}};
  ChunkQueue q(o);
  PushOk(q, MakeTransfer("a", TrafficClass::kOffload, 3000 * kMiB));
  PushOk(q, MakeTransfer("b", TrafficClass::kOffload, 3000 * kMiB));
  uint64_t a = 0, b = 0;
  for (int i = 0; i < 500; ++i) {
    std::optional<Chunk> c = q.Pop();
    ASSERT_TRUE(c.has_value());
    (c->transfer->gpu == "a" ? a : b) += c->len;
    // DRR's fairness bound (Shreedhar & Varghese): at any point the weight-normalized
    // service of two backlogged flows differs by at most one quantum plus one chunk, i.e.
    // |a/2 - b| <= 8 + 3 MiB.
    const int64_t diff = static_cast<int64_t>(a) - 2 * static_cast<int64_t>(b);
    ASSERT_LE(std::llabs(diff), static_cast<int64_t>(2 * (8 + 3) * kMiB)) << "after chunk " << i;
  }
  EXPECT_GT(b, 0u);
}

TEST(ChunkQueueTest, QuantumLargerThanChunkServesSeveralChunksPerVisit) {
  ChunkQueue q(Options(8 * kMiB, 16 * kMiB));
  PushOk(q, MakeTransfer("a", TrafficClass::kOffload, 64 * kMiB));
  PushOk(q, MakeTransfer("b", TrafficClass::kOffload, 64 * kMiB));
  const std::vector<std::string> want = {"a", "a", "b", "b", "a", "a", "b", "b"};
  EXPECT_EQ(PopGpus(q, 8), want);
}

TEST(ChunkQueueTest, QuantumSmallerThanChunkStillAlternatesAndSkipsEmptyRounds) {
  // 1 KiB quantum vs 8 MiB chunks: 8192 rounds per chunk, skipped arithmetically.
  ChunkQueueOptions o = Options(8 * kMiB, 1024);
  o.gpu_weights = {{"a", 2}};
  ChunkQueue q(o);
  PushOk(q, MakeTransfer("a", TrafficClass::kOffload, 64 * kMiB));
  PushOk(q, MakeTransfer("b", TrafficClass::kOffload, 64 * kMiB));
  std::map<std::string, int> chunks;
  for (const std::string& g : PopGpus(q, 9)) ++chunks[g];
  EXPECT_EQ(chunks["a"], 6);
  EXPECT_EQ(chunks["b"], 3);
}

TEST(ChunkQueueTest, IdleGpuGivesShareAwayAndBanksNoDeficit) {
  ChunkQueue q(Options(8 * kMiB, 8 * kMiB));
  PushOk(q, MakeTransfer("a", TrafficClass::kOffload, 80 * kMiB));
  // Only a is backlogged: it gets every chunk.
  const std::vector<std::string> first = PopGpus(q, 5);
  EXPECT_EQ(first, std::vector<std::string>(5, "a"));
  EXPECT_EQ(q.deficit_bytes(TrafficClass::kOffload, "b"), 0u);
  // b arrives late: no credit for its idle time, the two alternate from now on.
  PushOk(q, MakeTransfer("b", TrafficClass::kOffload, 40 * kMiB));
  const std::vector<std::string> want = {"b", "a", "b", "a", "b", "a"};
  EXPECT_EQ(PopGpus(q, 6), want);
}

TEST(ChunkQueueTest, EmptiedFlowLosesItsDeficit) {
  // 12 MiB transfer, 8 MiB chunks, 16 MiB quantum: a is left with 4 MiB deficit, then empties.
  ChunkQueue q(Options(8 * kMiB, 16 * kMiB));
  PushOk(q, MakeTransfer("a", TrafficClass::kOffload, 12 * kMiB));
  std::optional<Chunk> c = q.Pop();
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(q.deficit_bytes(TrafficClass::kOffload, "a"), 8 * kMiB);
  ASSERT_TRUE(q.Pop().has_value());
  EXPECT_EQ(q.deficit_bytes(TrafficClass::kOffload, "a"), 0u);
  PushOk(q, MakeTransfer("a", TrafficClass::kOffload, 8 * kMiB));
  PushOk(q, MakeTransfer("b", TrafficClass::kOffload, 8 * kMiB));
  EXPECT_EQ(q.deficit_bytes(TrafficClass::kOffload, "a"), 0u);
}

TEST(ChunkQueueTest, StrictClassPriorityWithoutOffloadContention) {
  ChunkQueue q(Options());
  PushOk(q, MakeTransfer("g", TrafficClass::kPrefetch, 16 * kMiB));
  PushOk(q, MakeTransfer("g", TrafficClass::kUrgent, 16 * kMiB));
  std::vector<TrafficClass> order;
  while (std::optional<Chunk> c = q.Pop()) order.push_back(c->transfer->cls);
  const std::vector<TrafficClass> want = {TrafficClass::kUrgent, TrafficClass::kUrgent,
                                          TrafficClass::kPrefetch, TrafficClass::kPrefetch};
  EXPECT_EQ(order, want);
}

TEST(ChunkQueueTest, UrgentBeforePrefetchBeforeOffloadWithZeroMinShare) {
  ChunkQueueOptions o = Options();
  o.offload_min_share = 0;
  ChunkQueue q(o);
  PushOk(q, MakeTransfer("g", TrafficClass::kOffload, 16 * kMiB));
  PushOk(q, MakeTransfer("g", TrafficClass::kPrefetch, 16 * kMiB));
  PushOk(q, MakeTransfer("h", TrafficClass::kUrgent, 16 * kMiB));
  std::vector<TrafficClass> order;
  while (std::optional<Chunk> c = q.Pop()) order.push_back(c->transfer->cls);
  const std::vector<TrafficClass> want = {TrafficClass::kUrgent,   TrafficClass::kUrgent,
                                          TrafficClass::kPrefetch, TrafficClass::kPrefetch,
                                          TrafficClass::kOffload,  TrafficClass::kOffload};
  EXPECT_EQ(order, want);
}

TEST(ChunkQueueTest, ProjectorCopiesGoLastAndAnUrgentOvertakesOneInProgress) {
  ChunkQueue q(Options());
  PushOk(q, MakeTransfer("g", TrafficClass::kProjector, 24 * kMiB));
  PushOk(q, MakeTransfer("g", TrafficClass::kOffload, 8 * kMiB));
  std::vector<TrafficClass> order;
  order.push_back(q.Pop()->transfer->cls);  // the offload, though queued after
  order.push_back(q.Pop()->transfer->cls);  // the projector copy's first chunk
  PushOk(q, MakeTransfer("h", TrafficClass::kUrgent, 8 * kMiB));
  PushOk(q, MakeTransfer("g", TrafficClass::kPrefetch, 8 * kMiB));
  while (std::optional<Chunk> c = q.Pop()) order.push_back(c->transfer->cls);
  const std::vector<TrafficClass> want = {
      TrafficClass::kOffload,   TrafficClass::kProjector, TrafficClass::kUrgent,
      TrafficClass::kPrefetch,  TrafficClass::kProjector, TrafficClass::kProjector};
  EXPECT_EQ(order, want);
  // No offload queued: the projector class does not count toward the offload share.
  EXPECT_EQ(q.contended_offload_and_total_bytes().second, 0u);
}

TEST(ChunkQueueTest, OffloadMinimumShareHoldsUnderReloadSaturation) {
  ChunkQueueOptions o = Options();
  o.offload_min_share = 0.2;
  ChunkQueue q(o);
  PushOk(q, MakeTransfer("g0", TrafficClass::kOffload, 4096 * kMiB));
  PushOk(q, MakeTransfer("g1", TrafficClass::kUrgent, 4096 * kMiB));
  PushOk(q, MakeTransfer("g2", TrafficClass::kPrefetch, 4096 * kMiB));
  uint64_t offload = 0, total = 0;
  bool prefetch_seen = false;
  for (int i = 0; i < 400; ++i) {
    std::optional<Chunk> c = q.Pop();
    ASSERT_TRUE(c.has_value());
    total += c->len;
    if (c->transfer->cls == TrafficClass::kOffload) offload += c->len;
    if (c->transfer->cls == TrafficClass::kPrefetch) prefetch_seen = true;
    if (i >= 4) {
      // From the first few chunks on, offload's share never falls below 20% by more than
      // one chunk.
      ASSERT_GE(offload + 8 * kMiB, total / 5) << "after chunk " << i;
    }
  }
  // Reloads keep the rest: the urgent transfer (512 chunks) is not yet done, so no prefetch.
  EXPECT_FALSE(prefetch_seen);
  // At least one chunk in five (80 of 400); the window halving keeps the share just above the
  // minimum, never far above it.
  EXPECT_GE(offload, 80 * 8 * kMiB);
  EXPECT_LE(offload, 84 * 8 * kMiB);
}

TEST(ChunkQueueTest, OffloadAloneGetsTheWholeLinkAndBanksNoShare) {
  ChunkQueue q(Options());
  PushOk(q, MakeTransfer("g0", TrafficClass::kOffload, 800 * kMiB));
  EXPECT_EQ(PopGpus(q, 50).size(), 50u);
  // Uncontended bytes are not counted toward the share.
  EXPECT_EQ(q.contended_offload_and_total_bytes().second, 0u);
  PushOk(q, MakeTransfer("g1", TrafficClass::kUrgent, 80 * kMiB));
  std::vector<TrafficClass> order;
  for (int i = 0; i < 10; ++i) order.push_back(q.Pop()->transfer->cls);
  int offload = 0;
  for (TrafficClass c : order) offload += c == TrafficClass::kOffload;
  EXPECT_EQ(order[0], TrafficClass::kUrgent);
  EXPECT_EQ(offload, 2);  // 20% of 10 chunks
}

TEST(ChunkQueueTest, EarliestDeadlineFirstThenFifoWithinGpu) {
  ChunkQueue q(Options());
  const uint64_t none1 = PushOk(q, MakeTransfer("g", TrafficClass::kPrefetch, 8 * kMiB, 0));
  const uint64_t late = PushOk(q, MakeTransfer("g", TrafficClass::kPrefetch, 8 * kMiB, 30.0));
  const uint64_t none2 = PushOk(q, MakeTransfer("g", TrafficClass::kPrefetch, 8 * kMiB, 0));
  const uint64_t early = PushOk(q, MakeTransfer("g", TrafficClass::kPrefetch, 8 * kMiB, 10.0));
  const uint64_t late2 = PushOk(q, MakeTransfer("g", TrafficClass::kPrefetch, 8 * kMiB, 30.0));
  std::vector<uint64_t> order;
  while (std::optional<Chunk> c = q.Pop()) order.push_back(c->transfer_id);
  EXPECT_EQ(order, (std::vector<uint64_t>{early, late, late2, none1, none2}));
}

TEST(ChunkQueueTest, EarlierDeadlineOvertakesTransferInProgress) {
  ChunkQueue q(Options());
  const uint64_t big = PushOk(q, MakeTransfer("g", TrafficClass::kPrefetch, 32 * kMiB, 50.0));
  ASSERT_EQ(q.Pop()->transfer_id, big);
  const uint64_t soon = PushOk(q, MakeTransfer("g", TrafficClass::kPrefetch, 8 * kMiB, 20.0));
  std::vector<std::pair<uint64_t, uint64_t>> order;  // (id, offset)
  while (std::optional<Chunk> c = q.Pop()) order.push_back({c->transfer_id, c->offset});
  const std::vector<std::pair<uint64_t, uint64_t>> want = {
      {soon, 0}, {big, 8 * kMiB}, {big, 16 * kMiB}, {big, 24 * kMiB}};
  EXPECT_EQ(order, want);
}

TEST(ChunkQueueTest, CancelDropsRemainingChunksAndIdlesTheFlow) {
  ChunkQueue q(Options());
  const uint64_t a = PushOk(q, MakeTransfer("a", TrafficClass::kOffload, 32 * kMiB));
  PushOk(q, MakeTransfer("b", TrafficClass::kOffload, 16 * kMiB));
  ASSERT_EQ(q.Pop()->transfer_id, a);
  EXPECT_EQ(q.Cancel(a), 24 * kMiB);
  EXPECT_EQ(q.Cancel(a), 0u);
  EXPECT_EQ(q.queued_transfers(), 1u);
  EXPECT_EQ(q.queued_bytes(TrafficClass::kOffload), 16 * kMiB);
  EXPECT_EQ(PopGpus(q, 10), (std::vector<std::string>{"b", "b"}));
  EXPECT_TRUE(q.empty());
}

TEST(ChunkQueueTest, PromotedTransferOvertakesQueuedPrefetchAndOffloadChunks) {
  ChunkQueueOptions o = Options();
  o.offload_min_share = 0;  // strict priority: the order shows the classes alone
  ChunkQueue q(o);
  const uint64_t p1 = PushOk(q, MakeTransfer("a", TrafficClass::kPrefetch, 16 * kMiB));
  PushOk(q, MakeTransfer("b", TrafficClass::kPrefetch, 16 * kMiB));
  PushOk(q, MakeTransfer("c", TrafficClass::kOffload, 16 * kMiB));
  auto late = MakeTransfer("d", TrafficClass::kPrefetch, 24 * kMiB);
  const uint64_t p3 = PushOk(q, late);
  ASSERT_EQ(q.Pop()->transfer_id, p1);  // one chunk of p1 goes before the promotion
  EXPECT_EQ(q.Promote(p3, TrafficClass::kUrgent), 24 * kMiB);
  EXPECT_EQ(late->cls, TrafficClass::kUrgent);
  EXPECT_EQ(q.queued_bytes(TrafficClass::kUrgent), 24 * kMiB);
  EXPECT_EQ(q.queued_bytes(TrafficClass::kPrefetch), 8 * kMiB + 16 * kMiB);
  // Never demoted, and nothing to do twice.
  EXPECT_EQ(q.Promote(p3, TrafficClass::kPrefetch), 0u);
  EXPECT_EQ(q.Promote(p3, TrafficClass::kUrgent), 0u);
  EXPECT_EQ(q.Promote(999, TrafficClass::kUrgent), 0u);
  EXPECT_EQ(PopGpus(q, 3), (std::vector<std::string>{"d", "d", "d"}));
  EXPECT_EQ(q.deficit_bytes(TrafficClass::kPrefetch, "d"), 0u);  // its old flow is gone
  // Then PREFETCH (a's remainder and b, by DRR), then the offload.
  std::vector<std::string> rest = PopGpus(q, 10);
  ASSERT_EQ(rest.size(), 5u);
  std::sort(rest.begin(), rest.begin() + 3);
  EXPECT_EQ(rest, (std::vector<std::string>{"a", "b", "b", "c", "c"}));
  EXPECT_TRUE(q.empty());
}

TEST(ChunkQueueTest, PromotingAPartlyPoppedTransferMovesOnlyItsRemainder) {
  ChunkQueue q(Options());
  auto t = MakeTransfer("a", TrafficClass::kPrefetch, 20 * kMiB);
  const uint64_t id = PushOk(q, t);
  std::optional<Chunk> first = q.Pop();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(q.Promote(id, TrafficClass::kUrgent), 12 * kMiB);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  while (std::optional<Chunk> c = q.Pop()) ranges.push_back({c->offset, c->len});
  EXPECT_EQ(ranges, (std::vector<std::pair<uint64_t, uint64_t>>{{8 * kMiB, 8 * kMiB},
                                                                 {16 * kMiB, 4 * kMiB}}));
  EXPECT_EQ(q.Promote(id, TrafficClass::kUrgent), 0u);  // all popped
}

// A parked transfer (its producer has not finished) offers no chunk: a later transfer of the
// same GPU and class goes instead; unparked, it is back ahead of transfers pushed after it.
TEST(ChunkQueueTest, AParkedTransferLetsLaterOnesOfItsGpuGoAndKeepsItsPlace) {
  ChunkQueue q(Options());
  const uint64_t waiting = PushOk(q, MakeTransfer("g", TrafficClass::kOffload, 64 * kMiB));
  ASSERT_EQ(q.Pop()->transfer_id, waiting);  // one chunk went before the producer was seen
  EXPECT_EQ(q.Park(waiting), 56 * kMiB);
  EXPECT_EQ(q.Park(waiting), 0u);
  EXPECT_EQ(q.queued_bytes(TrafficClass::kOffload), 0u);
  EXPECT_FALSE(q.Pop().has_value());
  EXPECT_FALSE(q.HasEligible(nullptr));
  EXPECT_EQ(q.queued_transfers(), 1u);
  const uint64_t ready = PushOk(q, MakeTransfer("g", TrafficClass::kOffload, 4 * kMiB));
  const uint64_t later = PushOk(q, MakeTransfer("g", TrafficClass::kOffload, 8 * kMiB));
  ASSERT_EQ(q.Pop()->transfer_id, ready);
  EXPECT_EQ(q.Unpark(waiting), 56 * kMiB);
  EXPECT_EQ(q.Unpark(waiting), 0u);
  std::vector<uint64_t> order;
  while (std::optional<Chunk> c = q.Pop()) order.push_back(c->transfer_id);
  std::vector<uint64_t> want(7, waiting);
  want.push_back(later);
  EXPECT_EQ(order, want);
  EXPECT_TRUE(q.empty());
}

TEST(ChunkQueueTest, AParkedTransferCanBeCancelledOrPromoted) {
  ChunkQueue q(Options());
  const uint64_t a = PushOk(q, MakeTransfer("g", TrafficClass::kPrefetch, 16 * kMiB));
  auto t = MakeTransfer("g", TrafficClass::kPrefetch, 8 * kMiB);
  const uint64_t b = PushOk(q, t);
  EXPECT_EQ(q.Park(a), 16 * kMiB);
  EXPECT_EQ(q.Park(b), 8 * kMiB);
  EXPECT_EQ(q.Cancel(a), 16 * kMiB);
  EXPECT_EQ(q.Promote(b, TrafficClass::kUrgent), 8 * kMiB);
  EXPECT_EQ(t->cls, TrafficClass::kUrgent);
  EXPECT_FALSE(q.Pop().has_value());  // still parked
  EXPECT_EQ(q.Unpark(b), 8 * kMiB);
  EXPECT_EQ(q.queued_bytes(TrafficClass::kUrgent), 8 * kMiB);
  std::optional<Chunk> c = q.Pop();
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->transfer_id, b);
  EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace offloadd::sched
