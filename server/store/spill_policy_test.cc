// BlockStore with a spill tier: which blocks spill, staging back, waiting offloads, quotas over
// both tiers, disk full and lost spill files. Bytes really move between a pool buffer and files
// under TEST_TMPDIR, and are checked.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "gtest/gtest.h"
#include "server/pool/block_table.h"
#include "server/spill/spill_tier.h"
#include "server/store/block_store.h"
#include "server/store/block_store_test_util.h"

namespace offloadd::store {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// Polls `cond` for up to 20 s (a correctness wait, not a timing assertion).
bool WaitFor(const std::function<bool()>& cond) {
  return base::PollUntil(cond, 20, /*poll_seconds=*/0.001);
}

class SpillPolicyTest : public ::testing::Test {
 protected:
  void Make(uint64_t pool_bytes, double high_water, uint64_t disk_bytes = 256 * kMiB,
            BlockStoreOptions o = TestStoreOptions(0, 5.0), uint32_t stage_ahead = 0,
            pool::BlockTable* table = nullptr, double disk_bytes_per_second = -1) {
    pool_bytes_ = pool_bytes;
    ASSERT_EQ(posix_memalign(reinterpret_cast<void**>(&pool_), 4096, pool_bytes), 0);
    memset(pool_, 0, pool_bytes);
    const char* tmp = getenv("TEST_TMPDIR");
    spill::SpillOptions so;
    so.directory = std::string(tmp != nullptr ? tmp : "/tmp") + "/spill_policy_" +
                   ::testing::UnitTest::GetInstance()->current_test_info()->name();
    so.capacity_bytes = disk_bytes;
    so.bytes_per_second = disk_bytes_per_second;  // < 0: unpaced
    so.chunk_bytes = chunk_bytes_;
    if (!spill::SpillTier::DirectIoSupported(so.directory)) {
      GTEST_SKIP() << so.directory << " does not take O_DIRECT";
    }
    auto tier = spill::SpillTier::Create(so, pool_, pool_bytes);
    ASSERT_TRUE(tier.ok()) << tier.status();
    tier_ = *std::move(tier);
    o.spill_high_water_fraction = high_water;
    o.stage_ahead_blocks = stage_ahead;
    store_ = std::make_unique<BlockStore>(pool_bytes, o, table, tier_.get());
  }
  void TearDown() override {
    store_.reset();
    tier_.reset();
    free(pool_);
  }
  // Offloads `bytes` with a pattern from `seed` (the bytes a copy would put in the extent).
  uint64_t Offload(uint64_t session, uint64_t bytes, uint8_t seed, OrderHint hint = {}) {
    auto r = ReserveNow(*store_, session, bytes, hint);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return 0;
    for (uint64_t i = 0; i < bytes; ++i) pool_[r->extent.offset + i] = Pattern(seed, i);
    store_->OffloadFinished(r->block_id, absl::OkStatus());
    return r->block_id;
  }
  static uint8_t Pattern(uint8_t seed, uint64_t i) {
    return static_cast<uint8_t>(seed * 131 + i * 7 + (i >> 12));
  }
  // Reloads and checks the bytes in the extent the store hands out; releases after.
  absl::Status ReloadAndCheck(uint64_t session, uint64_t id, uint64_t bytes, uint8_t seed,
                              bool release = true) {
    auto ref = ReloadNow(*store_, session, id);
    if (!ref.ok()) return ref.status();
    bool same = true;
    for (uint64_t i = 0; i < bytes && same; ++i) {
      same = pool_[ref->extent.offset + i] == Pattern(seed, i);
    }
    store_->EndReload(id, release);
    return same ? absl::OkStatus() : absl::DataLossError("bytes differ");
  }
  bool OnDisk(uint64_t id) { return access(tier_->FilePath(id).c_str(), F_OK) == 0; }
  bool SpillsSettled() { return store_->stats().spilling_bytes == 0; }
  static OrderHint Hint(uint64_t step, uint64_t position) { return OrderHint{true, step, position}; }

