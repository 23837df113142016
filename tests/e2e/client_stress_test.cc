// The C++ client (client/offloadd_client.h) against the real daemon binary the way operators
// and training jobs treat it: SIGKILL and restart under many submitting threads (with and
// without the request ring), Close() while a resume waits for a daemon that is down, a daemon
// killed while a client connects, and clients created and destroyed in a loop (threads and
// file descriptors, from /proc/self).
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "client/offloadd_client.h"
#include "client/shm_region.h"
#include "common/ring_format.h"
#include "gtest/gtest.h"
#include "tests/e2e/child_process.h"

namespace offloadd::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::string UniqueSocketPath() {
  std::string dir = "/tmp/ofd-stress-XXXXXX";  // mkdtemp: pids repeat across Bazel sandboxes
  if (mkdtemp(dir.data()) == nullptr) abort();
  return dir + "/d.sock";
}

std::string UniquePoolName(const std::string& tag) {
  return "offloadd-stress-" + tag + "-" + std::to_string(getpid()) + "-" +
         std::to_string(std::random_device{}());
}

// The daemon binary with its stdout on a pipe; Start() waits for its ready line.
struct Daemon {
  ChildProcess process;
  bool Start(const std::vector<std::string>& args) {
    process = SpawnChild(args);
    return process.pid > 0 && process.ReadLine().find("ready") != std::string::npos;
  }
  int Stop(int sig) {
    process.Signal(sig);
    return process.Wait();
  }
};

std::vector<std::string> SharedPoolArgs(const std::string& socket, const std::string& pool) {
  return {Runfile("server/offloadd"), "--socket_path=" + socket, "--pool_bytes=128MiB",
          "--metrics_address=",       "--pool_shm_name=" + pool, "--resume_grace_seconds=120"};
}

// Options of a client of GPU "gpu0" on `socket`; each test sets what it tries on top.
client::ClientOptions Gpu0Options(const std::string& socket) {
  client::ClientOptions o;
  o.socket_path = socket;
  o.device_id = "gpu0";
  return o;
}

// SIGSTOP, returning once the process is stopped (/proc/<pid>/stat state T): the signal is
// delivered asynchronously, and a daemon still running for a moment would answer requests.
bool Freeze(ChildProcess& p) {
  p.Signal(SIGSTOP);
  for (int i = 0; i < 5000; ++i) {
    FILE* f = fopen(("/proc/" + std::to_string(p.pid) + "/stat").c_str(), "r");
    char state = 0;
    if (f != nullptr) {
      if (fscanf(f, "%*d (%*[^)]) %c", &state) != 1) state = 0;
      fclose(f);
    }
    if (state == 'T' || state == 't') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

size_t CountEntries(const char* dir) {
  size_t n = 0;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// Threads of this process named "offloadd-*": the C++ client's session and ring threads
// (gRPC's own pool grows and shrinks with load, so a count of every thread is only a loose bound).
size_t CountClientThreads() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char name[32] = {};
      const std::string path = std::string("/proc/self/task/") + e->d_name + "/comm";
      if (FILE* f = fopen(path.c_str(), "r")) {
        if (fgets(name, sizeof(name), f) != nullptr && strncmp(name, "offloadd-", 9) == 0) ++n;
        fclose(f);
      }
    }
    closedir(d);
  }
  return n;
}

