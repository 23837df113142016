#include "server/pool/arena.h"

#include <linux/capability.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace offloadd::pool {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;

TEST(ArenaTest, ZeroSizeIsInvalid) {
  auto a = Arena::Create({});
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ArenaTest, SizeRoundsUpToPage) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (uint64_t size : {uint64_t{1}, page - 1, page, page + 1, 3 * page + 7}) {
    ArenaOptions o;
    o.size_bytes = size;
    auto a = Arena::Create(o);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ((*a)->size_bytes(), (size + page - 1) / page * page) << size;
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*a)->base()) % page, 0u);
    EXPECT_FALSE((*a)->locked());
  }
}

// Writes a pattern over every byte and reads it back.
void CheckWritable(const Arena& a) {
  uint8_t* p = a.base();
  const uint64_t n = a.size_bytes();
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(p[i], 0) << "fresh arena not zeroed at " << i;
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_EQ(p[i], static_cast<uint8_t>(i * 131 + (i >> 12))) << "at " << i;
  }
}

TEST(ArenaTest, EveryByteWritable) {
  for (bool prefault : {true, false}) {
    ArenaOptions o;
    o.size_bytes = 8 * kMiB + 12345;
    o.prefault = prefault;
    auto a = Arena::Create(o);
    ASSERT_TRUE(a.ok()) << a.status();
    CheckWritable(**a);
  }
}

TEST(ArenaTest, HugePagesAlignedAndWritable) {
  ArenaOptions o;
  o.size_bytes = 6 * kMiB + 4096;
  o.huge_pages = true;
  auto a = Arena::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->size_bytes(), 6 * kMiB + 4096);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*a)->base()) % (2 * kMiB), 0u);
  CheckWritable(**a);
}

TEST(ArenaTest, MlockSmallArena) {
  // 1 MiB fits the default 8 MiB RLIMIT_MEMLOCK, and privileged processes have no limit.
  struct rlimit rl;
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &rl), 0);
  ArenaOptions o;
  o.size_bytes = kMiB;
  o.mlock = true;
  auto a = Arena::Create(o);
  if (!MemlockPrivileged() && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < kMiB) {
    EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
    GTEST_SKIP() << "RLIMIT_MEMLOCK below 1 MiB here";
  }
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->locked());
  CheckWritable(**a);
}

// Clears CAP_IPC_LOCK from this process's effective set (raw capget/capset: no libcap here).
bool DropIpcLockCapability() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  data[0].effective &= ~(1u << CAP_IPC_LOCK);
  return syscall(SYS_capset, &header, data) == 0;
}

// The whole Create() path as an unprivileged process would see it, in a forked child: without
// CAP_IPC_LOCK and with RLIMIT_MEMLOCK at 1 MiB, a 4 MiB mlock'ed arena must fail with
// FAILED_PRECONDITION (exit 0), naming the remedy (else exit 2..5).
TEST(ArenaTest, MlockOverLimitInUnprivilegedChild) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (MemlockPrivileged() && !DropIpcLockCapability()) _exit(2);
    if (MemlockPrivileged()) _exit(3);
    struct rlimit rl = {kMiB, kMiB};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) _exit(4);
    ArenaOptions o;
    o.size_bytes = 4 * kMiB;
    o.mlock = true;
    auto a = Arena::Create(o);
    const bool ok = a.status().code() == absl::StatusCode::kFailedPrecondition &&
                    absl::StrContains(a.status().message(), "LimitMEMLOCK=infinity") &&
                    absl::StrContains(a.status().message(), absl::StrCat(4 * kMiB));
    _exit(ok ? 0 : 5);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: capget/capset failed, 3: still privileged, "
                                       "4: setrlimit failed, 5: wrong status";
}

