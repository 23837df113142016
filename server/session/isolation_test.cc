// Isolation and failure handling in the session layer, without gRPC: peer credentials and the
// access policy, Hello's pid binding (including PID namespaces through a fake /proc), the
// in-flight request limit, max_sessions, the per-uid quota at the session level, sessions ended
// from the daemon's side, and the pid watcher (pidfd and /proc fallback) ending a session whose
// process exited.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "common/base/clock.h"
#include "common/base/fake_clock.h"
#include "gtest/gtest.h"
#include "server/copy/shm/shm_engine.h"
#include "server/session/peer.h"
#include "server/session/pid_watcher.h"
#include "server/session/session.h"

namespace offloadd::session {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

bool WaitFor(const std::function<bool()>& pred, double seconds = 15) {
  return base::PollUntil(pred, seconds);
}

// A child process that sleeps until killed.
pid_t SpawnSleeper() {
  pid_t pid = fork();
  if (pid == 0) {
    while (true) pause();
  }
  return pid;
}

void KillAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  int status;
  waitpid(pid, &status, 0);
}

struct Collected {
  std::mutex mu;
  std::vector<Completion> got;
  std::vector<absl::Status> stream_ends;
  Session::Emit emit() {
    return [this](Completion c) {
      std::lock_guard<std::mutex> lock(mu);
      got.push_back(std::move(c));
    };
  }
  Session::EndStream end() {
    return [this](const absl::Status& s) {
      std::lock_guard<std::mutex> lock(mu);
      stream_ends.push_back(s);
    };
  }
  std::optional<Completion> Find(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& c : got) {
      if (c.request_id == id) return c;
    }
    return std::nullopt;
  }
  Completion Wait(uint64_t id) {
    EXPECT_TRUE(WaitFor([&] { return Find(id).has_value(); })) << "no completion " << id;
    return Find(id).value_or(Completion{});
  }
};

std::unique_ptr<Core> MakeCore(CoreOptions o = {}, uint64_t pool_bytes = 16 * kMiB) {
  pool::ArenaOptions a;
  a.size_bytes = pool_bytes;
  o.chunk_bytes = 1 * kMiB;
  o.store.admission_deadline_seconds = 0.1;
  return std::make_unique<Core>(o, *pool::Arena::Create(a),
                                std::make_unique<copy::ShmCopyEngine>());
}

Request Hello(uint64_t id, uint32_t pid) {
  Request r;
  r.request_id = id;
  r.kind = RequestKind::kHello;
  r.client_name = "iso";
  r.device_id = "gpu0";
  r.pid = pid;
  return r;
}

PeerCredentials Peer(int32_t pid, uint32_t uid = 1000, uint32_t gid = 1000) {
  PeerCredentials p;
  p.known = true;
  p.pid = pid;
  p.uid = uid;
  p.gid = gid;
  return p;
}

class Shm {
 public:
  explicit Shm(uint64_t size) : size(size) {
    static int n = 0;
    name = "/offloadd-iso-" + std::to_string(getpid()) + "-" + std::to_string(n++);
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_EQ(ftruncate(fd, size), 0);
    close(fd);
  }
  ~Shm() { shm_unlink(name.c_str()); }
  std::string name;
  uint64_t size;
};

TEST(PeerTest, ReadsOwnCredentialsFromASocketPair) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  auto p = ReadPeerCredentials(fds[0]);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->known);
  EXPECT_EQ(p->pid, getpid());
  EXPECT_EQ(p->uid, geteuid());
  EXPECT_EQ(p->gid, getegid());
  close(fds[0]);
  close(fds[1]);
  EXPECT_EQ(ReadPeerCredentials(-1).status().code(), absl::StatusCode::kInternal);
}

TEST(PeerTest, AllowListsByUidPrimaryOrSupplementaryGroup) {
  AccessPolicy open;
  EXPECT_TRUE(CheckPeerAllowed(open, Peer(1, 1000, 1000)).ok());
  AccessPolicy p;
  p.allowed_uids = {1001};
  p.allowed_gids = {2000};
  EXPECT_TRUE(CheckPeerAllowed(p, Peer(1, 1001, 5)).ok());
  EXPECT_TRUE(CheckPeerAllowed(p, Peer(1, 7, 2000)).ok());
  PeerCredentials supplementary = Peer(1, 7, 5);
  supplementary.groups = {9, 2000};
  EXPECT_TRUE(CheckPeerAllowed(p, supplementary).ok());
  absl::Status denied = CheckPeerAllowed(p, Peer(1, 7, 5));
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(std::string(denied.message()).find("uid 7"), std::string::npos) << denied;
  EXPECT_TRUE(CheckPeerAllowed(p, PeerCredentials{}).ok());  // unknown: nothing to check
}

