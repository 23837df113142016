#include "server/spill/disk_io.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace offloadd::spill {
namespace {

// Reads a 5 MiB + 4 KiB file (six pieces, the last one short) through each implementation and
// checks that the pieces it reports tile the buffer exactly once and that each piece's bytes
// are already the file's when it is reported (the stage-back checksums them at that moment).
class DiskIoTest : public ::testing::TestWithParam<bool> {};

TEST_P(DiskIoTest, ReadReportsEveryPieceOnceWithItsBytesInPlace) {
  const char* tmp = getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/disk_io_" +
                           (GetParam() ? "uring" : "posix");
  const uint64_t len = (5ull << 20) + 4096;
  std::vector<uint8_t> want(len);
  std::mt19937 rng(7);
  for (auto& b : want) b = static_cast<uint8_t>(rng());
  const int wfd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(wfd, 0);
  ASSERT_EQ(pwrite(wfd, want.data(), len, 0), static_cast<ssize_t>(len));
  close(wfd);
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << path << " does not take O_DIRECT";
  std::string why_not;
  std::unique_ptr<DiskIo> io = MakeDiskIo(GetParam(), &why_not);
  if (GetParam() && std::string(io->name()) != "io_uring") GTEST_SKIP() << why_not;
  void* buf = nullptr;
  // One page more than the file: the second read asks for it (and must fail).
  ASSERT_EQ(posix_memalign(&buf, kDirectAlignment, len + 4096), 0);
  memset(buf, 0, len + 4096);
  std::map<uint64_t, uint64_t> pieces;
  uint64_t matching = 0;
  const DiskIo::PieceRead on_piece = [&](uint64_t start, uint64_t n) {
    EXPECT_TRUE(pieces.emplace(start, n).second) << "piece at " << start << " twice";
    if (memcmp(static_cast<uint8_t*>(buf) + start, want.data() + start, n) == 0) matching += n;
  };
  ASSERT_TRUE(io->Read(fd, buf, len, 0, &on_piece).ok());
  uint64_t at = 0;
  for (const auto& [start, n] : pieces) {
    EXPECT_EQ(start, at);
    at = start + n;
  }
  EXPECT_EQ(at, len);
  EXPECT_EQ(matching, len);
  EXPECT_EQ(pieces.size(), GetParam() ? 6u : 1u);
  EXPECT_EQ(memcmp(buf, want.data(), len), 0);
  // A read past the file's end fails and reports none of its pieces as read.
  pieces.clear();
  EXPECT_EQ(io->Read(fd, buf, len + 4096, 0, &on_piece).code(), absl::StatusCode::kDataLoss);
  EXPECT_LE(pieces.size(), GetParam() ? 5u : 0u);
  for (const auto& [start, n] : pieces) EXPECT_LT(start + n, len + 1);
  free(buf);
  close(fd);
  unlink(path.c_str());
}

// While one call holds the only io_uring ring (a read of a pipe nobody has written yet), a second
// call that cannot create a ring of its own (no file descriptor left) still reads its bytes, through
// pread, instead of failing a stage-back.
TEST(DiskIoRingPool, ACallThatCannotGetARingReadsThroughPread) {
  std::string why_not;
  std::unique_ptr<DiskIo> io = MakeDiskIo(true, &why_not);
  if (std::string(io->name()) != "io_uring") GTEST_SKIP() << why_not;
  const char* tmp = getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/disk_io_pool";
  std::vector<uint8_t> want(1 << 20);
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<uint8_t>(i * 7 + 1);
  const int wfd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(wfd, 0);
  ASSERT_EQ(pwrite(wfd, want.data(), want.size(), 0), static_cast<ssize_t>(want.size()));
  close(wfd);
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << path << " does not take O_DIRECT";
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  std::atomic<bool> started{false};
  absl::Status held;
  std::thread holder([&] {
    std::vector<uint8_t> b(4096);
    started = true;
    held = io->Read(pipefd[0], b.data(), b.size(), 0, nullptr);  // until the pipe has data
  });
  while (!started) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // holder's ring is in use
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  const int lowest_free = dup(0);
  ASSERT_GE(lowest_free, 0);
  close(lowest_free);
  struct rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(lowest_free);  // no descriptor left for a new ring
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  void* buf = nullptr;
  ASSERT_EQ(posix_memalign(&buf, kDirectAlignment, want.size()), 0);
  uint64_t reported = 0;
  const DiskIo::PieceRead on_piece = [&](uint64_t, uint64_t n) { reported += n; };
  const absl::Status st = io->Read(fd, buf, want.size(), 0, &on_piece);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  std::vector<uint8_t> wake(4096, 1);
  ASSERT_EQ(write(pipefd[1], wake.data(), wake.size()), 4096);
  holder.join();
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(memcmp(buf, want.data(), want.size()), 0);
  EXPECT_EQ(reported, want.size());
  EXPECT_TRUE(held.ok()) << held;
  free(buf);
  close(fd);
  close(pipefd[0]);
  close(pipefd[1]);
  unlink(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Io, DiskIoTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "io_uring" : "posix"; });

}  // namespace
}  // namespace offloadd::spill
