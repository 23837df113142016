#include "server/host_check.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "server/metrics/loopback_listener.h"
#include "server/pool/arena.h"

namespace offloadd {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

v1::DaemonConfig Config(const std::string& backend, uint64_t pool_bytes, bool mlock) {
  v1::DaemonConfig c;
  c.set_backend(backend);
  c.set_pool_bytes(pool_bytes);
  c.set_pool_mlock(mlock);
  return c;
}

HostFacts Roomy() {
  HostFacts f;
  f.mem_available_bytes = 512 * kGiB;
  f.memlock_limit_bytes = RLIM_INFINITY;
  return f;
}

TEST(HostProblems, NoneWhenTheHostFits) {
  EXPECT_TRUE(HostProblems(Config("cuda", 256 * kGiB, true), Roomy()).empty());
}

TEST(HostProblems, InTheOrderTheDaemonMeetsThem) {
  HostFacts f;
  f.mem_available_bytes = 8 * kGiB;
  f.memlock_limit_bytes = 64 << 10;
  f.cuda = absl::FailedPreconditionError("no driver");
  auto problems = HostProblems(Config("cuda", 16 * kGiB, true), f);
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_EQ(problems[0].message(), "no driver");
  EXPECT_EQ(problems[1].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(problems[1].message().find("RLIMIT_MEMLOCK"), std::string::npos) << problems[1];
  EXPECT_EQ(problems[2].code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(problems[2].message().find("larger than MemAvailable, 8589934592 bytes (8192 MiB)"),
            std::string::npos)
      << problems[2];
}

TEST(HostProblems, MemlockOnlyWhereThePoolIsLocked) {
  HostFacts f = Roomy();
  f.memlock_limit_bytes = 64 << 10;
  f.cuda = absl::FailedPreconditionError("not read for shm");
  EXPECT_TRUE(HostProblems(Config("shm", kGiB, false), f).empty());
  EXPECT_EQ(HostProblems(Config("shm", kGiB, true), f).size(), 1u);
  f.memlock_privileged = true;  // CAP_IPC_LOCK: the limit does not apply
  EXPECT_TRUE(HostProblems(Config("shm", kGiB, true), f).empty());
}

// Backend cuda pins with cudaHostRegister, which RLIMIT_MEMLOCK does not govern: a container's
// 64 KiB limit must not keep the daemon from starting unless pool_mlock asks for a locked pool.
TEST(HostProblems, CudaBackendNeedsMemlockOnlyWithPoolMlock) {
  HostFacts f = Roomy();
  f.memlock_limit_bytes = 64 << 10;
  f.cuda = absl::OkStatus();
  EXPECT_TRUE(HostProblems(Config("cuda", 16 * kGiB, false), f).empty());
  auto problems = HostProblems(Config("cuda", 16 * kGiB, true), f);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].message().find("RLIMIT_MEMLOCK"), std::string::npos) << problems[0];
}

TEST(HostProblems, UnreadableMeminfoIsNotAProblem) {
  HostFacts f = Roomy();
  f.mem_available_bytes = absl::NotFoundError("old kernel");
  EXPECT_TRUE(HostProblems(Config("shm", 4096 * kGiB, false), f).empty());
}

v1::DaemonConfig Shared(uint64_t pool_bytes) {
  v1::DaemonConfig c = Config("shm", pool_bytes, false);
  c.set_pool_shm_name("offloadd-pool");
  return c;
}

// A daemon killed on a shared pool of 16 GiB leaves the object in /dev/shm, which MemAvailable
// no longer counts: the restart adopts it and needs no new memory.
TEST(HostProblems, SurvivingSharedPoolIsNotCountedAgainstMemAvailable) {
  HostFacts f = Roomy();
  f.mem_available_bytes = 6 * kGiB;
  f.shared_pool.exists = true;
  f.shared_pool.size_bytes = 16 * kGiB + (4 << 20);
  f.shared_pool.resident_bytes = f.shared_pool.size_bytes;
  EXPECT_TRUE(HostProblems(Shared(16 * kGiB), f).empty());
  // Without the object the same pool would not fit: the fresh-pool check still applies.
  f.shared_pool = pool::SharedPoolObject{};
  ASSERT_EQ(HostProblems(Shared(16 * kGiB), f).size(), 1u);
}

TEST(HostProblems, PartlyResidentObjectAdviceNeverLosesBlocks) {
  HostFacts f = Roomy();
  f.mem_available_bytes = 2 * kGiB;
  f.shared_pool.exists = true;
  f.shared_pool.size_bytes = 16 * kGiB;
  f.shared_pool.resident_bytes = 12 * kGiB;
  auto problems = HostProblems(Shared(16 * kGiB), f);
  ASSERT_EQ(problems.size(), 1u);
  const std::string m(problems[0].message());
  EXPECT_EQ(problems[0].code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(m.find("holds 12288 MiB of the pool's 16384 MiB already"), std::string::npos) << m;
  EXPECT_NE(m.find("the other 4096 MiB are more than MemAvailable, 2048 MiB"), std::string::npos)
      << m;
  EXPECT_NE(m.find("free host memory"), std::string::npos) << m;
  EXPECT_EQ(m.find("Lower the pool size"), std::string::npos) << m;
}

TEST(HostProblems, ObjectStartUpWouldRefuseIsAProblem) {
  HostFacts f = Roomy();
  f.shared_pool.exists = true;
  f.shared_pool.usable = absl::FailedPreconditionError("set pool_bytes back");
  auto problems = HostProblems(Shared(kGiB), f);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].message(), "set pool_bytes back");
}

