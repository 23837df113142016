#include "server/spill/spill_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/base/crc32c.h"

namespace offloadd::spill {
namespace {

constexpr uint64_t kPoolBytes = 32ull << 20;

class SpillTierTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const char* tmp = getenv("TEST_TMPDIR");
    dir_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/spill_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::string clean = dir_;
    for (size_t i = clean.rfind("spill_"); i < clean.size(); ++i) {
      if (clean[i] == '/') clean[i] = '_';
    }
    dir_ = clean;
    if (!SpillTier::DirectIoSupported(dir_)) GTEST_SKIP() << dir_ << " does not take O_DIRECT";
    ASSERT_EQ(posix_memalign(reinterpret_cast<void**>(&pool_), 4096, kPoolBytes), 0);
    memset(pool_, 0, kPoolBytes);
  }
  void TearDown() override { free(pool_); }

  std::unique_ptr<SpillTier> Make(uint64_t capacity = 64ull << 20, double rate = -1,
                                  uint32_t threads = 2, bool checksums = true) {
    SpillOptions o;
    o.directory = dir_;
    o.capacity_bytes = capacity;
    o.bytes_per_second = rate;
    o.io_uring = GetParam();
    o.chunk_bytes = 1 << 20;
    o.io_threads = threads;
    o.checksums = checksums;
    auto tier = SpillTier::Create(o, pool_, kPoolBytes);
    EXPECT_TRUE(tier.ok()) << tier.status();
    return tier.ok() ? *std::move(tier) : nullptr;
  }
  void Fill(pool::Extent e, uint32_t seed) {
    std::mt19937 rng(seed);
    for (uint64_t i = 0; i < e.bytes; ++i) pool_[e.offset + i] = static_cast<uint8_t>(rng());
  }
  bool Matches(pool::Extent e, uint32_t seed) {
    std::mt19937 rng(seed);
    for (uint64_t i = 0; i < e.bytes; ++i) {
      if (pool_[e.offset + i] != static_cast<uint8_t>(rng())) return false;
    }
    return true;
  }
  static absl::Status Wait(const std::function<void(SpillTier::Done)>& start) {
    auto p = std::make_shared<std::promise<absl::Status>>();
    auto f = p->get_future();
    // Moved, not copied: the last reference to an error's payload then dies on this thread
    // (TSan cannot see the refcount of the uninstrumented Abseil and reports its free).
    start([p](absl::Status st) { p->set_value(std::move(st)); });
    return f.get();
  }
  absl::Status SpillBlock(SpillTier& t, uint64_t id, pool::Extent e) {
    return Wait([&](SpillTier::Done d) { t.Spill(id, e, "s1", std::move(d)); });
  }
  absl::Status StageBlock(SpillTier& t, uint64_t id, pool::Extent e) {
    return Wait(
        [&](SpillTier::Done d) { t.Stage(id, e, DiskClass::kUrgent, "s1", std::move(d)); });
  }

  // Holds the tier's only I/O worker inside the completion of a spill (block 99, pool bytes
  // [28 MiB, +2 MiB): two chunks, so it is not copied inline on this thread) until the returned promise is set: whatever is submitted meanwhile is
  // queued, so the order the worker then takes it in depends on the scheduler only, not on
  // how fast this thread submits (a loaded machine reordered a paced version of these tests).
  // Needs a tier without checksums: with them a transfer reports from a checksum thread once
  // its last CRC is in, so the completion would not hold the I/O worker, and reports could
  // overtake one another (these tests read the link's order from them).
  std::shared_ptr<std::promise<void>> HoldWorker(SpillTier& t) {
    auto release = std::make_shared<std::promise<void>>();
    auto entered = std::make_shared<std::promise<void>>();
    std::shared_future<void> go = release->get_future().share();
    t.Spill(99, pool::Extent{28ull << 20, 2 << 20}, "hold", [entered, go](absl::Status st) {
      EXPECT_TRUE(st.ok()) << st;
      entered->set_value();
      go.wait();
    });
    entered->get_future().wait();
    return release;
  }