TEST(PeerTest, AdminIsRootTheDaemonUidOrConfigured) {
  AccessPolicy p;
  p.admin_uids = {4242};
  EXPECT_TRUE(IsAdmin(p, Peer(1, 0)));
  EXPECT_TRUE(IsAdmin(p, Peer(1, geteuid())));
  EXPECT_TRUE(IsAdmin(p, Peer(1, 4242)));
  if (geteuid() != 4243) {
    EXPECT_FALSE(IsAdmin(p, Peer(1, 4243)));
  }
  EXPECT_FALSE(IsAdmin(p, PeerCredentials{}));
}

TEST(PeerTest, HelloPidMustNameThePeerInEitherPidNamespace) {
  // A fake /proc: pid 123 in the daemon's namespace is pid 7 inside its container.
  std::string root = "/tmp/ofd-proc-" + std::to_string(getpid());
  ASSERT_EQ(mkdir(root.c_str(), 0700), 0);
  ASSERT_EQ(mkdir((root + "/123").c_str(), 0700), 0);
  std::ofstream(root + "/123/status") << "Name:\tpython3\nPid:\t123\nNSpid:\t123\t7\n";
  PeerCredentials peer = Peer(123);
  EXPECT_TRUE(CheckHelloPid(peer, 123, root).ok());
  EXPECT_TRUE(CheckHelloPid(peer, 7, root).ok());
  EXPECT_TRUE(CheckHelloPid(peer, 0, root).ok());
  // A peer the daemon's PID namespace cannot see (SO_PEERCRED pid 0): Hello's pid is taken.
  EXPECT_TRUE(CheckHelloPid(Peer(0), 4321, root).ok());
  absl::Status st = CheckHelloPid(peer, 8, root);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(std::string(st.message()).find("pid 8"), std::string::npos) << st;
  auto pids = NamespacePids(123, root);
  ASSERT_TRUE(pids.ok());
  EXPECT_EQ(*pids, (std::vector<int32_t>{123, 7}));
  EXPECT_EQ(NamespacePids(124, root).status().code(), absl::StatusCode::kNotFound);
  std::error_code ignored;
  std::filesystem::remove_all(root, ignored);
  // The real /proc: this process has an NSpid line ending with its own pid.
  auto own = NamespacePids(getpid());
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->front(), getpid());
}

