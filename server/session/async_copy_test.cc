// A session on an asynchronous cuda engine (CudaCopyEngine over FakeCudaApi, which
// moves real bytes): chunks are posted up to the per-GPU limit without a copy thread blocked per
// chunk, and offload + reload return the client's bytes.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/copy/cuda/cuda_api_fake.h"
#include "server/copy/cuda/cuda_engine.h"
#include "server/session/completion_collector.h"
#include "server/session/session.h"

namespace offloadd::session {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr char kUuid[] = "GPU-00000000-1111-2222-3333-444444444444";

using Collector = CompletionCollector;

Request Make(uint64_t id, RequestKind kind) {
  Request r;
  r.request_id = id;
  r.kind = kind;
  return r;
}

// One fake GPU (kUuid) whose copies move real bytes, for an asynchronous cuda engine.
copy::FakeCudaApi MakeFakeGpu() {
  copy::CudaDeviceInfo gpu;
  gpu.uuid = kUuid;
  gpu.pci_bus_id = "0000:1b:00.0";
  gpu.total_bytes = 1ull << 30;
  return copy::FakeCudaApi({gpu});
}

// A Core on the asynchronous engine over `fake`: 1 MiB chunks, one copy worker, two chunks in
// flight per GPU, a 64 MiB pool.
std::unique_ptr<Core> MakeAsyncCore(copy::FakeCudaApi& fake) {
  copy::CudaEngineOptions eo;
  eo.asynchronous = true;
  CoreOptions options;
  options.chunk_bytes = 1 * kMiB;
  options.copy_threads = 1;  // one worker, yet two chunks in flight
  options.max_chunks_in_flight_per_gpu = 2;
  pool::ArenaOptions a;
  a.size_bytes = 64 * kMiB;
  return std::make_unique<Core>(options, *pool::Arena::Create(a),
                                std::make_unique<copy::CudaCopyEngine>(fake.Borrow(), eo));
}

// Hello (request 1) on kUuid, then registers the 8 MiB allocation `handle` (request 2); returns
// the region id, or 0 after a test failure.
uint64_t HelloAndRegister(Session& s, Collector& out, const std::string& handle) {
  Request hello = Make(1, RequestKind::kHello);
  hello.client_name = "async";
  hello.device_id = kUuid;
  hello.pid = getpid();
  s.Handle(hello);
  EXPECT_EQ(out.Wait(1).kind, CompletionKind::kHello);
  Request reg = Make(2, RequestKind::kRegisterRegion);
  reg.region.cuda_ipc_handle = handle;
  reg.region.size_bytes = 8 * kMiB;
  s.Handle(reg);
  Completion region = out.Wait(2);
  EXPECT_EQ(region.kind, CompletionKind::kRegionRegistered) << region.status;
  return region.kind == CompletionKind::kRegionRegistered ? region.id : 0;
}

TEST(AsyncCopyTest, ChunksArePostedUpToTheLimitAndBytesRoundTrip) {
  copy::FakeCudaApi fake = MakeFakeGpu();
  auto core = MakeAsyncCore(fake);
  ASSERT_TRUE(core->engine().asynchronous());
  const std::string handle = fake.AddAllocation(0, 8 * kMiB);
  uint8_t* dev = fake.allocation_data(handle);
  for (uint64_t i = 0; i < 8 * kMiB; ++i) dev[i] = static_cast<uint8_t>(i * 131 + 7);

  Collector out;
  auto s = Session::Create(core.get(), out.emit());
  const uint64_t region_id = HelloAndRegister(*s, out, handle);
  ASSERT_NE(region_id, 0u);

  const uint64_t bytes = 3 * kMiB + kMiB / 2;  // 4 chunks
  fake.HoldCompletions(true);
  Request off = Make(3, RequestKind::kOffload);
  off.region_id = region_id;
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
  rel.region_id = region_id;
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

// Asynchronous copies and the session's end: the end waits for the chunks already posted to the
// engine (they write client memory), no chunk is posted after it, the stream ends only then, and
// the cancelled offload's done runs exactly once (its pool space comes back).
TEST(AsyncCopyTest, SessionEndWaitsForPostedChunksAndPostsNoMore) {
  copy::FakeCudaApi fake = MakeFakeGpu();
  auto core = MakeAsyncCore(fake);
  const std::string handle = fake.AddAllocation(0, 8 * kMiB);

  Collector out;
  std::atomic<bool> released{false};
  std::atomic<int> stream_ends{0};
  std::atomic<bool> ended_before_release{false};
  std::atomic<int> memcpys_at_end{-1};
  auto s = Session::Create(core.get(), out.emit(), PeerCredentials{}, [&](const absl::Status&) {
    if (!released) ended_before_release = true;
    memcpys_at_end = fake.count("MemcpyAsync");
    ++stream_ends;
  });
  const uint64_t region_id = HelloAndRegister(*s, out, handle);
  ASSERT_NE(region_id, 0u);

  fake.HoldCompletions(true);
  Request off = Make(3, RequestKind::kOffload);
  off.region_id = region_id;
  off.bytes = 4 * kMiB;  // 4 chunks; 2 posted, 2 queued behind the per-GPU limit
  s->Handle(off);
  fake.WaitForMemcpys(2);
  std::future<void> ended = std::async(
      std::launch::async, [&] { s->End(EndCause::kCrashed, absl::UnavailableError("peer gone")); });
  // The two posted chunks cannot complete while held, so the end cannot finish: it waits for
  // them (a wrong end returns here at once; the wait only bounds how long the test looks).
  EXPECT_EQ(ended.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  EXPECT_TRUE(s->closed());
  released = true;
  fake.HoldCompletions(false);
  ended.get();
  EXPECT_EQ(stream_ends.load(), 1);
  EXPECT_FALSE(ended_before_release.load());  // the stream ended after the posted chunks
  core->Drain();                              // every transfer accepted has had its done
  CoreStats stats = core->Stats();
  // The offload's done ran once, with the cancel: a failed transfer counts one error, and its
  // request's answer one more.
  EXPECT_EQ(stats.errors_total, 2u);
  EXPECT_EQ(stats.offloads_total, 0u);
  EXPECT_EQ(stats.store.blocks, 0u);  // its pool space came back
  EXPECT_GE(memcpys_at_end.load(), 2);
  EXPECT_EQ(fake.count("MemcpyAsync"), memcpys_at_end.load());  // none after the end
}

}  // namespace
}  // namespace offloadd::session
