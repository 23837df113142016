#include "server/copy/cuda_engine.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/copy/cuda_api_fake.h"

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

TEST_F(CudaEngineTest, ThousandCopiesOnOneRegionOpenTheHandleOnce) {
  const uint64_t size = 1 << 20;
  std::string h = Alloc(0, size);
  auto region = Open(h, size);
  ASSERT_NE(region, nullptr);
  std::vector<uint8_t> host(1024);
  const uint8_t* dev = fake_.allocation_data(h);
  for (int i = 0; i < 1000; ++i) {
    uint64_t off = (static_cast<uint64_t>(i) * 1021) % (size - host.size());
    ASSERT_TRUE(engine_->CopyChunk(Direction::kDeviceToHost, *region, off, host.data(),
                                   host.size())
                    .ok());
    ASSERT_EQ(std::memcmp(host.data(), dev + off, host.size()), 0) << "copy " << i;
  }
  EXPECT_EQ(fake_.count("IpcOpenMemHandle"), 1);
  EXPECT_EQ(fake_.count("MemcpyAsync"), 1000);
  CudaEngineStats st = engine_->stats();
  EXPECT_EQ(st.mem_handle_opens_total, 1u);
  EXPECT_EQ(st.chunks_total, 1000u);
  EXPECT_EQ(st.chunk_bytes_total, 1000u * 1024);
  // Completion events are reused, not created per chunk.
  EXPECT_LE(fake_.count("CreateEvent"), 2);
}

TEST_F(CudaEngineTest, RegistrationsShareOneOpenAndTheLastOneCloses) {
  std::string h = Alloc(0, 4096);
  auto a = Open(h, 4096);
  auto b = Open(h, 1024);  // a second registration (e.g. another session) of the same handle
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(fake_.count("IpcOpenMemHandle"), 1);
  EXPECT_EQ(b->size_bytes(), 1024u);
  a.reset();
  EXPECT_EQ(fake_.count("IpcCloseMemHandle"), 0);
  EXPECT_EQ(fake_.open_mappings(), 1);
  b.reset();
  EXPECT_EQ(fake_.count("IpcCloseMemHandle"), 1);
  EXPECT_EQ(fake_.open_mappings(), 0);
  EXPECT_EQ(engine_->stats().mem_handles_open, 0u);
  // Registering again opens again.
  auto c = Open(h, 4096);
  EXPECT_EQ(fake_.count("IpcOpenMemHandle"), 2);
}

TEST_F(CudaEngineTest, CacheIsKeyedByHandleBytesNotByAddress) {
  std::string h1 = Alloc(0, 4096), h2 = Alloc(0, 4096);
  auto a = Open(h1, 4096);
  auto b = Open(h2, 4096);
  EXPECT_EQ(fake_.count("IpcOpenMemHandle"), 2);
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
  EXPECT_EQ(fake_.open_mappings(), 0);
  // With a registration holding the mapping, a bad second one does not close it.
  auto ok = Open(h, 4096);
  EXPECT_EQ(OpenStatus(h, 8192, kUuid0).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(fake_.open_mappings(), 1);
  std::vector<uint8_t> host(16);
  EXPECT_TRUE(engine_->CopyChunk(Direction::kDeviceToHost, *ok, 0, host.data(), 16).ok());
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
  auto t0 = fake_.threads_for_device(0), t1 = fake_.threads_for_device(1);
  ASSERT_EQ(t0.size(), 1u);
  ASSERT_EQ(t1.size(), 1u);
  EXPECT_NE(*t0.begin(), *t1.begin());
  EXPECT_EQ(caller_ids.count(*t0.begin()), 0u);
  EXPECT_EQ(fake_.count("MemcpyAsync"), 200);
}

TEST_F(CudaEngineTest, OffloadWaitsOnTheClientEventBeforeCopyingAndCachesIt) {
  std::string h = Alloc(0, 4096);
  std::string ev = fake_.AddIpcEvent(0);
  auto r = Open(h, 4096);
  std::vector<uint8_t> host(4096);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(engine_->WaitReady(*r, ev).ok());
    ASSERT_TRUE(engine_->CopyChunk(Direction::kDeviceToHost, *r, 0, host.data(), 4096).ok());
  }
  EXPECT_EQ(fake_.count("IpcOpenEventHandle"), 1);
  std::vector<std::string> seq;
  for (auto& c : fake_.calls()) {
    if (c.name == "StreamWaitEvent" || c.name == "MemcpyAsync") seq.push_back(c.name);
  }
  EXPECT_EQ(seq, (std::vector<std::string>{"StreamWaitEvent", "MemcpyAsync", "StreamWaitEvent",
                                           "MemcpyAsync", "StreamWaitEvent", "MemcpyAsync"}));
  // The wait is on the stream the D2H copy then uses.
  std::string wait_stream = StreamOf(CallsOf("StreamWaitEvent")[0].detail);
  std::string copy_stream = StreamOf(CallsOf("MemcpyAsync")[0].detail);
  EXPECT_EQ(wait_stream, copy_stream);
  // An H2D copy uses another stream, so the directions overlap.
  ASSERT_TRUE(engine_->CopyChunk(Direction::kHostToDevice, *r, 0, host.data(), 16).ok());
  auto copies = CallsOf("MemcpyAsync");
  EXPECT_NE(StreamOf(copies.back().detail), copy_stream);
  EXPECT_NE(copies.back().detail.find("h2d"), std::string::npos);
  // An empty event means no wait.
  EXPECT_TRUE(engine_->WaitReady(*r, "").ok());
  EXPECT_EQ(fake_.count("StreamWaitEvent"), 3);
}

