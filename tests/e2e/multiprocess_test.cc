// Cross-process tests: several client processes against one daemon, a client killed while it
// holds blocks, and SIGTERM of the real daemon binary with clients connected.
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/e2e/child_process.h"
#include "tests/e2e/daemon_fixture.h"

namespace offloadd::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::vector<std::string> Workload(const std::string& socket, int i, const std::string& extra = "") {
  std::vector<std::string> args = {Runfile("bench/checkpoint_workload"), "--socket=" + socket,
                                   "--name=p" + std::to_string(i),
                                   "--device=gpu" + std::to_string(i), "--layers=8",
                                   "--layer_bytes=" + std::to_string(kMiB), "--steps=3",
                                   "--seed=" + std::to_string(i + 1), "--forward_seconds=0.001"};
  if (!extra.empty()) args.push_back(extra);
  return args;
}

TEST(MultiProcessTest, FourClientProcessesAllBitExact) {
  session::CoreOptions o;
  o.chunk_bytes = 256 * 1024;
  InProcessDaemon daemon(64 * kMiB, o, "mp");
  std::vector<ChildProcess> kids;
  for (int i = 0; i < 4; ++i) kids.push_back(SpawnChild(Workload(daemon.socket_path(), i)));
  for (auto& k : kids) {
    std::string out = k.ReadAll();
    EXPECT_EQ(k.Wait(), 0) << out;
    EXPECT_NE(out.find("\"errors\": 0, \"corrupted\": 0"), std::string::npos) << out;
    EXPECT_NE(out.find("\"bytes_moved\": 50331648"), std::string::npos) << out;  // 8x1MiBx3x2
  }
  auto s = daemon.core().Stats();
  EXPECT_EQ(s.offload_bytes_total, 4u * 24 * kMiB);
  EXPECT_EQ(s.reload_bytes_total, 4u * 24 * kMiB);
  EXPECT_EQ(s.store.pool.used_bytes, 0u);
  EXPECT_GT(s.store.pool.peak_used_bytes, 0u);
  EXPECT_EQ(s.errors_total, 0u);
}

TEST(MultiProcessTest, KilledClientsBlocksReturnToThePool) {
  InProcessDaemon daemon(64 * kMiB, {}, "kill");
  const auto baseline = daemon.core().store().stats().pool.used_bytes;
  ASSERT_EQ(baseline, 0u);
  ChildProcess holder = SpawnChild(Workload(daemon.socket_path(), 0, "--hold_seconds=60"));
  ChildProcess survivor = SpawnChild(Workload(daemon.socket_path(), 1, "--hold_seconds=1"));
  ASSERT_NE(holder.ReadLine().find("holding_blocks"), std::string::npos);
  ASSERT_NE(survivor.ReadLine().find("holding_blocks"), std::string::npos);
  EXPECT_GE(daemon.core().store().stats().blocks, 16u);
  holder.Signal(SIGKILL);
  EXPECT_EQ(holder.Wait(), 128 + SIGKILL);
  // The holder's 8 blocks come back; the survivor's work is untouched and completes bit-exact.
  std::string out = survivor.ReadAll();
  EXPECT_EQ(survivor.Wait(), 0) << out;
  EXPECT_NE(out.find("\"corrupted\": 0"), std::string::npos) << out;
  EXPECT_TRUE(InProcessDaemon::WaitFor(
      [&] { return daemon.core().store().stats().pool.used_bytes == baseline; }));
  EXPECT_EQ(daemon.core().store().stats().blocks, 0u);
  // The survivor released its blocks before it exited; its session ends when the daemon reads
  // the end of its stream, which may come after.
  EXPECT_TRUE(InProcessDaemon::WaitFor([&] { return daemon.core().Stats().sessions_open == 0; }));
}

TEST(MultiProcessTest, SigtermDrainsClosesAndRemovesTheSocket) {
  std::string socket = UniqueSocketPath("term");
  ChildProcess d = SpawnChild({Runfile("server/offloadd"), "--socket_path=" + socket,
                               "--pool_bytes=64MiB", "--metrics_address="});
  ASSERT_NE(d.ReadLine().find("ready"), std::string::npos);
  ChildProcess holder = SpawnChild(Workload(socket, 0, "--hold_seconds=60"));
  ASSERT_NE(holder.ReadLine().find("holding_blocks"), std::string::npos);
  d.Signal(SIGTERM);
  EXPECT_EQ(d.Wait(), 0);
  EXPECT_NE(access(socket.c_str(), F_OK), 0) << "socket file left behind";
  // The client saw its stream end: its reloads fail, it reports errors and exits 1.
  std::string out = holder.ReadAll();
  EXPECT_EQ(holder.Wait(), 1) << out;
  EXPECT_NE(out.find("UNAVAILABLE"), std::string::npos) << out;
  // A new daemon starts on the same path without manual cleanup.
  ChildProcess d2 = SpawnChild({Runfile("server/offloadd"), "--socket_path=" + socket,
                                "--pool_bytes=16MiB", "--metrics_address="});
  EXPECT_NE(d2.ReadLine().find("ready"), std::string::npos);
  d2.Signal(SIGINT);
  EXPECT_EQ(d2.Wait(), 0);
}

}  // namespace
}  // namespace offloadd::testing
