#include "client/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

namespace offloadd {
namespace client {
namespace {

bool ShmExists(const std::string& name) {
  struct stat st;
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

TEST(ShmRegionTest, CreateMapsRequestedSizeWithUniqueName) {
  absl::StatusOr<ShmRegion> region = ShmRegion::Create(12345);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ(region->size_bytes(), 12345u);
  EXPECT_TRUE(region->owner());
  ASSERT_NE(region->data(), nullptr);
  EXPECT_EQ(region->name().rfind("/offloadd-" + std::to_string(getpid()) + "-", 0), 0u)
      << region->name();
  EXPECT_EQ(region->name().find('/', 1), std::string::npos);
  EXPECT_TRUE(ShmExists(region->name()));
  // Fresh shared memory reads as zeros and is writable over its whole size.
  const unsigned char* bytes = static_cast<const unsigned char*>(region->data());
  EXPECT_EQ(bytes[0], 0);
  EXPECT_EQ(bytes[12344], 0);
  std::memset(region->data(), 0xab, region->size_bytes());
  EXPECT_EQ(bytes[12344], 0xab);
}

TEST(ShmRegionTest, NamesAreUnique) {
  std::set<std::string> names;
  std::vector<ShmRegion> regions;
  for (int i = 0; i < 64; ++i) {
    absl::StatusOr<ShmRegion> region = ShmRegion::Create(4096);
    ASSERT_TRUE(region.ok()) << region.status();
    names.insert(region->name());
    regions.push_back(*std::move(region));
  }
  EXPECT_EQ(names.size(), 64u);
}

TEST(ShmRegionTest, BytesAreVisibleThroughSecondMappingBothWays) {
  absl::StatusOr<ShmRegion> owner = ShmRegion::Create(1 << 20);
  ASSERT_TRUE(owner.ok()) << owner.status();
  auto* o = static_cast<unsigned char*>(owner->data());
  for (size_t i = 0; i < owner->size_bytes(); ++i) o[i] = static_cast<unsigned char>(i * 7 + 3);

  absl::StatusOr<ShmRegion> view = ShmRegion::Open(owner->name());
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_FALSE(view->owner());
  EXPECT_EQ(view->size_bytes(), owner->size_bytes());
  EXPECT_EQ(view->name(), owner->name());
  EXPECT_NE(view->data(), owner->data());  // a distinct mapping of the same pages
  EXPECT_EQ(std::memcmp(view->data(), owner->data(), owner->size_bytes()), 0);

  static_cast<unsigned char*>(view->data())[4242] = 0x5a;
  EXPECT_EQ(o[4242], 0x5a);
}

TEST(ShmRegionTest, OwnerUnlinksOnDestructionViewDoesNot) {
  std::string name;
  {
    absl::StatusOr<ShmRegion> owner = ShmRegion::Create(4096);
    ASSERT_TRUE(owner.ok()) << owner.status();
    name = owner->name();
    {
      absl::StatusOr<ShmRegion> view = ShmRegion::Open(name);
      ASSERT_TRUE(view.ok()) << view.status();
    }
    EXPECT_TRUE(ShmExists(name)) << "a non-owning view must not unlink";
  }
  EXPECT_FALSE(ShmExists(name));
  absl::StatusOr<ShmRegion> reopened = ShmRegion::Open(name);
  EXPECT_EQ(reopened.status().code(), absl::StatusCode::kNotFound) << reopened.status();
}

TEST(ShmRegionTest, MoveTransfersOwnership) {
  absl::StatusOr<ShmRegion> created = ShmRegion::Create(4096);
  ASSERT_TRUE(created.ok()) << created.status();
  ShmRegion a = *std::move(created);
  const std::string name = a.name();
  void* data = a.data();
  ShmRegion b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size_bytes(), 0u);
  EXPECT_FALSE(a.owner());
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.name(), name);
  EXPECT_TRUE(ShmExists(name));
  absl::StatusOr<ShmRegion> other = ShmRegion::Create(4096);
  ASSERT_TRUE(other.ok());
  const std::string other_name = other->name();
  b = *std::move(other);  // releases (unlinks) the first object
  EXPECT_FALSE(ShmExists(name));
  EXPECT_TRUE(ShmExists(other_name));
}

TEST(ShmRegionTest, OpenMissingNameIsNotFound) {
  absl::StatusOr<ShmRegion> region = ShmRegion::Open("/offloadd-test-no-such-object");
  EXPECT_EQ(region.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(region.status().message().find("/offloadd-test-no-such-object"), std::string::npos)
      << region.status();
}

TEST(ShmRegionTest, RejectsBadArguments) {
  EXPECT_EQ(ShmRegion::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Open("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Open("no-slash").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Open("/a/b").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Open("/").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShmRegionTest, OpenOfEmptyObjectIsFailedPrecondition) {
  // Sandboxed test runs may share /dev/shm and a pid: add a random number.
  const std::string name = "/offloadd-test-empty-" + std::to_string(getpid()) + "-" +
                           std::to_string(std::random_device{}());
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  EXPECT_EQ(ShmRegion::Open(name).status().code(), absl::StatusCode::kFailedPrecondition);
  shm_unlink(name.c_str());
}

}  // namespace
}  // namespace client
}  // namespace offloadd

namespace offloadd::client {
namespace {

// This process's PID namespace inode, as ShmRegion names carry it.
std::string PidNamespace() {
  char buf[64] = {};
  EXPECT_GT(readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1), 0);
  absl::string_view v(buf);
  EXPECT_TRUE(absl::ConsumePrefix(&v, "pid:[") && absl::ConsumeSuffix(&v, "]")) << buf;
  return std::string(v);
}

// Names a killed process left behind are swept by the next process's first Create; names of
// live processes (this one's), names made in another PID namespace (the same pid there may be a
// live process: /dev/shm is shared by containers and sandboxes) and other names are kept.
TEST(ShmRegionSweepTest, NamesOfDeadProcessesAreRemoved) {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);  // its pid is now free
  const std::string ns = PidNamespace();
  const std::string dead = absl::StrCat("/offloadd-", child, "-", ns, "-0-00000000deadbeef");
  const std::string foreign = absl::StrCat("/offloadd-", child, "-1", ns, "-0-00000000deadbeef");
  const std::string other = absl::StrCat("/offloadd-test-keep-", getpid());
  for (const std::string& n : {dead, foreign, other}) {
    const int fd = shm_open(n.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << n;
    close(fd);
  }
  auto mine = ShmRegion::Create(4096);
  ASSERT_TRUE(mine.ok()) << mine.status();
  ShmRegion::SweepStaleRegions();  // Create swept once already, perhaps before these existed
  struct stat st;
  EXPECT_NE(stat(("/dev/shm" + dead).c_str(), &st), 0) << dead << " was not removed";
  EXPECT_EQ(stat(("/dev/shm" + foreign).c_str(), &st), 0) << foreign << " was removed";
  EXPECT_EQ(stat(("/dev/shm" + other).c_str(), &st), 0);
  EXPECT_EQ(stat(("/dev/shm" + mine->name()).c_str(), &st), 0);  // alive: kept
  EXPECT_TRUE(absl::StartsWith(mine->name(), absl::StrCat("/offloadd-", getpid(), "-", ns, "-")))
      << mine->name();
  shm_unlink(foreign.c_str());
  shm_unlink(other.c_str());
}

}  // namespace
}  // namespace offloadd::client