  uint8_t* pool_ = nullptr;
  uint64_t pool_bytes_ = 0;
  uint64_t chunk_bytes_ = kMiB;  // the disk link's chunk (set before Make)
  std::unique_ptr<spill::SpillTier> tier_;
  std::unique_ptr<BlockStore> store_;
};

TEST_F(SpillPolicyTest, SpillsTheEarliestPositionsOfAStepAndReloadsBitExact) {
  Make(8 * kMiB, /*high_water=*/0.5);
  if (IsSkipped()) return;
  std::vector<uint64_t> ids;
  for (uint64_t p = 0; p < 6; ++p) ids.push_back(Offload(1, kMiB, p, Hint(3, p)));
  ASSERT_TRUE(WaitFor([&] { return SpillsSettled() && store_->stats().pool.used_bytes <= 4 * kMiB; }));
  // Backward reloads positions 5..0: positions 0 and 1 are needed last, so they went to disk.
  EXPECT_TRUE(OnDisk(ids[0]));
  EXPECT_TRUE(OnDisk(ids[1]));
  for (uint64_t p = 2; p < 6; ++p) EXPECT_FALSE(OnDisk(ids[p])) << p;
  StoreStats s = store_->stats();
  EXPECT_EQ(s.disk_blocks, 2u);
  EXPECT_EQ(s.disk_bytes, 2 * kMiB);
  EXPECT_EQ(s.pool.used_bytes, 4 * kMiB);
  EXPECT_EQ(store_->SessionUsedBytes(1), 6 * kMiB);  // quotas count both tiers
  for (int p = 5; p >= 0; --p) {
    EXPECT_TRUE(ReloadAndCheck(1, ids[p], kMiB, p).ok()) << p;
  }
  s = store_->stats();
  EXPECT_EQ(s.reloads_from_disk_total, 2u);
  EXPECT_EQ(s.staged_blocks_total, 2u);
  EXPECT_GT(s.reload_disk_wait_seconds_total, 0.0);
  EXPECT_TRUE(WaitFor([&] { return store_->stats().blocks == 0; }));
  EXPECT_EQ(tier_->stats().used_bytes, 0u);
  EXPECT_FALSE(OnDisk(ids[0]));
}

TEST_F(SpillPolicyTest, WithoutHintsTheEarliestOffloadedSpillsFirst) {
  Make(4 * kMiB, 0.5);
  if (IsSkipped()) return;
  std::vector<uint64_t> ids;
  for (uint8_t i = 0; i < 4; ++i) ids.push_back(Offload(1, kMiB, i));
  ASSERT_TRUE(WaitFor([&] { return SpillsSettled() && store_->stats().disk_blocks == 2; }));
  EXPECT_TRUE(OnDisk(ids[0]));
  EXPECT_TRUE(OnDisk(ids[1]));
  EXPECT_FALSE(OnDisk(ids[2]));
  EXPECT_FALSE(OnDisk(ids[3]));
}

TEST_F(SpillPolicyTest, OffloadWaitingForPoolSpaceGoesToThePoolAfterASpill) {
  Make(4 * kMiB, /*high_water=*/1.0);
  if (IsSkipped()) return;
  std::vector<uint64_t> ids;
  for (uint8_t i = 0; i < 4; ++i) ids.push_back(Offload(1, kMiB, i));
  EXPECT_EQ(store_->stats().disk_blocks, 0u);  // at the mark, not above: nothing spilled
  // The fifth does not fit: a spill makes room and it is admitted into the pool.
  const uint64_t fifth = Offload(1, kMiB, 4);
  ASSERT_NE(fifth, 0u);
  EXPECT_FALSE(OnDisk(fifth));
  EXPECT_GE(store_->stats().spilled_blocks_total, 1u);
  EXPECT_TRUE(OnDisk(ids[0]));
  for (int i = 4; i >= 0; --i) {
    EXPECT_TRUE(ReloadAndCheck(1, i == 4 ? fifth : ids[i], kMiB, i).ok()) << i;
  }
}

TEST_F(SpillPolicyTest, QuotaCountsBothTiers) {
  Make(4 * kMiB, 0.5, 256 * kMiB, TestStoreOptions(/*quota=*/3 * kMiB, /*deadline=*/0.2));
  if (IsSkipped()) return;
  for (uint8_t i = 0; i < 3; ++i) ASSERT_NE(Offload(1, kMiB, i), 0u);
  ASSERT_TRUE(WaitFor([&] { return SpillsSettled() && store_->stats().disk_blocks >= 1; }));
  auto r = ReserveNow(*store_, 1, kMiB);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("session quota"), std::string::npos);
  EXPECT_EQ(store_->SessionUsedBytes(1), 3 * kMiB);
}