  std::string dir_;
  uint8_t* pool_ = nullptr;
};

TEST_P(SpillTierTest, SpillAndStageBackAreBitExact) {
  auto tier = Make();
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().io, GetParam() ? "io_uring" : "posix");
  // Aligned extent of 3 MiB + 512 bytes: whole chunks go direct, the tail through the bounce.
  const pool::Extent e{8192, (3ull << 20) + 512};
  Fill(e, 7);
  ASSERT_TRUE(tier->TryReserve(e.bytes));
  ASSERT_TRUE(SpillBlock(*tier, 42, e).ok());
  struct stat st;
  ASSERT_EQ(stat(tier->FilePath(42).c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), SpillTier::FileBytes(e.bytes));
  memset(pool_ + e.offset, 0, e.bytes);
  // Staged into another extent: the bytes land there exactly.
  const pool::Extent back{16ull << 20, e.bytes};
  ASSERT_TRUE(StageBlock(*tier, 42, back).ok());
  EXPECT_TRUE(Matches(back, 7));
  EXPECT_EQ(pool_[back.offset + back.bytes], 0);  // nothing written past the extent
  SpillStats s = tier->stats();
  EXPECT_EQ(s.spill_bytes_total, SpillTier::FileBytes(e.bytes));
  EXPECT_EQ(s.stage_bytes_total, SpillTier::FileBytes(e.bytes));
  EXPECT_EQ(s.used_bytes, SpillTier::FileBytes(e.bytes));
  tier->Remove(42, e.bytes);
  EXPECT_EQ(tier->stats().used_bytes, 0u);
  EXPECT_NE(stat(tier->FilePath(42).c_str(), &st), 0);
}

TEST_P(SpillTierTest, UnalignedExtentGoesThroughTheBounceBuffer) {
  auto tier = Make();
  ASSERT_NE(tier, nullptr);
  const pool::Extent e{256, (2ull << 20) + 256};
  Fill(e, 11);
  ASSERT_TRUE(SpillBlock(*tier, 7, e).ok());
  memset(pool_ + e.offset, 0xee, e.bytes);
  ASSERT_TRUE(StageBlock(*tier, 7, e).ok());
  EXPECT_TRUE(Matches(e, 11));
}

TEST_P(SpillTierTest, CapacityIsReservedBeforeSpilling) {
  // A file is a 4096-byte header, then the extent rounded up to 4096.
  EXPECT_EQ(SpillTier::FileBytes(4096 + 256), 3u * 4096);
  EXPECT_EQ(SpillTier::FileBytes(100), 2u * 4096);
  auto tier = Make(/*capacity=*/5 * 4096);
  ASSERT_NE(tier, nullptr);
  EXPECT_TRUE(tier->TryReserve(4096 + 256));  // 3 x 4096 on disk
  EXPECT_FALSE(tier->TryReserve(4097));       // 3 x 4096 more do not fit
  EXPECT_TRUE(tier->TryReserve(100));         // 2 x 4096 do
  EXPECT_EQ(tier->stats().used_bytes, 5u * 4096);
  tier->Remove(1, 4096 + 256);
  EXPECT_TRUE(tier->TryReserve(4097));
}

TEST_P(SpillTierTest, RemovedFileIsDataLossForThatBlockOnly) {
  auto tier = Make();
  ASSERT_NE(tier, nullptr);
  const pool::Extent a{0, 1 << 20}, b{1 << 20, 1 << 20};
  Fill(a, 1);
  Fill(b, 2);
  ASSERT_TRUE(SpillBlock(*tier, 1, a).ok());
  ASSERT_TRUE(SpillBlock(*tier, 2, b).ok());
  memset(pool_, 0, 2 << 20);
  ASSERT_EQ(unlink(tier->FilePath(1).c_str()), 0);
  absl::Status lost = StageBlock(*tier, 1, a);
  EXPECT_EQ(lost.code(), absl::StatusCode::kDataLoss) << lost;
  EXPECT_NE(std::string(lost.message()).find("removed"), std::string::npos) << lost;
  ASSERT_TRUE(StageBlock(*tier, 2, b).ok());
  EXPECT_TRUE(Matches(b, 2));
}