TEST(PeerTest, SharedMemoryOfAnotherUidIsRefused) {
  std::string dir = "/tmp/ofd-shm-" + std::to_string(getpid());
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  std::ofstream(dir + "/mine") << "x";
  const uint32_t me = geteuid();
  EXPECT_TRUE(CheckShmOwner(Peer(1, me), "/mine", dir).ok());
  EXPECT_TRUE(CheckShmOwner(Peer(1, 0), "/mine", dir).ok());         // root may
  EXPECT_TRUE(CheckShmOwner(PeerCredentials{}, "/mine", dir).ok());  // unknown: not checked
  EXPECT_TRUE(CheckShmOwner(Peer(1, me + 1), "/absent", dir).ok());  // engine says NOT_FOUND
  absl::Status st = CheckShmOwner(Peer(1, me + 1), "/mine", dir);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(std::string(st.message()).find("belongs to uid"), std::string::npos) << st;
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST(SessionIsolationTest, HelloFromAnotherPidOrAUidNotAllowedIsDenied) {
  CoreOptions o;
  o.access.allowed_uids = {1000};
  auto core = MakeCore(o);
  Collected c;
  auto s = Session::Create(core.get(), c.emit(), Peer(getpid(), 1000));
  s->Handle(Hello(1, getpid() + 1));
  EXPECT_EQ(c.Wait(1).status.code(), absl::StatusCode::kPermissionDenied);
  s->Handle(Hello(2, 0));  // 0 = the peer's pid
  Completion ok = c.Wait(2);
  EXPECT_EQ(ok.kind, CompletionKind::kHello) << ok.status;
  EXPECT_EQ(s->info().pid, static_cast<uint32_t>(getpid()));
  EXPECT_EQ(s->info().uid, 1000u);
  s->Close(EndCause::kClosed);

  Collected c2;
  auto other = Session::Create(core.get(), c2.emit(), Peer(getpid(), 1001));
  other->Handle(Hello(1, getpid()));
  Completion denied = c2.Wait(1);
  EXPECT_EQ(denied.status.code(), absl::StatusCode::kPermissionDenied);
  other->Handle(Request{});  // still no session: requests before a hello are refused
  EXPECT_EQ(c2.Wait(0).status.code(), absl::StatusCode::kFailedPrecondition);
  other->Close(EndCause::kClosed);
}

TEST(SessionIsolationTest, MaxSessionsRefusesTheNextHelloUntilOneCloses) {
  CoreOptions o;
  o.max_sessions = 1;
  auto core = MakeCore(o);
  Collected a, b;
  auto s1 = Session::Create(core.get(), a.emit());
  auto s2 = Session::Create(core.get(), b.emit());
  s1->Handle(Hello(1, getpid()));
  EXPECT_EQ(a.Wait(1).kind, CompletionKind::kHello);
  s2->Handle(Hello(1, getpid()));
  EXPECT_EQ(b.Wait(1).status.code(), absl::StatusCode::kResourceExhausted);
  s1->Close(EndCause::kClosed);
  s2->Handle(Hello(2, getpid()));
  EXPECT_EQ(b.Wait(2).kind, CompletionKind::kHello);
  s2->Close(EndCause::kClosed);
}

TEST(SessionIsolationTest, MaxSessionsPerUidKeepsSlotsForOtherUidsAndAdmins) {
  CoreOptions o;
  o.max_sessions = 8;
  o.max_sessions_per_uid = 1;
  auto core = MakeCore(o);
  Collected a, b, c, d;
  auto first = Session::Create(core.get(), a.emit(), Peer(getpid(), 1000));
  auto second = Session::Create(core.get(), b.emit(), Peer(getpid(), 1000));
  auto other = Session::Create(core.get(), c.emit(), Peer(getpid(), 1001));
  auto admin = Session::Create(core.get(), d.emit(), Peer(getpid(), 0));
  first->Handle(Hello(1, getpid()));
  EXPECT_EQ(a.Wait(1).kind, CompletionKind::kHello);
  second->Handle(Hello(1, getpid()));
  Completion refused = b.Wait(1);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(refused.status.message()).find("max_sessions_per_uid"),
            std::string::npos);
  EXPECT_NE(std::string(refused.status.message()).find("uid 1000 already has 1 session open"),
            std::string::npos)
      << refused.status.message();
  other->Handle(Hello(1, getpid()));
  EXPECT_EQ(c.Wait(1).kind, CompletionKind::kHello);   // another uid still gets in
  admin->Handle(Hello(1, getpid()));
  EXPECT_EQ(d.Wait(1).kind, CompletionKind::kHello);   // admins count only in the total
  first->Close(EndCause::kClosed);
  second->Handle(Hello(2, getpid()));
  EXPECT_EQ(b.Wait(2).kind, CompletionKind::kHello);   // the uid's slot came back
  for (auto& s : {second, other, admin}) s->Close(EndCause::kClosed);
}

TEST(SessionIsolationTest, NewDeviceIdsBeyondMaxLinksAndLongNamesAreRefused) {
  CoreOptions o;
  o.max_links = 2;
  auto core = MakeCore(o);
  // Two links in use by open sessions (a link no session uses would make room).
  Collected ca, cb;
  auto a = Session::Create(core.get(), ca.emit());
  auto b = Session::Create(core.get(), cb.emit());
  Request hello = Hello(1, getpid());
  hello.device_id = "gpu-a";
  a->Handle(hello);
  ASSERT_EQ(ca.Wait(1).kind, CompletionKind::kHello);
  hello.device_id = "gpu-b";
  b->Handle(hello);
  ASSERT_EQ(cb.Wait(1).kind, CompletionKind::kHello);
  core->LinkFor("gpu-a");
  core->LinkFor("gpu-b");
  Collected c;
  auto s = Session::Create(core.get(), c.emit());
  hello.device_id = "gpu-c";
  s->Handle(hello);
  Completion refused = c.Wait(1);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(refused.status.message()).find("max_links"), std::string::npos);
  hello.request_id = 2;
  hello.device_id = std::string(kMaxNameBytes + 1, 'g');
  s->Handle(hello);
  EXPECT_EQ(c.Wait(2).status.code(), absl::StatusCode::kInvalidArgument);
  hello.request_id = 3;
  hello.device_id = "gpu-b";  // an existing link is fine
  s->Handle(hello);
  EXPECT_EQ(c.Wait(3).kind, CompletionKind::kHello);
  s->Close(EndCause::kClosed);
  a->Close(EndCause::kClosed);
  b->Close(EndCause::kClosed);
}

