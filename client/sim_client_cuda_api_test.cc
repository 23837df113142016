// The simulated client GPU without a daemon: its allocator and table slots, stream timelines,
// events and pending (daemon-recorded) events, the event-protocol checks, CUDA's last-error
// state, and CudaExporter on it. The "daemon" here is the test writing the table as SimCudaApi
// does (tests/e2e/sim_gpu_test.cc runs a real one). Times are SIMULATED.
#include "client/sim_client_cuda_api.h"

#include <unistd.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>

#include "client/cuda_export.h"
#include "common/sim_gpu_table.h"
#include "gtest/gtest.h"

namespace offloadd::client {
namespace {

using common::SimViolation;
constexpr uint64_t kMiB = 1ull << 20;

int64_t NowNs() { return common::SimNowNanoseconds(); }

class SimClientGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SimClientGpuOptions o;
    o.device_bytes = 64 * kMiB;
    o.event_slots = 64;
    o.segment_slots = 16;
    // Bazel runs tests in PID namespaces that share /dev/shm: a number of our own.
    std::mt19937 rng(std::random_device{}());
    for (int i = 0; i < 8 && gpu_ == nullptr; ++i) {
      o.pid = (1u << 30) | (rng() & 0x3fffffff);
      auto g = SimClientGpu::Create(o);
      if (g.ok()) gpu_ = *g;
    }
    ASSERT_NE(gpu_, nullptr);
  }

  uint64_t Malloc(uint64_t bytes, bool vmm = false) {
    uint64_t p = 0;
    EXPECT_EQ(gpu_->Malloc(&p, bytes, vmm), kSimCudaSuccess);
    return p;
  }
  void* Stream() {
    void* s = nullptr;
    EXPECT_EQ(gpu_->StreamCreate(&s), kSimCudaSuccess);
    return s;
  }
  void* Event() {
    void* e = nullptr;
    EXPECT_EQ(gpu_->EventCreateIpc(&e), kSimCudaSuccess);
    return e;
  }
  uint32_t EventSlot(void* e) {
    std::string h;
    EXPECT_EQ(gpu_->IpcGetEventHandle(e, &h), kSimCudaSuccess);
    common::SimEventRef ref;
    EXPECT_TRUE(common::ParseSimEventHandle(h, &ref));
    EXPECT_EQ(ref.pid, gpu_->pid());
    EXPECT_EQ(ref.instance, gpu_->table().instance());
    return ref.slot;
  }

  std::shared_ptr<SimClientGpu> gpu_;
};

TEST_F(SimClientGpuTest, SegmentsAreTableSlotsWithGenerationsAndFreedSlotsAreReusedLast) {
  const uint64_t a = Malloc(3 * kMiB);  // 4 MiB: 2 MiB granules
  PointerInfo info;
  ASSERT_TRUE(gpu_->PointerGetInfo(a + 12345, &info));
  EXPECT_EQ(info.base, a);
  EXPECT_EQ(info.size_bytes, 4 * kMiB);
  EXPECT_EQ(info.device, 0);
  EXPECT_TRUE(info.legacy_ipc_capable);
  std::string h;
  ASSERT_EQ(gpu_->IpcGetMemHandle(a, &h), kSimCudaSuccess);
  common::SimMemRef ref;
  ASSERT_TRUE(common::ParseSimMemHandle(h, &ref));
  const common::SimSegmentSlot& slot = *gpu_->table().segment(ref.slot);
  EXPECT_EQ(slot.state.load(), static_cast<uint32_t>(common::SimSegmentState::kLive));
  EXPECT_EQ(slot.generation.load(), ref.generation);
  EXPECT_EQ(slot.size, 4 * kMiB);
  EXPECT_EQ(slot.buffer_id, info.buffer_id);
  EXPECT_EQ(gpu_->table().SegmentMemory(slot), gpu_->HostBytes(a));

  // The daemon holds a mapping when the client frees it: counted.
  gpu_->table().segment(ref.slot)->daemon_maps.fetch_add(1);
  EXPECT_EQ(gpu_->Free(a), kSimCudaSuccess);
  EXPECT_EQ(gpu_->violations(SimViolation::kFreedWhileMapped), 1u);
  gpu_->table().segment(ref.slot)->daemon_maps.fetch_sub(1);
  EXPECT_EQ(slot.state.load(), static_cast<uint32_t>(common::SimSegmentState::kFreed));
  EXPECT_FALSE(gpu_->PointerGetInfo(a, &info));

  const uint64_t b = Malloc(kMiB);  // the same memory again, a new slot and buffer id
  EXPECT_EQ(b, a);
  PointerInfo binfo;
  ASSERT_TRUE(gpu_->PointerGetInfo(b, &binfo));
  EXPECT_NE(binfo.buffer_id, info.buffer_id);
  std::string hb;
  ASSERT_EQ(gpu_->IpcGetMemHandle(b, &hb), kSimCudaSuccess);
  common::SimMemRef bref;
  ASSERT_TRUE(common::ParseSimMemHandle(hb, &bref));
  EXPECT_NE(bref.slot, ref.slot);

  uint64_t none = 0;  // 64 MiB device, 2 MiB used
  EXPECT_EQ(gpu_->Malloc(&none, 63 * kMiB), kSimCudaErrorMemoryAllocation);
  EXPECT_EQ(gpu_->GetLastError(), kSimCudaErrorMemoryAllocation);
  EXPECT_NE(Malloc(62 * kMiB), 0u);
}