// Close() while auto_resume waits for a daemon that is down returns within about
// close_timeout_seconds, not after a whole connect attempt (connect_timeout_seconds, here 60 s).
// The pending request fails; the client is closed.
TEST(ClientStressTest, CloseDuringAResumeWithTheDaemonDownReturnsPromptly) {
  const std::string socket = UniqueSocketPath();
  const std::string pool = UniquePoolName("close");
  Daemon d;
  ASSERT_TRUE(d.Start(SharedPoolArgs(socket, pool)));
  client::ClientOptions o = Gpu0Options(socket);
  o.connect_timeout_seconds = 60;
  o.close_timeout_seconds = 1;
  auto cl = client::Client::Connect(o);
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(d.Stop(SIGKILL), 128 + SIGKILL);
  // Issued during the outage: it waits for the resume.
  auto release = (*cl)->Release(12345);
  EXPECT_EQ(release.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  const auto start = std::chrono::steady_clock::now();
  (*cl)->Close();
  const double close_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(close_seconds, 30.0);  // 60 s (a whole connect attempt) before the fix
  ASSERT_EQ(release.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  // As for any Close(): what was pending is CANCELLED, what comes after FAILED_PRECONDITION.
  EXPECT_EQ(release.get().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ((*cl)->stream_status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*cl)->Release(1).get().code(), absl::StatusCode::kFailedPrecondition);
  shm_unlink(("/" + pool).c_str());
}

// Eight threads offload, reload and release on one client while the daemon is SIGKILLed and
// started again on the same pool: every request completes OK with the right bytes, and the
// daemon ends holding nothing.
void ManyThreadsAcrossARestart(bool use_ring, int sig) {
  const std::string socket = UniqueSocketPath();
  const std::string pool = UniquePoolName(use_ring ? "ring" : "stream");
  Daemon first;
  ASSERT_TRUE(first.Start(SharedPoolArgs(socket, pool)));
  client::ClientOptions o = Gpu0Options(socket);
  o.use_ring = use_ring;
  auto connected = client::Client::Connect(o);
  ASSERT_TRUE(connected.ok()) << connected.status();
  std::unique_ptr<client::Client> cl = *std::move(connected);
  EXPECT_EQ(cl->ring_attached(), use_ring) << cl->ring_error();
  constexpr int kThreads = 8;
  constexpr uint64_t kSlice = 256 * 1024;
  constexpr int kSlicesPerThread = 4;
  const uint64_t region_bytes = kThreads * kSlicesPerThread * kSlice;
  auto src = client::ShmRegion::Create(region_bytes);
  auto dst = client::ShmRegion::Create(region_bytes);
  ASSERT_TRUE(src.ok() && dst.ok());
  std::mt19937_64 rng(7);
  for (uint64_t i = 0; i < region_bytes; ++i) static_cast<uint8_t*>(src->data())[i] = rng();
  auto sr = cl->RegisterShmRegion(*src);
  auto dr = cl->RegisterShmRegion(*dst);
  ASSERT_TRUE(sr.ok() && dr.ok());
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0}, failures{0}, unconfirmed{0};
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!stop.load()) {
        std::vector<client::Reply<absl::StatusOr<client::OffloadResult>>> offloads;
        for (int s = 0; s < kSlicesPerThread; ++s) {
          offloads.push_back(cl->Offload(*sr, (t * kSlicesPerThread + s) * kSlice, kSlice - t));
        }
        std::vector<uint64_t> blocks;
        for (auto& f : offloads) {
          auto r = f.get();
          if (!r.ok()) {
            errors[t] = r.status().ToString();
            ++failures;
            return;
          }
          blocks.push_back(r->block_id);
        }
        for (int s = 0; s < kSlicesPerThread; ++s) {
          const uint64_t offset = (t * kSlicesPerThread + s) * kSlice;
          auto r = cl->Reload(blocks[s], *dr, offset, client::Priority::kUrgent,
                              /*release_after=*/s % 2 == 0)
                       .get();
          // Documented: a reload with release_after cut by the crash whose block the next
          // daemon lacks may or may not have copied (DATA_LOSS); the block is gone either way.
          if (s % 2 == 0 && r.status().code() == absl::StatusCode::kDataLoss) {
            ++unconfirmed;
            continue;
          }
          if (!r.ok() || r->bytes != kSlice - t ||
              std::memcmp(static_cast<uint8_t*>(dst->data()) + offset,
                          static_cast<uint8_t*>(src->data()) + offset, kSlice - t) != 0) {
            errors[t] = r.ok() ? "bytes differ" : r.status().ToString();
            ++failures;
            return;
          }
          if (s % 2 == 1) {
            absl::Status released = cl->Release(blocks[s]).get();
            if (!released.ok()) {
              errors[t] = released.ToString();
              ++failures;
              return;
            }
          }
        }
        ++rounds;
      }
    });
  }
  auto wait_rounds = [&](int n) {
    for (int i = 0; i < 2000 && rounds.load() < n && failures.load() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  wait_rounds(kThreads * 2);
  EXPECT_EQ(first.Stop(sig), sig == SIGKILL ? 128 + SIGKILL : 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Daemon second;
  ASSERT_TRUE(second.Start(SharedPoolArgs(socket, pool)));
  const int before = rounds.load();
  // The client saw the stream end by now: nothing goes on the dead daemon's ring any more.
  const uint64_t ring_before = cl->counters().ring_requests_sent;
  wait_rounds(before + kThreads * 2);
  stop = true;
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(unconfirmed.load(), kThreads);  // only reloads in flight at the kill
  EXPECT_GT(rounds.load(), before);
  EXPECT_EQ(cl->counters().resumes, 1u);
  // The resume's Hello offered a new ring, the restarted daemon attached it, and the requests
  // after the resume went on it.
  EXPECT_EQ(cl->ring_active(), use_ring);
  if (use_ring) {
    EXPECT_GT(cl->counters().ring_requests_sent, ring_before);
  }
  auto stats = cl->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->blocks(), 0u);
  cl->Close();
  EXPECT_EQ(second.Stop(SIGTERM), 0);
  shm_unlink(("/" + pool).c_str());
}

TEST(ClientStressTest, ManyThreadsAcrossASigkillOnTheRing) {
  ManyThreadsAcrossARestart(true, SIGKILL);
}
TEST(ClientStressTest, ManyThreadsAcrossASigkillOnTheStream) {
  ManyThreadsAcrossARestart(false, SIGKILL);
}
TEST(ClientStressTest, ManyThreadsAcrossASigtermOnTheRing) {
  ManyThreadsAcrossARestart(true, SIGTERM);
}
TEST(ClientStressTest, ManyThreadsAcrossASigtermOnTheStream) {
  ManyThreadsAcrossARestart(false, SIGTERM);
}

// A daemon that stops (SIGSTOP) with requests in flight: keepalive drops the connection, the
// client resumes once it runs again (SIGCONT), and every request completes OK.
TEST(ClientStressTest, AFrozenDaemonIsDroppedAndResumedWhenItThaws) {
  const std::string socket = UniqueSocketPath();
  const std::string pool = UniquePoolName("stop");
  Daemon d;
  ASSERT_TRUE(d.Start(SharedPoolArgs(socket, pool)));
  client::ClientOptions o = Gpu0Options(socket);
  o.keepalive_time_seconds = 1;
  o.keepalive_timeout_seconds = 2;  // a loaded machine can hold a ping's answer for 1 s
  o.connect_timeout_seconds = 2;
  auto cl = client::Client::Connect(o);
  ASSERT_TRUE(cl.ok()) << cl.status();
  auto src = client::ShmRegion::Create(8 * kMiB);
  ASSERT_TRUE(src.ok());
  auto sr = (*cl)->RegisterShmRegion(*src);
  ASSERT_TRUE(sr.ok());
  ASSERT_TRUE(Freeze(d.process));
  std::vector<client::Reply<absl::StatusOr<client::OffloadResult>>> offloads;
  for (int i = 0; i < 8; ++i) offloads.push_back((*cl)->Offload(*sr, i * kMiB, kMiB));
  std::this_thread::sleep_for(std::chrono::seconds(6));  // keepalive: 1 s + 2 s
  EXPECT_EQ(offloads[0].wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  d.process.Signal(SIGCONT);
  for (auto& f : offloads) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    auto r = f.get();
    EXPECT_TRUE(r.ok()) << r.status();
  }
  EXPECT_EQ((*cl)->counters().resumes, 1u);
  // The frozen session's end frees what it stored after the thaw (the client never heard of
  // those blocks and sent its requests again on the new session); the daemon may still be
  // ending it when the resent requests are answered, so its blocks are waited for.
  uint64_t blocks = 0;
  for (int i = 0; i < 200; ++i) {
    auto stats = (*cl)->GetStats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    blocks = stats->blocks();
    if (blocks == 8u) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(blocks, 8u);
  (*cl)->Close();
  EXPECT_EQ(d.Stop(SIGTERM), 0);
  shm_unlink(("/" + pool).c_str());
}

// Close() from another thread while eight threads submit: every Reply resolves (OK, or
// CANCELLED / FAILED_PRECONDITION), nothing hangs, and requests after it fail at once.
TEST(ClientStressTest, CloseFromAnotherThreadWhileThreadsSubmit) {
  const std::string socket = UniqueSocketPath();
  Daemon d;
  ASSERT_TRUE(d.Start({Runfile("server/offloadd"), "--socket_path=" + socket,
                       "--pool_bytes=64MiB", "--metrics_address="}));
  for (const bool use_ring : {true, false}) {
    client::ClientOptions o = Gpu0Options(socket);
    o.use_ring = use_ring;
    auto connected = client::Client::Connect(o);
    ASSERT_TRUE(connected.ok()) << connected.status();
    std::unique_ptr<client::Client> cl = *std::move(connected);
    auto src = client::ShmRegion::Create(8 * kMiB);
    ASSERT_TRUE(src.ok());
    auto sr = cl->RegisterShmRegion(*src);
    ASSERT_TRUE(sr.ok());
    std::atomic<int> started{0}, bad{0}, refused{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        ++started;
        for (int i = 0; i < 2000; ++i) {
          auto r = cl->Offload(*sr, (t * 1024 + i % 1024) * 1024ull, 1024);
          if (r.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
            ++bad;
            return;
          }
          auto v = r.get();
          if (v.ok()) {
            cl->Release(v->block_id);  // dropped: completes or is cancelled by the close
            continue;
          }
          if (v.status().code() == absl::StatusCode::kFailedPrecondition) {
            ++refused;
            return;
          }
          if (v.status().code() != absl::StatusCode::kCancelled) {
            ++bad;
            return;
          }
        }
      });
    }
    while (started.load() < 8) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::thread closer([&] { cl->Close(); });
    closer.join();
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(bad.load(), 0) << "use_ring " << use_ring;
    EXPECT_EQ(cl->Release(1).get().code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(d.Stop(SIGTERM), 0);
}

// 20000 offloads in one ScopedBatch (stream) and on the ring: every one is answered with its
// own block, split at the message cap.
TEST(ClientStressTest, VeryLargeBatches) {
  const std::string socket = UniqueSocketPath();
  Daemon d;
  ASSERT_TRUE(d.Start({Runfile("server/offloadd"), "--socket_path=" + socket,
                       "--pool_bytes=256MiB", "--metrics_address="}));
  constexpr int kRequests = 20000;
  for (const bool use_ring : {false, true}) {
    client::ClientOptions o = Gpu0Options(socket);
    o.use_ring = use_ring;
    auto cl = client::Client::Connect(o);
    ASSERT_TRUE(cl.ok()) << cl.status();
    auto src = client::ShmRegion::Create(kRequests * 4096ull);
    ASSERT_TRUE(src.ok());
    auto sr = (*cl)->RegisterShmRegion(*src);
    ASSERT_TRUE(sr.ok());
    std::vector<client::Reply<absl::StatusOr<client::OffloadResult>>> offloads;
    {
      client::Client::ScopedBatch batch(**cl);
      for (int i = 0; i < kRequests; ++i) offloads.push_back((*cl)->Offload(*sr, i * 4096ull, 4096));
    }
    std::vector<uint64_t> blocks;
    for (auto& f : offloads) {
      ASSERT_EQ(f.wait_for(std::chrono::seconds(120)), std::future_status::ready);
      auto r = f.get();
      ASSERT_TRUE(r.ok()) << r.status();
      blocks.push_back(r->block_id);
    }
    std::sort(blocks.begin(), blocks.end());
    EXPECT_EQ(std::unique(blocks.begin(), blocks.end()), blocks.end());
    std::vector<client::Reply<absl::Status>> releases;
    for (uint64_t b : blocks) releases.push_back((*cl)->Release(b));
    for (auto& f : releases) EXPECT_TRUE(f.get().ok());
    auto stats = (*cl)->GetStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->blocks(), 0u);
    (*cl)->Close();
  }
  EXPECT_EQ(d.Stop(SIGTERM), 0);
}

// Clients created and destroyed in a loop, some with a request in flight, leave no thread of
// their own ("offloadd-stream", "offloadd-ring") and no file descriptor behind.
TEST(ClientStressTest, CreateAndDestroyInALoopLeaksNoThreadsOrFds) {
  const std::string socket = UniqueSocketPath();
  Daemon d;
  ASSERT_TRUE(d.Start({Runfile("server/offloadd"), "--socket_path=" + socket,
                       "--pool_bytes=16MiB", "--metrics_address="}));
  client::ClientOptions o = Gpu0Options(socket);
  auto cycle = [&](int i) {
    o.use_ring = i % 2 == 0;
    auto cl = client::Client::Connect(o);
    ASSERT_TRUE(cl.ok()) << cl.status();
    if (i % 3 == 0) {
      auto dropped = (*cl)->Release(999);  // answered NOT_FOUND, or cancelled by the close
    }
  };
  for (int i = 0; i < 10; ++i) cycle(i);  // gRPC's own pools start on first use
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const size_t threads = CountEntries("/proc/self/task");
  const size_t fds = CountEntries("/proc/self/fd");
  for (int i = 0; i < 100; ++i) {
    cycle(i);
    ASSERT_EQ(CountClientThreads(), 0u) << "after client " << i;  // joined by the destructor
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_LE(CountEntries("/proc/self/task"), threads + 16);  // 100 leaked would show
  EXPECT_LE(CountEntries("/proc/self/fd"), fds);
  EXPECT_EQ(d.Stop(SIGTERM), 0);
}

// The daemon SIGKILLed while a client connects with the ring, at 24 points from before the
// channel connects to after the HelloReply (0 to 5.75 ms in): Connect either returns a client
// whose session then ends UNAVAILABLE (no shared pool: not resumed) or fails UNAVAILABLE /
// DEADLINE_EXCEEDED; no ring thread outlives its client (one left unjoined aborts the test, one
// left running shows as an "offloadd-ring" thread in /proc/self/task).
TEST(ClientStressTest, ADaemonKilledDuringConnectLeavesNoRingThreadBehind) {
  const std::string socket = UniqueSocketPath();
  const std::vector<std::string> args = {Runfile("server/offloadd"), "--socket_path=" + socket,
                                         "--pool_bytes=16MiB", "--metrics_address="};
  client::ClientOptions o = Gpu0Options(socket);
  o.use_ring = true;
  o.connect_timeout_seconds = 0.5;
  auto cycle = [&](int i) {
    Daemon d;
    ASSERT_TRUE(d.Start(args));
    std::thread killer([&d, i] {
      std::this_thread::sleep_for(std::chrono::microseconds(250 * i));
      d.Stop(SIGKILL);
    });
    absl::StatusOr<std::unique_ptr<client::Client>> cl = client::Client::Connect(o);
    killer.join();
    if (!cl.ok()) {
      EXPECT_TRUE(absl::IsUnavailable(cl.status()) || absl::IsDeadlineExceeded(cl.status()))
          << "kill at " << 250 * i << " us: " << cl.status();
      return;
    }
    EXPECT_EQ((*cl)->Release(1).get().code(), absl::StatusCode::kUnavailable)
        << "kill at " << 250 * i << " us";
  };
  cycle(23);  // gRPC's own pools start on first use
  for (int i = 0; i < 24; ++i) {
    cycle(i);
    ASSERT_EQ(CountClientThreads(), 0u) << "kill at " << 250 * i << " us";
  }
}

// A frozen daemon with more requests in flight than the ring has slots: the submitting thread
// waits for slots until keepalive drops the connection; after SIGCONT every offload completes
// once, and the daemon holds exactly the blocks the client was told about.
TEST(ClientStressTest, AFrozenDaemonWithAFullRingStoresEachOffloadOnce) {
  const std::string socket = UniqueSocketPath();
  const std::string pool = UniquePoolName("stopring");
  Daemon d;
  ASSERT_TRUE(d.Start(SharedPoolArgs(socket, pool)));
  client::ClientOptions o = Gpu0Options(socket);
  o.keepalive_time_seconds = 1;
  o.keepalive_timeout_seconds = 2;  // a loaded machine can hold a ping's answer for 1 s
  o.connect_timeout_seconds = 2;
  o.ring_entries = 64;
  auto connected = client::Client::Connect(o);
  ASSERT_TRUE(connected.ok()) << connected.status();
  std::unique_ptr<client::Client> cl = *std::move(connected);
  ASSERT_TRUE(cl->ring_attached());
  auto src = client::ShmRegion::Create(1024 * 4096);
  ASSERT_TRUE(src.ok());
  auto sr = cl->RegisterShmRegion(*src);
  ASSERT_TRUE(sr.ok());
  ASSERT_TRUE(Freeze(d.process));
  std::vector<client::Reply<absl::StatusOr<client::OffloadResult>>> offloads;
  std::thread submitter([&] {
    for (int i = 0; i < 1000; ++i) offloads.push_back(cl->Offload(*sr, i * 4096ull, 4096));
  });
  std::this_thread::sleep_for(std::chrono::seconds(6));  // keepalive: 1 s + 2 s
  d.process.Signal(SIGCONT);
  submitter.join();
  std::vector<uint64_t> blocks;
  for (auto& f : offloads) {
    ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.status();
    blocks.push_back(r->block_id);
  }
  auto stats = cl->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->blocks(), blocks.size());
  for (uint64_t b : blocks) EXPECT_TRUE(cl->Release(b).get().ok()) << b;
  stats = cl->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->blocks(), 0u);
  EXPECT_EQ(stats->pool_used_bytes(), 0u);
  cl->Close();
  EXPECT_EQ(d.Stop(SIGTERM), 0);
  shm_unlink(("/" + pool).c_str());
}

