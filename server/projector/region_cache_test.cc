#include "server/projector/region_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/copy/shm/shm_engine.h"

namespace offloadd::projector {
namespace {

// Unique per process even across Bazel sandboxes, whose PID namespaces may repeat pids while
// they share /dev/shm and /tmp.
std::string UniqueTag() {
  static const std::string tag = [] {
    std::random_device rd;
    return std::to_string(getpid()) + "-" + std::to_string(rd() % 1000000000u);
  }();
  return tag;
}

// A shm object of `bytes` filled with `fill`; unlinked by the destructor.
class TestShm {
 public:
  TestShm(uint64_t bytes, uint8_t fill) : name_(NewName()), bytes_(bytes) { Create(fill); }
  ~TestShm() { shm_unlink(name_.c_str()); }
  void Create(uint8_t fill) {
    int fd = shm_open(name_.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, bytes_), 0);
    std::vector<uint8_t> data(bytes_, fill);
    EXPECT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
    close(fd);
  }
  void Unlink() { shm_unlink(name_.c_str()); }
  copy::RegionSpec Spec() const {
    copy::RegionSpec s;
    s.shm_name = name_;
    s.size_bytes = bytes_;
    s.device_id = "cpu";
    return s;
  }

 private:
  static std::string NewName() {
    static int n = 0;
    return "/ofd-rc-" + UniqueTag() + "-" + std::to_string(n++);
  }
  std::string name_;
  uint64_t bytes_;
};

uint8_t FirstByte(RegionCache::Opened& o) {
  uint8_t b = 0;
  EXPECT_TRUE(o.engine->CopyChunk(copy::Direction::kDeviceToHost, *o.region, 0, &b, 1).ok());
  return b;
}

class RegionCacheTest : public ::testing::Test {
 protected:
  RegionCache Make(size_t max_entries = 16, double idle = 60) {
    RegionCacheOptions o;
    o.max_entries = max_entries;
    o.idle_seconds = idle;
    o.now_seconds = [this] { return now_; };
    return RegionCache(&engine_, nullptr, o);
  }
  copy::ShmCopyEngine engine_;
  double now_ = 1000;
};

TEST_F(RegionCacheTest, RepeatedOpensOfOneHandleMapItOnce) {
  TestShm shm(4096, 7);
  RegionCache cache = Make();
  for (int i = 0; i < 5; ++i) {
    auto o = cache.Open(shm.Spec());
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(FirstByte(*o), 7);
    EXPECT_EQ(o->owner_uid, static_cast<int64_t>(getuid()));
  }
  EXPECT_EQ(cache.opens_total(), 1u);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(engine_.handle_counts()["cpu"].open, 1u);
}

TEST_F(RegionCacheTest, LeastRecentlyUsedIsClosedBeyondTheBound) {
  TestShm a(4096, 1), b(4096, 2), c(4096, 3);
  RegionCache cache = Make(/*max_entries=*/2);
  ASSERT_TRUE(cache.Open(a.Spec()).ok());
  ASSERT_TRUE(cache.Open(b.Spec()).ok());
  ASSERT_TRUE(cache.Open(a.Spec()).ok());  // a is now the most recent
  ASSERT_TRUE(cache.Open(c.Spec()).ok());  // closes b
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.opens_total(), 3u);
  EXPECT_EQ(engine_.handle_counts()["cpu"].open, 2u);
  ASSERT_TRUE(cache.Open(a.Spec()).ok());
  EXPECT_EQ(cache.opens_total(), 3u);  // a was still cached
  ASSERT_TRUE(cache.Open(b.Spec()).ok());
  EXPECT_EQ(cache.opens_total(), 4u);  // b had been closed
}

TEST_F(RegionCacheTest, IdleEntriesAreClosed) {
  TestShm a(4096, 1), b(4096, 2);
  RegionCache cache = Make(16, /*idle=*/30);
  ASSERT_TRUE(cache.Open(a.Spec()).ok());
  now_ += 31;
  ASSERT_TRUE(cache.Open(b.Spec()).ok());
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(engine_.handle_counts()["cpu"].open, 1u);
}

TEST_F(RegionCacheTest, ARemovedObjectIsNotFoundAndAReplacedOneIsReopened) {
  TestShm shm(4096, 5);
  RegionCache cache = Make();
  auto first = cache.Open(shm.Spec());
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(FirstByte(*first), 5);
  // Same name, new object: the old mapping must not be served.
  shm.Unlink();
  shm.Create(9);
  auto second = cache.Open(shm.Spec());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(FirstByte(*second), 9);
  EXPECT_EQ(cache.opens_total(), 2u);
  shm.Unlink();
  auto gone = cache.Open(shm.Spec());
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  EXPECT_EQ(cache.size(), 0u);
}

TEST_F(RegionCacheTest, DeclaredSizeBeyondTheObjectIsOutOfRange) {
  TestShm shm(4096, 1);
  RegionCache cache = Make();
  copy::RegionSpec spec = shm.Spec();
  spec.size_bytes = 8192;
  auto o = cache.Open(spec);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kOutOfRange) << o.status();
}

TEST_F(RegionCacheTest, CudaHandleWithoutACudaEngineIsFailedPrecondition) {
  RegionCache cache = Make();
  copy::RegionSpec spec;
  spec.cuda_ipc_handle = std::string(64, '\1');
  spec.size_bytes = 1 << 20;
  auto o = cache.Open(spec);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kFailedPrecondition) << o.status();
  EXPECT_NE(o.status().message().find("cuda"), std::string::npos);
}

}  // namespace
}  // namespace offloadd::projector
