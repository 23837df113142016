#include "server/store/block_store.h"

#include <chrono>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/base/fake_clock.h"
#include "gtest/gtest.h"
#include "server/store/block_store_test_util.h"

namespace offloadd::store {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

TEST(BlockStoreTest, AdmitsWithDistinctNonZeroIdsAndAccountsBytes) {
  BlockStore s(64 * kMiB, TestStoreOptions());
  std::set<uint64_t> ids;
  for (int i = 0; i < 10; ++i) {
    auto r = ReserveNow(s, 1, kMiB + 1);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NE(r->block_id, 0u);
    EXPECT_EQ(r->bytes, kMiB + 1);
    EXPECT_EQ(r->extent.bytes, kMiB + 256);
    ids.insert(r->block_id);
  }
  EXPECT_EQ(ids.size(), 10u);
  EXPECT_EQ(s.SessionUsedBytes(1), 10 * (kMiB + 256));
  EXPECT_EQ(s.SessionBlocks(1), 10u);
  EXPECT_EQ(s.stats().blocks, 10u);
  EXPECT_EQ(s.stats().pool.used_bytes, 10 * (kMiB + 256));
}

TEST(BlockStoreTest, RejectsZeroOversizeAndOverQuotaAtOnce) {
  BlockStore s(16 * kMiB, TestStoreOptions(/*quota=*/4 * kMiB));
  EXPECT_EQ(ReserveNow(s, 1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReserveNow(s, 1, 17 * kMiB).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ReserveNow(s, 1, 5 * kMiB).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s.stats().blocks, 0u);
}

TEST(BlockStoreTest, FullPoolWaitsThenAdmitsOnRelease) {
  BlockStore s(8 * kMiB, TestStoreOptions());
  auto a = ReserveNow(s, 1, 8 * kMiB);
  ASSERT_TRUE(a.ok());
  s.OffloadFinished(a->block_id, absl::OkStatus());
  std::promise<absl::StatusOr<BlockRef>> p;
  auto f = p.get_future();
  s.Reserve(2, 4 * kMiB, [&p](absl::StatusOr<BlockRef> r) { p.set_value(std::move(r)); });
  EXPECT_EQ(f.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  EXPECT_EQ(s.stats().offloads_waiting, 1u);
  ASSERT_TRUE(s.Release(1, a->block_id).ok());
  auto b = f.get();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GT(b->queued_seconds, 0.0);
  EXPECT_EQ(s.stats().offloads_waiting, 0u);
  EXPECT_EQ(s.SessionUsedBytes(2), 4 * kMiB);
}

TEST(BlockStoreTest, DeadlinePassesWithResourceExhausted) {
  base::FakeClock clock(100);
  BlockStoreOptions o = TestStoreOptions(0, /*deadline=*/5.0);
  o.clock = &clock;
  BlockStore s(4 * kMiB, o);
  ASSERT_TRUE(ReserveNow(s, 1, 4 * kMiB).ok());
  std::promise<absl::StatusOr<BlockRef>> refused;
  s.Reserve(2, kMiB, [&](absl::StatusOr<BlockRef> r) { refused.set_value(std::move(r)); });
  clock.Advance(4.9);  // before the deadline (fake time: the store cannot refuse yet)
  EXPECT_EQ(s.stats().offloads_waiting, 1u);
  EXPECT_EQ(s.stats().offloads_refused_total, 0u);
  clock.Advance(0.2);  // past it: the deadline thread, woken by the clock, refuses
  absl::StatusOr<BlockRef> r = refused.get_future().get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(r.status().message()).find("within 5.100 s"), std::string::npos)
      << r.status();
  EXPECT_NE(std::string(r.status().message()).find("pool is full"), std::string::npos);
  EXPECT_EQ(s.stats().offloads_refused_total, 1u);
  EXPECT_EQ(s.stats().offloads_waiting, 0u);
}

TEST(BlockStoreTest, FullQueueRefusesAtOnce) {
  BlockStore s(4 * kMiB, TestStoreOptions(0, 60.0, /*queue=*/2));
  ASSERT_TRUE(ReserveNow(s, 1, 4 * kMiB).ok());
  int called = 0;
  for (int i = 0; i < 2; ++i) s.Reserve(2, kMiB, [&called](absl::StatusOr<BlockRef>) { ++called; });
  EXPECT_EQ(called, 0);
  auto r = ReserveNow(s, 3, kMiB);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.stats().offloads_waiting, 2u);
  // Ending the waiting session cancels its waiters.
  s.ReleaseSession(2);
  EXPECT_EQ(called, 2);
  EXPECT_EQ(s.stats().offloads_waiting, 0u);
}

TEST(BlockStoreTest, QuotaHoldsOneSessionWhileAnotherProceeds) {
  BlockStore s(64 * kMiB, TestStoreOptions(/*quota=*/8 * kMiB, 60.0));
  auto a = ReserveNow(s, 1, 8 * kMiB);
  ASSERT_TRUE(a.ok());
  s.OffloadFinished(a->block_id, absl::OkStatus());
  bool admitted = false;
  s.Reserve(1, kMiB, [&admitted](absl::StatusOr<BlockRef> r) { admitted = r.ok(); });
  EXPECT_FALSE(admitted);
  EXPECT_TRUE(ReserveNow(s, 2, 8 * kMiB).ok());  // another session is not held back
  ASSERT_TRUE(s.Release(1, a->block_id).ok());
  EXPECT_TRUE(admitted);
}

TEST(BlockStoreTest, ForeignAndDoubleReleaseAreNotFound) {
  BlockStore s(16 * kMiB, TestStoreOptions());
  auto a = ReserveNow(s, 1, kMiB);
  ASSERT_TRUE(a.ok());
  s.OffloadFinished(a->block_id, absl::OkStatus());
  EXPECT_EQ(s.Release(2, a->block_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.BeginReload(2, a->block_id, [](absl::StatusOr<BlockRef>) {}).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(s.Release(1, a->block_id).ok());
  EXPECT_EQ(s.Release(1, a->block_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.Release(1, 12345).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.stats().pool.used_bytes, 0u);
}

TEST(BlockStoreTest, ReloadBeforeOffloadFinishesWaitsForIt) {
  BlockStore s(16 * kMiB, TestStoreOptions());
  auto a = ReserveNow(s, 1, kMiB);
  ASSERT_TRUE(a.ok());
  int ready = 0;
  ASSERT_TRUE(s.BeginReload(1, a->block_id, [&](absl::StatusOr<BlockRef> r) {
                 ASSERT_TRUE(r.ok());
                 EXPECT_EQ(r->extent.offset, a->extent.offset);
                 ++ready;
               }).ok());
  EXPECT_EQ(ready, 0);
  s.OffloadFinished(a->block_id, absl::OkStatus());
  EXPECT_EQ(ready, 1);
  s.EndReload(a->block_id, /*release=*/true);
  EXPECT_EQ(s.stats().blocks, 0u);
  EXPECT_EQ(s.stats().pool.used_bytes, 0u);
}

TEST(BlockStoreTest, ReleaseDuringReloadFreesAfterIt) {
  BlockStore s(16 * kMiB, TestStoreOptions());
  auto a = ReserveNow(s, 1, kMiB);
  s.OffloadFinished(a->block_id, absl::OkStatus());
  ASSERT_TRUE(s.BeginReload(1, a->block_id, [](absl::StatusOr<BlockRef>) {}).ok());
  ASSERT_TRUE(s.Release(1, a->block_id).ok());
  EXPECT_EQ(s.stats().blocks, 1u);  // still being read
  EXPECT_EQ(s.BeginReload(1, a->block_id, [](absl::StatusOr<BlockRef>) {}).code(),
            absl::StatusCode::kFailedPrecondition);
  s.EndReload(a->block_id, false);
  EXPECT_EQ(s.stats().blocks, 0u);
}

TEST(BlockStoreTest, FailedOffloadFreesBlockAndFailsWaitingReload) {
  BlockStore s(16 * kMiB, TestStoreOptions());
  auto a = ReserveNow(s, 1, kMiB);
  absl::Status seen;
  ASSERT_TRUE(s.BeginReload(1, a->block_id, [&](absl::StatusOr<BlockRef> r) {
                 seen = r.status();
               }).ok());
  s.OffloadFinished(a->block_id, absl::DataLossError("copy failed"));
  EXPECT_EQ(seen.code(), absl::StatusCode::kDataLoss);
  s.EndReload(a->block_id, false);
  EXPECT_EQ(s.stats().blocks, 0u);
  EXPECT_EQ(s.stats().pool.used_bytes, 0u);
}

TEST(BlockStoreTest, ReleaseSessionReturnsPoolToBaseline) {
  BlockStore s(64 * kMiB, TestStoreOptions());
  std::vector<uint64_t> ids;
  for (int i = 0; i < 5; ++i) {
    auto r = ReserveNow(s, 7, 3 * kMiB + 17);
    ids.push_back(r->block_id);
  }
  for (int i = 0; i < 4; ++i) s.OffloadFinished(ids[i], absl::OkStatus());
  auto other = ReserveNow(s, 8, kMiB);
  EXPECT_EQ(s.ReleaseSession(7), 5u);
  // The block whose offload is still copying is freed when the copy finishes.
  EXPECT_EQ(s.stats().blocks, 2u);
  s.OffloadFinished(ids[4], absl::OkStatus());
  EXPECT_EQ(s.stats().blocks, 1u);
  EXPECT_EQ(s.SessionUsedBytes(7), 0u);
  EXPECT_EQ(s.stats().pool.used_bytes, other->extent.bytes);
}

}  // namespace
}  // namespace offloadd::store

namespace offloadd::store {
namespace {

TEST(BlockStoreUidQuotaTest, SessionsOfOneUidShareTheQuotaOtherUidsAndOwnerlessDoNot) {
  BlockStoreOptions o = TestStoreOptions(0, /*deadline=*/0.05);
  o.uid_quota_bytes = 8 * kMiB;
  BlockStore s(64 * kMiB, o);
  s.SetSessionOwner(1, 1000);
  s.SetSessionOwner(2, 1000);
  s.SetSessionOwner(3, 1001);
  auto first = ReserveNow(s, 1, 6 * kMiB);
  ASSERT_TRUE(first.ok());
  s.OffloadFinished(first->block_id, absl::OkStatus());
  // Session 2 belongs to the same uid: 6 + 4 MiB > 8 MiB, so it waits and times out naming the
  // uid quota, not the pool.
  auto r = ReserveNow(s, 2, 4 * kMiB);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(r.status().message()).find("quota of uid 1000"), std::string::npos)
      << r.status();
  ASSERT_TRUE(ReserveNow(s, 2, 2 * kMiB).ok());  // exactly fills the uid quota
  ASSERT_TRUE(ReserveNow(s, 3, 8 * kMiB).ok());  // another uid has its own
  ASSERT_TRUE(ReserveNow(s, 4, 16 * kMiB).ok());  // no owner: only the pool limits it
  // Larger than the quota can never fit: OUT_OF_RANGE at once.
  EXPECT_EQ(ReserveNow(s, 3, 9 * kMiB).status().code(), absl::StatusCode::kOutOfRange);
  auto usage = s.UidUsedBytes();
  EXPECT_EQ(usage[1000], 8 * kMiB);
  EXPECT_EQ(usage[1001], 8 * kMiB);
  EXPECT_EQ(usage.size(), 2u);
  // Ending session 1 returns its share to the uid (its block is resident, so at once).
  EXPECT_EQ(s.ReleaseSession(1), 1u);
  EXPECT_EQ(s.UidUsedBytes()[1000], 2 * kMiB);
  ASSERT_TRUE(ReserveNow(s, 2, 6 * kMiB).ok());
  // Blocks still being offloaded stay counted until their copy ends.
  s.ReleaseSession(2);
  s.ReleaseSession(3);
  EXPECT_EQ(s.UidUsedBytes().size(), 2u);
}

TEST(BlockStoreUidQuotaTest, WaiterOfAFullUidIsAdmittedWhenItsUidReleases) {
  BlockStoreOptions o = TestStoreOptions(0, /*deadline=*/60);
  o.uid_quota_bytes = 4 * kMiB;
  BlockStore s(64 * kMiB, o);
  s.SetSessionOwner(1, 7);
  s.SetSessionOwner(2, 7);
  auto a = ReserveNow(s, 1, 4 * kMiB);
  ASSERT_TRUE(a.ok());
  s.OffloadFinished(a->block_id, absl::OkStatus());
  std::promise<absl::StatusOr<BlockRef>> p;
  auto f = p.get_future();
  s.Reserve(2, 4 * kMiB, [&p](absl::StatusOr<BlockRef> r) { p.set_value(std::move(r)); });
  EXPECT_EQ(s.stats().offloads_waiting, 1u);
  ASSERT_TRUE(s.Release(1, a->block_id).ok());
  auto b = f.get();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(s.UidUsedBytes()[7], 4 * kMiB);
}

}  // namespace
}  // namespace offloadd::store

namespace offloadd::store {
namespace {

// A refusal caused by fragmentation says so, with the largest free extent,
// instead of "the pool is full" while most of it is free.
TEST(BlockStoreFragmentationTest, RefusalNamesTheLargestFreeExtent) {
  BlockStore s(8 * kMiB, TestStoreOptions(0, /*deadline=*/0.05));
  std::vector<uint64_t> blocks;
  for (int i = 0; i < 8; ++i) {
    auto b = ReserveNow(s, 1, kMiB);
    ASSERT_TRUE(b.ok());
    s.OffloadFinished(b->block_id, absl::OkStatus());
    blocks.push_back(b->block_id);
  }
  for (int i = 0; i < 8; i += 2) ASSERT_TRUE(s.Release(1, blocks[i]).ok());  // 4 holes of 1 MiB
  auto r = ReserveNow(s, 2, 2 * kMiB);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(r.status().message());
  EXPECT_EQ(message.find("pool is full"), std::string::npos) << message;
  EXPECT_NE(message.find("4194304 bytes free"), std::string::npos) << message;
  EXPECT_NE(message.find("largest 1048576"), std::string::npos) << message;
}

}  // namespace
}  // namespace offloadd::store