// An idle client whose daemon is killed twice in a row (the second time right after it came
// back) resumes each time and keeps its blocks.
TEST(ClientStressTest, AnIdleClientResumesAcrossTwoKills) {
  const std::string socket = UniqueSocketPath();
  const std::string pool = UniquePoolName("twice");
  Daemon first;
  ASSERT_TRUE(first.Start(SharedPoolArgs(socket, pool)));
  client::ClientOptions o = Gpu0Options(socket);
  auto cl = client::Client::Connect(o);
  ASSERT_TRUE(cl.ok()) << cl.status();
  auto src = client::ShmRegion::Create(kMiB);
  auto dst = client::ShmRegion::Create(kMiB);
  ASSERT_TRUE(src.ok() && dst.ok());
  for (uint64_t i = 0; i < kMiB; ++i) static_cast<uint8_t*>(src->data())[i] = i * 7 + 1;
  auto sr = (*cl)->RegisterShmRegion(*src);
  auto dr = (*cl)->RegisterShmRegion(*dst);
  ASSERT_TRUE(sr.ok() && dr.ok());
  auto stored = (*cl)->Offload(*sr, 0, kMiB).get();
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(first.Stop(SIGKILL), 128 + SIGKILL);
  Daemon second;
  ASSERT_TRUE(second.Start(SharedPoolArgs(socket, pool)));
  for (int i = 0; i < 500 && (*cl)->counters().resumes < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(second.Stop(SIGKILL), 128 + SIGKILL);
  Daemon third;
  ASSERT_TRUE(third.Start(SharedPoolArgs(socket, pool)));
  auto r = (*cl)->Reload(stored->block_id, *dr, 0, client::Priority::kUrgent, true).get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), kMiB), 0);
  EXPECT_GE((*cl)->counters().resumes, 1u);
  (*cl)->Close();
  EXPECT_EQ(third.Stop(SIGTERM), 0);
  shm_unlink(("/" + pool).c_str());
}

