// A producer that never finishes must not stall anyone else on its GPU. Against the real daemon
// on --backend=cuda-sim (the cuda engine over the simulated copy engines) with 8 MiB chunks and
// 8 chunks in flight per GPU: one session offloads 2 x 64 MiB (16 chunks, twice the GPU's
// slots) whose ready events are recorded behind a kernel that never ends, or reloads 64 MiB into
// memory such a kernel still uses; another session's ready offloads and reloads on the same
// GPU must still complete, with their bytes. The waits
// are bounded only to turn a hang into a failure. Every time figure is SIMULATED.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/cuda_export.h"
#include "client/offloadd_client.h"
#include "client/sim_client_cuda_api.h"
#include "common/sim_gpu_table.h"
#include "gtest/gtest.h"
#include "tests/e2e/child_process.h"
#include "tests/e2e/sim_gpu_daemon.h"

namespace offloadd::testing {
namespace {

using client::IpcEvent;
using client::SimClientGpu;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kWaitingBytes = 64 * kMiB;  // 8 chunks: all of the GPU's slots
constexpr uint64_t kReadyBytes = 4 * kMiB;
// A failure detector, not a speed bound: a ready 4 MiB copy takes milliseconds.
constexpr auto kAnswerTimeout = std::chrono::seconds(30);
constexpr double kNeverSeconds = 1e6;  // the producer kernel: longer than any test run

std::string Pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

template <typename T>
bool Answered(client::Reply<T>& reply) {
  return reply.wait_for(kAnswerTimeout) == std::future_status::ready;
}

class SlowProducerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new SimGpuDaemon("slowprod", {"--pool_bytes=512MiB", "--chunk_bytes=8MiB",
                                            "--max_chunks_in_flight_per_gpu=8"});
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(daemon_->Stop(), 0);  // it stops although a producer never ended
    delete daemon_;
  }

  void SetUp() override {
    ASSERT_TRUE(daemon_->ready()) << "the daemon did not start on --backend=cuda-sim";
    auto g = CreateOwnSimGpu(256 * kMiB);
    ASSERT_TRUE(g.ok()) << g.status();
    gpu_ = *g;
    exporter_ = std::make_unique<client::CudaExporter>(client::NewSimClientCudaApi(gpu_));
    for (void** s : {&stuck_stream_, &ready_stream_}) {
      ASSERT_EQ(gpu_->StreamCreate(s), client::kSimCudaSuccess);
    }
    producer_ = Connect("slow-producer");
    victim_ = Connect("ready-neighbour");
    ASSERT_NE(producer_, nullptr);
    ASSERT_NE(victim_, nullptr);
  }
  void TearDown() override {
    for (auto& c : {producer_.get(), victim_.get()}) {
      if (c != nullptr) c->Close();
    }
    exporter_.reset();
  }