TEST_F(SpillPolicyTest, DiskFullMakesOffloadsWaitThenFailAndLosesNothing) {
  Make(2 * kMiB, 1.0, /*disk_bytes=*/spill::SpillTier::FileBytes(kMiB),
       TestStoreOptions(0, /*deadline=*/0.3));
  if (IsSkipped()) return;
  std::vector<uint64_t> ids;
  ids.push_back(Offload(1, kMiB, 0));
  ids.push_back(Offload(1, kMiB, 1));
  ids.push_back(Offload(1, kMiB, 2));  // one spill (the disk holds one block) makes room
  ASSERT_NE(ids[2], 0u);
  auto r = ReserveNow(*store_, 1, kMiB);  // the disk is full: it waits, then fails
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("spill tier"), std::string::npos)
      << r.status();
  EXPECT_GE(store_->stats().spill_refused_disk_full_total, 1u);
  for (int i = 2; i >= 0; --i) EXPECT_TRUE(ReloadAndCheck(1, ids[i], kMiB, i).ok()) << i;
}

TEST_F(SpillPolicyTest, RemovedOrTruncatedSpillFileIsDataLossForThoseBlocksOnly) {
  Make(4 * kMiB, 0.25);
  if (IsSkipped()) return;
  std::vector<uint64_t> ids;
  for (uint64_t p = 0; p < 4; ++p) ids.push_back(Offload(1, kMiB, p, Hint(1, p)));
  ASSERT_TRUE(WaitFor([&] { return SpillsSettled() && store_->stats().disk_blocks == 3; }));
  ASSERT_EQ(unlink(tier_->FilePath(ids[0]).c_str()), 0);
  ASSERT_EQ(truncate(tier_->FilePath(ids[1]).c_str(), 4096), 0);
  EXPECT_TRUE(ReloadAndCheck(1, ids[3], kMiB, 3).ok());
  EXPECT_TRUE(ReloadAndCheck(1, ids[2], kMiB, 2).ok());  // from disk, intact
  for (int p : {1, 0}) {
    absl::Status st = ReloadAndCheck(1, ids[p], kMiB, p, /*release=*/false);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << p << ": " << st;
    store_->EndReload(ids[p], false);  // the failed reload ends, as a session does
    // Asked again: the block stays lost, and says so at once.
    st = ReloadAndCheck(1, ids[p], kMiB, p, false);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << p << ": " << st;
    EXPECT_TRUE(store_->Release(1, ids[p]).ok());
  }
  EXPECT_EQ(store_->stats().blocks_lost_total, 2u);
  // The store keeps serving: a new block goes in and out.
  const uint64_t fresh = Offload(2, kMiB, 9);
  EXPECT_TRUE(ReloadAndCheck(2, fresh, kMiB, 9).ok());
  EXPECT_TRUE(WaitFor([&] { return store_->stats().blocks == 0; }));
  EXPECT_EQ(tier_->stats().used_bytes, 0u);
}