TEST_P(SpillTierTest, TruncatedFileIsDataLoss) {
  auto tier = Make();
  ASSERT_NE(tier, nullptr);
  const pool::Extent a{0, 2 << 20};
  Fill(a, 3);
  ASSERT_TRUE(SpillBlock(*tier, 5, a).ok());
  ASSERT_EQ(truncate(tier->FilePath(5).c_str(), 1 << 20), 0);
  absl::Status lost = StageBlock(*tier, 5, a);
  EXPECT_EQ(lost.code(), absl::StatusCode::kDataLoss) << lost;
  EXPECT_NE(std::string(lost.message()).find("truncated"), std::string::npos) << lost;
}

// Rewrites [offset, offset + bytes) of `path` with `bytes` copies of `value` (or, value < 0,
// with the bytes at the same place in `from`), and syncs it.
static void Damage(const std::string& path, off_t offset, size_t bytes, int value,
                   const std::string& from = "") {
  std::vector<uint8_t> buf(bytes, static_cast<uint8_t>(value));
  if (value < 0) {
    const int src = open(from.c_str(), O_RDONLY);
    ASSERT_GE(src, 0);
    ASSERT_EQ(pread(src, buf.data(), bytes, offset), static_cast<ssize_t>(bytes));
    close(src);
  }
  const int fd = open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(pwrite(fd, buf.data(), bytes, offset), static_cast<ssize_t>(bytes));
  ASSERT_EQ(fsync(fd), 0);
  close(fd);
}

// Eight damaged or misplaced files, eight DATA_LOSS stage-backs, never wrong bytes with OK; the
// undamaged block still comes back bit-exact.
TEST_P(SpillTierTest, DamagedSwappedOrReplacedFilesAreDataLossNeverWrongBytes) {
  auto tier = Make();
  ASSERT_NE(tier, nullptr);
  constexpr uint64_t kBlock = 1 << 20;
  constexpr uint64_t kBlocks = 10;  // 8 damaged, 2 as sources and a control
  for (uint64_t id = 1; id <= kBlocks; ++id) {
    const pool::Extent e{(id - 1) * kBlock, kBlock};
    Fill(e, static_cast<uint32_t>(id));
    ASSERT_TRUE(SpillBlock(*tier, id, e).ok());
  }
  const auto path = [&](uint64_t id) { return tier->FilePath(id); };
  const off_t data = static_cast<off_t>(SpillTier::kHeaderBytes);
  Damage(path(1), data + 12345, 1, 0x5a);               // one byte changed inside
  Damage(path(2), data, 4096, 0);                        // the data's first 4 KiB zeroed
  Damage(path(3), 0, 4096, 0);                           // the file's first 4 KiB zeroed
  Damage(path(4), data + kBlock - 1, 1, 0xa5);          // the last byte changed
  ASSERT_EQ(rename(path(5).c_str(), (dir_ + "/swap").c_str()), 0);  // 5 and 6 swapped
  ASSERT_EQ(rename(path(6).c_str(), path(5).c_str()), 0);
  ASSERT_EQ(rename((dir_ + "/swap").c_str(), path(6).c_str()), 0);
  Damage(path(7), 0, SpillTier::FileBytes(kBlock), -1, path(9));  // replaced by block 9's
  Damage(path(8), data, kBlock, -1, path(9));            // data replaced, header kept
  memset(pool_, 0, kPoolBytes);
  int lost = 0;
  for (uint64_t id = 1; id <= 8; ++id) {
    const pool::Extent e{(id - 1) * kBlock, kBlock};
    absl::Status st = StageBlock(*tier, id, e);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << "block " << id << ": " << st;
    EXPECT_NE(std::string(st.message()).find(path(id)), std::string::npos) << st;
    lost += st.code() == absl::StatusCode::kDataLoss;
  }
  EXPECT_EQ(lost, 8);
  const pool::Extent control{9 * kBlock, kBlock};
  ASSERT_TRUE(StageBlock(*tier, 10, control).ok());
  EXPECT_TRUE(Matches(control, 10));
}