// A daemon that does not come back within the resume window: what was pending and what was
// issued during the outage fails UNAVAILABLE, and so does everything after.
TEST(ClientStressTest, ADaemonThatStaysDownFailsEverythingAfterTheWindow) {
  const std::string socket = UniqueSocketPath();
  const std::string pool = UniquePoolName("down");
  Daemon d;
  ASSERT_TRUE(d.Start(SharedPoolArgs(socket, pool)));
  client::ClientOptions o = Gpu0Options(socket);
  o.resume_window_seconds = 1;
  auto cl = client::Client::Connect(o);
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(d.Stop(SIGKILL), 128 + SIGKILL);
  auto during = (*cl)->Release(5);
  ASSERT_EQ(during.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(during.get().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*cl)->Release(6).get().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*cl)->stream_status().code(), absl::StatusCode::kUnavailable);
  (*cl)->Close();
  shm_unlink(("/" + pool).c_str());
}

// Close() racing a resume that is about to install its stream (the daemon just came back):
// Close returns, every Reply resolves, repeatedly.
TEST(ClientStressTest, CloseRacingAResumeThatSucceeds) {
  const std::string socket = UniqueSocketPath();
  const std::string pool = UniquePoolName("race");
  for (int round = 0; round < 6; ++round) {
    Daemon first;
    ASSERT_TRUE(first.Start(SharedPoolArgs(socket, pool)));
    client::ClientOptions o = Gpu0Options(socket);
    o.close_timeout_seconds = 2;
    auto cl = client::Client::Connect(o);
    ASSERT_TRUE(cl.ok()) << cl.status();
    EXPECT_EQ(first.Stop(SIGKILL), 128 + SIGKILL);
    std::vector<client::Reply<absl::Status>> during;
    for (int i = 0; i < 50; ++i) during.push_back((*cl)->Release(1000 + i));
    Daemon second;
    ASSERT_TRUE(second.Start(SharedPoolArgs(socket, pool)));
    std::this_thread::sleep_for(std::chrono::milliseconds(round * 10));
    (*cl)->Close();
    for (auto& f : during) {
      ASSERT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::ready) << round;
      const absl::StatusCode code = f.get().code();
      EXPECT_TRUE(code == absl::StatusCode::kNotFound || code == absl::StatusCode::kCancelled ||
                  code == absl::StatusCode::kUnavailable)
          << round << ": " << code;
    }
    cl->reset();
    EXPECT_EQ(second.Stop(SIGTERM), 0);
  }
  shm_unlink(("/" + pool).c_str());
}

