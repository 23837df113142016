// The C++ client (client/offloadd_client.h) against the real daemon binary the way operators
// and training jobs treat it: SIGKILL and restart under many submitting threads (with and
// without the request ring), Close() while a resume waits for a daemon that is down, and
// clients created and destroyed in a loop (threads and file descriptors, from /proc/self).
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

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

size_t CountEntries(const char* dir) {
  size_t n = 0;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
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
  client::ClientOptions o;
  o.socket_path = socket;
  o.device_id = "gpu0";
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
  EXPECT_FALSE(release.get().ok());
  EXPECT_FALSE((*cl)->stream_status().ok());
  shm_unlink(("/" + pool).c_str());
}

// Eight threads offload, reload and release on one client while the daemon is SIGKILLed and
// started again on the same pool: every request completes OK with the right bytes, and the
// daemon ends holding nothing.
void ManyThreadsAcrossASigkill(bool use_ring) {
  const std::string socket = UniqueSocketPath();
  const std::string pool = UniquePoolName(use_ring ? "ring" : "stream");
  Daemon first;
  ASSERT_TRUE(first.Start(SharedPoolArgs(socket, pool)));
  client::ClientOptions o;
  o.socket_path = socket;
  o.device_id = "gpu0";
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
  std::atomic<int> rounds{0}, failures{0};
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
  EXPECT_EQ(first.Stop(SIGKILL), 128 + SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Daemon second;
  ASSERT_TRUE(second.Start(SharedPoolArgs(socket, pool)));
  const int before = rounds.load();
  wait_rounds(before + kThreads * 2);
  stop = true;
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(rounds.load(), before);
  EXPECT_EQ(cl->counters().resumes, 1u);
  auto stats = cl->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->blocks(), 0u);
  cl->Close();
  EXPECT_EQ(second.Stop(SIGTERM), 0);
  shm_unlink(("/" + pool).c_str());
}

TEST(ClientStressTest, ManyThreadsAcrossASigkillOnTheRing) { ManyThreadsAcrossASigkill(true); }
TEST(ClientStressTest, ManyThreadsAcrossASigkillOnTheStream) { ManyThreadsAcrossASigkill(false); }

// Clients created and destroyed in a loop, some with a request in flight, leave no thread and no
// file descriptor behind.
TEST(ClientStressTest, CreateAndDestroyInALoopLeaksNoThreadsOrFds) {
  const std::string socket = UniqueSocketPath();
  Daemon d;
  ASSERT_TRUE(d.Start({Runfile("server/offloadd"), "--socket_path=" + socket,
                       "--pool_bytes=16MiB", "--metrics_address="}));
  client::ClientOptions o;
  o.socket_path = socket;
  o.device_id = "gpu0";
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
  for (int i = 0; i < 100; ++i) cycle(i);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_LE(CountEntries("/proc/self/task"), threads + 2);
  EXPECT_LE(CountEntries("/proc/self/fd"), fds);
  EXPECT_EQ(d.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace offloadd::testing