// A spill file replaced by a symbolic link is not followed (DATA_LOSS); a link planted where a
// file is about to be spilled is replaced, and its target is never written.
TEST_P(SpillTierTest, SymbolicLinksAreNeverFollowed) {
  auto tier = Make();
  ASSERT_NE(tier, nullptr);
  const pool::Extent a{0, 1 << 20}, b{1 << 20, 1 << 20};
  Fill(a, 1);
  Fill(b, 2);
  ASSERT_TRUE(SpillBlock(*tier, 1, a).ok());
  ASSERT_TRUE(SpillBlock(*tier, 2, b).ok());
  ASSERT_EQ(rename(tier->FilePath(1).c_str(), (dir_ + "/elsewhere").c_str()), 0);
  ASSERT_EQ(symlink((dir_ + "/elsewhere").c_str(), tier->FilePath(1).c_str()), 0);
  absl::Status st = StageBlock(*tier, 1, a);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(std::string(st.message()).find("symbolic link"), std::string::npos) << st;

  const std::string victim = dir_ + "/victim";
  {
    const int fd = open(victim.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, "keep", 4), 4);
    close(fd);
  }
  ASSERT_EQ(symlink(victim.c_str(), tier->FilePath(3).c_str()), 0);
  ASSERT_TRUE(SpillBlock(*tier, 3, b).ok());
  struct stat st_victim, st_file;
  ASSERT_EQ(stat(victim.c_str(), &st_victim), 0);
  EXPECT_EQ(st_victim.st_size, 4);
  ASSERT_EQ(lstat(tier->FilePath(3).c_str(), &st_file), 0);
  EXPECT_TRUE(S_ISREG(st_file.st_mode));
  memset(pool_ + b.offset, 0, b.bytes);
  ASSERT_TRUE(StageBlock(*tier, 3, b).ok());
  EXPECT_TRUE(Matches(b, 2));
  unlink(victim.c_str());
  unlink((dir_ + "/elsewhere").c_str());
}

// A directory others can write, or owned by another uid, is refused at start-up and by
// CheckDirectory (--check-config); the daemon's own 0700 directory is accepted.
TEST_P(SpillTierTest, ADirectoryOthersCanWriteIsRefused) {
  EXPECT_TRUE(SpillTier::CheckDirectory(dir_).ok());
  ASSERT_EQ(chmod(dir_.c_str(), 0777), 0);
  EXPECT_EQ(SpillTier::CheckDirectory(dir_).code(), absl::StatusCode::kFailedPrecondition);
  SpillOptions o;
  o.directory = dir_;
  o.capacity_bytes = 64 << 20;
  o.bytes_per_second = -1;
  auto refused = SpillTier::Create(o, pool_, kPoolBytes);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(refused.status().message()).find("mode 0777"), std::string::npos)
      << refused.status();
  ASSERT_EQ(chmod(dir_.c_str(), 0720), 0);  // group-writable
  EXPECT_FALSE(SpillTier::Create(o, pool_, kPoolBytes).ok());
  ASSERT_EQ(chmod(dir_.c_str(), 0700), 0);
  const uid_t me = geteuid();
  if (chown(dir_.c_str(), me == 65534 ? 65533 : 65534, static_cast<gid_t>(-1)) == 0) {
    // Another owner (only where this test may chown: root outside a user namespace).
    EXPECT_EQ(SpillTier::CheckDirectory(dir_).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(SpillTier::Create(o, pool_, kPoolBytes).ok());
    ASSERT_EQ(chown(dir_.c_str(), me, static_cast<gid_t>(-1)), 0);
  }
  EXPECT_TRUE(SpillTier::Create(o, pool_, kPoolBytes).ok());
}