// Close() while the daemon is frozen (SIGSTOP, no keepalive) with requests in flight: Close
// cancels the stream after close_timeout_seconds, the pending requests fail CANCELLED.
TEST(ClientStressTest, CloseWithAFrozenDaemonCancelsAfterTheCloseTimeout) {
  const std::string socket = UniqueSocketPath();
  const std::string pool = UniquePoolName("stopclose");
  Daemon d;
  ASSERT_TRUE(d.Start(SharedPoolArgs(socket, pool)));
  for (const bool use_ring : {true, false}) {
    client::ClientOptions o = Gpu0Options(socket);
    o.keepalive_time_seconds = 0;
    o.close_timeout_seconds = 1;
    o.use_ring = use_ring;
    auto cl = client::Client::Connect(o);
    ASSERT_TRUE(cl.ok()) << cl.status();
    auto src = client::ShmRegion::Create(kMiB);
    ASSERT_TRUE(src.ok());
    auto sr = (*cl)->RegisterShmRegion(*src);
    ASSERT_TRUE(sr.ok());
    ASSERT_TRUE(Freeze(d.process));
    std::vector<client::Reply<absl::StatusOr<client::OffloadResult>>> offloads;
    for (int i = 0; i < 16; ++i) offloads.push_back((*cl)->Offload(*sr, i * 4096ull, 4096));
    const auto start = std::chrono::steady_clock::now();
    std::thread closer([&] { (*cl)->Close(); });
    closer.join();
    const double close_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(close_seconds, 30.0) << "use_ring " << use_ring;
    for (auto& f : offloads) {
      ASSERT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::ready);
      EXPECT_EQ(f.get().status().code(), absl::StatusCode::kCancelled) << "use_ring " << use_ring;
    }
    d.process.Signal(SIGCONT);
  }
  EXPECT_EQ(d.Stop(SIGTERM), 0);
  shm_unlink(("/" + pool).c_str());
}