TEST(CheckMemlockLimitTest, Decisions) {
  EXPECT_TRUE(CheckMemlockLimit(8 * kMiB, 8 * kMiB, false).ok());
  EXPECT_TRUE(CheckMemlockLimit(1, 8 * kMiB, false).ok());
  EXPECT_TRUE(CheckMemlockLimit(1ull << 40, RLIM_INFINITY, false).ok());
  EXPECT_TRUE(CheckMemlockLimit(1ull << 40, 0, true).ok());
  EXPECT_EQ(CheckMemlockLimit(8 * kMiB + 1, 8 * kMiB, false).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckMemlockLimit(1, 0, false).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CheckMemlockLimitTest, MessageNamesNumbersAndRemedies) {
  const absl::Status s = CheckMemlockLimit(64 * kMiB, 8 * kMiB, false);
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(s.message());
  EXPECT_TRUE(absl::StrContains(m, absl::StrCat(64 * kMiB))) << m;
  EXPECT_TRUE(absl::StrContains(m, absl::StrCat(8 * kMiB))) << m;
  EXPECT_TRUE(absl::StrContains(m, "LimitMEMLOCK=infinity")) << m;
  EXPECT_TRUE(absl::StrContains(m, "ulimit -l unlimited")) << m;
  EXPECT_TRUE(absl::StrContains(m, "securityContext")) << m;
}

TEST(CheckMemAvailableTest, Decisions) {
  EXPECT_TRUE(CheckMemAvailable(100, 100).ok());
  const absl::Status s = CheckMemAvailable(3 * kMiB, 2 * kMiB);
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat(3 * kMiB))) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat(2 * kMiB))) << s;
}

TEST(ParseMemAvailableTest, Parses) {
  const char kMeminfo[] =
      "MemTotal:       24683620 kB\n"
      "MemFree:         1000000 kB\n"
      "MemAvailable:   24071000 kB\n"
      "Buffers:          100 kB\n";
  auto v = ParseMemAvailableBytes(kMeminfo);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, uint64_t{24071000} * 1024);
  EXPECT_EQ(ParseMemAvailableBytes("MemTotal: 5 kB\n").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ParseMemAvailableBytes("MemAvailable: lots kB\n").status().code(),
            absl::StatusCode::kInvalidArgument);
  auto live = ReadMemAvailableBytes();
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_GT(*live, 0u);
}

TEST(ArenaTest, LargerThanAvailableRamIsResourceExhausted) {
  auto avail = ReadMemAvailableBytes();
  ASSERT_TRUE(avail.ok()) << avail.status();
  ArenaOptions o;
  o.size_bytes = *avail + (uint64_t{1} << 30);  // never mapped: the check comes first
  auto a = Arena::Create(o);
  ASSERT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted) << a.status();
  const std::string m(a.status().message());
  EXPECT_TRUE(absl::StrContains(m, "MemAvailable")) << m;
  EXPECT_TRUE(absl::StrContains(m, absl::StrCat((o.size_bytes + 4095) / 4096 * 4096))) << m;
}

// Shared pools: a name unique to this test process, removed afterwards.
class SharedArenaTest : public ::testing::Test {
 protected:
  void TearDown() override { shm_unlink(("/" + name_).c_str()); }
  ArenaOptions Options(uint64_t size_bytes) {
    ArenaOptions o;
    o.size_bytes = size_bytes;
    o.shm_name = name_;
    return o;
  }
  const std::string name_ = absl::StrCat("offloadd-arena-test-", getpid());
};

TEST_F(SharedArenaTest, BlocksAndRecordsOutliveTheArena) {
  {
    auto a = Arena::Create(Options(4 * kMiB));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_FALSE((*a)->adopted());
    ASSERT_NE((*a)->block_table(), nullptr);
    EXPECT_EQ((*a)->block_table()->slots(), SharedRecordSlots(4 * kMiB));
    EXPECT_TRUE((*a)->block_table()->Adopt().blocks.empty());
    std::memset((*a)->base() + kMiB, 0x5a, 4096);
    StoredBlock b;
    b.slot = 7;
    b.block_id = 42;
    b.extent_offset = kMiB;
    b.bytes = 4096;
    b.owner_uid = 1234;
    (*a)->block_table()->Write(b);
  }
  auto a = Arena::Create(Options(4 * kMiB));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->adopted());
  AdoptionReport r = (*a)->block_table()->Adopt();
  ASSERT_EQ(r.blocks.size(), 1u);
  EXPECT_EQ(r.blocks[0].block_id, 42u);
  EXPECT_EQ(r.blocks[0].owner_uid, 1234u);
  for (int i = 0; i < 4096; ++i) ASSERT_EQ((*a)->base()[kMiB + i], 0x5a) << i;
}

