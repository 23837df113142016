// The simulated GPU table's format on its own (common/sim_gpu_table.h): handles round-trip and
// refuse other kinds, a created table reads back, and Adopt accepts only a mapping whose layout
// fits. Whose table a handle names and the daemon's guarded open are tested in
// tests/attacks/sim_table_owner_test.cc.
#include "common/sim_gpu_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"

namespace offloadd::common {
namespace {

// A pid no live process of this test uses for its own table.
uint32_t TestPid() { return static_cast<uint32_t>(getpid()) + 3000000; }

TEST(SimGpuTableFormat, HandlesRoundTripAndRefuseOtherKinds) {
  const SimMemRef mem{7, 3, 11, 0x1234};
  const std::string mh = MakeSimMemHandle(mem);
  ASSERT_EQ(mh.size(), 64u);
  EXPECT_EQ(std::memcmp(mh.data(), kSimMemMagic, 8), 0);
  SimMemRef back;
  ASSERT_TRUE(ParseSimMemHandle(mh, &back));
  EXPECT_EQ(back.pid, 7u);
  EXPECT_EQ(back.slot, 3u);
  EXPECT_EQ(back.generation, 11u);
  EXPECT_EQ(back.instance, 0x1234u);
  SimEventRef event;
  EXPECT_FALSE(ParseSimEventHandle(mh, &event));  // a memory handle is not an event handle
  ASSERT_TRUE(ParseSimEventHandle(MakeSimEventHandle({9, 2, 5}), &event));
  EXPECT_EQ(event.pid, 9u);
  EXPECT_EQ(event.slot, 2u);
  EXPECT_EQ(event.instance, 5u);
  EXPECT_FALSE(ParseSimMemHandle(mh.substr(0, 63), &back));
  EXPECT_EQ(SimTableName(42), "/ofd-simgpu-42");
}

TEST(SimGpuTableFormat, CreatedTableReadsBackAndAdoptChecksTheLayout) {
  const uint32_t pid = TestPid();
  shm_unlink(SimTableName(pid).c_str());
  auto created = SimGpuTable::Create(pid, 2, 1 << 20, 8, 4);
  ASSERT_TRUE(created.ok()) << created.status();
  const SimGpuTable& t = **created;
  EXPECT_NE(t.instance(), 0u);
  EXPECT_TRUE(t.owner());
  ASSERT_NE(t.event(7), nullptr);
  EXPECT_EQ(t.event(8), nullptr);
  EXPECT_EQ(t.event(0)->complete_at_ns.load(), kSimNever);
  ASSERT_NE(t.segment(3), nullptr);
  EXPECT_EQ(t.segment(4), nullptr);
  SimSegmentSlot& s = *t.segment(0);
  s.device = 1;
  s.offset = 4096;
  s.size = 8192;
  SimSegmentGeometry g;
  ASSERT_TRUE(t.Geometry(s, &g));
  EXPECT_EQ(g.size_bytes, 8192u);
  s.size = (1 << 20) - 4095;  // one byte past device 1's end
  EXPECT_FALSE(t.Geometry(s, &g));

  // A second mapping of the same object, adopted: the same table.
  const int fd = shm_open(t.name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  void* p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  int released = 0;
  {
    auto adopted = SimGpuTable::Adopt(t.name(), static_cast<uint8_t*>(p), st.st_size, 0,
                                      [&released] { ++released; });
    ASSERT_TRUE(adopted.ok()) << adopted.status();
    EXPECT_EQ((*adopted)->instance(), t.instance());
    EXPECT_FALSE((*adopted)->owner());
    (*adopted)->CountViolation(SimViolation::kConsumedEarly);
    EXPECT_EQ(t.violations(SimViolation::kConsumedEarly), 1u);  // one object, two mappings
  }
  EXPECT_EQ(released, 1);

  // A mapping too short for the layout its header states is refused, and released.
  p = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memcpy(p, &t.header(), 4096);
  auto refused = SimGpuTable::Adopt("short", static_cast<uint8_t*>(p), 8192, 0,
                                    [&released] { ++released; });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(released, 2);
}

}  // namespace
}  // namespace offloadd::common
