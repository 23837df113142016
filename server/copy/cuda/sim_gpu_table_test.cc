// The daemon's opening of a client's simulated GPU table (sim_gpu_table.h): a table the client
// truncates under the daemon's mapping reads as zeros instead of killing the daemon (SIGBUS),
// and SimTablesZeroedTotal counts it.
#include "server/copy/cuda/sim_gpu_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace offloadd::copy {
namespace {

TEST(OpenSimGpuTableTest, ATableTruncatedUnderTheDaemonReadsAsZerosAndIsCounted) {
  const auto pid = static_cast<uint32_t>(getpid());
  auto created = common::SimGpuTable::Create(pid, 1, 1 << 20, 8, 4);
  ASSERT_TRUE(created.ok()) << created.status();
  common::SimSegmentSlot* client_slot = (*created)->segment(0);
  ASSERT_NE(client_slot, nullptr);
  client_slot->size = 4096;
  client_slot->generation.store(7);

  auto opened = OpenSimGpuTable(pid, (*created)->instance());
  ASSERT_TRUE(opened.ok()) << opened.status();
  common::SimSegmentSlot* daemon_slot = (*opened)->segment(0);
  ASSERT_NE(daemon_slot, nullptr);
  EXPECT_EQ(daemon_slot->generation.load(), 7u);  // the client's write, through the mapping
  EXPECT_EQ(daemon_slot->size, 4096u);

  const uint64_t zeroed_before = SimTablesZeroedTotal();
  const std::string name = common::SimTableName(pid);
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);  // a hostile or crashing client shrinks its table
  close(fd);
  // The next read faults (the pages are gone): the guard swaps in zeros and the read returns.
  EXPECT_EQ(daemon_slot->generation.load(), 0u);
  EXPECT_EQ(daemon_slot->size, 0u);
  EXPECT_EQ(SimTablesZeroedTotal(), zeroed_before + 1);
  EXPECT_EQ(daemon_slot->generation.load(), 0u);  // still zeros, no second fault
  EXPECT_EQ(SimTablesZeroedTotal(), zeroed_before + 1);
}

TEST(OpenSimGpuTableTest, AMissingTableIsNotFoundAndAWrongInstanceIsRefused) {
  const auto pid = static_cast<uint32_t>(getpid());
  EXPECT_EQ(OpenSimGpuTable(pid, 5).status().code(), absl::StatusCode::kNotFound);
  auto created = common::SimGpuTable::Create(pid, 1, 1 << 20, 8, 4);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(OpenSimGpuTable(pid, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(OpenSimGpuTable(pid, (*created)->instance() + 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(OpenSimGpuTable(pid, (*created)->instance()).ok());
}

}  // namespace
}  // namespace offloadd::copy