TEST_F(SpillPolicyTest, ReloadOfBlockKStagesTheNextBlocksBackAhead) {
  Make(8 * kMiB, 0.5, 256 * kMiB, TestStoreOptions(), /*stage_ahead=*/2);
  if (IsSkipped()) return;
  std::vector<uint64_t> ids;
  for (uint64_t p = 0; p < 8; ++p) ids.push_back(Offload(1, kMiB, p, Hint(1, p)));
  ASSERT_TRUE(WaitFor([&] { return SpillsSettled() && store_->stats().disk_blocks == 4; }));
  // Between reloads the stage-backs under way finish (the time backward computes a layer).
  for (int p = 7; p >= 0; --p) {
    EXPECT_TRUE(ReloadAndCheck(1, ids[p], kMiB, p).ok()) << p;
    ASSERT_TRUE(WaitFor([&] { return store_->stats().staging_bytes == 0; }));
  }
  StoreStats s = store_->stats();
  EXPECT_EQ(s.staged_blocks_total, 4u);
  // Each reload k staged k-1 and k-2 back while the pool had room: no reload found its block
  // on disk.
  EXPECT_EQ(s.reloads_from_disk_total, 0u);
}

TEST_F(SpillPolicyTest, SharedPoolRecordsSpilledBlocksAsSpilled) {
  // A restarted daemon adopts what the block table records: a spilled block's record is marked
  // spilled (no extent: it is reused), and names its new extent when it is staged back.
  constexpr uint64_t kSlots = 16;
  std::vector<uint8_t> records(kSlots * pool::kRecordBytes, 0);
  pool::BlockTable table(records.data(), kSlots, 4 * kMiB);
  auto scan = [&] {
    std::vector<uint8_t> copy = records;  // adoption clears what it drops: scan a copy
    std::map<uint64_t, pool::StoredBlock> found;
    for (const auto& b : pool::BlockTable(copy.data(), kSlots, 4 * kMiB).Adopt().blocks) {
      found[b.block_id] = b;
    }
    return found;
  };
  Make(4 * kMiB, 0.5, 256 * kMiB, TestStoreOptions(), 0, &table);
  if (IsSkipped()) return;
  std::vector<uint64_t> ids;
  for (uint64_t p = 0; p < 4; ++p) ids.push_back(Offload(1, kMiB, p, Hint(1, p)));
  ASSERT_TRUE(WaitFor([&] { return SpillsSettled() && store_->stats().disk_blocks == 2; }));
  std::map<uint64_t, pool::StoredBlock> recorded = scan();
  ASSERT_EQ(recorded.size(), 4u);
  for (int p : {0, 1}) {
    EXPECT_TRUE(recorded[ids[p]].spilled) << p;
    EXPECT_EQ(recorded[ids[p]].extent_offset, 0u) << p;
    EXPECT_EQ(recorded[ids[p]].bytes, kMiB) << p;
  }
  for (int p : {2, 3}) EXPECT_FALSE(recorded[ids[p]].spilled) << p;
  auto ref = ReloadNow(*store_, 1, ids[1]);  // staged back, kept
  ASSERT_TRUE(ref.ok()) << ref.status();
  store_->EndReload(ids[1], false);
  recorded = scan();
  ASSERT_EQ(recorded.count(ids[1]), 1u);
  EXPECT_FALSE(recorded[ids[1]].spilled);
  EXPECT_EQ(recorded[ids[1]].extent_offset, ref->extent.offset);
  for (uint64_t id : ids) store_->Release(1, id).IgnoreError();
  EXPECT_TRUE(WaitFor([&] { return scan().empty() && store_->stats().blocks == 0; }));
}

// A daemon restarted on the same shared pool and spill directory.
class SpillRestartTest : public SpillPolicyTest {
 protected:
  static constexpr uint64_t kSlots = 16;
  const pool::ResumeKey key_ = pool::ResumeKeyOf("token-a");
  std::vector<uint8_t> records_ = std::vector<uint8_t>(kSlots * pool::kRecordBytes, 0);
  pool::BlockTable table_{records_.data(), kSlots, 4 * kMiB};