TEST_F(SharedArenaTest, InspectSeesTheSurvivingObjectWithoutTouchingIt) {
  SharedPoolObject none = InspectSharedPool(name_, 4 * kMiB);
  EXPECT_FALSE(none.exists);
  EXPECT_TRUE(none.usable.ok()) << none.usable;
  {
    auto a = Arena::Create(Options(4 * kMiB));
    ASSERT_TRUE(a.ok()) << a.status();
    (*a)->base()[0] = 0x42;
  }
  const uint64_t total = SharedDataOffset(4 * kMiB) + 4 * kMiB;
  SharedPoolObject o = InspectSharedPool(name_, 4 * kMiB);
  EXPECT_TRUE(o.exists);
  EXPECT_TRUE(o.usable.ok()) << o.usable;
  EXPECT_EQ(o.size_bytes, total);
  EXPECT_GE(o.resident_bytes, total);  // posix_fallocate put every page in memory
  SharedPoolObject other = InspectSharedPool(name_, 8 * kMiB);
  EXPECT_EQ(other.usable.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(other.usable.message(), "set pool_bytes back")) << other.usable;
  auto a = Arena::Create(Options(4 * kMiB));  // nothing was changed or left locked
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->adopted());
  EXPECT_EQ((*a)->base()[0], 0x42);
}

TEST(ShmHugePagesTest, FollowsTheMountOptionAndShmemEnabled) {
  const std::string never =
      "25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683584k\n"
      "30 25 0:27 / /dev/shm rw,nosuid shared:4 - tmpfs tmpfs rw,size=24683584k\n";
  const std::string within =
      "25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24683584k\n"
      "30 25 0:27 / /dev/shm rw,nosuid shared:4 - tmpfs tmpfs rw,size=1g,huge=within_size\n";
  const std::string kDefault = "always within_size advise [never] deny force\n";
  absl::Status s = ShmHugePagesFor(never, kDefault);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "huge=never")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "huge=within_size")) << s;
  EXPECT_TRUE(ShmHugePagesFor(within, kDefault).ok());
  // The last mount on /dev/shm decides: the first one's huge= is hidden under the second.
  EXPECT_FALSE(ShmHugePagesFor(
      "1 0 0:1 / /dev/shm rw - tmpfs tmpfs rw,huge=always\n2 1 0:2 / /dev/shm rw - tmpfs tmpfs rw\n",
      kDefault).ok());
  EXPECT_TRUE(ShmHugePagesFor(never, "always within_size advise never deny [force]").ok());
  EXPECT_FALSE(ShmHugePagesFor(within, "always within_size advise never [deny] force").ok());
  EXPECT_TRUE(absl::StrContains(ShmHugePagesFor("", kDefault).message(), "not a mount point"));
}

TEST_F(SharedArenaTest, SecondHolderIsRefused) {
  auto a = Arena::Create(Options(2 * kMiB));
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = Arena::Create(Options(2 * kMiB));
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(b.status().message(), "another process holds")) << b.status();
}

TEST_F(SharedArenaTest, SizeMismatchIsRefusedAndLeavesThePoolIntact) {
  {
    auto a = Arena::Create(Options(2 * kMiB));
    ASSERT_TRUE(a.ok()) << a.status();
    (*a)->base()[0] = 0x77;
  }
  auto b = Arena::Create(Options(4 * kMiB));
  ASSERT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(b.status().message(), "2097152 bytes of pool")) << b.status();
  EXPECT_TRUE(absl::StrContains(b.status().message(), "rm /dev/shm/" + name_)) << b.status();
  auto c = Arena::Create(Options(2 * kMiB));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->adopted());
  EXPECT_EQ((*c)->base()[0], 0x77);
}