TEST_P(SpillTierTest, FilesOfAPreviousDaemonAreKeptUntilAdoptedThenOrphansRemoved) {
  {
    auto tier = Make();
    ASSERT_NE(tier, nullptr);
    for (uint64_t id : {7, 8, 9}) ASSERT_TRUE(SpillBlock(*tier, id, pool::Extent{0, 4096}).ok());
  }
  ASSERT_EQ(truncate((dir_ + "/0000000000000008.spill").c_str(), 100), 0);
  struct stat st;
  auto tier = Make();
  ASSERT_NE(tier, nullptr);
  ASSERT_EQ(stat((dir_ + "/0000000000000009.spill").c_str(), &st), 0);  // Create keeps them
  EXPECT_TRUE(tier->AdoptFile(9, 4096).ok());
  EXPECT_EQ(tier->AdoptFile(8, 4096).code(), absl::StatusCode::kDataLoss);  // short
  EXPECT_EQ(tier->AdoptFile(5, 4096).code(), absl::StatusCode::kDataLoss);  // missing
  EXPECT_EQ(tier->stats().used_bytes, 3u * SpillTier::FileBytes(4096));  // Remove returns it
  EXPECT_EQ(tier->RemoveFilesExcept({9, 8, 5}), 1);  // block 7's file: no record names it
  EXPECT_NE(stat((dir_ + "/0000000000000007.spill").c_str(), &st), 0);
  EXPECT_EQ(stat((dir_ + "/0000000000000009.spill").c_str(), &st), 0);
  ASSERT_TRUE(StageBlock(*tier, 9, pool::Extent{0, 4096}).ok());
}

// A second daemon on the same directory would take the first one's files for leftovers and
// remove them (found by the attack round: 14 spilled blocks lost): it is refused, and the
// directory is free again once the first tier is gone. The first tier's file is untouched.
TEST_P(SpillTierTest, ASecondTierOnTheSameDirectoryIsRefused) {
  auto first = Make();
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(SpillBlock(*first, 3, pool::Extent{0, 4096}).ok());
  SpillOptions o;
  o.directory = dir_;
  o.capacity_bytes = 1 << 20;
  o.bytes_per_second = -1;
  o.io_uring = GetParam();
  auto second = SpillTier::Create(o, pool_, kPoolBytes);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use by another offloadd"), std::string::npos)
      << second.status();
  struct stat st;
  EXPECT_EQ(stat((dir_ + "/0000000000000003.spill").c_str(), &st), 0);
  first.reset();
  auto third = SpillTier::Create(o, pool_, kPoolBytes);
  EXPECT_TRUE(third.ok()) << third.status();
}