  // 4 blocks of 1 MiB in a 4 MiB pool at high water 0.5: positions 0 and 1 go to disk.
  std::vector<uint64_t> FillAndSpill() {
    Make(4 * kMiB, 0.5, 256 * kMiB, TestStoreOptions(), 0, &table_);
    if (IsSkipped()) return {};
    store_->SetSessionOwner(1, 1000);
    store_->SetSessionResumeKey(1, key_);
    std::vector<uint64_t> ids;
    for (uint64_t p = 0; p < 4; ++p) ids.push_back(Offload(1, kMiB, p, Hint(1, p)));
    EXPECT_TRUE(WaitFor([&] { return SpillsSettled() && store_->stats().disk_blocks == 2; }));
    return ids;
  }
  // The daemon goes; the next one adopts the table over the same pool memory and directory.
  // Pool bytes outside adopted extents are overwritten, so a stage-back must read the file.
  void Restart() {
    spill::SpillOptions so;
    so.directory = directory();
    so.capacity_bytes = 256 * kMiB;
    so.bytes_per_second = -1;
    so.chunk_bytes = chunk_bytes_;
    store_.reset();
    tier_.reset();
    pool::AdoptionReport report = table_.Adopt();
    std::vector<bool> kept(pool_bytes_, false);
    for (const auto& b : report.blocks) {
      if (b.spilled) continue;
      for (uint64_t i = 0; i < b.bytes; ++i) kept[b.extent_offset + i] = true;
    }
    for (uint64_t i = 0; i < pool_bytes_; ++i) {
      if (!kept[i]) pool_[i] = 0xee;
    }
    auto tier = spill::SpillTier::Create(so, pool_, pool_bytes_);
    ASSERT_TRUE(tier.ok()) << tier.status();
    tier_ = *std::move(tier);
    BlockStoreOptions o = TestStoreOptions();
    o.spill_high_water_fraction = 0.5;
    store_ = std::make_unique<BlockStore>(pool_bytes_, o, &table_, tier_.get());
    adopted_ = store_->Adopt(report.blocks, 3600);
    store_->RemoveUnnamedSpillFiles();
  }
  std::string directory() const {
    const char* tmp = getenv("TEST_TMPDIR");
    return std::string(tmp != nullptr ? tmp : "/tmp") + "/spill_policy_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  uint64_t adopted_ = 0;
};

TEST_F(SpillRestartTest, SpilledBlocksAreAdoptedAndStageBackBitExact) {
  std::vector<uint64_t> ids = FillAndSpill();
  if (IsSkipped()) return;
  ASSERT_TRUE(OnDisk(ids[0]) && OnDisk(ids[1]));
  Restart();
  EXPECT_EQ(adopted_, 4u);
  EXPECT_TRUE(OnDisk(ids[0]) && OnDisk(ids[1]));  // named by records: kept
  EXPECT_EQ(store_->stats().disk_blocks, 2u);
  EXPECT_EQ(tier_->stats().used_bytes, 2 * spill::SpillTier::FileBytes(kMiB));
  std::vector<uint64_t> resumed;
  ASSERT_TRUE(store_->ResumeSession(7, key_, 1000, &resumed).ok());
  EXPECT_EQ(resumed.size(), 4u);
  for (int p : {3, 2, 1, 0}) {
    EXPECT_TRUE(ReloadAndCheck(7, ids[p], kMiB, p, /*release=*/false).ok()) << p;
  }
  EXPECT_GE(store_->stats().staged_blocks_total, 2u);
  for (uint64_t id : ids) EXPECT_TRUE(store_->Release(7, id).ok());
  EXPECT_TRUE(WaitFor([&] { return store_->stats().blocks == 0; }));
  EXPECT_FALSE(OnDisk(ids[0]) || OnDisk(ids[1]));
  EXPECT_EQ(tier_->stats().used_bytes, 0u);
}

TEST_F(SpillRestartTest, MissingOrShortSpillFileIsDataLossForThatBlockOnly) {
  std::vector<uint64_t> ids = FillAndSpill();
  if (IsSkipped()) return;
  ASSERT_EQ(unlink(tier_->FilePath(ids[0]).c_str()), 0);
  ASSERT_EQ(truncate(tier_->FilePath(ids[1]).c_str(), 4096), 0);
  Restart();
  EXPECT_EQ(adopted_, 4u);
  ASSERT_TRUE(store_->ResumeSession(7, key_, 1000).ok());
  for (int p : {0, 1}) {
    absl::Status st = ReloadAndCheck(7, ids[p], kMiB, p, /*release=*/false);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << p << ": " << st;
    EXPECT_TRUE(store_->Release(7, ids[p]).ok());
  }
  EXPECT_EQ(store_->stats().blocks_lost_total, 2u);
  for (int p : {2, 3}) EXPECT_TRUE(ReloadAndCheck(7, ids[p], kMiB, p).ok()) << p;
  // The store keeps serving: a new block goes in and out.
  store_->SetSessionOwner(8, 1000);
  const uint64_t fresh = Offload(8, kMiB, 9);
  EXPECT_TRUE(ReloadAndCheck(8, fresh, kMiB, 9).ok());
  EXPECT_TRUE(WaitFor([&] { return store_->stats().blocks == 0; }));
  EXPECT_EQ(tier_->stats().used_bytes, 0u);
}

TEST_F(SpillRestartTest, OnlySpillFilesNoRecordNamesAreRemoved) {
  std::vector<uint64_t> ids = FillAndSpill();
  if (IsSkipped()) return;
  const std::string orphan = tier_->FilePath(0xabcdef);
  const std::string other = directory() + "/notes.txt";
  for (const std::string& path : {orphan, other}) {
    FILE* f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr) << path;
    fputs("x", f);
    fclose(f);
  }
  // Block 1's record is gone (released by a crash-free path would unlink it; here only the
  // record is cleared): its file is an orphan too.
  {
    std::vector<uint8_t> copy = records_;
    for (const auto& b : pool::BlockTable(copy.data(), kSlots, 4 * kMiB).Adopt().blocks) {
      if (b.block_id == ids[1]) table_.Clear(b.slot);
    }
  }
  Restart();
  EXPECT_EQ(adopted_, 3u);
  EXPECT_NE(access(orphan.c_str(), F_OK), 0);
  EXPECT_FALSE(OnDisk(ids[1]));
  EXPECT_TRUE(OnDisk(ids[0]));
  EXPECT_EQ(access(other.c_str(), F_OK), 0);  // not a spill file: left alone
  ASSERT_TRUE(store_->ResumeSession(7, key_, 1000).ok());
  EXPECT_TRUE(ReloadAndCheck(7, ids[0], kMiB, 0).ok());
}

