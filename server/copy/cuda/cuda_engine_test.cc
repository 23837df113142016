#include "server/copy/cuda/cuda_engine.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/copy/cuda/cuda_api_fake.h"

namespace offloadd::copy {
namespace {

constexpr char kUuid0[] = "GPU-00000000-1111-2222-3333-444444444444";
constexpr char kUuid1[] = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";

std::vector<CudaDeviceInfo> TwoGpus() {
  CudaDeviceInfo a, b;
  a.uuid = kUuid0;
  a.pci_bus_id = "0000:1b:00.0";
  a.total_bytes = 1ull << 30;
  b.uuid = kUuid1;
  b.pci_bus_id = "0000:2c:00.0";
  b.total_bytes = 1ull << 30;
  return {a, b};
}

// The stream name ("s3") at the start of a call's detail.
std::string StreamOf(const std::string& detail) { return detail.substr(0, detail.find(' ')); }

CudaEngineOptions Options(uint32_t streams, bool asynchronous = false, uint32_t cached_events = 64,
                          uint64_t register_chunk_bytes = 1ull << 30) {
  CudaEngineOptions o;
  o.streams_per_direction = streams;
  o.asynchronous = asynchronous;
  o.max_cached_events = cached_events;
  o.host_register_chunk_bytes = register_chunk_bytes;
  o.assumed_bytes_per_second = 0;  // the tests count copies issued before a rate is learned
  return o;
}

// Polls `cond` for up to 5 s (work done on the engine's threads).
template <typename F>
bool Eventually(F cond) {
  for (int i = 0; i < 5000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return cond();
}

class CudaEngineTest : public ::testing::Test {
 protected:
  explicit CudaEngineTest(CudaEngineOptions options = {})
      : fake_(TwoGpus()), engine_(std::make_unique<CudaCopyEngine>(fake_.Borrow(), options)) {}

  // An allocation on `ordinal` filled with a position-dependent pattern.
  std::string Alloc(int ordinal, uint64_t size) {
    std::string h = fake_.AddAllocation(ordinal, size);
    uint8_t* d = fake_.allocation_data(h);
    for (uint64_t i = 0; i < size; ++i) d[i] = static_cast<uint8_t>((i * 131 + 7) >> 3);
    return h;
  }
  std::shared_ptr<Region> Open(const std::string& handle, uint64_t size,
                               const std::string& uuid = kUuid0) {
    RegionSpec spec;
    spec.cuda_ipc_handle = handle;
    spec.size_bytes = size;
    spec.device_id = uuid;
    auto r = engine_->OpenRegion(spec);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : nullptr;
  }
  absl::Status OpenStatus(const std::string& handle, uint64_t size, const std::string& uuid) {
    RegionSpec spec;
    spec.cuda_ipc_handle = handle;
    spec.size_bytes = size;
    spec.device_id = uuid;
    return engine_->OpenRegion(spec).status();
  }
  std::shared_ptr<TransferOrder> Begin(Region& r, Direction d, uint64_t bytes,
                                       const std::string& ready = "",
                                       const std::string& done = "",
                                       std::function<void()> recorded = nullptr,
                                       uint64_t owner = 0) {
    TransferSpec spec;
    spec.owner_id = owner;
    spec.direction = d;
    spec.bytes = bytes;
    spec.ready_event = ready;
    spec.done_event = done;
    spec.on_done_recorded = std::move(recorded);
    auto o = engine_->BeginTransfer(r, std::move(spec));
    EXPECT_TRUE(o.ok()) << o.status();
    return o.ok() ? *o : nullptr;
  }
  // Calls of `name`, with their details.
  std::vector<FakeCudaApi::Call> CallsOf(const std::string& name) {
    std::vector<FakeCudaApi::Call> out;
    for (auto& c : fake_.calls()) {
      if (c.name == name) out.push_back(c);
    }
    return out;
  }

  FakeCudaApi fake_;
  std::unique_ptr<CudaCopyEngine> engine_;
};

// The engine says what it does beyond a blocking copy: it orders transfers, and posts
// asynchronously only when configured to.
TEST_F(CudaEngineTest, CapabilitiesFollowTheOptions) {
  EXPECT_TRUE(engine_->capabilities().orders_transfers);
  EXPECT_FALSE(engine_->capabilities().asynchronous);
  CudaCopyEngine async_engine(fake_.Borrow(), Options(1, true));
  EXPECT_TRUE(async_engine.capabilities().asynchronous);
  EXPECT_TRUE(async_engine.capabilities().orders_transfers);
}

TEST_F(CudaEngineTest, ThousandChunksOfOneTransferOpenTheHandleOnce) {
  const uint64_t size = 1 << 20;
  std::string h = Alloc(0, size);
  auto region = Open(h, size);
  ASSERT_NE(region, nullptr);
  EXPECT_EQ(fake_.count("IpcOpenMemHandle"), 1);  // the registration checks the handle...
  EXPECT_TRUE(Eventually([&] { return fake_.open_mappings() == 0; }));  // ...and lets it go
  std::vector<uint8_t> host(1024);
  const uint8_t* dev = fake_.allocation_data(h);
  auto order = Begin(*region, Direction::kDeviceToHost, 1000 * host.size());
  for (int i = 0; i < 1000; ++i) {
    uint64_t off = (static_cast<uint64_t>(i) * 1021) % (size - host.size());
    ASSERT_TRUE(engine_->CopyOrderedChunk(order.get(), i * host.size(), Direction::kDeviceToHost,
                                          *region, off, host.data(), host.size())
                    .ok());
    ASSERT_EQ(std::memcmp(host.data(), dev + off, host.size()), 0) << "copy " << i;
  }
  EXPECT_EQ(fake_.count("IpcOpenMemHandle"), 2);
  EXPECT_EQ(fake_.count("MemcpyAsync"), 1000);
  EXPECT_EQ(fake_.open_mappings(), 1);
  order.reset();  // the transfer is over: the daemon lets the memory go
  EXPECT_TRUE(Eventually([&] { return fake_.open_mappings() == 0; }));
  CudaEngineStats st = engine_->stats();
  EXPECT_EQ(st.mem_handle_opens_total, 2u);
  EXPECT_EQ(st.chunks_total, 1000u);
  EXPECT_EQ(st.chunk_bytes_total, 1000u * 1024);
  // Completion events are reused, not created per chunk.
  EXPECT_LE(fake_.count("CreateEvent"), 2);
}

// What lets a training process's allocator free a segment at any time: the daemon maps it only
// while a transfer uses it, overlapping transfers sharing one open.
TEST_F(CudaEngineTest, AnAllocationIsMappedOnlyWhileATransferUsesIt) {
  std::string h = Alloc(0, 4096);
  auto a = Open(h, 4096);
  auto b = Open(h, 1024);  // a second registration (e.g. another session) of the same handle
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->size_bytes(), 1024u);
  EXPECT_TRUE(Eventually([&] { return fake_.open_mappings() == 0; }));
  auto t1 = Begin(*a, Direction::kDeviceToHost, 64);
  auto t2 = Begin(*b, Direction::kHostToDevice, 64);
  std::vector<uint8_t> host(64);
  ASSERT_TRUE(engine_->CopyOrderedChunk(t1.get(), 0, Direction::kDeviceToHost, *a, 0,
                                        host.data(), 64).ok());
  ASSERT_TRUE(engine_->CopyOrderedChunk(t2.get(), 0, Direction::kHostToDevice, *b, 0,
                                        host.data(), 64).ok());
  EXPECT_EQ(fake_.open_mappings(), 1);
  const int opens = fake_.count("IpcOpenMemHandle");
  t1.reset();
  EXPECT_EQ(fake_.open_mappings(), 1);  // t2 still uses it
  t2.reset();
  EXPECT_TRUE(Eventually([&] { return engine_->stats().mem_handles_open == 0; }));
  EXPECT_EQ(fake_.open_mappings(), 0);
  EXPECT_LE(opens, 3);  // the two registrations' checks and at most one for both transfers
  // Opens and closes ran on the GPU's mapper thread, not on its device thread.
  std::set<std::thread::id> copy_threads, map_threads;
  for (auto& c : fake_.calls()) {
    if (c.name == "MemcpyAsync") copy_threads.insert(c.thread);
    if (c.name == "IpcOpenMemHandle" || c.name == "IpcCloseMemHandle") map_threads.insert(c.thread);
  }
  ASSERT_EQ(copy_threads.size(), 1u);
  ASSERT_EQ(map_threads.size(), 1u);
  EXPECT_NE(*copy_threads.begin(), *map_threads.begin());
}

TEST_F(CudaEngineTest, CacheIsKeyedByHandleBytesNotByAddress) {
  std::string h1 = Alloc(0, 4096), h2 = Alloc(0, 4096);
  auto a = Open(h1, 4096);
  auto b = Open(h2, 4096);
  auto ta = Begin(*a, Direction::kDeviceToHost, 16), tb = Begin(*b, Direction::kDeviceToHost, 16);
  std::vector<uint8_t> host(16);
  ASSERT_TRUE(
      engine_->CopyOrderedChunk(ta.get(), 0, Direction::kDeviceToHost, *a, 0, host.data(), 16)
          .ok());
  ASSERT_TRUE(
      engine_->CopyOrderedChunk(tb.get(), 0, Direction::kDeviceToHost, *b, 0, host.data(), 16)
          .ok());
  EXPECT_EQ(fake_.count("IpcOpenMemHandle"), 4);
  EXPECT_EQ(fake_.open_mappings(), 2);
}

TEST_F(CudaEngineTest, RejectsMalformedSpecs) {
  RegionSpec shm;
  shm.shm_name = "/x";
  shm.size_bytes = 10;
  shm.device_id = kUuid0;
  EXPECT_EQ(engine_->OpenRegion(shm).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenStatus(std::string(63, 'x'), 10, kUuid0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenStatus(Alloc(0, 64), 0, kUuid0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fake_.count("IpcOpenMemHandle"), 0);
}

TEST_F(CudaEngineTest, SizeLargerThanTheAllocationIsOutOfRangeAndLeavesNothingOpen) {
  std::string h = Alloc(0, 4096);
  absl::Status st = OpenStatus(h, 4097, kUuid0);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_NE(st.message().find("4096"), std::string::npos) << st;
  EXPECT_TRUE(Eventually([&] { return fake_.open_mappings() == 0; }));
  // A bad second registration leaves a good one and its transfer alone.
  auto ok = Open(h, 4096);
  auto t = Begin(*ok, Direction::kDeviceToHost, 16);
  std::vector<uint8_t> host(16);
  EXPECT_TRUE(
      engine_->CopyOrderedChunk(t.get(), 0, Direction::kDeviceToHost, *ok, 0, host.data(), 16)
          .ok());
  EXPECT_EQ(OpenStatus(h, 8192, kUuid0).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(fake_.open_mappings(), 1);
  EXPECT_TRUE(
      engine_->CopyOrderedChunk(t.get(), 0, Direction::kDeviceToHost, *ok, 0, host.data(), 16)
          .ok());
}

TEST_F(CudaEngineTest, ChunksOutsideTheRegionAreRejectedBeforeAnyCopy) {
  std::string h = Alloc(0, 8192);
  auto r = Open(h, 4096);  // registered smaller than the allocation: its own bound applies
  std::vector<uint8_t> host(8192);
  EXPECT_EQ(engine_->CopyChunk(Direction::kDeviceToHost, *r, 4000, host.data(), 97).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(engine_->CopyChunk(Direction::kHostToDevice, *r, 4097, host.data(), 0).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(engine_->CopyChunk(Direction::kDeviceToHost, *r, ~0ull - 10, host.data(), 20).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(fake_.count("MemcpyAsync"), 0);
  EXPECT_TRUE(engine_->CopyChunk(Direction::kDeviceToHost, *r, 4000, host.data(), 96).ok());
}

TEST_F(CudaEngineTest, HostToDeviceWritesTheDeviceBytes) {
  std::string h = Alloc(1, 4096);
  auto r = Open(h, 4096, kUuid1);
  std::vector<uint8_t> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(255 - i % 251);
  ASSERT_TRUE(engine_->CopyChunk(Direction::kHostToDevice, *r, 3000, host.data(), 1000).ok());
  EXPECT_EQ(std::memcmp(fake_.allocation_data(h) + 3000, host.data(), 1000), 0);
}

TEST_F(CudaEngineTest, DevicesAreFoundByUuidAndContextsCreatedLazily) {
  EXPECT_EQ(fake_.contexts_created(), 0);
  std::string h = Alloc(1, 4096);
  // Same UUID as the daemon's list, upper-case and without the "GPU-" prefix.
  auto r = Open(h, 4096, "AAAAAAAA-BBBB-CCCC-DDDD-EEEEEEEEEEEE");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(fake_.contexts_created(), 1);  // only GPU 1 got a context
  auto opens = CallsOf("IpcOpenMemHandle");
  ASSERT_EQ(opens.size(), 1u);
  EXPECT_EQ(opens[0].current_device, 1);
  ASSERT_EQ(engine_->stats().devices.size(), 1u);
  EXPECT_EQ(engine_->stats().devices[0].uuid, kUuid1);
  EXPECT_EQ(engine_->stats().devices[0].free_bytes_after_context, (1ull << 30) / 2);

  absl::Status st = OpenStatus(h, 4096, "GPU-99999999-0000-0000-0000-000000000000");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find(kUuid0), std::string::npos) << st;  // lists what it sees
  EXPECT_NE(st.message().find("CUDA_VISIBLE_DEVICES"), std::string::npos) << st;
}

TEST_F(CudaEngineTest, EveryCallForADeviceRunsOnThatDevicesOwnThread) {
  std::string h0 = Alloc(0, 1 << 16), h1 = Alloc(1, 1 << 16);
  auto r0 = Open(h0, 1 << 16, kUuid0);
  auto r1 = Open(h1, 1 << 16, kUuid1);
  std::vector<std::thread> callers;
  std::set<std::thread::id> caller_ids;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      std::vector<uint8_t> host(512);
      Region& r = t % 2 ? *r1 : *r0;
      for (int i = 0; i < 50; ++i) {
        Direction d = i % 2 ? Direction::kHostToDevice : Direction::kDeviceToHost;
        EXPECT_TRUE(engine_->CopyChunk(d, r, 512 * (i + t * 50) % 60000, host.data(), 512).ok());
      }
    });
    caller_ids.insert(callers.back().get_id());
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(fake_.wrong_device_calls(), 0);
  // Per GPU: its device thread (copies, events) and its mapper thread (opens, closes).
  auto t0 = fake_.threads_for_device(0), t1 = fake_.threads_for_device(1);
  ASSERT_EQ(t0.size(), 2u);
  ASSERT_EQ(t1.size(), 2u);
  for (auto id : t0) {
    EXPECT_EQ(t1.count(id), 0u);
    EXPECT_EQ(caller_ids.count(id), 0u);
  }
  EXPECT_EQ(fake_.count("MemcpyAsync"), 200);
}

TEST_F(CudaEngineTest, AChunkWaitsForItsTransfersReadyEventOnlyAndNoStreamWaits) {
  std::string h = Alloc(0, 8192);
  auto r = Open(h, 8192);
  std::string ev = fake_.AddIpcEvent(0);
  fake_.SetIpcEventPending(ev, true);  // its producer is still running
  auto a = Begin(*r, Direction::kDeviceToHost, 4096, ev);
  auto b = Begin(*r, Direction::kDeviceToHost, 4096);
  std::vector<uint8_t> host(8192);
  std::promise<absl::Status> a_done;
  std::atomic<bool> a_finished{false};
  std::thread first([&] {
    a_done.set_value(engine_->CopyOrderedChunk(a.get(), 0, Direction::kDeviceToHost, *r, 0,
                                               host.data(), 4096));
    a_finished = true;
  });
  // B, submitted after A, is copied while A's producer runs.
  ASSERT_TRUE(engine_->CopyOrderedChunk(b.get(), 0, Direction::kDeviceToHost, *r, 4096,
                                        host.data() + 4096, 4096)
                  .ok());
  EXPECT_FALSE(a_finished.load());
  EXPECT_EQ(fake_.count("MemcpyAsync"), 1);
  fake_.SetIpcEventPending(ev, false);
  first.join();
  EXPECT_TRUE(a_done.get_future().get().ok());
  EXPECT_EQ(std::memcmp(host.data(), fake_.allocation_data(h), 8192), 0);
  EXPECT_EQ(fake_.count("StreamWaitEvent"), 0);  // nothing on a stream waits for a client
  EXPECT_EQ(fake_.count("IpcOpenEventHandle"), 1);
  // The event stays open for the next transfer that names it.
  auto c = Begin(*r, Direction::kDeviceToHost, 16, ev);
  ASSERT_TRUE(
      engine_->CopyOrderedChunk(c.get(), 0, Direction::kDeviceToHost, *r, 0, host.data(), 16)
          .ok());
  EXPECT_EQ(fake_.count("IpcOpenEventHandle"), 1);
}

TEST_F(CudaEngineTest, TheDoneEventIsRecordedRightAfterTheLastChunkBeforeItCompletes) {
  std::string h = Alloc(0, 8192);
  auto r = Open(h, 8192);
  std::string ev = fake_.AddIpcEvent(0);
  std::atomic<int> recorded{0};
  auto t = Begin(*r, Direction::kHostToDevice, 8192, "", ev, [&] { ++recorded; });
  std::vector<uint8_t> host(8192, 9);
  fake_.HoldCompletions(true);
  std::vector<std::thread> copies;
  copies.emplace_back([&] {
    EXPECT_TRUE(engine_->CopyOrderedChunk(t.get(), 0, Direction::kHostToDevice, *r, 0,
                                          host.data(), 4096)
                    .ok());
  });
  fake_.WaitForMemcpys(1);
  EXPECT_EQ(recorded.load(), 0);  // not after the first chunk
  copies.emplace_back([&] {
    EXPECT_TRUE(engine_->CopyOrderedChunk(t.get(), 4096, Direction::kHostToDevice, *r, 4096,
                                          host.data() + 4096, 4096)
                    .ok());
  });
  fake_.WaitForMemcpys(2);
  EXPECT_TRUE(Eventually([&] { return recorded.load() == 1; }));  // copies still held
  fake_.HoldCompletions(false);
  for (auto& c : copies) c.join();
  // The record follows the last copy on the same stream, and both chunks used one stream.
  auto calls = fake_.calls();
  std::string last_copy_stream;
  int record_after = -1;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].name == "MemcpyAsync") last_copy_stream = StreamOf(calls[i].detail);
    if (calls[i].name == "EventRecord" && !last_copy_stream.empty()) record_after = i;
  }
  ASSERT_GE(record_after, 0);
  auto memcpys = CallsOf("MemcpyAsync");
  EXPECT_EQ(StreamOf(memcpys[0].detail), StreamOf(memcpys[1].detail));
  EXPECT_EQ(fake_.count("IpcOpenEventHandle"), 1);
  EXPECT_EQ(recorded.load(), 1);
  TransferSpec bad;
  bad.done_event = "short";
  EXPECT_EQ(engine_->BeginTransfer(*r, bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaEngineTest, AnUnknownEventFailsTheTransfersChunksNamingTheGpu) {
  auto r = Open(Alloc(0, 4096), 4096);
  auto t = Begin(*r, Direction::kDeviceToHost, 64, std::string(kIpcHandleBytes, 'z'));
  std::vector<uint8_t> host(64);
  absl::Status st =
      engine_->CopyOrderedChunk(t.get(), 0, Direction::kDeviceToHost, *r, 0, host.data(), 64);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find(kUuid0), std::string::npos) << st;
  EXPECT_EQ(fake_.count("MemcpyAsync"), 0);
}

TEST_F(CudaEngineTest, ATransferWaitingForItsReadyEventStopsWhenCancelled) {
  auto r = Open(Alloc(0, 4096), 4096);
  std::string ev = fake_.AddIpcEvent(0);
  fake_.SetIpcEventPending(ev, true);  // never completes
  std::atomic<bool> cancelled{false};
  TransferSpec spec;
  spec.direction = Direction::kDeviceToHost;
  spec.bytes = 64;
  spec.ready_event = ev;
  spec.cancelled = [&] { return cancelled.load(); };
  auto t = engine_->BeginTransfer(*r, spec);
  ASSERT_TRUE(t.ok());
  std::vector<uint8_t> host(64);
  std::promise<absl::Status> got;
  std::thread copier([&] {
    got.set_value(engine_->CopyOrderedChunk(t->get(), 0, Direction::kDeviceToHost, *r, 0,
                                            host.data(), 64));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  cancelled = true;  // the session ended
  copier.join();
  EXPECT_EQ(got.get_future().get().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(fake_.count("MemcpyAsync"), 0);
}

// The engine says when a transfer's chunks start and stop waiting for its producer (the link
// scheduler then lets other transfers use the GPU's slots): once each, only for a ready event
// found running, and also when a wait ends in failure.
TEST_F(CudaEngineTest, ATransferReportsWhenItsChunksWaitForItsProducer) {
  std::string h = Alloc(0, 8192);
  auto r = Open(h, 8192);
  std::string ev = fake_.AddIpcEvent(0);
  std::mutex mu;
  std::map<std::string, std::vector<bool>> reports;
  std::atomic<bool> cancelled{false};
  auto begin = [&](const std::string& name, const std::string& ready) {
    TransferSpec spec;
    spec.direction = Direction::kDeviceToHost;
    spec.bytes = 4096;
    spec.ready_event = ready;
    spec.cancelled = [&] { return cancelled.load(); };
    spec.on_producer_wait = [&, name](bool waiting) {
      std::lock_guard<std::mutex> lock(mu);
      reports[name].push_back(waiting);
    };
    auto o = engine_->BeginTransfer(*r, std::move(spec));
    EXPECT_TRUE(o.ok()) << o.status();
    return o.ok() ? *o : nullptr;
  };
  auto reported = [&](const std::string& name) {
    std::lock_guard<std::mutex> lock(mu);
    return reports[name];
  };
  std::vector<uint8_t> host(8192);
  // Its event completed already: no wait to report.
  auto done = begin("done", ev);
  ASSERT_TRUE(engine_->CopyOrderedChunk(done.get(), 0, Direction::kDeviceToHost, *r, 0,
                                        host.data(), 4096)
                  .ok());
  EXPECT_TRUE(reported("done").empty());
  // Its producer runs: reported waiting once, however often the gate is asked, then done.
  fake_.SetIpcEventPending(ev, true);
  auto slow = begin("slow", ev);
  std::thread copier([&] {
    EXPECT_TRUE(engine_->CopyOrderedChunk(slow.get(), 0, Direction::kDeviceToHost, *r, 0,
                                          host.data(), 4096)
                    .ok());
  });
  EXPECT_TRUE(Eventually([&] { return !reported("slow").empty(); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the gate is asked again
  EXPECT_EQ(reported("slow"), std::vector<bool>{true});
  fake_.SetIpcEventPending(ev, false);
  copier.join();
  EXPECT_EQ(reported("slow"), (std::vector<bool>{true, false}));
  // A wait that ends because the session ended is reported over too.
  fake_.SetIpcEventPending(ev, true);
  auto ended = begin("ended", ev);
  std::thread waiter([&] {
    EXPECT_EQ(engine_->CopyOrderedChunk(ended.get(), 0, Direction::kDeviceToHost, *r, 4096,
                                        host.data() + 4096, 4096)
                  .code(),
              absl::StatusCode::kCancelled);
  });
  EXPECT_TRUE(Eventually([&] { return !reported("ended").empty(); }));
  cancelled = true;
  waiter.join();
  EXPECT_EQ(reported("ended"), (std::vector<bool>{true, false}));
  EXPECT_EQ(fake_.count("MemcpyAsync"), 2);
}

TEST_F(CudaEngineTest, CopiesInFlightDrainBeforeTheHandleCloses) {
  std::string h = Alloc(0, 1 << 16);
  auto session_ref = Open(h, 1 << 16);
  EXPECT_TRUE(Eventually([&] { return fake_.open_mappings() == 0; }));  // the check's close
  std::shared_ptr<Region> copy_ref = session_ref;  // what a queued transfer holds
  fake_.HoldCompletions(true);
  std::vector<uint8_t> host(1 << 16);
  absl::Status copy_status = absl::UnknownError("not run");
  std::thread copier([&] {
    copy_status = engine_->CopyChunk(Direction::kDeviceToHost, *copy_ref, 0, host.data(),
                                     host.size());
    copy_ref.reset();  // the transfer finishes and lets go
  });
  fake_.WaitForMemcpys(1);
  session_ref.reset();  // the client crashed: the session drops its registration
  const int closes = fake_.count("IpcCloseMemHandle");  // the registration's check
  EXPECT_EQ(fake_.open_mappings(), 1);
  fake_.HoldCompletions(false);
  copier.join();
  EXPECT_TRUE(copy_status.ok()) << copy_status;
  EXPECT_EQ(std::memcmp(host.data(), fake_.allocation_data(h), host.size()), 0);
  EXPECT_TRUE(Eventually([&] { return fake_.open_mappings() == 0; }));
  EXPECT_EQ(fake_.count("IpcCloseMemHandle"), closes + 1);
  // The last close came after the copy was issued.
  auto names = fake_.call_names();
  auto copy_at = std::find(names.begin(), names.end(), "MemcpyAsync");
  auto close_at = std::find(names.rbegin(), names.rend(), "IpcCloseMemHandle");
  EXPECT_LT(copy_at - names.begin(), names.rend() - close_at - 1);
}

TEST_F(CudaEngineTest, CudaErrorsBecomeFailedPreconditionWithTheCallAndAHint) {
  std::string h = Alloc(0, 4096);
  fake_.FailNext("IpcOpenMemHandle",
                 absl::FailedPreconditionError(
                     "cudaIpcOpenMemHandle: cudaErrorInvalidResourceHandle (400): invalid"));
  absl::Status st = OpenStatus(h, 4096, kUuid0);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("cudaIpcOpenMemHandle"), std::string::npos) << st;
  EXPECT_NE(st.message().find("expandable_segments"), std::string::npos) << st;
  EXPECT_EQ(fake_.open_mappings(), 0);

  auto r = Open(h, 4096);
  std::vector<uint8_t> host(64);
  fake_.FailNext("MemcpyAsync", absl::FailedPreconditionError("cudaMemcpyAsync: boom (700)"));
  st = engine_->CopyChunk(Direction::kDeviceToHost, *r, 64, host.data(), 64);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("d2h copy of 64 bytes at offset 64"), std::string::npos) << st;
  fake_.FailNext("EventQuery", absl::FailedPreconditionError("cudaEventQuery: illegal (700)"));
  st = engine_->CopyChunk(Direction::kDeviceToHost, *r, 64, host.data(), 64);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  // And the engine keeps working afterwards.
  EXPECT_TRUE(engine_->CopyChunk(Direction::kDeviceToHost, *r, 64, host.data(), 64).ok());
}

TEST_F(CudaEngineTest, NoDriverIsAFailedPreconditionThatNamesTheShmBackend) {
  fake_.FailNext("ListDevices", absl::FailedPreconditionError(
                                    "cudaGetDeviceCount: cudaErrorInsufficientDriver (35)"));
  absl::Status st = OpenStatus(Alloc(0, 64), 64, kUuid0);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("(35)"), std::string::npos) << st;
  EXPECT_NE(st.message().find("shm"), std::string::npos) << st;
  EXPECT_EQ(fake_.contexts_created(), 0);
}

TEST_F(CudaEngineTest, ShutdownClosesHandlesStreamsAndLeavesRegionsInert) {
  std::string h = Alloc(0, 4096);
  auto r = Open(h, 4096);
  auto t = Begin(*r, Direction::kDeviceToHost, 64, fake_.AddIpcEvent(0));
  std::vector<uint8_t> host(64);
  ASSERT_TRUE(
      engine_->CopyOrderedChunk(t.get(), 0, Direction::kDeviceToHost, *r, 0, host.data(), 64)
          .ok());
  EXPECT_GT(fake_.live_streams(), 0);
  EXPECT_EQ(fake_.open_mappings(), 1);  // the transfer still holds it
  const int closes = fake_.count("IpcCloseMemHandle");
  engine_.reset();
  EXPECT_EQ(fake_.open_mappings(), 0);
  EXPECT_EQ(fake_.live_streams(), 0);
  t.reset();  // a transfer and a region outliving the engine are inert
  r.reset();
  EXPECT_EQ(fake_.count("IpcCloseMemHandle"), closes + 1);
}

TEST_F(CudaEngineTest, HostPoolIsRegisteredInChunksInTheBackgroundAndUnregistered) {
  engine_ = std::make_unique<CudaCopyEngine>(fake_.Borrow(), Options(1, false, 64, 1 << 20));
  std::vector<uint8_t> pool((11 << 20) / 2);  // 5.5 MiB -> 6 chunks
  ASSERT_TRUE(engine_->PrepareHostPool(pool.data(), pool.size()).ok());
  // Pinning needs a context: it waits for the first GPU a session uses (no context on GPU 0
  // just to pin).
  EXPECT_EQ(engine_->WaitHostPoolReady().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fake_.contexts_created(), 0);
  auto r = Open(Alloc(1, 64), 64, kUuid1);
  ASSERT_TRUE(engine_->WaitHostPoolReady().ok());
  EXPECT_EQ(fake_.count("HostRegister"), 6);
  EXPECT_EQ(fake_.registered_host_bytes(), pool.size());
  CudaEngineStats st = engine_->stats();
  EXPECT_TRUE(st.host_pool_ready);
  EXPECT_EQ(st.host_registered_bytes, pool.size());
  EXPECT_EQ(engine_->PrepareHostPool(pool.data(), pool.size()).code(),
            absl::StatusCode::kFailedPrecondition);
  for (auto& c : CallsOf("HostRegister")) EXPECT_EQ(c.current_device, 1);
  EXPECT_EQ(fake_.contexts_created(), 1);
  engine_.reset();
  EXPECT_EQ(fake_.registered_host_bytes(), 0u);
  EXPECT_EQ(fake_.count("HostUnregister"), 6);
}

TEST_F(CudaEngineTest, AChunkAcrossTwoPinnedPiecesIsCopiedPieceByPiece) {
  // 4 KiB pieces (the option's floor): a 6000-byte chunk at pool offset 3000 spans pieces 0,
  // 1 and 2, and one cudaMemcpyAsync over them is refused by the driver (and the fake).
  engine_ = std::make_unique<CudaCopyEngine>(fake_.Borrow(), Options(1, false, 64, 4096));
  std::vector<uint8_t> pool(4 * 4096);
  ASSERT_TRUE(engine_->PrepareHostPool(pool.data(), pool.size()).ok());
  std::string h = Alloc(1, 16384);
  auto r = Open(h, 16384, kUuid1);
  ASSERT_TRUE(engine_->WaitHostPoolReady().ok());
  ASSERT_EQ(fake_.count("HostRegister"), 4);
  const int before = fake_.count("MemcpyAsync");
  ASSERT_TRUE(engine_->CopyChunk(Direction::kDeviceToHost, *r, 100, pool.data() + 3000, 6000).ok());
  EXPECT_EQ(std::memcmp(pool.data() + 3000, fake_.allocation_data(h) + 100, 6000), 0);
  EXPECT_EQ(fake_.count("MemcpyAsync") - before, 3);  // 1096 bytes, 4096, then 808
  for (size_t i = 0; i < 6000; ++i) pool[3000 + i] = static_cast<uint8_t>(i % 253);
  ASSERT_TRUE(engine_->CopyChunk(Direction::kHostToDevice, *r, 9000, pool.data() + 3000, 6000).ok());
  EXPECT_EQ(std::memcmp(fake_.allocation_data(h) + 9000, pool.data() + 3000, 6000), 0);
  // A chunk inside one piece is one copy; host memory outside the pool is never split.
  ASSERT_TRUE(engine_->CopyChunk(Direction::kDeviceToHost, *r, 0, pool.data() + 4096, 4096).ok());
  std::vector<uint8_t> outside(6000);
  ASSERT_TRUE(engine_->CopyChunk(Direction::kDeviceToHost, *r, 0, outside.data(), 6000).ok());
  EXPECT_EQ(fake_.count("MemcpyAsync") - before, 8);
  EXPECT_EQ(fake_.split_registration_copies(), 0);
}

// A chunk across two pieces whose second cudaMemcpyAsync fails has put its first one on the
// stream: it fails only once that copy ran, holding its mapping (and the pool range it writes,
// which its failure hands back) until then.
TEST_F(CudaEngineTest, AChunkWhoseLaterPieceFailsEndsOnlyAfterItsEarlierPiecesRan) {
  engine_ = std::make_unique<CudaCopyEngine>(fake_.Borrow(), Options(1, true, 64, 4096));
  std::vector<uint8_t> pool(4 * 4096);
  ASSERT_TRUE(engine_->PrepareHostPool(pool.data(), pool.size()).ok());
  auto r = Open(Alloc(0, 16384), 16384);
  ASSERT_TRUE(engine_->WaitHostPoolReady().ok());
  EXPECT_TRUE(Eventually([&] { return fake_.open_mappings() == 0; }));
  fake_.HoldCompletions(true);
  fake_.FailNext("MemcpyAsync", absl::FailedPreconditionError("cudaMemcpyAsync: boom (1)"), 1);
  std::promise<absl::Status> got;
  std::future<absl::Status> f = got.get_future();
  engine_->PostChunk(Direction::kDeviceToHost, *r, 0, pool.data() + 3000, 2000,
                     ChunkUrgency::kNormal, [&](absl::Status st) { got.set_value(st); });
  fake_.WaitForMemcpys(1);  // 1096 bytes on the stream; the 904 after the boundary refused
  EXPECT_EQ(f.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  EXPECT_EQ(fake_.open_mappings(), 1);
  fake_.HoldCompletions(false);
  absl::Status st = f.get();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("boom"), std::string::npos) << st;
  EXPECT_TRUE(Eventually([&] { return fake_.open_mappings() == 0; }));
  EXPECT_EQ(engine_->stats().chunks_total, 0u);
  // The engine keeps working.
  ASSERT_TRUE(engine_->CopyChunk(Direction::kDeviceToHost, *r, 0, pool.data() + 3000, 2000).ok());
}

TEST_F(CudaEngineTest, HostPoolRegistrationFailureIsReportedWithAHint) {
  fake_.FailNext("HostRegister", absl::FailedPreconditionError("cudaHostRegister: oom (2)"));
  std::vector<uint8_t> pool(1 << 16);
  auto r = Open(Alloc(0, 64), 64);
  ASSERT_TRUE(engine_->PrepareHostPool(pool.data(), pool.size()).ok());
  absl::Status st = engine_->WaitHostPoolReady();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("RLIMIT_MEMLOCK"), std::string::npos) << st;
  EXPECT_FALSE(engine_->stats().host_pool_error.empty());
}

class TwoStreamEngineTest : public CudaEngineTest {
 protected:
  TwoStreamEngineTest() : CudaEngineTest(Options(2, false, 2)) {}
};

TEST_F(TwoStreamEngineTest, ATransferKeepsOneStreamTransfersAlternateAndEventsAreEvictedLru) {
  auto r = Open(Alloc(0, 4096), 4096);
  std::vector<uint8_t> host(64);
  auto copy = [&](TransferOrder* t, uint64_t at) {
    ASSERT_TRUE(
        engine_->CopyOrderedChunk(t, at, Direction::kDeviceToHost, *r, 0, host.data(), 16).ok());
  };
  auto t1 = Begin(*r, Direction::kDeviceToHost, 32), t2 = Begin(*r, Direction::kDeviceToHost, 32);
  copy(t1.get(), 0);
  copy(t2.get(), 0);
  copy(t1.get(), 16);
  copy(t2.get(), 16);
  auto c = CallsOf("MemcpyAsync");
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(StreamOf(c[0].detail), StreamOf(c[2].detail));  // t1's chunks on one stream
  EXPECT_EQ(StreamOf(c[1].detail), StreamOf(c[3].detail));
  EXPECT_NE(StreamOf(c[0].detail), StreamOf(c[1].detail));  // the two transfers alternate
  // Two opened client events are kept (max_cached_events 2); a third evicts the oldest.
  std::string e1 = fake_.AddIpcEvent(0), e2 = fake_.AddIpcEvent(0), e3 = fake_.AddIpcEvent(0);
  for (const std::string* e : {&e1, &e2, &e1, &e3, &e1, &e2}) {
    auto t = Begin(*r, Direction::kDeviceToHost, 16, *e);
    copy(t.get(), 0);
  }
  EXPECT_EQ(fake_.count("IpcOpenEventHandle"), 4);  // e1, e2, e3, then e2 again
}

// A CUDA IPC handle in use for one uid is refused to another uid's sessions: a memory handle
// while the first uid has a registration of it, an event handle while it is opened for the first
// uid's transfers. Unknown uids (-1) are not compared.
TEST_F(CudaEngineTest, HandlesInUseForOneUidAreRefusedToAnother) {
  std::string h = Alloc(0, 4096);
  auto open_as = [&](int64_t uid) {
    RegionSpec spec;
    spec.cuda_ipc_handle = h;
    spec.size_bytes = 4096;
    spec.device_id = kUuid0;
    spec.owner_uid = uid;
    return engine_->OpenRegion(spec);
  };
  auto a = open_as(1000);
  ASSERT_TRUE(a.ok()) << a.status();
  auto a2 = open_as(1000);  // the same uid again: fine
  ASSERT_TRUE(a2.ok()) << a2.status();
  auto b = open_as(2000);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kPermissionDenied) << b.status();
  EXPECT_NE(b.status().message().find("uid 1000"), std::string::npos) << b.status();
  EXPECT_TRUE(open_as(-1).ok());
  a->reset();
  a2->reset();
  EXPECT_TRUE(Eventually([&] { return open_as(2000).ok(); }));  // its registrations are gone

  auto r = Open(Alloc(0, 4096), 4096);
  std::vector<uint8_t> host(4096);
  std::string e = fake_.AddIpcEvent(0);
  auto copy_as = [&](uint64_t session, int64_t uid) {
    TransferSpec spec;
    spec.direction = Direction::kDeviceToHost;
    spec.bytes = 16;
    spec.ready_event = e;
    spec.owner_id = session;
    spec.owner_uid = uid;
    auto t = engine_->BeginTransfer(*r, std::move(spec));
    EXPECT_TRUE(t.ok()) << t.status();
    return engine_->CopyOrderedChunk(t->get(), 0, Direction::kDeviceToHost, *r, 0, host.data(),
                                     16);
  };
  EXPECT_TRUE(copy_as(1, 1000).ok());
  absl::Status other = copy_as(2, 2000);
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied) << other;
  EXPECT_TRUE(copy_as(3, 1000).ok());
  engine_->ReleaseOwner(1);
  engine_->ReleaseOwner(3);
  EXPECT_TRUE(copy_as(4, 2000).ok());  // no longer opened for uid 1000
}

// A cached client event stays while a session that used it lives, and goes (destroyed on the
// mapper) when the last of them ends, without waiting for the cache to fill.
TEST_F(CudaEngineTest, CachedEventsGoWithTheLastSessionThatUsedThem) {
  std::string h = Alloc(0, 4096);
  auto r = Open(h, 4096);
  std::vector<uint8_t> host(4096);
  std::string e1 = fake_.AddIpcEvent(0), e2 = fake_.AddIpcEvent(0);
  auto run = [&](const std::string& e, uint64_t owner) {
    auto t = Begin(*r, Direction::kDeviceToHost, 16, e, "", nullptr, owner);
    ASSERT_TRUE(engine_->CopyOrderedChunk(t.get(), 0, Direction::kDeviceToHost, *r, 0,
                                          host.data(), 16)
                    .ok());
  };
  run(e1, 1);
  run(e1, 2);
  run(e2, 2);
  run(e2, 0);  // (a transfer of no session adds no owner)
  EXPECT_EQ(engine_->cached_events(), 2u);
  const int destroyed = fake_.count("DestroyEvent");
  engine_->ReleaseOwner(1);
  EXPECT_EQ(engine_->cached_events(), 2u);  // session 2 still uses e1
  engine_->ReleaseOwner(2);
  EXPECT_EQ(engine_->cached_events(), 0u);
  EXPECT_TRUE(Eventually([&] { return fake_.count("DestroyEvent") == destroyed + 2; }));
  run(e1, 3);  // opened again when used again
  EXPECT_EQ(fake_.count("IpcOpenEventHandle"), 3);
}

class AsyncEngineTest : public CudaEngineTest {
 protected:
  // No assumed rate: until it learns one the worker keeps two copies issued, which these tests
  // hold and count.
  AsyncEngineTest() : CudaEngineTest(Options(1, true)) {}
};

// PostChunk returns once the copy is queued; its callback runs once, on the device
// thread, when the copy's event completes; several chunks are in flight from one caller (before
// the worker has learned a copy rate it keeps two issued to CUDA, the rest queued).
TEST_F(AsyncEngineTest, PostedChunksCompleteThroughEventsWithoutBlockingTheCaller) {
  ASSERT_TRUE(engine_->asynchronous());
  std::string h = Alloc(0, 3 * 4096);
  auto r = Open(h, 3 * 4096);
  std::vector<uint8_t> host(3 * 4096);
  std::mutex mu;
  std::vector<absl::Status> results(3, absl::UnknownError("not called"));
  std::vector<int> calls(3, 0);
  std::set<std::thread::id> threads;
  fake_.HoldCompletions(true);
  for (int i = 0; i < 3; ++i) {
    engine_->PostChunk(Direction::kDeviceToHost, *r, i * 4096, host.data() + i * 4096, 4096,
                       ChunkUrgency::kNormal,
                       [&, i](absl::Status st) {
                         std::lock_guard<std::mutex> lock(mu);
                         results[i] = st;
                         ++calls[i];
                         threads.insert(std::this_thread::get_id());
                       });
  }
  fake_.WaitForMemcpys(2);  // two issued although none has completed; all three posted
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(calls, std::vector<int>({0, 0, 0}));
  }
  fake_.HoldCompletions(false);
  for (int spins = 0; spins < 5000; ++spins) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (calls == std::vector<int>({1, 1, 1})) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(calls, std::vector<int>({1, 1, 1}));
  for (const absl::Status& st : results) EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(std::memcmp(host.data(), fake_.allocation_data(h), host.size()), 0);
  ASSERT_EQ(threads.size(), 1u);  // one thread of the device's own: its device thread
  EXPECT_EQ(fake_.threads_for_device(0).count(*threads.begin()), 1u);
  EXPECT_EQ(fake_.wrong_device_calls(), 0);
  EXPECT_EQ(engine_->stats().chunks_total, 3u);
  EXPECT_EQ(fake_.count("EventRecord"), 3);
}

// Chunks wait on the device worker until the copy engine is about to need them; an
// urgent chunk posted after others goes to CUDA before them (never before a copy issued).
TEST_F(AsyncEngineTest, AnUrgentChunkIsIssuedAheadOfChunksQueuedBeforeIt) {
  std::string h = Alloc(0, 4 * 4096);
  auto r = Open(h, 4 * 4096);
  std::vector<uint8_t> host(4 * 4096);
  std::atomic<int> done{0};
  fake_.HoldCompletions(true);
  auto post = [&](int i, uint64_t bytes, ChunkUrgency urgency) {
    engine_->PostChunk(Direction::kHostToDevice, *r, i * 4096, host.data() + i * 4096, bytes,
                       urgency, [&](absl::Status st) {
                         EXPECT_TRUE(st.ok()) << st;
                         ++done;
                       });
  };
  auto wait_queued = [&](uint64_t n) {  // on the worker, not issued
    for (;;) {
      const CudaEngineStats st = engine_->stats();
      if (st.devices.size() == 1 && st.devices[0].queued_chunks[1] == n) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  for (int i = 0; i < 3; ++i) post(i, 4096, ChunkUrgency::kNormal);
  fake_.WaitForMemcpys(2);  // no copy rate learned yet: two issued, the third waits
  wait_queued(1);
  post(3, 1000, ChunkUrgency::kUrgent);
  wait_queued(2);
  fake_.HoldCompletions(false);
  while (done.load() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::vector<std::string> sizes;
  for (const FakeCudaApi::Call& c : fake_.calls()) {
    if (c.name == "MemcpyAsync") sizes.push_back(c.detail);
  }
  ASSERT_EQ(sizes.size(), 4u);
  EXPECT_NE(sizes[2].find("1000"), std::string::npos) << sizes[2];  // the urgent one
  EXPECT_NE(sizes[3].find("4096"), std::string::npos) << sizes[3];
}

TEST_F(AsyncEngineTest, APostedChunkOutsideTheRegionFailsInlineWithoutACopy) {
  auto r = Open(Alloc(0, 4096), 4096);
  std::vector<uint8_t> host(8192);
  absl::Status got = absl::UnknownError("not called");
  engine_->PostChunk(Direction::kHostToDevice, *r, 4000, host.data(), 200, ChunkUrgency::kNormal,
                     [&](absl::Status st) { got = st; });
  EXPECT_EQ(got.code(), absl::StatusCode::kOutOfRange) << got;
  EXPECT_EQ(fake_.count("MemcpyAsync"), 0);
  // A CUDA error comes back through the callback, annotated with the GPU and the chunk.
  fake_.FailNext("MemcpyAsync", absl::FailedPreconditionError("cudaMemcpyAsync: boom"));
  std::promise<absl::Status> failed;
  engine_->PostChunk(Direction::kHostToDevice, *r, 0, host.data(), 100, ChunkUrgency::kNormal,
                     [&](absl::Status st) { failed.set_value(st); });
  absl::Status st = failed.get_future().get();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find(kUuid0), std::string::npos) << st;
  EXPECT_NE(st.message().find("h2d copy of 100 bytes at offset 0"), std::string::npos) << st;
}

TEST(UuidTest, NormalizesCaseAndPrefix) {
  EXPECT_EQ(NormalizeGpuUuid("GPU-ABCDEF01-2345-6789-abcd-ef0123456789"),
            "GPU-abcdef01-2345-6789-abcd-ef0123456789");
  EXPECT_EQ(NormalizeGpuUuid(" abcdef01-2345-6789-ABCD-ef0123456789 "),
            "GPU-abcdef01-2345-6789-abcd-ef0123456789");
  const unsigned char raw[16] = {0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89,
                                 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89};
  EXPECT_EQ(FormatGpuUuid(raw), "GPU-abcdef01-2345-6789-abcd-ef0123456789");
}

TEST(PciNumaNodeTest, ReadsSysfsAndReportsUnknownAsMinusOne) {
  char tmpl[] = "/tmp/offloadd-numa-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string root = tmpl;
  std::string dir = root + "/bus/pci/devices/0000:1b:00.0";
  ASSERT_EQ(std::system(("mkdir -p '" + dir + "'").c_str()), 0);
  std::ofstream(dir + "/numa_node") << "1\n";
  EXPECT_EQ(PciNumaNode("0000:1b:00.0", root), 1);
  EXPECT_EQ(PciNumaNode("0000:99:00.0", root), -1);
  EXPECT_EQ(std::system(("rm -rf '" + root + "'").c_str()), 0);
}

}  // namespace
}  // namespace offloadd::copy