// max_links used to be checked at Hello but links are made at the first transfer,
// so Hellos for new devices that all arrived before any copy were all admitted, and their first
// offloads then made more links than max_links allowed.
TEST(SessionIsolationTest, ConcurrentHellosForNewDevicesCannotExceedMaxLinks) {
  CoreOptions o;
  o.max_links = 2;
  auto core = MakeCore(o);
  constexpr int kSessions = 6;
  Shm shm(1 * kMiB);
  std::vector<std::unique_ptr<Collected>> collected;
  std::vector<std::shared_ptr<Session>> sessions;
  for (int i = 0; i < kSessions; ++i) {
    collected.push_back(std::make_unique<Collected>());
    sessions.push_back(Session::Create(core.get(), collected.back()->emit()));
  }
  std::vector<std::thread> hellos;
  for (int i = 0; i < kSessions; ++i) {
    hellos.emplace_back([&, i] {
      Request hello = Hello(1, getpid());
      hello.device_id = "gpu-" + std::to_string(i);
      sessions[i]->Handle(hello);
    });
  }
  for (auto& t : hellos) t.join();
  int admitted = 0;
  for (int i = 0; i < kSessions; ++i) {
    Completion c = collected[i]->Wait(1);
    if (c.kind != CompletionKind::kHello) {
      EXPECT_EQ(c.status.code(), absl::StatusCode::kResourceExhausted) << c.status;
      continue;
    }
    ++admitted;
    Request reg;
    reg.request_id = 2;
    reg.kind = RequestKind::kRegisterRegion;
    reg.region.shm_name = shm.name;
    reg.region.size_bytes = shm.size;
    sessions[i]->Handle(reg);
    ASSERT_EQ(collected[i]->Wait(2).kind, CompletionKind::kRegionRegistered);
    Request off;
    off.request_id = 3;
    off.kind = RequestKind::kOffload;
    off.region_id = collected[i]->Wait(2).id;
    off.bytes = 4096;
    sessions[i]->Handle(off);
    EXPECT_EQ(collected[i]->Wait(3).kind, CompletionKind::kOffloadDone);
  }
  EXPECT_EQ(admitted, 2);
  EXPECT_EQ(core->Stats().links.size(), 2u);
  for (auto& s : sessions) s->Close(EndCause::kClosed);
}

TEST(SessionIsolationTest, ASessionsEndReturnsItsClaimOnALinkNeverMade) {
  CoreOptions o;
  o.max_links = 1;
  auto core = MakeCore(o);
  Collected a, b;
  auto first = Session::Create(core.get(), a.emit());
  auto second = Session::Create(core.get(), b.emit());
  Request hello = Hello(1, getpid());
  hello.device_id = "gpu-a";
  first->Handle(hello);
  ASSERT_EQ(a.Wait(1).kind, CompletionKind::kHello);
  hello.device_id = "gpu-b";
  second->Handle(hello);
  EXPECT_EQ(b.Wait(1).status.code(), absl::StatusCode::kResourceExhausted);
  first->Close(EndCause::kClosed);  // gpu-a never copied: its slot comes back
  hello.request_id = 2;
  second->Handle(hello);
  EXPECT_EQ(b.Wait(2).kind, CompletionKind::kHello);
  second->Close(EndCause::kClosed);
}