// Reload of a block on disk, not awaited: its callback fills the returned future.
std::future<absl::StatusOr<BlockRef>> BeginReloadAsync(BlockStore& store, uint64_t session,
                                                       uint64_t id) {
  auto p = std::make_shared<std::promise<absl::StatusOr<BlockRef>>>();
  auto f = p->get_future();
  absl::Status st = store.BeginReload(session, id, [p](absl::StatusOr<BlockRef> r) {
    p->set_value(std::move(r));
  });
  if (!st.ok()) p->set_value(st);
  return f;
}

// The hang of the chaos soak with a 4 MiB pool: an urgent stage-back waits for room; the
// spill started for it is cancelled by a reload of the spilled block (served from the pool),
// and nothing started another spill, so the stage-back waited for ever.
TEST_F(SpillPolicyTest, UrgentStageBackGetsRoomWhenTheSpillForItIsCancelled) {
  // Paced at 2 MiB/s: a 1 MiB spill is under way for 0.5 s, long enough to reload its block.
  Make(4 * kMiB, /*high_water=*/1.0, 256 * kMiB, TestStoreOptions(), 0, nullptr, 2.0 * kMiB);
  if (IsSkipped()) return;
  std::vector<uint64_t> ids;
  for (uint64_t p = 0; p < 5; ++p) ids.push_back(Offload(1, kMiB, p, Hint(1, p)));
  ASSERT_TRUE(WaitFor([&] { return SpillsSettled() && OnDisk(ids[0]); }));
  // Block 0 is on disk and the pool is full: its stage-back waits, block 1 starts spilling.
  auto staged = BeginReloadAsync(*store_, 1, ids[0]);
  ASSERT_GT(store_->stats().spilling_bytes, 0u);
  // Block 1 is reloaded while it is being spilled: served from the pool, the spill cancelled.
  ASSERT_TRUE(ReloadAndCheck(1, ids[1], kMiB, 1, /*release=*/false).ok());
  ASSERT_EQ(staged.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "the urgent stage-back of block 0 still waits for pool space";
  auto ref = staged.get();
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (uint64_t i = 0; i < kMiB; ++i) {
    ASSERT_EQ(pool_[ref->extent.offset + i], Pattern(0, i)) << i;
  }
  store_->EndReload(ids[0], /*release=*/true);
  for (uint64_t p = 1; p < 5; ++p) EXPECT_TRUE(ReloadAndCheck(1, ids[p], kMiB, p).ok()) << p;
}

// Space freed for a waiting urgent stage-back goes to it, not to offloads waiting beside it
// (or a small offload could take every hole a spill opens, and the reload starve).
TEST_F(SpillPolicyTest, UrgentStageBackGetsFreedSpaceBeforeWaitingOffloads) {
  // Paced at 4 MiB/s so the spills finish in the order they started.
  Make(4 * kMiB, /*high_water=*/1.0, 256 * kMiB, TestStoreOptions(), 0, nullptr, 4.0 * kMiB);
  if (IsSkipped()) return;
  const uint64_t a = Offload(1, 2 * kMiB, 0, Hint(1, 0));
  const uint64_t b = Offload(1, kMiB, 1, Hint(1, 1));
  const uint64_t c = Offload(1, kMiB, 2, Hint(1, 2));
  const uint64_t d = Offload(1, 2 * kMiB, 3, Hint(1, 3));  // a spills to make room
  ASSERT_NE(d, 0u);
  ASSERT_TRUE(WaitFor([&] { return SpillsSettled() && OnDisk(a); }));
  auto staged = BeginReloadAsync(*store_, 1, a);  // needs 2 MiB: b and c start spilling
  // Whether a's stage-back had its pool extent (being read, or done) when the offload got one.
  bool stage_had_room = false;
  std::promise<absl::StatusOr<BlockRef>> offloaded;
  store_->Reserve(2, kMiB, [&](absl::StatusOr<BlockRef> r) {
    const StoreStats s = store_->stats();
    stage_had_room = s.staging_bytes >= 2 * kMiB || s.staged_blocks_total >= 1;
    offloaded.set_value(std::move(r));
  });
  auto offload = offloaded.get_future().get();
  ASSERT_TRUE(offload.ok()) << offload.status();
  store_->OffloadFinished(offload->block_id, absl::OkStatus());
  EXPECT_TRUE(stage_had_room) << "the offload was admitted while the urgent stage-back waited";
  ASSERT_EQ(staged.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  auto ref = staged.get();
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (uint64_t i = 0; i < 2 * kMiB; ++i) {
    ASSERT_EQ(pool_[ref->extent.offset + i], Pattern(0, i)) << i;
  }
  store_->EndReload(a, true);
  EXPECT_TRUE(ReloadAndCheck(1, b, kMiB, 1).ok());
  EXPECT_TRUE(ReloadAndCheck(1, c, kMiB, 2).ok());
  EXPECT_TRUE(ReloadAndCheck(1, d, 2 * kMiB, 3).ok());
}

// A reload of a block whose stage-back ahead of need is still queued at PREFETCH promotes the
// rest of that read to URGENT.
TEST_F(SpillPolicyTest, ReloadOfABlockStagedAheadPromotesItsStageBackToUrgent) {
  chunk_bytes_ = 64 * 1024;  // 16 chunks a block: most are still queued when the reload comes
  Make(8 * kMiB, /*high_water=*/0.5, 256 * kMiB, TestStoreOptions(), /*stage_ahead=*/1,
       nullptr, /*disk_bytes_per_second=*/2.0 * kMiB);
  if (IsSkipped()) return;
  std::vector<uint64_t> ids;
  for (uint64_t p = 0; p < 8; ++p) ids.push_back(Offload(1, kMiB, p, Hint(1, p)));
  ASSERT_TRUE(WaitFor([&] { return SpillsSettled() && store_->stats().disk_blocks == 4; }));
  for (int p = 7; p >= 5; --p) ASSERT_TRUE(ReloadAndCheck(1, ids[p], kMiB, p).ok()) << p;
  const sched::LinkSchedulerStats before = tier_->stats().link;
  // Reloading block 4 stages block 3 back ahead (PREFETCH, 0.5 s at this rate); block 3's
  // reload comes right after.
  auto ahead = ReloadNow(*store_, 1, ids[4]);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  EXPECT_GT(store_->stats().staging_bytes, 0u);
  EXPECT_TRUE(ReloadAndCheck(1, ids[3], kMiB, 3).ok());
  store_->EndReload(ids[4], true);
  StoreStats s = store_->stats();
  EXPECT_EQ(s.stages_promoted_total, 1u);
  EXPECT_EQ(s.reloads_from_disk_total, 1u);
  const sched::LinkSchedulerStats after = tier_->stats().link;
  const int urgent = static_cast<int>(sched::TrafficClass::kUrgent);
  const int prefetch = static_cast<int>(sched::TrafficClass::kPrefetch);
  // At most the chunks already picked (one per disk worker) went at PREFETCH.
  EXPECT_GE(after.class_bytes[urgent] - before.class_bytes[urgent], kMiB - 2 * 64 * 1024);
  EXPECT_LE(after.class_bytes[prefetch] - before.class_bytes[prefetch], 2 * 64 * 1024);
}

// Disk full and pool full: a reload of a block on disk cannot be staged back, and nothing can be
// spilled to make room. It fails with RESOURCE_EXHAUSTED after the admission deadline instead of
// waiting for ever (a client blocked on it may be the one that would release), and the block is
// kept: once there is room the same reload works.
TEST_F(SpillPolicyTest, StageBackWithNoRoomAndAFullDiskFailsAfterTheDeadlineAndKeepsTheBlock) {
  Make(2 * kMiB, 1.0, /*disk_bytes=*/spill::SpillTier::FileBytes(kMiB),
       TestStoreOptions(0, /*deadline=*/0.3));
  if (IsSkipped()) return;
  std::vector<uint64_t> ids;
  for (uint8_t i = 0; i < 3; ++i) ids.push_back(Offload(1, kMiB, i));  // ids[0] spills
  ASSERT_TRUE(WaitFor([&] { return SpillsSettled() && OnDisk(ids[0]); }));
  auto staged = BeginReloadAsync(*store_, 1, ids[0]);
  ASSERT_EQ(staged.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "the reload still waits for a stage-back that can never get room";
  auto r = staged.get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("block is kept"), std::string::npos)
      << r.status();
  store_->EndReload(ids[0], false);  // the failed reload ends, as a session does
  EXPECT_EQ(store_->stats().stages_expired_total, 1u);
  // A release makes room: the same reload now works, bit-exact.
  EXPECT_TRUE(store_->Release(1, ids[2]).ok());
  EXPECT_TRUE(ReloadAndCheck(1, ids[0], kMiB, 0).ok());
  EXPECT_TRUE(ReloadAndCheck(1, ids[1], kMiB, 1).ok());
}

}  // namespace
}  // namespace offloadd::store
