// The spill tier end to end: client processes whose checkpoints are 4x the pool run
// the checkpoint workload (forward offloads layers 0..L-1 with ordering hints, backward reloads
// L-1..0 with prefetch) against a daemon with a spill directory; every reload is checked
// byte for byte by the workload.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client/shm_region.h"

#include "gtest/gtest.h"
#include "tests/e2e/child_process.h"
#include "tests/e2e/daemon_fixture.h"

namespace offloadd::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::string SpillDir(const std::string& name) {
  const char* tmp = getenv("TEST_TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
}

std::vector<std::string> Workload(const std::string& socket, int i, uint64_t layers,
                                  const std::string& extra = "") {
  std::vector<std::string> args = {Runfile("bench/checkpoint_workload"), "--socket=" + socket,
                                   "--name=p" + std::to_string(i),
                                   "--device=gpu" + std::to_string(i),
                                   "--layers=" + std::to_string(layers),
                                   "--layer_bytes=" + std::to_string(kMiB), "--steps=3",
                                   "--seed=" + std::to_string(i + 1), "--forward_seconds=0.001"};
  if (!extra.empty()) args.push_back(extra);
  return args;
}

// Skips the test where the spill directory's file system refuses O_DIRECT (tmpfs).
#define SKIP_WITHOUT_DIRECT_IO(dir)                                          \
  if (!spill::SpillTier::DirectIoSupported(SpillDir(dir))) {                 \
    GTEST_SKIP() << SpillDir(dir) << " does not take O_DIRECT (tmpfs?)";     \
  }

session::CoreOptions SpillOptions(const std::string& dir) {
  session::CoreOptions o;
  o.chunk_bytes = 256 * 1024;
  o.store.admission_deadline_seconds = 30;
  o.spill.directory = SpillDir(dir);
  o.spill.capacity_bytes = 256 * kMiB;
  o.spill.bytes_per_second = -1;  // unpaced: the test checks bytes, not speed
  o.spill.chunk_bytes = kMiB;
  return o;
}

void ExpectCleanRun(ChildProcess& k, uint64_t layers) {
  std::string out = k.ReadAll();
  EXPECT_EQ(k.Wait(), 0) << out;
  EXPECT_NE(out.find("\"errors\": 0, \"corrupted\": 0"), std::string::npos) << out;
  const std::string moved = "\"bytes_moved\": " + std::to_string(layers * kMiB * 3 * 2);
  EXPECT_NE(out.find(moved), std::string::npos) << out;
}

TEST(SpillE2eTest, CheckpointsFourTimesThePoolCompleteBitExact) {
  SKIP_WITHOUT_DIRECT_IO("spill_e2e");
  // Two processes, 16 checkpoints of 1 MiB each per step: 32 MiB in flight over an 8 MiB pool.
  InProcessDaemon daemon(8 * kMiB, SpillOptions("spill_e2e"), "spill");
  std::vector<ChildProcess> kids;
  for (int i = 0; i < 2; ++i) kids.push_back(SpawnChild(Workload(daemon.socket_path(), i, 16)));
  for (auto& k : kids) ExpectCleanRun(k, 16);
  auto s = daemon.core().Stats();
  EXPECT_EQ(s.offload_bytes_total, 2u * 3 * 16 * kMiB);
  EXPECT_EQ(s.reload_bytes_total, 2u * 3 * 16 * kMiB);
  EXPECT_EQ(s.errors_total, 0u);
  EXPECT_GT(s.store.spilled_blocks_total, 0u);
  EXPECT_EQ(s.store.staged_blocks_total, s.store.spilled_blocks_total);
  EXPECT_EQ(s.store.offloads_refused_total, 0u);
  EXPECT_EQ(s.store.blocks_lost_total, 0u);
  ASSERT_TRUE(InProcessDaemon::WaitFor([&] { return daemon.core().Stats().store.blocks == 0; }));
  s = daemon.core().Stats();
  EXPECT_EQ(s.store.pool.used_bytes, 0u);
  EXPECT_EQ(s.store.disk_bytes, 0u);
  EXPECT_EQ(daemon.core().spill()->stats().used_bytes, 0u);
  std::printf("spilled %lu blocks, staged %lu, reloads that found their block on disk %lu\n",
              static_cast<unsigned long>(s.store.spilled_blocks_total),
              static_cast<unsigned long>(s.store.staged_blocks_total),
              static_cast<unsigned long>(s.store.reloads_from_disk_total));
}

TEST(SpillE2eTest, WithoutOrderingHintsStillBitExact) {
  SKIP_WITHOUT_DIRECT_IO("spill_e2e_nohint");
  InProcessDaemon daemon(8 * kMiB, SpillOptions("spill_e2e_nohint"), "spilln");
  ChildProcess k = SpawnChild(Workload(daemon.socket_path(), 0, 32, "--ordering=0"));
  ExpectCleanRun(k, 32);
  EXPECT_GT(daemon.core().Stats().store.spilled_blocks_total, 0u);
}

// A client in the test process with one shm region of `blocks` MiB filled with random bytes.
class SpillFailureTest : public ::testing::Test {
 protected:
  void Start(const std::string& dir, uint64_t pool_bytes, double high_water, uint64_t disk_bytes,
             double deadline_seconds, uint64_t blocks) {
    session::CoreOptions o = SpillOptions(dir);
    o.spill.capacity_bytes = disk_bytes;
    o.store.spill_high_water_fraction = high_water;
    o.store.admission_deadline_seconds = deadline_seconds;
    daemon_ = std::make_unique<InProcessDaemon>(pool_bytes, o, "spillf");
    client_ = daemon_->Connect();
    auto r = client::ShmRegion::Create(blocks * kMiB);
    ASSERT_TRUE(r.ok());
    region_ = std::make_unique<client::ShmRegion>(*std::move(r));
    std::mt19937_64 rng(7);
    auto* w = static_cast<uint64_t*>(region_->data());
    for (uint64_t i = 0; i < region_->size_bytes() / 8; ++i) w[i] = rng();
    original_.assign(static_cast<uint8_t*>(region_->data()),
                     static_cast<uint8_t*>(region_->data()) + region_->size_bytes());
    auto id = client_->RegisterShmRegion(*region_);
    ASSERT_TRUE(id.ok()) << id.status();
    region_id_ = *id;
  }
  void TearDown() override {
    if (client_) client_->Close();
    daemon_.reset();
  }
  absl::StatusOr<uint64_t> Offload(uint64_t i) {
    auto r = client_->Offload(region_id_, i * kMiB, kMiB, "", 0, client::OrderingHint{true, 1, i})
                 .get();
    if (!r.ok()) return r.status();
    return r->block_id;
  }
  // Reloads block `id` into slot i (zeroed first); OK only when the bytes are the original.
  absl::Status ReloadInto(uint64_t i, uint64_t id) {
    memset(static_cast<uint8_t*>(region_->data()) + i * kMiB, 0, kMiB);
    auto r = client_->Reload(id, region_id_, i * kMiB, client::Priority::kUrgent, true).get();
    if (!r.ok()) return r.status();
    if (memcmp(static_cast<uint8_t*>(region_->data()) + i * kMiB, &original_[i * kMiB], kMiB) !=
        0) {
      return absl::DataLossError("the reloaded bytes differ");
    }
    return absl::OkStatus();
  }
  store::StoreStats Store() { return daemon_->core().Stats().store; }