TEST(HostNotes, HugePagesTheSharedPoolCannotGet) {
  HostFacts f = Roomy();
  f.shm_huge_pages = absl::FailedPreconditionError("huge=never");
  v1::DaemonConfig c = Shared(kGiB);
  EXPECT_TRUE(HostNotes(c, f).empty());  // pool_huge_pages not set
  c.set_pool_huge_pages(true);
  ASSERT_EQ(HostNotes(c, f).size(), 1u);
  EXPECT_EQ(HostNotes(c, f)[0], "huge=never");
  c.clear_pool_shm_name();  // an anonymous pool gets transparent huge pages by madvise
  EXPECT_TRUE(HostNotes(c, f).empty());
}

TEST(CheckSpillDirectory, WritableMissingAndRefused) {
  char tmpl[] = "/tmp/ofd-spillcheck-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  EXPECT_TRUE(CheckSpillDirectory(dir).ok());
  EXPECT_TRUE(CheckSpillDirectory(dir + "/spill").ok()) << "created by the daemon";
  absl::Status deep = CheckSpillDirectory(dir + "/a/spill");
  EXPECT_EQ(deep.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(deep.message().find("its parent " + dir + "/a does not exist"), std::string::npos)
      << deep;
  { std::ofstream(dir + "/file") << "x"; }
  EXPECT_NE(CheckSpillDirectory(dir + "/file").message().find("is not a directory"),
            std::string::npos);
  // A read-only file system (EROFS, the unit's ProtectSystem=strict): tests/monitoring
  // test_manifests and tests/systemd check that message with a real read-only mount.
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST(HostProblems, SpillDirectoryComesLast) {
  HostFacts f = Roomy();
  f.mem_available_bytes = 1 * kGiB;
  f.spill_directory = absl::FailedPreconditionError("read-only");
  auto problems = HostProblems(Config("shm", 2 * kGiB, false), f);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[1].message(), "read-only");
}

// A spill_directory that is a file was named twice: by the host check and by the spill tier's.
TEST(HostProblems, ASpillDirectoryThatIsAFileIsOneProblem) {
  char tmpl[] = "/tmp/ofd-hostcheck-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string file = std::string(tmpl) + "/file";
  { std::ofstream(file) << "x"; }
  v1::DaemonConfig c = Config("shm", 1 * kGiB, false);
  c.set_spill_directory(file);
  HostFacts f = Roomy();
  f.spill_directory = CheckSpillDirectory(file);
  const auto problems = HostProblems(c, f);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].message(), "spill_directory " + file + ": " + file +
                                       " is not a directory");
  std::error_code ignored;
  std::filesystem::remove_all(tmpl, ignored);
}

