#include "server/copy/shm/shm_engine.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "client/shm_region.h"
#include "gtest/gtest.h"

namespace offloadd::copy {
namespace {

// The client's side of a region: an shm object created, sized (not reserved), mapped and finally
// unlinked by the C++ client library (client/shm_region.h), as a training process does.
class ShmObject {
 public:
  explicit ShmObject(uint64_t size)
      : region_(client::ShmRegion::Create(size, {0600, /*reserve=*/false}).value()) {}
  const std::string& name() const { return region_.name(); }
  uint8_t* data() { return static_cast<uint8_t*>(region_.data()); }

 private:
  client::ShmRegion region_;
};

TEST(ShmCopyEngineTest, CopiesBothWaysThroughTheMapping) {
  ShmObject obj(1 << 20);
  for (int i = 0; i < (1 << 20); ++i) obj.data()[i] = static_cast<uint8_t>(i * 7 + 3);
  ShmCopyEngine engine;
  auto region = engine.OpenRegion({obj.name(), "", 1 << 20, "gpu0"});
  ASSERT_TRUE(region.ok()) << region.status();
  std::vector<uint8_t> host(4096);
  ASSERT_TRUE(engine.CopyChunk(Direction::kDeviceToHost, **region, 8192, host.data(), 4096).ok());
  EXPECT_EQ(std::memcmp(host.data(), obj.data() + 8192, 4096), 0);
  std::memset(obj.data() + 8192, 0, 4096);
  ASSERT_TRUE(engine.CopyChunk(Direction::kHostToDevice, **region, 8192, host.data(), 4096).ok());
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(obj.data()[8192 + i], static_cast<uint8_t>((8192 + i) * 7 + 3));
  EXPECT_EQ(engine.CopyChunk(Direction::kDeviceToHost, **region, (1 << 20) - 10, host.data(), 11)
                .code(),
            absl::StatusCode::kOutOfRange);
  auto second = engine.OpenRegion({obj.name(), "", 4096, "gpu0"});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(engine.handle_counts()["gpu0"].opens_total, 2u);
  EXPECT_EQ(engine.handle_counts()["gpu0"].open, 2u);
  region->reset();
  second->reset();
  EXPECT_EQ(engine.handle_counts()["gpu0"].open, 0u);
  EXPECT_EQ(engine.handle_counts()["gpu0"].opens_total, 2u);
}

// Regions of transient devices (probes, projector refreshes) leave no series once their last
// handle closes: refreshes naming ever-new device ids grew the handle counts without bound.
// A device a session opened (not transient) keeps its series.
TEST(ShmCopyEngineTest, ATransientDevicesCountsGoWithItsLastHandle) {
  ShmObject obj(1 << 20);
  ShmCopyEngine engine;
  for (int i = 0; i < 50; ++i) {
    RegionSpec spec{obj.name(), "", 4096, "refresh-" + std::to_string(i)};
    spec.transient_device = true;
    auto region = engine.OpenRegion(spec);
    ASSERT_TRUE(region.ok()) << region.status();
    EXPECT_EQ(engine.handle_counts().at(spec.device_id).open, 1u);
  }
  EXPECT_TRUE(engine.handle_counts().empty());
  auto kept = engine.OpenRegion({obj.name(), "", 4096, "gpu0"});
  ASSERT_TRUE(kept.ok());
  RegionSpec probe{obj.name(), "", 4096, "gpu0"};
  probe.transient_device = true;
  ASSERT_TRUE(engine.OpenRegion(probe).ok());  // opened and closed at once
  kept->reset();
  ASSERT_EQ(engine.handle_counts().count("gpu0"), 1u);
  EXPECT_EQ(engine.handle_counts()["gpu0"].opens_total, 2u);
  EXPECT_EQ(engine.handle_counts()["gpu0"].open, 0u);
}

// The blocking adapter: nothing asynchronous or ordered, a null order, and a posted chunk
// copied and completed on the calling thread before PostChunk returns.
TEST(ShmCopyEngineTest, PostedAndOrderedChunksAreBlockingCopies) {
  ShmObject obj(1 << 16);
  for (int i = 0; i < (1 << 16); ++i) obj.data()[i] = static_cast<uint8_t>(i * 5 + 1);
  ShmCopyEngine engine;
  EXPECT_FALSE(engine.capabilities().asynchronous);
  EXPECT_FALSE(engine.capabilities().orders_transfers);
  auto region = engine.OpenRegion({obj.name(), "", 1 << 16, "gpu0"});
  ASSERT_TRUE(region.ok()) << region.status();
  TransferSpec spec;
  spec.bytes = 4096;
  bool recorded = false;
  spec.on_done_recorded = [&recorded] { recorded = true; };
  auto order = engine.BeginTransfer(**region, std::move(spec));
  ASSERT_TRUE(order.ok());
  EXPECT_EQ(order->get(), nullptr);
  std::vector<uint8_t> host(4096);
  int calls = 0;
  absl::Status got = absl::UnknownError("not run");
  engine.PostOrderedChunk(order->get(), 0, Direction::kDeviceToHost, **region, 4096, host.data(),
                          4096, ChunkUrgency::kNormal, [&](absl::Status s) {
                            ++calls;
                            got = std::move(s);
                          });
  EXPECT_EQ(calls, 1);  // inline, before PostOrderedChunk returned
  EXPECT_TRUE(got.ok()) << got;
  EXPECT_EQ(std::memcmp(host.data(), obj.data() + 4096, 4096), 0);
  EXPECT_FALSE(recorded);
  EXPECT_EQ(engine.pinned_bytes(), 0u);
}

TEST(ShmCopyEngineTest, BadRegistrationsHaveSpecificCodes) {
  ShmCopyEngine engine;
  EXPECT_EQ(engine.OpenRegion({"/offloadd-does-not-exist-x", "", 10, ""}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(engine.OpenRegion({"no-slash", "", 10, ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.OpenRegion({"/a/b", "", 10, ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.OpenRegion({"", std::string(64, 'x'), 10, ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  ShmObject obj(4096);
  EXPECT_EQ(engine.OpenRegion({obj.name(), "", 0, ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.OpenRegion({obj.name(), "", 8192, ""}).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(ShmCopyEngineTest, TruncatedRegionFailsTheCopyWithoutKillingTheProcess) {
  ShmObject obj(1 << 20);
  ShmCopyEngine engine;
  auto region = engine.OpenRegion({obj.name(), "", 1 << 20, "gpu0"});
  ASSERT_TRUE(region.ok());
  int fd = shm_open(obj.name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);  // the client shrinks its object under the daemon
  close(fd);
  std::vector<uint8_t> host(1 << 16, 7);
  for (auto dir : {Direction::kDeviceToHost, Direction::kHostToDevice}) {
    absl::Status st = engine.CopyChunk(dir, **region, 4096, host.data(), host.size());
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  }
}

TEST(ShmCopyEngineTest, SpecialNamesAreInvalidArgument) {
  ShmCopyEngine engine;
  for (std::string name : {std::string("/.."), std::string("/."), std::string("/a\0b", 4)}) {
    EXPECT_EQ(engine.OpenRegion({name, "", 10, ""}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
}

}  // namespace
}  // namespace offloadd::copy

namespace offloadd::copy {
namespace {

// Mappings of the daemon's address space that map `name` (from /proc/self/maps).
int MappingsOf(const std::string& name) {
  FILE* f = fopen("/proc/self/maps", "r");
  int n = 0;
  char line[4096];
  const std::string needle = "/dev/shm" + name;
  while (fgets(line, sizeof(line), f) != nullptr) {
    if (std::strstr(line, needle.c_str()) != nullptr) ++n;
  }
  fclose(f);
  return n;
}

// Registering one object many times must not map it many times (each
// mapping counts against vm.max_map_count and, touched, costs page tables).
TEST(ShmMappingTest, ManyRegistrationsOfOneObjectShareOneMapping) {
  ShmObject obj(1 << 20);
  ShmCopyEngine engine;
  std::vector<std::shared_ptr<Region>> regions;
  for (int i = 0; i < 200; ++i) {
    auto r = engine.OpenRegion({obj.name(), "", (i % 2 == 0) ? (1u << 20) : 4096u, "gpu0"});
    ASSERT_TRUE(r.ok()) << r.status();
    regions.push_back(*r);
  }
  EXPECT_EQ(MappingsOf(obj.name()), 1 + 1);  // the test's own mapping + the engine's one
  // Every registration still copies through its own bounds.
  std::vector<uint8_t> host(8192, 0x5A);
  EXPECT_EQ(engine.CopyChunk(Direction::kHostToDevice, *regions[1], 0, host.data(), 8192).code(),
            absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(engine.CopyChunk(Direction::kHostToDevice, *regions[0], 0, host.data(), 8192).ok());
  EXPECT_EQ(obj.data()[8191], 0x5A);
  EXPECT_EQ(engine.mapping_stats().mappings, 1u);
  EXPECT_EQ(engine.mapping_stats().mapped_bytes, 1u << 20);
  regions.clear();
  EXPECT_EQ(MappingsOf(obj.name()), 1);  // unmapped with the last registration
  EXPECT_EQ(engine.mapping_stats().mappings, 0u);
}

TEST(ShmMappingTest, MappingsAndMappedBytesPerUidAreBoundedWithResourceExhausted) {
  ShmObject a(1 << 20), b(1 << 20), c(4 << 20);
  ShmMappingLimits limits;
  limits.max_mappings_per_uid = 2;
  limits.max_mapped_bytes_per_uid = 4 << 20;
  ShmCopyEngine engine(limits);
  auto ra = engine.OpenRegion({a.name(), "", 1 << 20, "gpu0"});
  auto rb = engine.OpenRegion({b.name(), "", 1 << 20, "gpu0"});
  ASSERT_TRUE(ra.ok() && rb.ok());
  auto rc = engine.OpenRegion({c.name(), "", 1 << 20, "gpu0"});
  ASSERT_EQ(rc.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(rc.status().message().find("max_shm_mappings_per_uid"), std::string::npos)
      << rc.status();
  ra->reset();
  // One mapping slot free again, but 4 MiB would pass the mapped bytes bound.
  rc = engine.OpenRegion({c.name(), "", 4 << 20, "gpu0"});
  ASSERT_EQ(rc.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(rc.status().message().find("max_shm_mapped_bytes_per_uid"), std::string::npos)
      << rc.status();
  rc = engine.OpenRegion({c.name(), "", 2 << 20, "gpu0"});
  EXPECT_TRUE(rc.ok()) << rc.status();
}

TEST(ShmMappingTest, TotalMappingsAreBounded) {
  ShmObject a(4096), b(4096);
  ShmMappingLimits limits;
  limits.max_mappings_total = 1;
  ShmCopyEngine engine(limits);
  auto ra = engine.OpenRegion({a.name(), "", 4096, "gpu0"});
  ASSERT_TRUE(ra.ok());
  auto rb = engine.OpenRegion({b.name(), "", 4096, "gpu0"});
  EXPECT_EQ(rb.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(rb.status().message().find("max_shm_mappings_total"), std::string::npos);
}

}  // namespace
}  // namespace offloadd::copy