TEST_F(SharedArenaTest, ForeignObjectIsRefused) {
  const int fd = shm_open(("/" + name_).c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  const uint64_t total = SharedDataOffset(2 * kMiB) + 2 * kMiB;
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(total)), 0);
  ASSERT_EQ(pwrite(fd, "NOTOURS!", 8, 0), 8);
  close(fd);
  auto a = Arena::Create(Options(2 * kMiB));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(a.status().message(), "not an offloadd pool")) << a.status();
}

// A header whose magic was zeroed (damaged) in a pool holding records: the records are kept and
// adopted (each checks itself); before, the pool was taken for a new one and every record wiped.
TEST_F(SharedArenaTest, ZeroedMagicKeepsTheRecords) {
  {
    auto a = Arena::Create(Options(4 * kMiB));
    ASSERT_TRUE(a.ok()) << a.status();
    StoredBlock b;
    b.slot = 3;
    b.block_id = 77;
    b.extent_offset = kMiB;
    b.bytes = 4096;
    b.owner_uid = 1000;
    (*a)->block_table()->Write(b);
  }
  const int fd = shm_open(("/" + name_).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, "\0\0\0\0\0\0\0\0", 8, 0), 8);
  close(fd);
  auto a = Arena::Create(Options(4 * kMiB));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->adopted());
  AdoptionReport r = (*a)->block_table()->Adopt();
  ASSERT_EQ(r.blocks.size(), 1u);
  EXPECT_EQ(r.blocks[0].block_id, 77u);
  // The header is whole again: a third start adopts as usual.
  a->reset();
  auto c = Arena::Create(Options(4 * kMiB));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->adopted());
}

// A damaged layout_version with the right size: the advice must not be "set pool_bytes back"
// (it is already right); it names the damage and the two ways out (found by the attack round).
TEST_F(SharedArenaTest, DamagedLayoutVersionSaysSoNotPoolBytes) {
  { ASSERT_TRUE(Arena::Create(Options(2 * kMiB)).ok()); }
  const int fd = shm_open(("/" + name_).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  const uint32_t version = 99;
  ASSERT_EQ(pwrite(fd, &version, sizeof(version), 8), 4);  // after the 8-byte magic
  close(fd);
  auto a = Arena::Create(Options(2 * kMiB));
  ASSERT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(a.status().message(), "header is damaged")) << a.status();
  EXPECT_TRUE(absl::StrContains(a.status().message(), "layout 99")) << a.status();
  EXPECT_FALSE(absl::StrContains(a.status().message(), "set pool_bytes")) << a.status();
}

// Another uid may create the pool's name in /dev/shm before the daemon first starts: adopting
// that object would let its creator read and forge every block. An object open to group or
// others, or owned by another uid, is refused before anything is mapped or written.
TEST_F(SharedArenaTest, ObjectOpenToOthersIsRefused) {
  const int fd = shm_open(("/" + name_).c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchmod(fd, 0666), 0);
  close(fd);
  auto a = Arena::Create(Options(2 * kMiB));
  ASSERT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition) << a.status();
  EXPECT_TRUE(absl::StrContains(a.status().message(), "mode 0666")) << a.status();
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm/" + name_).c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "the refused object was sized";
}

TEST_F(SharedArenaTest, ObjectOfAnotherUidIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give the object to another uid";
  const int fd = shm_open(("/" + name_).c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  if (fchown(fd, 65534, 65534) != 0) {  // a sandbox's user namespace may not map uid 65534
    close(fd);
    GTEST_SKIP() << "cannot give the object to uid 65534: " << std::strerror(errno);
  }
  close(fd);
  auto a = Arena::Create(Options(2 * kMiB));
  ASSERT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition) << a.status();
  EXPECT_TRUE(absl::StrContains(a.status().message(), "belongs to uid 65534")) << a.status();
}

}  // namespace
}  // namespace offloadd::pool