  std::unique_ptr<client::Client> Connect(const std::string& name) {
    client::ClientOptions o;
    o.socket_path = daemon_->socket();
    o.client_name = name;
    o.device_id = client::SimDeviceUuid(0);
    auto c = client::Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  uint64_t Malloc(uint64_t bytes) {
    uint64_t p = 0;
    EXPECT_EQ(gpu_->Malloc(&p, bytes, /*vmm=*/false), client::kSimCudaSuccess);
    return p;
  }

  // (region id, offset) of [ptr, +bytes) for `c`.
  std::pair<uint64_t, uint64_t> Region(client::Client& c, uint64_t ptr, uint64_t bytes) {
    auto x = exporter_->Export(ptr, bytes);
    EXPECT_TRUE(x.ok()) << x.status();
    if (!x.ok()) return {0, 0};
    auto id = c.RegisterRegion({x->ipc_handle, "", x->allocation_bytes});
    EXPECT_TRUE(id.ok()) << id.status();
    return {id.ok() ? *id : 0, x->offset};
  }

  // An offload of [ptr, +bytes) whose ready event is recorded on `stream` now.
  client::Reply<absl::StatusOr<client::OffloadResult>> StartOffload(client::Client& c,
                                                                    uint64_t ptr, uint64_t bytes,
                                                                    void* stream) {
    auto [region, offset] = Region(c, ptr, bytes);
    auto ev = exporter_->RecordReady(stream);
    EXPECT_TRUE(ev.ok()) << ev.status();
    return c.Offload(region, offset, bytes, ev.ok() ? ev->handle : "");
  }

  // The producer's two offloads, their chunks posted and held for the kernel that never ends.
  void StartStuckOffloads() {
    ASSERT_EQ(gpu_->LaunchKernel(stuck_stream_, kNeverSeconds), client::kSimCudaSuccess);
    for (int i = 0; i < 2; ++i) {
      const uint64_t src = Malloc(kWaitingBytes);
      stuck_.push_back(StartOffload(*producer_, src, kWaitingBytes, stuck_stream_));
      // The daemon maps the source when the transfer is admitted, right before posting it.
      for (int spins = 0; spins < 30000 && gpu_->DaemonMaps(src) == 0; ++spins) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_GT(gpu_->DaemonMaps(src), 0u) << "offload " << i << " was never admitted";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let their chunks post
  }

  static SimGpuDaemon* daemon_;
  std::shared_ptr<SimClientGpu> gpu_;
  std::unique_ptr<client::CudaExporter> exporter_;
  void* stuck_stream_ = nullptr;  // the never-ending producer's stream
  void* ready_stream_ = nullptr;  // the neighbour's, idle
  std::unique_ptr<client::Client> producer_, victim_;
  std::vector<client::Reply<absl::StatusOr<client::OffloadResult>>> stuck_;  // its offloads
};

SimGpuDaemon* SlowProducerTest::daemon_ = nullptr;

TEST_F(SlowProducerTest, AReadyOffloadAndReloadOfAnotherSessionCompleteWhileAProducerNeverEnds) {
  StartStuckOffloads();
  // The neighbour: three ready offloads, each one chunk, then a reload of each.
  std::map<uint64_t, std::string> stored;  // block -> its bytes
  for (uint32_t i = 0; i < 3; ++i) {
    const std::string data = Pattern(kReadyBytes, 10 + i);
    const uint64_t src = Malloc(kReadyBytes);
    std::memcpy(gpu_->HostBytes(src), data.data(), kReadyBytes);
    auto reply = StartOffload(*victim_, src, kReadyBytes, ready_stream_);
    ASSERT_TRUE(Answered(reply)) << "ready offload " << i << " is stuck behind the producer";
    auto r = reply.get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->bytes, kReadyBytes);
    stored[r->block_id] = data;
  }
  const uint64_t dst = Malloc(kReadyBytes);
  auto [region, offset] = Region(*victim_, dst, kReadyBytes);
  for (const auto& [block, data] : stored) {
    auto ready = exporter_->RecordReady(ready_stream_);
    ASSERT_TRUE(ready.ok()) << ready.status();
    auto reply = victim_->Reload(block, region, offset, client::Priority::kPrefetch,
                                 /*release_after=*/true, 0, "", ready->handle);
    ASSERT_TRUE(Answered(reply)) << "ready reload of block " << block << " is stuck";
    auto r = reply.get();
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(gpu_->StreamSynchronize(ready_stream_).ok());
    EXPECT_EQ(std::memcmp(gpu_->HostBytes(dst), data.data(), kReadyBytes), 0) << block;
  }
  // The producer's offloads still wait, unanswered; its session's end fails them.
  for (auto& reply : stuck_) {
    EXPECT_NE(reply.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  }
  producer_->Close();
  for (auto& reply : stuck_) {
    ASSERT_TRUE(Answered(reply));
    EXPECT_EQ(reply.get().status().code(), absl::StatusCode::kCancelled);
  }
  // And the neighbour goes on.
  const uint64_t src = Malloc(kReadyBytes);
  auto reply = StartOffload(*victim_, src, kReadyBytes, ready_stream_);
  ASSERT_TRUE(Answered(reply));
  EXPECT_TRUE(reply.get().ok());
}

// The same on the host-to-device side: a reload whose destination's ready event never
// completes (8 chunks, all of the GPU's slots) and another session's ready reload.
TEST_F(SlowProducerTest, AReadyReloadOfAnotherSessionCompletesWhileAnotherWaitsForever) {
  const uint64_t src = Malloc(kWaitingBytes), dst = Malloc(kWaitingBytes);
  auto offloaded = StartOffload(*producer_, src, kWaitingBytes, ready_stream_);
  ASSERT_TRUE(Answered(offloaded));
  auto block = offloaded.get();
  ASSERT_TRUE(block.ok()) << block.status();
  ASSERT_EQ(gpu_->LaunchKernel(stuck_stream_, kNeverSeconds), client::kSimCudaSuccess);
  auto [region, offset] = Region(*producer_, dst, kWaitingBytes);
  auto never = exporter_->RecordReady(stuck_stream_);  // dst stays in use for ever
  ASSERT_TRUE(never.ok()) << never.status();
  auto stuck = producer_->Reload(block->block_id, region, offset, client::Priority::kPrefetch,
                                 /*release_after=*/false, 0, "", never->handle);
  for (int spins = 0; spins < 30000 && gpu_->DaemonMaps(dst) == 0; ++spins) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GT(gpu_->DaemonMaps(dst), 0u) << "the stuck reload never started";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let its chunks post

  const std::string data = Pattern(kReadyBytes, 20);
  const uint64_t mine = Malloc(kReadyBytes), back = Malloc(kReadyBytes);
  std::memcpy(gpu_->HostBytes(mine), data.data(), kReadyBytes);
  auto stored = StartOffload(*victim_, mine, kReadyBytes, ready_stream_);
  ASSERT_TRUE(Answered(stored));
  auto r = stored.get();
  ASSERT_TRUE(r.ok()) << r.status();
  auto [back_region, back_offset] = Region(*victim_, back, kReadyBytes);
  auto ready = exporter_->RecordReady(ready_stream_);
  ASSERT_TRUE(ready.ok()) << ready.status();
  auto reload = victim_->Reload(r->block_id, back_region, back_offset,
                                client::Priority::kPrefetch, /*release_after=*/true, 0, "",
                                ready->handle);
  ASSERT_TRUE(Answered(reload)) << "a ready reload is stuck behind the waiting one";
  auto done = reload.get();
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_TRUE(gpu_->StreamSynchronize(ready_stream_).ok());
  EXPECT_EQ(std::memcmp(gpu_->HostBytes(back), data.data(), kReadyBytes), 0);
  EXPECT_NE(stuck.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  producer_->Close();
  ASSERT_TRUE(Answered(stuck));
  EXPECT_EQ(stuck.get().status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace offloadd::testing
