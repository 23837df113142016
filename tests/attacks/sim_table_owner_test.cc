// Which simulated GPU tables a session may name (CheckSimHandleOwner), the instance a handle
// must carry, and a layout the daemon reads once: the checks behind sim_gpu_attacks_test.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "server/copy/cuda/sim_gpu_table.h"

namespace offloadd::copy {
namespace {

using common::MakeSimEventHandle;
using common::MakeSimMemHandle;
using common::SimEventSlot;
using common::SimGpuTable;
using common::SimSegmentGeometry;
using common::SimSegmentSlot;
using common::SimSegmentState;
using common::SimTableHeader;
using common::SimTableName;

class SimTableOwnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pid_ = static_cast<uint32_t>(getpid());
    shm_unlink(SimTableName(pid_).c_str());
    auto t = SimGpuTable::Create(pid_, 1, 4 << 20, 16, 16);
    ASSERT_TRUE(t.ok()) << t.status();
    table_ = *t;
    SimSegmentSlot* s = table_->segment(0);
    s->device = 0;
    s->offset = 1 << 20;
    s->size = 1 << 20;
    s->generation = 1;
    s->state = static_cast<uint32_t>(SimSegmentState::kLive);
  }
  uint32_t pid_ = 0;
  std::shared_ptr<SimGpuTable> table_;
};

TEST_F(SimTableOwnerTest, OnlyTheSessionsOwnProcessAndUid) {
  const std::string mem = MakeSimMemHandle({pid_, 0, 1, table_->instance()});
  const std::string event = MakeSimEventHandle({pid_, 3, table_->instance()});
  const uint32_t uid = geteuid();
  for (const std::string& h : {mem, event}) {
    EXPECT_TRUE(CheckSimHandleOwner(h, {pid_}, uid).ok());
    EXPECT_TRUE(CheckSimHandleOwner(h, {0, pid_}, uid).ok());  // peer pid unknown, Hello's own
    absl::Status other_pid = CheckSimHandleOwner(h, {pid_ + 1}, uid);
    EXPECT_EQ(other_pid.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(other_pid.message().find("not this session's process"), std::string::npos)
        << other_pid;
    absl::Status other_uid = CheckSimHandleOwner(h, {pid_}, uid + 1);
    EXPECT_EQ(other_uid.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(other_uid.message().find("belongs to uid"), std::string::npos) << other_uid;
    EXPECT_EQ(CheckSimHandleOwner(h, {}, uid).code(), absl::StatusCode::kPermissionDenied);
  }
  // Handles of other kinds (real CUDA bytes, cuda-sim's modelled memory) are not tables'.
  EXPECT_TRUE(CheckSimHandleOwner(std::string(64, '\x01'), {pid_ + 1}, uid + 1).ok());
  EXPECT_TRUE(CheckSimHandleOwner("", {}, uid).ok());
}

TEST_F(SimTableOwnerTest, OpenNeedsTheTablesInstance) {
  EXPECT_EQ(OpenSimGpuTable(pid_, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(OpenSimGpuTable(pid_, table_->instance() ^ 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(OpenSimGpuTable(pid_, table_->instance()).ok());
  EXPECT_NE(table_->instance(), 0u);
}

TEST_F(SimTableOwnerTest, LayoutIsReadOnceAndRewritesChangeNothing) {
  auto opened = OpenSimGpuTable(pid_, table_->instance());
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::shared_ptr<SimGpuTable> daemon = *opened;
  SimSegmentGeometry before;
  ASSERT_TRUE(daemon->Geometry(*daemon->segment(0), &before));
  SimEventSlot* event_before = daemon->event(3);
  SimSegmentSlot* segment_before = daemon->segment(0);
  SimTableHeader& h = table_->header();  // the client rewrites its header
  h.memory_offset = std::numeric_limits<uint64_t>::max() - 4095;
  h.events_offset = uint64_t{1} << 50;
  h.segments_offset = uint64_t{1} << 50;
  h.segment_slots = h.event_slots = 1u << 31;
  h.devices = 1u << 31;
  EXPECT_EQ(daemon->event(3), event_before);
  EXPECT_EQ(daemon->segment(0), segment_before);
  EXPECT_EQ(daemon->event(16), nullptr);  // the slot counts are the ones read at open
  EXPECT_EQ(daemon->segment(16), nullptr);
  SimSegmentGeometry after;
  ASSERT_TRUE(daemon->Geometry(*daemon->segment(0), &after));
  EXPECT_EQ(after.memory, before.memory);
  // A segment pointing past its device is refused, not added to a base.
  daemon->segment(0)->offset = uint64_t{1} << 50;
  EXPECT_FALSE(daemon->Geometry(*daemon->segment(0), &after));
  EXPECT_EQ(daemon->SegmentMemory(*daemon->segment(0)), nullptr);
  // A table whose header wraps past 2^64 does not open.
  EXPECT_EQ(OpenSimGpuTable(pid_, table_->instance()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  h.memory_offset = std::numeric_limits<uint64_t>::max() - 4095;
  h.events_offset = 4096;
  h.segments_offset = 8192;
  h.segment_slots = h.event_slots = 16;
  h.devices = 1;
  EXPECT_EQ(OpenSimGpuTable(pid_, table_->instance()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace offloadd::copy