// The header's own CRC32C is no secret: a header rewritten to say "no data checksum" (flags 0,
// header CRC recomputed) over changed data is still DATA_LOSS, since this tier wrote the file
// with a checksum.
TEST_P(SpillTierTest, AHeaderRewrittenToCarryNoChecksumIsNotBelieved) {
  auto tier = Make();
  ASSERT_NE(tier, nullptr);
  const pool::Extent e{0, 2 << 20};
  Fill(e, 3);
  ASSERT_TRUE(tier->TryReserve(e.bytes));
  ASSERT_TRUE(SpillBlock(*tier, 77, e).ok());
  const std::string path = tier->FilePath(77);
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t h[40];
  ASSERT_EQ(pread(fd, h, sizeof(h), 0), 40);
  const uint32_t no_flags = 0;
  memcpy(h + 12, &no_flags, 4);  // SpillHeader::flags
  const uint32_t header_crc = base::Crc32c(h, 36);
  memcpy(h + 36, &header_crc, 4);  // SpillHeader::header_crc
  ASSERT_EQ(pwrite(fd, h, sizeof(h), 0), 40);
  const std::vector<uint8_t> junk(4096, 0x11);
  ASSERT_EQ(pwrite(fd, junk.data(), junk.size(), SpillTier::kHeaderBytes + 8192), 4096);
  ASSERT_EQ(fsync(fd), 0);
  close(fd);
  memset(pool_, 0, e.bytes);
  const absl::Status st = StageBlock(*tier, 77, e);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(std::string(st.message()).find("header was rewritten"), std::string::npos) << st;
  // The same file adopted by the next daemon (the rewrite happened while none ran: no CRC of
  // it is remembered anywhere but the header) is not believed either.
  tier.reset();
  auto next = Make();
  ASSERT_NE(next, nullptr);
  ASSERT_TRUE(next->AdoptFile(77, e.bytes).ok());
  const absl::Status adopted = StageBlock(*next, 77, e);
  EXPECT_EQ(adopted.code(), absl::StatusCode::kDataLoss) << adopted;
}