TEST_F(SimClientGpuTest, EventsCompleteWhenTheStreamsModelledKernelsEnd) {
  void* compute = Stream();
  void* other = Stream();
  void* ev = Event();
  EXPECT_EQ(gpu_->EventQuery(ev), kSimCudaSuccess);  // never recorded
  const int64_t t0 = NowNs();
  ASSERT_EQ(gpu_->LaunchKernel(compute, 0.1), kSimCudaSuccess);
  ASSERT_EQ(gpu_->EventRecord(ev, compute), kSimCudaSuccess);
  EXPECT_GE(gpu_->EventCompleteAtNanoseconds(ev), t0 + 100'000'000);
  EXPECT_EQ(gpu_->EventSeq(ev), 1u);
  EXPECT_EQ(gpu_->EventQuery(ev), kSimCudaErrorNotReady);
  EXPECT_EQ(gpu_->PeekAtLastError(), kSimCudaSuccess);  // not-ready is not an error
  ASSERT_EQ(gpu_->StreamWaitEvent(other, ev), kSimCudaSuccess);
  ASSERT_EQ(gpu_->LaunchKernel(other, 0.01), kSimCudaSuccess);
  EXPECT_GE(gpu_->StreamTailNanoseconds(other), gpu_->EventCompleteAtNanoseconds(ev) + 10'000'000);
  ASSERT_TRUE(gpu_->StreamSynchronize(other).ok());
  EXPECT_GE(NowNs() - t0, 110'000'000);
  EXPECT_EQ(gpu_->EventQuery(ev), kSimCudaSuccess);
}

TEST_F(SimClientGpuTest, AWritesBytesLandAtItsEndAndRecordsBehindItArePendingUntilThen) {
  void* s = Stream();
  void* ev = Event();
  const uint64_t p = Malloc(kMiB);
  const std::string data(4096, 'w');
  const int64_t t0 = NowNs();
  ASSERT_EQ(gpu_->LaunchWrite(s, 0.05, p + 100, data), kSimCudaSuccess);
  ASSERT_EQ(gpu_->EventRecord(ev, s), kSimCudaSuccess);
  EXPECT_EQ(gpu_->EventCompleteAtNanoseconds(ev), common::kSimPending);
  EXPECT_EQ(gpu_->HostBytes(p + 100)[0], 0);  // not yet
  std::string got;
  ASSERT_TRUE(gpu_->ReadOnStream(s, p + 100, data.size(), &got).ok());
  EXPECT_EQ(got, data);
  EXPECT_GE(NowNs() - t0, 50'000'000);
  const int64_t at = gpu_->EventCompleteAtNanoseconds(ev);  // written once the bytes landed
  EXPECT_NE(at, common::kSimPending);
  EXPECT_GE(at, t0 + 50'000'000);
  EXPECT_EQ(gpu_->EventQuery(ev), kSimCudaSuccess);
  EXPECT_EQ(gpu_->LaunchWrite(s, 0, p + 2 * kMiB - 1, "xy"), kSimCudaErrorInvalidValue);  // past the end
  EXPECT_EQ(gpu_->GetLastError(), kSimCudaErrorInvalidValue);
}

