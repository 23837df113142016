// A daemon killed with SIGKILL while holding blocks in a shared pool; the next daemon adopts
// them and the owner's session resumes with its token: every confirmed block reloads
// bit-exact, a corrupted record's block is reported NOT_FOUND (never served), another uid and a
// forged token are refused. The first daemon runs in a forked child that SIGKILLs itself.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/copy/shm/shm_engine.h"
#include "server/pool/arena.h"
#include "server/session/completion_collector.h"
#include "server/session/session.h"
#include "server/session/session_test_util.h"

namespace offloadd::session {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kPoolBytes = 64 * kMiB;
constexpr int kBlocks = 8;

Request Hello(uint64_t id, const std::string& token) {
  return HelloRequest(id, "resume-test", token);
}

std::unique_ptr<Core> SharedCore(const std::string& pool_name, bool data_checksums = false) {
  pool::ArenaOptions a;
  a.size_bytes = kPoolBytes;
  a.shm_name = pool_name;
  auto arena = pool::Arena::Create(a);
  EXPECT_TRUE(arena.ok()) << arena.status();
  if (!arena.ok()) return nullptr;
  CoreOptions options;
  options.chunk_bytes = kMiB;
  options.resume_grace_seconds = 3600;
  options.watch_pids = false;
  options.pool_data_checksums = data_checksums;
  return std::make_unique<Core>(options, *std::move(arena),
                                std::make_unique<copy::ShmCopyEngine>());
}

PeerCredentials Peer(uint32_t uid) {
  PeerCredentials p;
  p.known = true;
  p.pid = getpid();
  p.uid = uid;
  p.gid = getgid();
  return p;
}

uint64_t BlockBytes(int i) { return kMiB + 4099 * static_cast<uint64_t>(i); }  // not 256-aligned
uint64_t BlockOffset(int i) { return 2 * kMiB * static_cast<uint64_t>(i); }

// What the killed daemon's client learnt: its token and the ids of its confirmed blocks.
struct FirstLife {
  char token[kResumeTokenBytes];
  uint64_t ids[kBlocks];
};

// Child: a daemon with one session that offloads kBlocks blocks (the last one released
// again), reports to the parent, and dies by SIGKILL with everything still open.
[[noreturn]] void RunFirstDaemon(const std::string& pool_name, const TestShm& src,
                                 int report_fd, bool data_checksums = false) {
  auto core = SharedCore(pool_name, data_checksums);
  if (core == nullptr) _exit(2);
  CompletionCollector out;
  auto s = Session::Create(core.get(), out.emit(), Peer(getuid()));
  s->Handle(Hello(1, ""));
  Completion hello = out.Wait(1);
  s->Handle(RegisterRequest(2, src));
  const uint64_t region = out.Wait(2).id;
  FirstLife life{};
  if (hello.resume_token.size() != kResumeTokenBytes) _exit(3);
  std::memcpy(life.token, hello.resume_token.data(), kResumeTokenBytes);
  for (int i = 0; i < kBlocks; ++i) {
    Request r;
    r.request_id = 10 + i;
    r.kind = RequestKind::kOffload;
    r.region_id = region;
    r.offset = BlockOffset(i);
    r.bytes = BlockBytes(i);
    s->Handle(r);
  }
  for (int i = 0; i < kBlocks; ++i) {
    Completion c = out.Wait(10 + i);
    if (c.kind != CompletionKind::kOffloadDone) _exit(4);
    life.ids[i] = c.id;
  }
  Request rel;
  rel.request_id = 30;
  rel.kind = RequestKind::kRelease;
  rel.block_id = life.ids[kBlocks - 1];
  s->Handle(rel);
  if (out.Wait(30).kind != CompletionKind::kReleased) _exit(5);
  if (write(report_fd, &life, sizeof(life)) != static_cast<ssize_t>(sizeof(life))) _exit(6);
  raise(SIGKILL);
  _exit(7);
}

// Flips one byte of the `n`th non-empty record of the pool object (a torn/corrupted record).
void CorruptRecord(const std::string& pool_name, int n) {
  const int fd = shm_open(("/" + pool_name).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  const uint64_t meta = pool::SharedDataOffset(kPoolBytes);
  auto* p = static_cast<uint8_t*>(mmap(nullptr, meta, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  int seen = 0;
  for (uint64_t off = 4096; off + pool::kRecordBytes <= meta; off += pool::kRecordBytes) {
    bool empty = true;
    for (uint64_t i = 0; i < pool::kRecordBytes; ++i) empty = empty && p[off + i] == 0;
    if (empty || seen++ < n) continue;
    p[off + 33] ^= 0x40;  // inside `bytes`
    break;
  }
  munmap(p, meta);
}

// Runs RunFirstDaemon in a forked child and returns what its client learnt.
FirstLife KilledFirstDaemon(const std::string& pool_name, const TestShm& src,
                            bool data_checksums = false) {
  FirstLife life{};
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  EXPECT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    RunFirstDaemon(pool_name, src, fds[1], data_checksums);
  }
  close(fds[1]);
  EXPECT_EQ(read(fds[0], &life, sizeof(life)), static_cast<ssize_t>(sizeof(life)));
  close(fds[0]);
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  return life;
}

// Changes the data of block `block_id` in the pool object, as a stray write or a bad DIMM
// would: XOR `mask` into `bytes` bytes at `offset` of its extent (found through its record).
void ChangeBlockData(const std::string& pool_name, uint64_t block_id, uint64_t offset,
                     uint64_t bytes, uint8_t mask) {
  const int fd = shm_open(("/" + pool_name).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  const uint64_t meta = pool::SharedDataOffset(kPoolBytes), size = meta + kPoolBytes;
  auto* p = static_cast<uint8_t*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  bool found = false;
  for (uint64_t off = 4096; off + pool::kRecordBytes <= meta && !found; off += pool::kRecordBytes) {
    uint64_t id, extent;
    std::memcpy(&id, p + off, 8);
    std::memcpy(&extent, p + off + 24, 8);
    if (id != block_id) continue;
    for (uint64_t i = 0; i < bytes; ++i) p[meta + extent + offset + i] ^= mask;
    found = true;
  }
  munmap(p, size);
  EXPECT_TRUE(found) << "no record names block " << block_id;
}

// An urgent reload of `block_id` into `region` at `offset` that releases the block after.
Request UrgentReloadAndRelease(uint64_t request_id, uint64_t block_id, uint64_t region,
                               uint64_t offset) {
  Request r;
  r.request_id = request_id;
  r.kind = RequestKind::kReload;
  r.block_id = block_id;
  r.region_id = region;
  r.offset = offset;
  r.priority = kPriorityUrgent;
  r.release_after = true;
  return r;
}

// Resumes `life`'s session on `core` and reloads each of its blocks: by block index, "ok"
// (bytes equal to `src`), "wrong bytes" (OK with other bytes) or the error code's name.
std::vector<std::string> ReloadAll(Core* core, const FirstLife& life, const TestShm& src) {
  CompletionCollector out;
  auto s = Session::Create(core, out.emit(), Peer(getuid()));
  s->Handle(Hello(1, std::string(life.token, kResumeTokenBytes)));
  EXPECT_EQ(out.Wait(1).kind, CompletionKind::kHello);
  TestShm dst(src.size);
  s->Handle(RegisterRequest(2, dst));
  const uint64_t region = out.Wait(2).id;
  std::vector<std::string> outcomes;
  for (int i = 0; i < kBlocks; ++i) {
    s->Handle(UrgentReloadAndRelease(100 + i, life.ids[i], region, BlockOffset(i)));
    Completion c = out.Wait(100 + i);
    if (c.kind != CompletionKind::kReloadDone) {
      outcomes.push_back(absl::StatusCodeToString(c.status.code()));
    } else {
      const bool same =
          std::memcmp(dst.data + BlockOffset(i), src.data + BlockOffset(i), BlockBytes(i)) == 0;
      outcomes.push_back(same ? "ok" : "wrong bytes");
    }
  }
  s->Close(EndCause::kClosed);
  return outcomes;
}

// pool_data_checksums: after a SIGKILL, blocks whose bytes changed in the pool (one bit; the
// first 4 KiB zeroed) are dropped at adoption and answer DATA_LOSS; the rest reload bit-exact.
// The same damage without the option is served with OK: the check is what catches it.
TEST(ResumeTest, ChangedDataIsDroppedAtAdoptionWithDataChecksums) {
  for (const bool checksums : {true, false}) {
    SCOPED_TRACE(checksums ? "pool_data_checksums on" : "off");
    const std::string pool_name = UniqueTestName("pool");
    TestShm src(2 * kMiB * kBlocks);
    std::mt19937_64 rng(28);
    for (uint64_t i = 0; i < src.size; ++i) src.data[i] = static_cast<uint8_t>(rng());
    const FirstLife life = KilledFirstDaemon(pool_name, src, checksums);
    ASSERT_FALSE(HasFailure());
    ChangeBlockData(pool_name, life.ids[2], BlockBytes(2) - 1, 1, 0x10);
    ChangeBlockData(pool_name, life.ids[5], 0, 4096, 0xff);
    auto core = SharedCore(pool_name, checksums);
    ASSERT_NE(core, nullptr);
    const pool::AdoptionReport& a = core->adoption();
    EXPECT_EQ(a.dropped[static_cast<int>(pool::DropReason::kData)], checksums ? 2u : 0u);
    EXPECT_EQ(a.data_verified_blocks, checksums ? static_cast<uint64_t>(kBlocks - 3) : 0u);
    EXPECT_EQ(a.data_unchecked_blocks, 0u);
    const std::vector<std::string> outcomes = ReloadAll(core.get(), life, src);
    const std::string changed = checksums ? "DATA_LOSS" : "wrong bytes";
    EXPECT_EQ(outcomes, (std::vector<std::string>{"ok", "ok", changed, "ok", "ok", changed, "ok",
                                                  "NOT_FOUND"}));  // the last: released
    core.reset();
    shm_unlink(("/" + pool_name).c_str());
  }
}

TEST(ResumeTest, BlocksSurviveSigkillAndResumeBitExact) {
  const std::string pool_name = UniqueTestName("pool");
  TestShm src(2 * kMiB * kBlocks);
  std::mt19937_64 rng(15);
  for (uint64_t i = 0; i < src.size; ++i) src.data[i] = static_cast<uint8_t>(rng());
  const FirstLife life = KilledFirstDaemon(pool_name, src);
  ASSERT_FALSE(HasFailure());

  CorruptRecord(pool_name, 2);  // one of the 7 records left (which block is not known here)
  auto core = SharedCore(pool_name);
  ASSERT_NE(core, nullptr);
  EXPECT_EQ(core->adoption().blocks.size(), static_cast<size_t>(kBlocks - 2));
  EXPECT_EQ(core->adoption().dropped[static_cast<int>(pool::DropReason::kChecksum)], 1u);
  EXPECT_EQ(core->store().stats().adopted_blocks_waiting, static_cast<uint64_t>(kBlocks - 2));
  const std::string token(life.token, kResumeTokenBytes);

  CompletionCollector out;
  auto other = Session::Create(core.get(), out.emit(), Peer(getuid() + 1));
  other->Handle(Hello(1, token));
  EXPECT_EQ(out.Wait(1).status.code(), absl::StatusCode::kPermissionDenied);
  auto forged = Session::Create(core.get(), out.emit(), Peer(getuid()));
  std::string wrong = token;
  wrong[0] ^= 1;
  forged->Handle(Hello(2, wrong));
  EXPECT_EQ(out.Wait(2).status.code(), absl::StatusCode::kNotFound);

  auto s = Session::Create(core.get(), out.emit(), Peer(getuid()));
  s->Handle(Hello(3, token));
  Completion hello = out.Wait(3);
  ASSERT_EQ(hello.kind, CompletionKind::kHello) << hello.status;
  EXPECT_EQ(hello.blocks_resumed, static_cast<uint64_t>(kBlocks - 2));
  EXPECT_EQ(hello.resume_token, token);
  TestShm dst(src.size);
  s->Handle(RegisterRequest(4, dst));
  const uint64_t region = out.Wait(4).id;
  int reloaded = 0, released = 0, lost = 0;
  for (int i = 0; i < kBlocks; ++i) {
    s->Handle(UrgentReloadAndRelease(100 + i, life.ids[i], region, BlockOffset(i)));
    Completion c = out.Wait(100 + i);
    if (c.kind == CompletionKind::kReloadDone) {
      ++reloaded;
      EXPECT_EQ(c.bytes, BlockBytes(i));
      EXPECT_EQ(std::memcmp(dst.data + BlockOffset(i), src.data + BlockOffset(i), BlockBytes(i)),
                0)
          << "block " << i;
    } else if (c.status.code() == absl::StatusCode::kNotFound) {
      ++released;
    } else {
      ++lost;
      EXPECT_EQ(c.status.code(), absl::StatusCode::kDataLoss) << "block " << i << c.status;
    }
  }
  EXPECT_EQ(reloaded, kBlocks - 2);
  EXPECT_EQ(released, 1);  // released before the kill: unknown
  EXPECT_EQ(lost, 1);      // the corrupted record's block: known lost
  EXPECT_EQ(core->store().stats().blocks, 0u);
  s->Close(EndCause::kClosed);
  other->Close(EndCause::kClosed);
  forged->Close(EndCause::kClosed);
  s.reset();
  other.reset();
  forged.reset();
  core.reset();
  shm_unlink(("/" + pool_name).c_str());
}

TEST(ResumeTest, NewSessionsGetDistinctRandomTokens) {
  const std::string pool_name = UniqueTestName("pool");
  auto core = SharedCore(pool_name);
  ASSERT_NE(core, nullptr);
  CompletionCollector out;
  auto a = Session::Create(core.get(), out.emit(), Peer(getuid()));
  auto b = Session::Create(core.get(), out.emit(), Peer(getuid()));
  a->Handle(Hello(1, ""));
  b->Handle(Hello(2, ""));
  const std::string ta = out.Wait(1).resume_token, tb = out.Wait(2).resume_token;
  EXPECT_EQ(ta.size(), kResumeTokenBytes);
  EXPECT_EQ(tb.size(), kResumeTokenBytes);
  EXPECT_NE(ta, tb);
  // A token of a live session in this daemon has nothing adopted to resume.
  auto c = Session::Create(core.get(), out.emit(), Peer(getuid()));
  c->Handle(Hello(3, ta));
  EXPECT_EQ(out.Wait(3).status.code(), absl::StatusCode::kNotFound);
  a->Close(EndCause::kClosed);
  b->Close(EndCause::kClosed);
  c->Close(EndCause::kClosed);
  a.reset();
  b.reset();
  c.reset();
  core.reset();
  shm_unlink(("/" + pool_name).c_str());
}

}  // namespace
}  // namespace offloadd::session
