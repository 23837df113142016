// The spill tier end to end (issue 18): client processes whose checkpoints are 4x the pool run
// the checkpoint workload (forward offloads layers 0..L-1 with ordering hints, backward reloads
// L-1..0 with prefetch) against a daemon with a spill directory; every reload is checked
// byte for byte by the workload.
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

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
  InProcessDaemon daemon(8 * kMiB, SpillOptions("spill_e2e_nohint"), "spilln");
  ChildProcess k = SpawnChild(Workload(daemon.socket_path(), 0, 32, "--ordering=0"));
  ExpectCleanRun(k, 32);
  EXPECT_GT(daemon.core().Stats().store.spilled_blocks_total, 0u);
}

}  // namespace
}  // namespace offloadd::testing