// The event protocol's two checks, with the test playing the daemon: it records the done event
// pending (seq + 1), then writes its completion time, as SimCudaApi does.
TEST_F(SimClientGpuTest, WaitingBeforeTheDaemonsRecordOrReadingBeforeItCompletedIsCounted) {
  void* compute = Stream();
  void* other = Stream();
  void* done = Event();
  void* after = Event();
  const uint64_t dst = Malloc(kMiB);
  common::SimEventSlot& slot = *gpu_->table().event(EventSlot(done));
  gpu_->NoteReloadSent(done, dst, kMiB);

  ASSERT_EQ(gpu_->StreamWaitEvent(compute, done), kSimCudaSuccess);  // too early
  EXPECT_EQ(gpu_->violations(SimViolation::kWaitUnrecorded), 1u);
  EXPECT_LE(gpu_->StreamTailNanoseconds(compute), NowNs());  // it ordered nothing

  slot.complete_at_ns.store(common::kSimPending);  // the daemon's record
  slot.seq.fetch_add(1);
  ASSERT_EQ(gpu_->StreamWaitEvent(compute, done), kSimCudaSuccess);
  EXPECT_EQ(gpu_->violations(SimViolation::kWaitUnrecorded), 1u);
  ASSERT_EQ(gpu_->LaunchKernel(compute, 0.02), kSimCudaSuccess);  // queued behind the wait
  ASSERT_EQ(gpu_->EventRecord(after, compute), kSimCudaSuccess);
  EXPECT_EQ(gpu_->EventCompleteAtNanoseconds(after), common::kSimPending);
  std::string got;
  ASSERT_TRUE(gpu_->ReadOnStream(other, dst, 16, &got).ok());  // other never waited
  EXPECT_EQ(gpu_->violations(SimViolation::kConsumedEarly), 1u);
  EXPECT_EQ(gpu_->StreamSynchronize(compute, 0.05).code(), absl::StatusCode::kDeadlineExceeded);

  gpu_->HostBytes(dst)[0] = 7;  // the daemon moves the bytes, then writes the time
  const int64_t copied_at = NowNs();
  slot.complete_at_ns.store(copied_at);
  ASSERT_TRUE(gpu_->ReadOnStream(compute, dst, 16, &got).ok());
  EXPECT_EQ(got[0], 7);
  EXPECT_EQ(gpu_->violations(SimViolation::kConsumedEarly), 1u);
  EXPECT_GE(NowNs(), copied_at + 20'000'000);  // the kernel queued behind the wait ran after it
  for (int i = 0; i < 1000 && gpu_->EventQuery(after) != kSimCudaSuccess; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the resolver thread
  }
  EXPECT_EQ(gpu_->EventCompleteAtNanoseconds(after), copied_at + 20'000'000);
}