TEST_F(CudaEngineTest, ReloadRecordsTheDoneEventOnTheH2DStreamAfterTheCopy) {
  std::string h = Alloc(0, 4096);
  std::string ev = fake_.AddIpcEvent(0);
  auto r = Open(h, 4096);
  std::vector<uint8_t> host(4096, 9);
  ASSERT_TRUE(engine_->CopyChunk(Direction::kHostToDevice, *r, 0, host.data(), 4096).ok());
  ASSERT_TRUE(engine_->SignalDone(*r, ev).ok());
  auto calls = fake_.calls();
  ASSERT_GE(calls.size(), 2u);
  const auto& last = calls.back();
  EXPECT_EQ(last.name, "EventRecord");
  EXPECT_EQ(StreamOf(last.detail), StreamOf(CallsOf("MemcpyAsync").back().detail));
  EXPECT_EQ(fake_.count("IpcOpenEventHandle"), 1);
  EXPECT_EQ(engine_->SignalDone(*r, "short").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaEngineTest, AnUnknownEventIsAFailedPreconditionNamingTheGpu) {
  auto r = Open(Alloc(0, 4096), 4096);
  absl::Status st = engine_->WaitReady(*r, std::string(kIpcHandleBytes, 'z'));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find(kUuid0), std::string::npos) << st;
  EXPECT_NE(st.message().find("cudaEventInterprocess"), std::string::npos) << st;
}

TEST_F(CudaEngineTest, CopiesInFlightDrainBeforeTheHandleCloses) {
  std::string h = Alloc(0, 1 << 16);
  auto session_ref = Open(h, 1 << 16);
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
  EXPECT_EQ(fake_.count("IpcCloseMemHandle"), 0);
  EXPECT_EQ(fake_.open_mappings(), 1);
  fake_.HoldCompletions(false);
  copier.join();
  EXPECT_TRUE(copy_status.ok()) << copy_status;
  EXPECT_EQ(std::memcmp(host.data(), fake_.allocation_data(h), host.size()), 0);
  EXPECT_EQ(fake_.count("IpcCloseMemHandle"), 1);
  EXPECT_EQ(fake_.open_mappings(), 0);
  // The close came after the copy was issued.
  auto names = fake_.call_names();
  auto copy_at = std::find(names.begin(), names.end(), "MemcpyAsync");
  auto close_at = std::find(names.begin(), names.end(), "IpcCloseMemHandle");
  EXPECT_LT(copy_at - names.begin(), close_at - names.begin());
}

TEST_F(CudaEngineTest, OpenedEventsCloseWithTheirMapping) {
  std::string h = Alloc(0, 4096);
  auto r = Open(h, 4096);
  ASSERT_TRUE(engine_->WaitReady(*r, fake_.AddIpcEvent(0)).ok());
  ASSERT_TRUE(engine_->WaitReady(*r, fake_.AddIpcEvent(0)).ok());
  int events_before = fake_.live_events();
  r.reset();
  EXPECT_EQ(fake_.live_events(), events_before - 2);
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
  ASSERT_TRUE(engine_->WaitReady(*r, fake_.AddIpcEvent(0)).ok());
  std::vector<uint8_t> host(64);
  ASSERT_TRUE(engine_->CopyChunk(Direction::kDeviceToHost, *r, 0, host.data(), 64).ok());
  EXPECT_GT(fake_.live_streams(), 0);
  engine_.reset();
  EXPECT_EQ(fake_.open_mappings(), 0);
  EXPECT_EQ(fake_.live_streams(), 0);
  EXPECT_EQ(fake_.live_events(), 0);
  r.reset();  // a region outliving the engine is inert
  EXPECT_EQ(fake_.count("IpcCloseMemHandle"), 1);
}

