#include "server/spill/chunk_checksums.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/base/crc32c.h"

namespace offloadd::spill {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(ChunkChecksums, PiecesComputedOnWorkersInAnyOrderJoinToTheWholeCrc) {
  const std::vector<uint8_t> data = RandomBytes(1 << 20, 7);
  base::WorkerThreads workers(3);
  auto sums = std::make_shared<ChunkChecksums>(&workers);
  std::vector<uint64_t> starts;
  for (uint64_t o = 0; o < data.size(); o += 40960) starts.push_back(o);
  std::shuffle(starts.begin(), starts.end(), std::mt19937(3));
  for (uint64_t o : starts) {
    sums->Compute(o, data.data() + o, std::min<uint64_t>(40960, data.size() - o));
  }
  std::promise<void> settled;
  sums->WhenSettled([&] { settled.set_value(); });
  settled.get_future().wait();
  uint32_t crc = 0;
  ASSERT_TRUE(sums->Joined(data.size(), &crc));
  EXPECT_EQ(crc, base::Crc32c(data.data(), data.size()));
}

TEST(ChunkChecksums, WhenSettledWaitsForTheLastPendingCrcThenRunsOnce) {
  const std::vector<uint8_t> data = RandomBytes(64 << 10, 11);
  base::WorkerThreads workers(1);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  workers.Post([released] { released.wait(); });  // holds the only worker
  auto sums = std::make_shared<ChunkChecksums>(&workers);
  sums->Compute(0, data.data(), 32 << 10);
  sums->Compute(32 << 10, data.data() + (32 << 10), 32 << 10);
  std::atomic<int> runs{0};
  std::promise<uint32_t> joined;
  sums->WhenSettled([&] {
    uint32_t crc = 0;
    ++runs;
    joined.set_value(sums->Joined(data.size(), &crc) ? crc : 0);
  });
  uint32_t crc = 0;
  EXPECT_EQ(runs.load(), 0);
  EXPECT_FALSE(sums->Joined(data.size(), &crc));  // nothing computed yet
  release.set_value();
  EXPECT_EQ(joined.get_future().get(), base::Crc32c(data.data(), data.size()));
  workers.Shutdown();
  EXPECT_EQ(runs.load(), 1);
}

TEST(ChunkChecksums, WhenSettledWithNothingPendingRunsOnTheCallersThread) {
  base::WorkerThreads workers(1);
  auto sums = std::make_shared<ChunkChecksums>(&workers);
  std::thread::id ran_on;
  sums->WhenSettled([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(ChunkChecksums, AGapOrAShortTotalIsNotJoined) {
  const std::vector<uint8_t> data = RandomBytes(12288, 5);
  auto sums = std::make_shared<ChunkChecksums>(nullptr);  // computed inline
  sums->Compute(0, data.data(), 4096);
  sums->Compute(8192, data.data() + 8192, 4096);
  uint32_t crc = 0;
  EXPECT_FALSE(sums->Joined(12288, &crc));  // [4096, 8192) missing
  sums->Compute(4096, data.data() + 4096, 4096);
  EXPECT_FALSE(sums->Joined(16384, &crc));  // covers only 12288
  ASSERT_TRUE(sums->Joined(12288, &crc));
  EXPECT_EQ(crc, base::Crc32c(data.data(), data.size()));
}

}  // namespace
}  // namespace offloadd::spill