// The open request ring of this process (memfd "offloadd-ring"), mapped; nullptr when none.
common::RingControl* MapOwnRing() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return nullptr;
  common::RingControl* control = nullptr;
  while (dirent* e = readdir(d)) {
    char target[256] = {};
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    if (readlink(link.c_str(), target, sizeof(target) - 1) <= 0) continue;
    if (std::string(target).find("memfd:offloadd-ring") == std::string::npos) continue;
    void* p = mmap(nullptr, sizeof(common::RingControl), PROT_READ | PROT_WRITE, MAP_SHARED,
                   atoi(e->d_name), 0);
    if (p != MAP_FAILED) control = static_cast<common::RingControl*>(p);
    break;
  }
  closedir(d);
  return control;
}

// The client finds its ring's completion index impossible (shared memory overwritten) while the
// stream is alive: the session ends with INTERNAL, so that no request waits for an answer the
// ring can no longer carry (before, the ring thread stopped and every ring request hung).
TEST(ClientStressTest, ACorruptRingEndsTheSessionInsteadOfHangingItsRequests) {
  const std::string socket = UniqueSocketPath();
  Daemon d;
  ASSERT_TRUE(d.Start({Runfile("server/offloadd"), "--socket_path=" + socket,
                       "--pool_bytes=16MiB", "--metrics_address="}));
  client::ClientOptions o = Gpu0Options(socket);
  auto cl = client::Client::Connect(o);
  ASSERT_TRUE(cl.ok()) << cl.status();
  ASSERT_TRUE((*cl)->ring_attached()) << (*cl)->ring_error();
  EXPECT_EQ((*cl)->Release(77).get().code(), absl::StatusCode::kNotFound);  // on the ring
  common::RingControl* control = MapOwnRing();
  ASSERT_NE(control, nullptr);
  control->completion_tail.value.store(control->completion_tail.value.load() + (1u << 20));
  control->client_doorbell.RingAlways();
  // Nothing is submitted until the ring thread has read the impossible index: an answer the
  // daemon published first would overwrite it.
  for (int i = 0; i < 2000 && (*cl)->stream_status().ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto release = (*cl)->Release(78);
  ASSERT_EQ(release.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_EQ(release.get().code(), absl::StatusCode::kInternal);
  EXPECT_EQ((*cl)->stream_status().code(), absl::StatusCode::kInternal);
  munmap(control, sizeof(common::RingControl));
  (*cl)->Close();
  EXPECT_EQ(d.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace offloadd::testing