  std::unique_ptr<InProcessDaemon> daemon_;
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<client::ShmRegion> region_;
  std::vector<uint8_t> original_;
  uint64_t region_id_ = 0;
};

TEST_F(SpillFailureTest, RemovedOrTruncatedSpillFileIsDataLossForThoseBlocksOnly) {
  SKIP_WITHOUT_DIRECT_IO("spill_lost");
  Start("spill_lost", 4 * kMiB, 0.5, 256 * kMiB, 30, 8);
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 8; ++i) {
    auto id = Offload(i);
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  ASSERT_TRUE(InProcessDaemon::WaitFor(
      [&] { return Store().spilling_bytes == 0 && Store().disk_blocks == 6; }));
  spill::SpillTier* tier = daemon_->core().spill();
  ASSERT_EQ(unlink(tier->FilePath(ids[0]).c_str()), 0);
  ASSERT_EQ(truncate(tier->FilePath(ids[1]).c_str(), 8192), 0);
  for (int i = 7; i >= 2; --i) EXPECT_TRUE(ReloadInto(i, ids[i]).ok()) << i;
  for (int i : {1, 0}) {
    absl::Status st = ReloadInto(i, ids[i]);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << i << ": " << st;
    EXPECT_NE(std::string(st.message()).find(".spill"), std::string::npos) << st;
  }
  EXPECT_EQ(Store().blocks_lost_total, 2u);
  // The session and the daemon keep serving: a new block goes to the pool and back.
  auto fresh = Offload(3);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(ReloadInto(3, *fresh).ok());
}

TEST_F(SpillFailureTest, DiskFullOffloadFailsWithResourceExhaustedAndNothingIsLost) {
  // Pool 2 MiB, disk one 1 MiB block (and its file's header): three blocks fit in both tiers
  // together, the fourth does not.
  SKIP_WITHOUT_DIRECT_IO("spill_full");
  Start("spill_full", 2 * kMiB, 1.0, spill::SpillTier::FileBytes(kMiB), 0.5, 4);
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < 3; ++i) {
    auto id = Offload(i);
    ASSERT_TRUE(id.ok()) << i << ": " << id.status();
    ids.push_back(*id);
  }
  auto fourth = Offload(3);
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted) << fourth.status();
  for (int i = 2; i >= 0; --i) EXPECT_TRUE(ReloadInto(i, ids[i]).ok()) << i;
  EXPECT_EQ(Store().blocks_lost_total, 0u);
}

}  // namespace
}  // namespace offloadd::testing