TEST_F(CudaEngineTest, HostPoolIsRegisteredInChunksInTheBackgroundAndUnregistered) {
  engine_ = std::make_unique<CudaCopyEngine>(fake_.Borrow(),
                                             CudaEngineOptions{1, 1 << 20, 64});
  std::vector<uint8_t> pool((11 << 20) / 2);  // 5.5 MiB -> 6 chunks
  ASSERT_TRUE(engine_->PrepareHostPool(pool.data(), pool.size()).ok());
  ASSERT_TRUE(engine_->WaitHostPoolReady().ok());
  EXPECT_EQ(fake_.count("HostRegister"), 6);
  EXPECT_EQ(fake_.registered_host_bytes(), pool.size());
  CudaEngineStats st = engine_->stats();
  EXPECT_TRUE(st.host_pool_ready);
  EXPECT_EQ(st.host_registered_bytes, pool.size());
  EXPECT_EQ(engine_->PrepareHostPool(pool.data(), pool.size()).code(),
            absl::StatusCode::kFailedPrecondition);
  for (auto& c : CallsOf("HostRegister")) EXPECT_GE(c.current_device, 0);
  engine_.reset();
  EXPECT_EQ(fake_.registered_host_bytes(), 0u);
  EXPECT_EQ(fake_.count("HostUnregister"), 6);
}

TEST_F(CudaEngineTest, HostPoolRegistrationFailureIsReportedWithAHint) {
  fake_.FailNext("HostRegister", absl::FailedPreconditionError("cudaHostRegister: oom (2)"));
  std::vector<uint8_t> pool(1 << 16);
  ASSERT_TRUE(engine_->PrepareHostPool(pool.data(), pool.size()).ok());
  absl::Status st = engine_->WaitHostPoolReady();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("RLIMIT_MEMLOCK"), std::string::npos) << st;
  EXPECT_FALSE(engine_->stats().host_pool_error.empty());
}

class TwoStreamEngineTest : public CudaEngineTest {
 protected:
  TwoStreamEngineTest() : CudaEngineTest(CudaEngineOptions{2, 64ull << 30, 2}) {}
};

TEST_F(TwoStreamEngineTest, WaitReadyCoversEveryD2HStreamAndEventsAreEvictedLru) {
  auto r = Open(Alloc(0, 4096), 4096);
  std::string e1 = fake_.AddIpcEvent(0), e2 = fake_.AddIpcEvent(0), e3 = fake_.AddIpcEvent(0);
  ASSERT_TRUE(engine_->WaitReady(*r, e1).ok());
  EXPECT_EQ(fake_.count("StreamWaitEvent"), 2);
  ASSERT_TRUE(engine_->WaitReady(*r, e2).ok());
  ASSERT_TRUE(engine_->WaitReady(*r, e1).ok());  // cached, now most recent
  ASSERT_TRUE(engine_->WaitReady(*r, e3).ok());  // evicts e2
  EXPECT_EQ(fake_.count("IpcOpenEventHandle"), 3);
  ASSERT_TRUE(engine_->WaitReady(*r, e1).ok());
  EXPECT_EQ(fake_.count("IpcOpenEventHandle"), 3);
  ASSERT_TRUE(engine_->WaitReady(*r, e2).ok());
  EXPECT_EQ(fake_.count("IpcOpenEventHandle"), 4);
  // Copies alternate between the two D2H streams.
  std::vector<uint8_t> host(64);
  ASSERT_TRUE(engine_->CopyChunk(Direction::kDeviceToHost, *r, 0, host.data(), 64).ok());
  ASSERT_TRUE(engine_->CopyChunk(Direction::kDeviceToHost, *r, 0, host.data(), 64).ok());
  auto copies = CallsOf("MemcpyAsync");
  EXPECT_NE(StreamOf(copies[0].detail), StreamOf(copies[1].detail));
}

class AsyncEngineTest : public CudaEngineTest {
 protected:
  // No assumed rate: until it learns one the worker keeps two copies issued, which these tests
  // hold and count.
  AsyncEngineTest() : CudaEngineTest(CudaEngineOptions{1, 64ull << 30, 64, true, 50e-6, 1e-3, 0}) {}
};

// Issue 16: PostChunk returns once the copy is queued; its callback runs once, on the device
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
  EXPECT_EQ(threads, fake_.threads_for_device(0));  // the device thread, only
  EXPECT_EQ(fake_.wrong_device_calls(), 0);
  EXPECT_EQ(engine_->stats().chunks_total, 3u);
  EXPECT_EQ(fake_.count("EventRecord"), 3);
}

// Issue 16: chunks wait on the device worker until the copy engine is about to need them; an
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