class SocketPath : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ofd-hostcheck-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  // A Unix socket bound at `path`; listening when `listen_too`.
  int Bind(const std::string& path, bool listen_too) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    if (listen_too) {
      EXPECT_EQ(listen(fd, 1), 0);
    }
    return fd;
  }
  std::string dir_;
};

TEST_F(SocketPath, FreePathsPass) {
  EXPECT_TRUE(CheckSocketPath(dir_ + "/d.sock").ok());
  EXPECT_TRUE(CheckSocketPath(dir_ + "/to/be/made/d.sock").ok());  // the daemon creates them
}

TEST_F(SocketPath, ListeningDaemonIsAlreadyExists) {
  const std::string path = dir_ + "/d.sock";
  int fd = Bind(path, /*listen_too=*/true);
  absl::Status st = CheckSocketPath(path);
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;
  EXPECT_NE(st.message().find("another offloadd is already listening on " + path),
            std::string::npos);
  close(fd);
  // Closed without unlinking: a stale socket, which the daemon replaces.
  EXPECT_TRUE(CheckSocketPath(path).ok());
}

TEST_F(SocketPath, WrongThingsAtThePath) {
  const std::string file = dir_ + "/plain";
  std::ofstream(file) << "x";
  EXPECT_EQ(CheckSocketPath(file).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckSocketPath(file + "/d.sock").code(), absl::StatusCode::kFailedPrecondition);
  absl::Status long_path = CheckSocketPath(dir_ + "/" + std::string(120, 'a'));
  EXPECT_EQ(long_path.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(long_path.message().find("limited to 107"), std::string::npos) << long_path;
}

TEST(HostProblems, MetricsAddressAnotherProcessListensOnIsAProblemWithItsRemedy) {
  std::string address;
  const int fd = metrics::ListenOnLoopback(&address);
  ASSERT_GE(fd, 0);
  v1::DaemonConfig config = Config("shm", 1 * kGiB, false);
  config.set_metrics_address(address);
  const HostFacts facts = ReadHostFacts(config, /*cuda_in_build=*/false);
  auto problems = HostProblems(config, Roomy());
  EXPECT_TRUE(problems.empty());  // Roomy() has no metrics fact: only ReadHostFacts probes
  HostFacts f = Roomy();
  f.metrics_address = facts.metrics_address;
  problems = HostProblems(config, f);
  ASSERT_EQ(problems.size(), 1u);
  const std::string message(problems[0].message());
  EXPECT_NE(message.find("cannot serve metrics on " + config.metrics_address() +
                         ": the address is in use"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("--metrics_address= to serve no metrics"), std::string::npos) << message;
  close(fd);
  // Free again: the probe itself leaves nothing bound.
  EXPECT_TRUE(ReadHostFacts(config, false).metrics_address.ok());
  EXPECT_TRUE(ReadHostFacts(config, false).metrics_address.ok());
}

TEST(CudaDriver, ProbeSaysWhatIsMissingOrPasses) {
  absl::Status st = ProbeCudaDriver();
  if (!st.ok()) {
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find("backend \"cuda\""), std::string::npos) << st;
  }
}

TEST(Capabilities, RaiseIpcLockAgreesWithTheEffectiveSet) {
  // Root (or a file capability) ends with CAP_IPC_LOCK effective; others without it get false.
  EXPECT_EQ(RaiseIpcLockCapability(), pool::MemlockPrivileged() || geteuid() == 0);
}

}  // namespace
}  // namespace offloadd
