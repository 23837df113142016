// Issue 16: a session on an asynchronous cuda engine (CudaCopyEngine over FakeCudaApi, which
// moves real bytes): chunks are posted up to the per-GPU limit without a copy thread blocked per
// chunk, and offload + reload return the client's bytes.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "gtest/gtest.h"
#include "server/copy/cuda_api_fake.h"
#include "server/copy/cuda_engine.h"
#include "server/session/session.h"

namespace offloadd::session {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr char kUuid[] = "GPU-00000000-1111-2222-3333-444444444444";

class Collector {
 public:
  Session::Emit emit() {
    return [this](Completion c) {
      std::lock_guard<std::mutex> lock(mu_);
      got_.push_back(std::move(c));
      cv_.notify_all();
    };
  }
  Completion Wait(uint64_t request_id) {
    std::unique_lock<std::mutex> lock(mu_);
    Completion out;
    bool found = cv_.wait_for(lock, std::chrono::seconds(10), [&] {
      for (auto& c : got_) {
        if (c.request_id == request_id) {
          out = c;
          return true;
        }
      }
      return false;
    });
    EXPECT_TRUE(found) << "no completion for request " << request_id;
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Completion> got_;
};

Request Make(uint64_t id, RequestKind kind) {
  Request r;
  r.request_id = id;
  r.kind = kind;
  return r;
}

TEST(AsyncCopyTest, ChunksArePostedUpToTheLimitAndBytesRoundTrip) {
  copy::CudaDeviceInfo gpu;
  gpu.uuid = kUuid;
  gpu.pci_bus_id = "0000:1b:00.0";
  gpu.total_bytes = 1ull << 30;
  copy::FakeCudaApi fake({gpu});
  copy::CudaEngineOptions eo;
  eo.asynchronous = true;
  CoreOptions options;
  options.chunk_bytes = 1 * kMiB;
  options.copy_threads = 1;  // one worker, yet two chunks in flight
  options.max_chunks_in_flight_per_gpu = 2;
  pool::ArenaOptions a;
  a.size_bytes = 64 * kMiB;
  auto core = std::make_unique<Core>(options, *pool::Arena::Create(a),
                                     std::make_unique<copy::CudaCopyEngine>(fake.Borrow(), eo));
  ASSERT_TRUE(core->engine().asynchronous());
  const std::string handle = fake.AddAllocation(0, 8 * kMiB);
  uint8_t* dev = fake.allocation_data(handle);
  for (uint64_t i = 0; i < 8 * kMiB; ++i) dev[i] = static_cast<uint8_t>(i * 131 + 7);

  Collector out;
  auto s = Session::Create(core.get(), out.emit());
  Request hello = Make(1, RequestKind::kHello);
  hello.client_name = "async";
  hello.device_id = kUuid;
  hello.pid = getpid();
  s->Handle(hello);
  ASSERT_EQ(out.Wait(1).kind, CompletionKind::kHello);
  Request reg = Make(2, RequestKind::kRegisterRegion);
  reg.region.cuda_ipc_handle = handle;
  reg.region.size_bytes = 8 * kMiB;
  s->Handle(reg);
  Completion region = out.Wait(2);
  ASSERT_EQ(region.kind, CompletionKind::kRegionRegistered) << region.status;

  const uint64_t bytes = 3 * kMiB + kMiB / 2;  // 4 chunks
  fake.HoldCompletions(true);
  Request off = Make(3, RequestKind::kOffload);
  off.region_id = region.id;
  off.offset = kMiB;
  off.bytes = bytes;
  s->Handle(off);
  fake.WaitForMemcpys(2);
  // The limit holds the rest back while the first two are in flight.
  EXPECT_EQ(fake.count("MemcpyAsync"), 2);
  fake.HoldCompletions(false);
  Completion done = out.Wait(3);
  ASSERT_EQ(done.kind, CompletionKind::kOffloadDone) << done.status;
  EXPECT_EQ(fake.count("MemcpyAsync"), 4);

  std::vector<uint8_t> expect(dev + kMiB, dev + kMiB + bytes);
  std::memset(dev, 0, 8 * kMiB);
  Request rel = Make(4, RequestKind::kReload);
  rel.block_id = done.id;
  rel.region_id = region.id;
  rel.offset = 4 * kMiB;
  rel.priority = kPriorityUrgent;
  rel.release_after = true;
  s->Handle(rel);
  Completion back = out.Wait(4);
  ASSERT_EQ(back.kind, CompletionKind::kReloadDone) << back.status;
  EXPECT_EQ(std::memcmp(dev + 4 * kMiB, expect.data(), bytes), 0);
  EXPECT_EQ(core->Stats().offload_bytes_total, bytes);
  EXPECT_EQ(core->Stats().reload_bytes_total, bytes);
  EXPECT_EQ(fake.wrong_device_calls(), 0);
  s->Close(EndCause::kClosed);
}

}  // namespace
}  // namespace offloadd::session