TEST_P(SpillTierTest, AnExtentPastThePoolIsRefusedEvenWhenItsEndWrapsAround) {
  auto tier = Make();
  ASSERT_NE(tier, nullptr);
  const pool::Extent wraps{~uint64_t{0} - 4095, 8192};  // offset + bytes wraps to 4096
  EXPECT_EQ(Wait([&](SpillTier::Done d) { tier->Spill(5, wraps, "s1", std::move(d)); }).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Wait([&](SpillTier::Done d) {
              tier->Stage(5, wraps, DiskClass::kUrgent, "s1", std::move(d));
            }).code(),
            absl::StatusCode::kInvalidArgument);
  const pool::Extent too_big{0, kPoolBytes + 4096};
  EXPECT_EQ(Wait([&](SpillTier::Done d) { tier->Spill(6, too_big, "s1", std::move(d)); }).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(SpillTierTest, CheckConfigNotesAMissingDirectoryAndOneARunningTierHolds) {
  const std::string missing = dir_ + "/not_yet";
  EXPECT_TRUE(SpillTier::CheckDirectory(missing).ok());
  EXPECT_NE(SpillTier::DirectoryNote(missing).find("does not exist yet"), std::string::npos)
      << SpillTier::DirectoryNote(missing);
  struct stat st;
  EXPECT_NE(stat(missing.c_str(), &st), 0);  // the note creates nothing
  {
    auto tier = Make();
    ASSERT_NE(tier, nullptr);
    const std::string note = SpillTier::DirectoryNote(dir_);
    EXPECT_NE(note.find("in use by a running offloadd"), std::string::npos) << note;
    EXPECT_NE(note.find(dir_ + "/offloadd.lock"), std::string::npos) << note;
  }
  EXPECT_EQ(SpillTier::DirectoryNote(dir_), "");  // the lock went with the tier
  auto again = Make();  // and the note's own look at the lock left it free
  EXPECT_NE(again, nullptr);
}

// A lock file start-up could not open or lock fails the check (it passed, then start-up
// refused); a fifo there does not hang it.
TEST_P(SpillTierTest, CheckConfigRefusesALockFileThatIsNotARegularFile) {
  const std::string lock = dir_ + "/offloadd.lock";
  unlink(lock.c_str());
  ASSERT_EQ(mkfifo(lock.c_str(), 0600), 0);
  absl::Status st = SpillTier::CheckDirectory(dir_);  // returns: no open waits for a writer
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(std::string(st.message()).find("not a regular file"), std::string::npos) << st;
  EXPECT_EQ(SpillTier::DirectoryNote(dir_), "");
  unlink(lock.c_str());
  ASSERT_EQ(symlink("/etc/hostname", lock.c_str()), 0);
  EXPECT_EQ(SpillTier::CheckDirectory(dir_).code(), absl::StatusCode::kFailedPrecondition);
  unlink(lock.c_str());
  ASSERT_EQ(mkdir(lock.c_str(), 0700), 0);
  EXPECT_EQ(SpillTier::CheckDirectory(dir_).code(), absl::StatusCode::kFailedPrecondition);
  rmdir(lock.c_str());
  EXPECT_TRUE(SpillTier::CheckDirectory(dir_).ok());  // missing: start-up creates it
}

TEST_P(SpillTierTest, UrgentStageGoesBeforeQueuedSpills) {
  // One worker, held while six spills and then an urgent stage are queued: the urgent stage
  // goes first.
  auto tier = Make(64ull << 20, -1, /*threads=*/1, /*checksums=*/false);
  ASSERT_NE(tier, nullptr);
  Fill({20ull << 20, 1 << 20}, 5);
  ASSERT_TRUE(SpillBlock(*tier, 100, {20ull << 20, 1 << 20}).ok());
  std::mutex mu;
  std::vector<std::string> order;
  std::vector<std::future<void>> waits;
  auto note = [&](std::string what) {
    auto p = std::make_shared<std::promise<void>>();
    waits.push_back(p->get_future());
    return [&mu, &order, what, p](absl::Status st) {
      EXPECT_TRUE(st.ok()) << st;
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(what);
      }
      p->set_value();
    };
  };
  auto release = HoldWorker(*tier);
  for (int i = 0; i < 6; ++i) {
    tier->Spill(200 + i, {static_cast<uint64_t>(i) << 20, 1 << 20}, "s1",
                note("spill" + std::to_string(i)));
  }
  tier->Stage(100, {24ull << 20, 1 << 20}, DiskClass::kUrgent, "s2", note("urgent"));
  release->set_value();
  for (auto& w : waits) w.wait();
  ASSERT_EQ(order.size(), 7u);
  EXPECT_EQ(order[0], "urgent") << "the urgent stage waited behind queued spills";
  for (int i = 0; i < 6; ++i) EXPECT_EQ(order[1 + i], "spill" + std::to_string(i));
  EXPECT_TRUE(Matches({24ull << 20, 1 << 20}, 5));
}

TEST_P(SpillTierTest, PromotedPrefetchStageOvertakesQueuedStagesAndSpills) {
  // One worker, held while four PREFETCH stages, three spills and a last PREFETCH stage are
  // queued: the last stage, promoted, goes first.
  auto tier = Make(64ull << 20, -1, /*threads=*/1, /*checksums=*/false);
  ASSERT_NE(tier, nullptr);
  for (uint64_t b = 0; b < 5; ++b) {
    const pool::Extent e{(20 + b) << 20, 1 << 20};
    Fill(e, 10 + b);
    ASSERT_TRUE(SpillBlock(*tier, 100 + b, e).ok());
  }
  std::mutex mu;
  std::vector<std::string> order;
  std::vector<std::future<void>> waits;
  auto note = [&](std::string what) {
    auto p = std::make_shared<std::promise<void>>();
    waits.push_back(p->get_future());
    return [&mu, &order, what, p](absl::Status st) {
      EXPECT_TRUE(st.ok()) << st;
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(what);
      }
      p->set_value();
    };
  };
  auto release = HoldWorker(*tier);
  for (uint64_t b = 0; b < 4; ++b) {
    tier->Stage(100 + b, {b << 20, 1 << 20}, DiskClass::kPrefetch, "s" + std::to_string(b),
                note("prefetch" + std::to_string(b)));
  }
  for (int i = 0; i < 3; ++i) {
    tier->Spill(200 + i, {static_cast<uint64_t>(8 + i) << 20, 1 << 20}, "s9",
                note("spill" + std::to_string(i)));
  }
  tier->Stage(104, {12ull << 20, 1 << 20}, DiskClass::kPrefetch, "s4", note("promoted"));
  tier->Promote(104);
  release->set_value();
  for (auto& w : waits) w.wait();
  ASSERT_EQ(order.size(), 8u);
  EXPECT_EQ(order[0], "promoted") << "the promoted stage waited behind queued stages and spills";
  EXPECT_TRUE(Matches({12ull << 20, 1 << 20}, 14));
  for (uint64_t b = 0; b < 4; ++b) EXPECT_TRUE(Matches({b << 20, 1 << 20}, 10 + b)) << b;
}