TEST(SessionIsolationTest, RequestsBeyondTheInFlightLimitAreRefusedAtOnce) {
  CoreOptions o;
  o.max_requests_in_flight = 4;
  o.store.admission_queue_limit = 100;
  auto core = MakeCore(o, 4 * kMiB);
  Shm shm(8 * kMiB);
  Collected c;
  auto s = Session::Create(core.get(), c.emit());
  s->Handle(Hello(1, getpid()));
  ASSERT_EQ(c.Wait(1).kind, CompletionKind::kHello);
  Request reg;
  reg.request_id = 2;
  reg.kind = RequestKind::kRegisterRegion;
  reg.region.shm_name = shm.name;
  reg.region.size_bytes = shm.size;
  s->Handle(reg);
  uint64_t region = c.Wait(2).id;
  // Fill the pool, then queue offloads that wait for space (admission deadline 0.1 s).
  auto offload = [&](uint64_t id, uint64_t bytes) {
    Request r;
    r.request_id = id;
    r.kind = RequestKind::kOffload;
    r.region_id = region;
    r.bytes = bytes;
    s->Handle(r);
  };
  offload(10, 4 * kMiB);
  ASSERT_EQ(c.Wait(10).kind, CompletionKind::kOffloadDone);
  for (uint64_t id = 11; id <= 14; ++id) offload(id, kMiB);  // 4 waiting = the limit
  EXPECT_EQ(s->info().requests_in_flight, 4u);
  offload(15, kMiB);
  Completion refused = c.Wait(15);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(refused.status.message()).find("max_requests_in_flight"),
            std::string::npos);
  // The waiting ones time out (pool full); then the count is back to 0 and requests flow.
  for (uint64_t id = 11; id <= 14; ++id) {
    EXPECT_EQ(c.Wait(id).status.code(), absl::StatusCode::kResourceExhausted);
  }
  EXPECT_TRUE(WaitFor([&] { return s->info().requests_in_flight == 0; }));
  Request release;
  release.request_id = 16;
  release.kind = RequestKind::kRelease;
  release.block_id = c.Wait(10).id;
  s->Handle(release);
  EXPECT_EQ(c.Wait(16).kind, CompletionKind::kReleased);
  s->Close(EndCause::kClosed);
}

TEST(SessionIsolationTest, EndSessionReleasesEverythingAndEndsTheStream) {
  auto core = MakeCore();
  Shm shm(4 * kMiB);
  Collected c;
  const uint32_t uid = geteuid();  // owns the shm object
  auto s = Session::Create(core.get(), c.emit(), Peer(getpid(), uid), c.end());
  s->Handle(Hello(1, getpid()));
  ASSERT_EQ(c.Wait(1).kind, CompletionKind::kHello);
  Request reg;
  reg.request_id = 2;
  reg.kind = RequestKind::kRegisterRegion;
  reg.region.shm_name = shm.name;
  reg.region.size_bytes = shm.size;
  s->Handle(reg);
  Request off;
  off.request_id = 3;
  off.kind = RequestKind::kOffload;
  off.region_id = c.Wait(2).id;
  off.bytes = 3 * kMiB;
  s->Handle(off);
  ASSERT_EQ(c.Wait(3).kind, CompletionKind::kOffloadDone);
  EXPECT_EQ(core->Stats().uid_used_bytes[uid], 3 * kMiB);
  auto ended = core->EndSession(s->id(), EndCause::kAdmin, absl::AbortedError("by test"));
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->blocks, 1u);
  EXPECT_EQ(ended->used_bytes, 3 * kMiB);
  EXPECT_TRUE(s->closed());
  EXPECT_EQ(core->store().stats().pool.used_bytes, 0u);
  EXPECT_TRUE(core->Stats().uid_used_bytes.empty());
  ASSERT_EQ(c.stream_ends.size(), 1u);
  EXPECT_EQ(c.stream_ends[0].code(), absl::StatusCode::kAborted);
  // A second end, or a stream close afterwards, changes nothing.
  EXPECT_EQ(
      core->EndSession(s->id(), EndCause::kAdmin, absl::AbortedError("again")).status().code(),
      absl::StatusCode::kNotFound);
  s->Close(EndCause::kCrashed);
  EXPECT_EQ(c.stream_ends.size(), 1u);
  EXPECT_EQ(core->EndSession(999999, EndCause::kAdmin, absl::AbortedError("x")).status().code(),
            absl::StatusCode::kNotFound);
}

