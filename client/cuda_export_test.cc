#include "client/cuda_export.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace offloadd::client {
namespace {

// Device memory as a table of allocations; events as counters.
class FakeClientCudaApi : public ClientCudaApi {
 public:
  struct Alloc {
    uint64_t size;
    uint64_t buffer_id;
    int device;
    bool legacy = true;
  };
  std::map<uint64_t, Alloc> allocs;  // by base
  int current_device = 0;
  int handle_calls = 0, events_created = 0, events_destroyed = 0, records = 0;
  void* last_record_stream = nullptr;

  absl::StatusOr<PointerInfo> Describe(uint64_t ptr) override {
    for (auto& [base, a] : allocs) {
      if (ptr >= base && ptr < base + a.size) {
        return PointerInfo{base, a.size, a.buffer_id, a.device, a.legacy};
      }
    }
    return absl::InvalidArgumentError("not device memory");
  }
  absl::StatusOr<std::string> DeviceUuid(int device) override {
    return "GPU-0000000" + std::to_string(device) + "-0000-0000-0000-000000000000";
  }
  absl::StatusOr<std::string> IpcGetMemHandle(uint64_t base) override {
    ++handle_calls;
    std::string h(kExportHandleBytes, '\0');
    std::string id = std::to_string(base) + "/" + std::to_string(allocs[base].buffer_id);
    h.replace(0, id.size(), id);
    return h;
  }
  absl::StatusOr<int> CurrentDevice() override { return current_device; }
  absl::StatusOr<void*> CreateIpcEvent() override {
    ++events_created;
    return reinterpret_cast<void*>(static_cast<uintptr_t>(0x1000 + events_created));
  }
  absl::StatusOr<std::string> IpcGetEventHandle(void* event) override {
    return std::string(kExportHandleBytes, static_cast<char>(reinterpret_cast<uintptr_t>(event)));
  }
  absl::Status EventRecord(void* event, void* stream) override {
    ++records;
    last_record_stream = stream;
    return absl::OkStatus();
  }
  absl::Status StreamWaitEvent(void*, void*) override { return absl::OkStatus(); }
  void DestroyEvent(void*) override {
    ++events_destroyed;
    if (destroyed_sink != nullptr) ++*destroyed_sink;  // outlives the fake (owned by the exporter)
  }
  int* destroyed_sink = nullptr;
};

class CudaExportTest : public ::testing::Test {
 protected:
  CudaExportTest() {
    auto f = std::make_unique<FakeClientCudaApi>();
    fake_ = f.get();
    fake_->allocs[0x10000] = {1 << 20, 1, 0};
    fake_->allocs[0x200000] = {4096, 2, 1};
    exporter_ = std::make_unique<CudaExporter>(std::move(f));
  }
  FakeClientCudaApi* fake_;
  std::unique_ptr<CudaExporter> exporter_;
};

TEST_F(CudaExportTest, ExportsTheAllocationBaseWithTheOffsetAndCachesTheHandle) {
  auto a = exporter_->Export(0x10000 + 4096, 1000);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->base, 0x10000u);
  EXPECT_EQ(a->offset, 4096u);
  EXPECT_EQ(a->allocation_bytes, 1u << 20);
  EXPECT_EQ(a->ipc_handle.size(), kExportHandleBytes);
  EXPECT_EQ(a->device_uuid, "GPU-00000000-0000-0000-0000-000000000000");
  for (int i = 0; i < 100; ++i) {
    auto b = exporter_->Export(0x10000 + i * 8192, 8192);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->ipc_handle, a->ipc_handle);
  }
  EXPECT_EQ(fake_->handle_calls, 1);
  auto c = exporter_->Export(0x200000, 4096);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->ipc_handle, a->ipc_handle);
  EXPECT_EQ(c->device_uuid, "GPU-00000001-0000-0000-0000-000000000000");
  EXPECT_EQ(exporter_->stats().handles_created_total, 2u);
  EXPECT_EQ(exporter_->stats().exports_total, 102u);
}

TEST_F(CudaExportTest, AReallocatedAddressGetsANewHandle) {
  auto a = exporter_->Export(0x200000, 16);
  fake_->allocs[0x200000].buffer_id = 99;  // freed and allocated again at the same address
  auto b = exporter_->Export(0x200000, 16);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->ipc_handle, b->ipc_handle);
  EXPECT_EQ(fake_->handle_calls, 2);
  EXPECT_EQ(exporter_->ForgetAll(), 2u);
}

TEST_F(CudaExportTest, RejectsVmmMemoryNamingTheAllocatorSetting) {
  fake_->allocs[0x10000].legacy = false;
  auto a = exporter_->Export(0x10000, 16);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(a.status().message().find("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"),
            std::string::npos)
      << a.status();
  EXPECT_EQ(fake_->handle_calls, 0);
}

TEST_F(CudaExportTest, BoundsAndBadPointers) {
  EXPECT_EQ(exporter_->Export(0x200000 + 4000, 97).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(exporter_->Export(0x200000 + 4000, 96).ok());
  EXPECT_EQ(exporter_->Export(0x200000, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(exporter_->Export(0x5, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaExportTest, EventsArePooledPerDeviceAndReusedOnlyAfterRelease) {
  void* stream = reinterpret_cast<void*>(0x77);
  auto e1 = exporter_->RecordReady(stream);
  auto e2 = exporter_->AcquireEvent();
  ASSERT_TRUE(e1.ok() && e2.ok());
  EXPECT_NE(e1->event, e2->event);
  EXPECT_EQ(fake_->records, 1);
  EXPECT_EQ(fake_->last_record_stream, stream);
  EXPECT_EQ(fake_->events_created, 2);
  exporter_->ReleaseEvent(*e1);
  auto e3 = exporter_->AcquireEvent();
  ASSERT_TRUE(e3.ok());
  EXPECT_EQ(e3->event, e1->event);
  EXPECT_EQ(e3->handle, e1->handle);
  EXPECT_EQ(fake_->events_created, 2);
  fake_->current_device = 1;  // another GPU: not served from device 0's pool
  exporter_->ReleaseEvent(*e3);
  auto e4 = exporter_->AcquireEvent();
  ASSERT_TRUE(e4.ok());
  EXPECT_EQ(e4->device, 1);
  EXPECT_EQ(fake_->events_created, 3);
  EXPECT_EQ(exporter_->stats().events_in_use, 2u);  // e2 and e4
  exporter_->ReleaseEvent(*e2);
  exporter_->ReleaseEvent(*e4);
  int destroyed_at_reset = fake_->events_destroyed;
  fake_->destroyed_sink = &destroyed_at_reset;
  exporter_.reset();  // destroys the fake too: read the count through the sink
  fake_ = nullptr;
  EXPECT_EQ(destroyed_at_reset, 3);
}

}  // namespace
}  // namespace offloadd::client