// A Promote that comes before its Stage reaches the disk link (the store promotes under its
// lock, the stage is submitted after it) makes that stage URGENT.
TEST_P(SpillTierTest, PromoteBeforeTheStageIsSubmittedMakesItUrgent) {
  auto tier = Make(64ull << 20, -1, /*threads=*/1, /*checksums=*/false);
  ASSERT_NE(tier, nullptr);
  Fill({20ull << 20, 1 << 20}, 3);
  ASSERT_TRUE(SpillBlock(*tier, 100, {20ull << 20, 1 << 20}).ok());
  tier->Promote(100);
  ASSERT_TRUE(Wait([&](SpillTier::Done d) {
                tier->Stage(100, {0, 1 << 20}, DiskClass::kPrefetch, "s1", std::move(d));
              }).ok());
  const SpillStats s = tier->stats();
  EXPECT_EQ(s.link.class_bytes[static_cast<int>(sched::TrafficClass::kUrgent)], 1u << 20);
  EXPECT_EQ(s.link.class_bytes[static_cast<int>(sched::TrafficClass::kPrefetch)], 0u);
  EXPECT_TRUE(Matches({0, 1 << 20}, 3));
}

TEST(SpillTierCreate, RefusesEmptyDirectory) {
  uint8_t pool[4096];
  auto tier = SpillTier::Create(SpillOptions{}, pool, sizeof(pool));
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SpillTierCreate, MeasuresBandwidthWhenNotGiven) {
  const char* tmp = getenv("TEST_TMPDIR");
  SpillOptions o;
  o.directory = std::string(tmp != nullptr ? tmp : "/tmp") + "/spill_measure";
  o.capacity_bytes = 1 << 30;
  o.measure_bytes = 4 << 20;
  if (!SpillTier::DirectIoSupported(o.directory)) GTEST_SKIP() << "no O_DIRECT here";
  std::vector<uint8_t> pool(4096);
  auto tier = SpillTier::Create(o, pool.data(), pool.size());
  ASSERT_TRUE(tier.ok()) << tier.status();
  EXPECT_TRUE((*tier)->stats().bytes_per_second_measured);
  EXPECT_GT((*tier)->stats().bytes_per_second, 0);
}

TEST(SpillTierCreate, RefusesADirectoryWithoutDirectIo) {
  // tmpfs (/dev/shm) refuses O_DIRECT on kernels before 6.6; where it takes it, nothing to test.
  SpillOptions o;
  o.directory = "/dev/shm/offloadd-spill-test-" + std::to_string(getpid());
  o.capacity_bytes = 1 << 20;
  o.bytes_per_second = -1;
  if (SpillTier::DirectIoSupported(o.directory)) {
    rmdir(o.directory.c_str());
    GTEST_SKIP() << "this kernel's tmpfs takes O_DIRECT";
  }
  uint8_t pool[4096];
  auto tier = SpillTier::Create(o, pool, sizeof(pool));
  rmdir(o.directory.c_str());
  ASSERT_EQ(tier.status().code(), absl::StatusCode::kFailedPrecondition) << tier.status();
  EXPECT_NE(std::string(tier.status().message()).find("O_DIRECT"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Io, SpillTierTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "io_uring" : "posix"; });

}  // namespace
}  // namespace offloadd::spill