TEST_F(SimClientGpuTest, LastErrorStaysUntilReadAndTheClientCudaApiClearsIt) {
  const uint64_t vmm = Malloc(kMiB, /*vmm=*/true);
  PointerInfo info;
  ASSERT_TRUE(gpu_->PointerGetInfo(vmm, &info));
  EXPECT_FALSE(info.legacy_ipc_capable);
  std::string h;
  EXPECT_EQ(gpu_->IpcGetMemHandle(vmm, &h), kSimCudaErrorInvalidValue);  // the raw runtime
  EXPECT_EQ(gpu_->PeekAtLastError(), kSimCudaErrorInvalidValue);
  EXPECT_EQ(gpu_->PeekAtLastError(), kSimCudaErrorInvalidValue);  // peeking keeps it
  std::thread([&] { EXPECT_EQ(gpu_->PeekAtLastError(), kSimCudaSuccess); }).join();  // per thread
  EXPECT_EQ(gpu_->GetLastError(), kSimCudaErrorInvalidValue);
  EXPECT_EQ(gpu_->PeekAtLastError(), kSimCudaSuccess);

  int x = 0;
  EXPECT_FALSE(gpu_->PointerGetInfo(reinterpret_cast<uint64_t>(&x), &info));  // a driver call
  EXPECT_EQ(gpu_->PeekAtLastError(), kSimCudaSuccess);

  auto api = NewSimClientCudaApi(gpu_);
  auto r = api->IpcGetMemHandle(vmm);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("cudaIpcGetMemHandle: cudaErrorInvalidValue (1)"),
            std::string::npos)
      << r.status();
  EXPECT_EQ(gpu_->PeekAtLastError(), kSimCudaSuccess);
  gpu_->InjectFailure("cudaEventRecord", kSimCudaErrorInvalidResourceHandle);
  auto e = api->CreateIpcEvent();
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(api->EventRecord(*e, nullptr).ok());
  EXPECT_EQ(gpu_->PeekAtLastError(), kSimCudaSuccess);
  EXPECT_TRUE(api->EventRecord(*e, nullptr).ok());  // one-shot
  EXPECT_EQ(api->DeviceUuid(1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpu_->PeekAtLastError(), kSimCudaSuccess);
}

TEST_F(SimClientGpuTest, CudaExporterExportsSegmentsAndRefusesVmmMemoryWithoutALastError) {
  CudaExporter exporter(NewSimClientCudaApi(gpu_));
  const uint64_t a = Malloc(8 * kMiB);
  auto x = exporter.Export(a + 4096, kMiB);
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->base, a);
  EXPECT_EQ(x->offset, 4096u);
  EXPECT_EQ(x->allocation_bytes, 8 * kMiB);
  EXPECT_EQ(x->device_uuid, SimDeviceUuid(0));
  common::SimMemRef ref;
  ASSERT_TRUE(common::ParseSimMemHandle(x->ipc_handle, &ref));
  EXPECT_EQ(ref.pid, gpu_->pid());
  ASSERT_TRUE(exporter.Export(a, 8 * kMiB).ok());
  EXPECT_EQ(exporter.stats().handles_created_total, 1u);  // cached per buffer id
  EXPECT_EQ(exporter.Export(a, 8 * kMiB + 1).status().code(), absl::StatusCode::kOutOfRange);

  ASSERT_EQ(gpu_->Free(a), kSimCudaSuccess);  // the same address, a new allocation
  const uint64_t a2 = Malloc(8 * kMiB);
  ASSERT_EQ(a2, a);
  auto y = exporter.Export(a2, kMiB);
  ASSERT_TRUE(y.ok());
  EXPECT_NE(y->ipc_handle, x->ipc_handle);
  EXPECT_EQ(exporter.stats().handles_created_total, 2u);

  const uint64_t vmm = Malloc(kMiB, /*vmm=*/true);
  auto v = exporter.Export(vmm, 4096);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(v.status().message().find("expandable_segments"), std::string::npos) << v.status();
  EXPECT_EQ(gpu_->PeekAtLastError(), kSimCudaSuccess);

  const uint64_t b = Malloc(kMiB);
  gpu_->InjectFailure("cudaIpcGetMemHandle", kSimCudaErrorInvalidValue);
  EXPECT_EQ(exporter.Export(b, 4096).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpu_->PeekAtLastError(), kSimCudaSuccess);
  EXPECT_TRUE(exporter.Export(b, 4096).ok());  // nothing sticky

  auto ev = exporter.AcquireEvent();
  ASSERT_TRUE(ev.ok());
  common::SimEventRef eref;
  ASSERT_TRUE(common::ParseSimEventHandle(ev->handle, &eref));
  EXPECT_EQ(eref.instance, gpu_->table().instance());
  exporter.ReleaseEvent(*ev);
}

}  // namespace
}  // namespace offloadd::client