void ExpectSessionEndsWhenItsProcessExits(bool force_proc_polling) {
  pid_t child = SpawnSleeper();
  ASSERT_GT(child, 0);
  base::FakeClock clock(100);
  CoreOptions o;
  o.pid_exit_grace_seconds = 5;
  o.pid_poll_interval_seconds = 0.05;
  o.hello_timeout_seconds = 0;  // this test moves time; no Hello deadline
  o.clock = &clock;
  auto core = MakeCore(o);
  Collected c;
  // The session's peer is the child (as if it had connected), the stream stays open.
  auto s = Session::Create(core.get(), c.emit(), Peer(child, 0), c.end());
  s->Handle(Hello(1, 0));
  ASSERT_EQ(c.Wait(1).kind, CompletionKind::kHello);
  EXPECT_EQ(core->pids_watched(), 1u);
  EXPECT_FALSE(s->closed());
  KillAndReap(child);
  // Time moves only here, 0.1 s per look: the session ends after the 5 s grace on the Core's
  // clock, without the test waiting for it in real time.
  EXPECT_TRUE(WaitFor([&] {
    if (s->closed()) return true;
    clock.Advance(0.1);
    return false;
  })) << "session not ended after its pid exited";
  EXPECT_GE(clock.NowSeconds(), 105.0);
  // The stream's end is handed over by the closing thread after closed() reads true.
  EXPECT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(c.mu);
    return !c.stream_ends.empty();
  })) << "the stream was not ended";
  std::lock_guard<std::mutex> lock(c.mu);
  ASSERT_EQ(c.stream_ends.size(), 1u);
  EXPECT_EQ(c.stream_ends[0].code(), absl::StatusCode::kAborted);
  EXPECT_EQ(core->pids_watched(), 0u);
  (void)force_proc_polling;
}

TEST(SessionIsolationTest, SessionEndsWhenItsProcessExitsWhileTheStreamLingers) {
  ExpectSessionEndsWhenItsProcessExits(false);
}

TEST(PidWatcherTest, ReportsExitsThroughPidfdAndThroughProcPolling) {
  for (bool polling : {false, true}) {
    std::mutex mu;
    std::vector<uint64_t> exited;
    PidWatcher w(
        0.0, 0.05,
        [&](uint64_t key) {
          std::lock_guard<std::mutex> lock(mu);
          exited.push_back(key);
        },
        polling);
    pid_t a = SpawnSleeper(), b = SpawnSleeper();
    w.Watch(1, a);
    w.Watch(2, b);
    EXPECT_EQ(w.polled(), polling ? 2u : 0u);
    KillAndReap(a);
    EXPECT_TRUE(WaitFor([&] {
      std::lock_guard<std::mutex> lock(mu);
      return !exited.empty();
    })) << "polling="
        << polling;
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(exited, std::vector<uint64_t>{1});
    }
    EXPECT_EQ(w.watched(), 1u);
    w.Unwatch(2);
    KillAndReap(b);
    // A pid that does not exist (b, reaped) is reported as exited at once.
    w.Watch(3, b);
    EXPECT_TRUE(WaitFor([&] {
      std::lock_guard<std::mutex> lock(mu);
      return exited.size() == 2;
    }));
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(exited.back(), 3u);
  }
}

TEST(PidWatcherTest, UnwatchDuringTheGraceCancelsTheReport) {
  base::FakeClock clock(100);
  std::mutex mu;
  std::vector<std::pair<uint64_t, double>> reports;  // (key, clock seconds)
  PidWatcher w(
      1.0, 0.05,
      [&](uint64_t key) {
        std::lock_guard<std::mutex> lock(mu);
        reports.emplace_back(key, clock.NowSeconds());
      },
      /*force_proc_polling=*/false, &clock);
  pid_t a = SpawnSleeper(), b = SpawnSleeper();
  w.Watch(1, a);
  w.Watch(2, b);  // the control: its report shows the grace has passed
  KillAndReap(a);
  KillAndReap(b);
  ASSERT_TRUE(WaitFor([&] { return w.exits_pending() == 2; }));  // both noticed at 100 s
  w.Unwatch(1);
  clock.Advance(1.1);
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(mu);
    return !reports.empty();
  }));
  std::lock_guard<std::mutex> lock(mu);
  // Key 1 had the same deadline as key 2, so it would be in the same pass: only 2 is.
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].first, 2u);
  EXPECT_GE(reports[0].second, 101.0);
  EXPECT_EQ(w.watched(), 0u);
}

TEST(PidWatcherTest, StartTicksOfThisProcessAndOfNone) {
  EXPECT_GT(PidWatcher::ProcessStartTicks(getpid()), 0u);
  pid_t a = SpawnSleeper();
  KillAndReap(a);
  EXPECT_EQ(PidWatcher::ProcessStartTicks(a), 0u);
}

}  // namespace
}  // namespace offloadd::session
