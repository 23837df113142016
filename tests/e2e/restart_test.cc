// The real daemon binary on a shared pool (pool_shm_name), SIGKILLed while four clients have
// offloads in flight, then started again: every block a client was told is stored (OffloadDone)
// reloads bit-exact after Client::Resume with its token, and the pool returns to empty once the
// clients close. AutoResume: the same with the clients recovering by themselves (auto_resume):
// no request fails, those issued during the outage wait, nothing is stored twice.
#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/offloadd_client.h"
#include "client/shm_region.h"
#include "gtest/gtest.h"
#include "server/spill/spill_tier.h"
#include "tests/e2e/child_process.h"

namespace offloadd::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr int kClients = 4;
constexpr int kConfirmedFirst = 8;  // offloads confirmed before the kill
constexpr int kInFlight = 8;        // offloads sent right before the kill
constexpr uint64_t kRegionBytes = 16 * kMiB;

std::string UniqueSocketPath() {
  std::string dir = "/tmp/ofd-restart-XXXXXX";  // mkdtemp: pids repeat across Bazel sandboxes
  if (mkdtemp(dir.data()) == nullptr) abort();
  return dir + "/d.sock";
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

struct Confirmed {
  uint64_t block_id, offset, bytes;
};

uint64_t BlockBytes(int client, int i) { return 256 * 1024 + 4097 * (client + 1) * (i + 1); }
uint64_t BlockOffset(int i) { return kMiB * static_cast<uint64_t>(i); }

TEST(RestartTest, SigkilledDaemonComesBackAndEveryConfirmedBlockReloadsBitExact) {
  const std::string socket = UniqueSocketPath();
  const std::string pool = "offloadd-restart-test-" + std::to_string(getpid()) + "-" +
                           std::to_string(std::random_device{}());
  const std::vector<std::string> args = {
      Runfile("server/offloadd"), "--socket_path=" + socket, "--pool_bytes=256MiB",
      "--metrics_address=",       "--pool_shm_name=" + pool, "--resume_grace_seconds=120",
      "--chunk_bytes=65536"};
  Daemon first;
  ASSERT_TRUE(first.Start(args));

  std::vector<std::unique_ptr<client::Client>> clients;
  std::vector<client::ShmRegion> sources;
  std::vector<uint64_t> regions;
  std::vector<std::vector<Confirmed>> confirmed(kClients);
  std::vector<std::vector<std::future<absl::StatusOr<client::OffloadResult>>>> in_flight(kClients);
  for (int c = 0; c < kClients; ++c) {
    client::ClientOptions o;
    o.socket_path = socket;
    o.client_name = "restart-test " + std::to_string(c);
    o.device_id = "gpu" + std::to_string(c);
    o.auto_resume = false;  // this test resumes by hand (a new process would)
    auto cl = client::Client::Connect(o);
    ASSERT_TRUE(cl.ok()) << cl.status();
    EXPECT_EQ((*cl)->resume_token().size(), 16u);
    auto src = client::ShmRegion::Create(kRegionBytes);
    ASSERT_TRUE(src.ok()) << src.status();
    std::mt19937_64 rng(100 + c);
    auto* bytes = static_cast<uint8_t*>(src->data());
    for (uint64_t i = 0; i < kRegionBytes; ++i) bytes[i] = static_cast<uint8_t>(rng());
    auto region = (*cl)->RegisterShmRegion(*src);
    ASSERT_TRUE(region.ok()) << region.status();
    regions.push_back(*region);
    for (int i = 0; i < kConfirmedFirst; ++i) {
      auto r = (*cl)->Offload(*region, BlockOffset(i), BlockBytes(c, i)).get();
      ASSERT_TRUE(r.ok()) << r.status();
      confirmed[c].push_back({r->block_id, BlockOffset(i), BlockBytes(c, i)});
    }
    clients.push_back(*std::move(cl));
    sources.push_back(*std::move(src));
  }
  for (int c = 0; c < kClients; ++c) {
    for (int i = kConfirmedFirst; i < kConfirmedFirst + kInFlight; ++i) {
      in_flight[c].push_back(clients[c]->Offload(regions[c], BlockOffset(i), BlockBytes(c, i)));
    }
  }
  EXPECT_EQ(first.Stop(SIGKILL), 128 + SIGKILL);
  int lost_in_flight = 0;
  for (int c = 0; c < kClients; ++c) {
    for (int i = 0; i < kInFlight; ++i) {
      auto r = in_flight[c][i].get();
      if (r.ok()) {
        const int k = kConfirmedFirst + i;
        confirmed[c].push_back({r->block_id, BlockOffset(k), BlockBytes(c, k)});
      } else {
        EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
        ++lost_in_flight;  // never confirmed: the client still holds the source
      }
    }
  }
  std::printf("offloads unconfirmed at the kill: %d of %d\n", lost_in_flight, kClients * kInFlight);

  Daemon second;
  ASSERT_TRUE(second.Start(args));
  for (int c = 0; c < kClients; ++c) {
    client::ClientOptions o;
    o.socket_path = socket;
    o.client_name = "restart-test " + std::to_string(c) + " resumed";
    o.device_id = "gpu" + std::to_string(c);
    const std::string token = clients[c]->resume_token();
    clients[c].reset();
    auto cl = client::Client::Resume(o, token);
    ASSERT_TRUE(cl.ok()) << cl.status();
    EXPECT_EQ((*cl)->resume_token(), token);
    // The daemon may also hold blocks whose OffloadDone never reached the client.
    EXPECT_GE((*cl)->blocks_resumed(), confirmed[c].size());
    auto dst = client::ShmRegion::Create(kRegionBytes);
    ASSERT_TRUE(dst.ok()) << dst.status();
    auto region = (*cl)->RegisterShmRegion(*dst);
    ASSERT_TRUE(region.ok()) << region.status();
    for (const Confirmed& b : confirmed[c]) {
      auto r = (*cl)->Reload(b.block_id, *region, b.offset, client::Priority::kUrgent,
                             /*release_after=*/true)
                   .get();
      ASSERT_TRUE(r.ok()) << "client " << c << " block " << b.block_id << ": " << r.status();
      EXPECT_EQ(r->bytes, b.bytes);
      EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(dst->data()) + b.offset,
                            static_cast<uint8_t*>(sources[c].data()) + b.offset, b.bytes),
                0)
          << "client " << c << " block at " << b.offset;
    }
    clients[c] = *std::move(cl);
  }
  // A token cannot be resumed twice.
  {
    client::ClientOptions o;
    o.socket_path = socket;
    o.device_id = "gpu0";
    auto again = client::Client::Resume(o, clients[0]->resume_token());
    EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << again.status();
  }
  for (auto& cl : clients) cl->Close();
  client::ClientOptions o;
  o.socket_path = socket;
  o.device_id = "stats";
  auto probe = client::Client::Connect(o);
  ASSERT_TRUE(probe.ok()) << probe.status();
  auto stats = (*probe)->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->blocks(), 0u);  // unconfirmed-but-stored blocks went with their sessions
  EXPECT_EQ(stats->pool_used_bytes(), 0u);
  (*probe)->Close();
  EXPECT_EQ(second.Stop(SIGTERM), 0);
  shm_unlink(("/" + pool).c_str());
}

// An upgrade: SIGTERM drains and closes the sessions, but keeps their blocks' records; the next
// daemon adopts them and the client resumes.
TEST(RestartTest, SigtermHandsBlocksToTheNextDaemon) {
  const std::string socket = UniqueSocketPath();
  const std::string pool = "offloadd-restart-term-" + std::to_string(getpid()) + "-" +
                           std::to_string(std::random_device{}());
  const std::vector<std::string> args = {Runfile("server/offloadd"), "--socket_path=" + socket,
                                         "--pool_bytes=64MiB", "--metrics_address=",
                                         "--pool_shm_name=" + pool};
  Daemon first;
  ASSERT_TRUE(first.Start(args));
  client::ClientOptions o;
  o.socket_path = socket;
  o.device_id = "gpu0";
  o.auto_resume = false;
  auto cl = client::Client::Connect(o);
  ASSERT_TRUE(cl.ok()) << cl.status();
  auto src = client::ShmRegion::Create(4 * kMiB);
  ASSERT_TRUE(src.ok()) << src.status();
  std::mt19937_64 rng(7);
  for (uint64_t i = 0; i < 4 * kMiB; ++i) static_cast<uint8_t*>(src->data())[i] = rng();
  auto region = (*cl)->RegisterShmRegion(*src);
  ASSERT_TRUE(region.ok()) << region.status();
  std::vector<Confirmed> blocks;
  for (int i = 0; i < 4; ++i) {
    auto r = (*cl)->Offload(*region, BlockOffset(i), kMiB - 3).get();
    ASSERT_TRUE(r.ok()) << r.status();
    blocks.push_back({r->block_id, BlockOffset(i), kMiB - 3});
  }
  EXPECT_EQ(first.Stop(SIGTERM), 0);
  const std::string token = (*cl)->resume_token();
  cl->reset();
  Daemon second;
  ASSERT_TRUE(second.Start(args));
  auto resumed = client::Client::Resume(o, token);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ((*resumed)->blocks_resumed(), 4u);
  auto dst = client::ShmRegion::Create(4 * kMiB);
  ASSERT_TRUE(dst.ok());
  auto dst_region = (*resumed)->RegisterShmRegion(*dst);
  ASSERT_TRUE(dst_region.ok());
  for (const Confirmed& b : blocks) {
    auto r = (*resumed)->Reload(b.block_id, *dst_region, b.offset, client::Priority::kUrgent,
                                true).get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(dst->data()) + b.offset,
                          static_cast<uint8_t*>(src->data()) + b.offset, b.bytes),
              0);
  }
  (*resumed)->Close();
  EXPECT_EQ(second.Stop(SIGTERM), 0);
  shm_unlink(("/" + pool).c_str());
}

// The spill tier across a SIGKILL: offloads of 3x the pool, so most blocks
// are on disk when the daemon dies; the next daemon on the same pool_shm_name and
// spill_directory adopts both tiers and every block reloads bit-exact (spilled ones staged back).
TEST(RestartTest, SpilledBlocksSurviveASigkill) {
  const char* tmp = getenv("TEST_TMPDIR");
  const std::string spill_dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/restart_spill";
  if (!spill::SpillTier::DirectIoSupported(spill_dir)) {
    GTEST_SKIP() << spill_dir << " does not take O_DIRECT";
  }
  const std::string socket = UniqueSocketPath();
  const std::string pool = "offloadd-restart-spill-" + std::to_string(getpid()) + "-" +
                           std::to_string(std::random_device{}());
  const std::vector<std::string> args = {
      Runfile("server/offloadd"), "--socket_path=" + socket, "--pool_bytes=8MiB",
      "--metrics_address=", "--pool_shm_name=" + pool, "--resume_grace_seconds=120",
      "--spill_directory=" + spill_dir, "--spill_capacity_bytes=256MiB",
      "--spill_bytes_per_second=-1", "--spill_high_water_fraction=0.5"};
  Daemon first;
  ASSERT_TRUE(first.Start(args));
  client::ClientOptions o;
  o.socket_path = socket;
  o.device_id = "gpu0";
  o.auto_resume = false;
  auto cl = client::Client::Connect(o);
  ASSERT_TRUE(cl.ok()) << cl.status();
  constexpr int kBlocks = 12;  // of 2 MiB - 5: 24 MiB through an 8 MiB pool
  auto src = client::ShmRegion::Create(kBlocks * 2 * kMiB);
  ASSERT_TRUE(src.ok()) << src.status();
  std::mt19937_64 rng(11);
  for (uint64_t i = 0; i < kBlocks * 2 * kMiB; ++i) static_cast<uint8_t*>(src->data())[i] = rng();
  auto region = (*cl)->RegisterShmRegion(*src);
  ASSERT_TRUE(region.ok()) << region.status();
  std::vector<Confirmed> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    auto r = (*cl)->Offload(*region, 2 * BlockOffset(i), 2 * kMiB - 5).get();
    ASSERT_TRUE(r.ok()) << r.status();
    blocks.push_back({r->block_id, 2 * BlockOffset(i), 2 * kMiB - 5});
  }
  EXPECT_EQ(first.Stop(SIGKILL), 128 + SIGKILL);
  int spill_files = 0;  // the blocks on disk when the daemon died
  if (DIR* d = opendir(spill_dir.c_str())) {
    while (dirent* e = readdir(d)) spill_files += absl::EndsWith(e->d_name, ".spill") ? 1 : 0;
    closedir(d);
  }
  EXPECT_GE(spill_files, kBlocks / 2);
  const std::string token = (*cl)->resume_token();
  cl->reset();
  Daemon second;
  ASSERT_TRUE(second.Start(args));
  auto resumed = client::Client::Resume(o, token);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ((*resumed)->blocks_resumed(), static_cast<uint64_t>(kBlocks));
  auto dst = client::ShmRegion::Create(kBlocks * 2 * kMiB);
  ASSERT_TRUE(dst.ok());
  auto dst_region = (*resumed)->RegisterShmRegion(*dst);
  ASSERT_TRUE(dst_region.ok());
  for (int i = kBlocks - 1; i >= 0; --i) {
    const Confirmed& b = blocks[i];
    auto r = (*resumed)->Reload(b.block_id, *dst_region, b.offset, client::Priority::kUrgent,
                                true).get();
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(dst->data()) + b.offset,
                          static_cast<uint8_t*>(src->data()) + b.offset, b.bytes),
              0) << i;
  }
  (*resumed)->Close();
  EXPECT_EQ(second.Stop(SIGTERM), 0);
  shm_unlink(("/" + pool).c_str());
}

// An upgrade with a client that recovers by itself (auto_resume, the default): the SIGTERMed
// daemon closes the session stream; the client must wait for the next daemon and resume, as it
// does after a SIGKILL, and its blocks reload bit-exact through the same Client object.
TEST(RestartTest, AutoResumeAcrossSigterm) {
  const std::string socket = UniqueSocketPath();
  const std::string pool = "offloadd-restart-autoterm-" + std::to_string(getpid()) + "-" +
                           std::to_string(std::random_device{}());
  const std::vector<std::string> args = {Runfile("server/offloadd"), "--socket_path=" + socket,
                                         "--pool_bytes=64MiB", "--metrics_address=",
                                         "--pool_shm_name=" + pool,
                                         "--resume_grace_seconds=60"};
  Daemon first;
  ASSERT_TRUE(first.Start(args));
  client::ClientOptions o;
  o.socket_path = socket;
  o.device_id = "gpu0";
  auto cl = client::Client::Connect(o);
  ASSERT_TRUE(cl.ok()) << cl.status();
  auto src = client::ShmRegion::Create(4 * kMiB);
  ASSERT_TRUE(src.ok()) << src.status();
  std::mt19937_64 rng(11);
  for (uint64_t i = 0; i < 4 * kMiB; ++i) static_cast<uint8_t*>(src->data())[i] = rng();
  auto region = (*cl)->RegisterShmRegion(*src);
  ASSERT_TRUE(region.ok()) << region.status();
  auto dst = client::ShmRegion::Create(4 * kMiB);
  ASSERT_TRUE(dst.ok());
  auto dst_region = (*cl)->RegisterShmRegion(*dst);
  ASSERT_TRUE(dst_region.ok());
  std::vector<Confirmed> blocks;
  for (int i = 0; i < 4; ++i) {
    auto r = (*cl)->Offload(*region, BlockOffset(i), kMiB - 5).get();
    ASSERT_TRUE(r.ok()) << r.status();
    blocks.push_back({r->block_id, BlockOffset(i), kMiB - 5});
  }
  EXPECT_EQ(first.Stop(SIGTERM), 0);
  Daemon second;
  ASSERT_TRUE(second.Start(args));
  for (const Confirmed& b : blocks) {
    auto r = (*cl)->Reload(b.block_id, *dst_region, b.offset, client::Priority::kUrgent,
                           true).get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(dst->data()) + b.offset,
                          static_cast<uint8_t*>(src->data()) + b.offset, b.bytes),
              0);
  }
  (*cl)->Close();
  EXPECT_EQ(second.Stop(SIGTERM), 0);
  shm_unlink(("/" + pool).c_str());
}

// Clients that recover by themselves: SIGKILL while offloads and reloads are in flight, more
// requests issued while no daemon serves the socket, then a new daemon on the same pool. Every
// future completes OK, every confirmed block reloads bit-exact, and the daemon holds exactly the
// blocks the clients were told about (an offload re-sent never leaves a second block).
TEST(RestartTest, AutoResumeResendsUnansweredRequestsAndHoldsThoseOfTheOutage) {
  const std::string socket = UniqueSocketPath();
  const std::string pool = "offloadd-restart-auto-" + std::to_string(getpid()) + "-" +
                           std::to_string(std::random_device{}());
  const std::vector<std::string> args = {
      Runfile("server/offloadd"), "--socket_path=" + socket, "--pool_bytes=256MiB",
      "--metrics_address=",       "--pool_shm_name=" + pool, "--resume_grace_seconds=120",
      "--chunk_bytes=65536"};
  Daemon first;
  ASSERT_TRUE(first.Start(args));
  struct PerClient {
    std::unique_ptr<client::Client> client;
    std::optional<client::ShmRegion> src, dst;
    uint64_t src_region = 0, dst_region = 0;
    std::vector<Confirmed> confirmed;
    std::vector<std::pair<int, std::future<absl::StatusOr<client::OffloadResult>>>> offloads;
    std::vector<std::pair<Confirmed, std::future<absl::StatusOr<client::ReloadResult>>>> reloads;
  };
  std::vector<PerClient> cs(kClients);
  for (int c = 0; c < kClients; ++c) {
    client::ClientOptions o;
    o.socket_path = socket;
    o.device_id = "gpu" + std::to_string(c);
    auto cl = client::Client::Connect(o);
    ASSERT_TRUE(cl.ok()) << cl.status();
    EXPECT_EQ((*cl)->hello_resume_grace_seconds(), 120);
    auto src = client::ShmRegion::Create(kRegionBytes);
    auto dst = client::ShmRegion::Create(kRegionBytes);
    ASSERT_TRUE(src.ok() && dst.ok());
    std::mt19937_64 rng(200 + c);
    for (uint64_t i = 0; i < kRegionBytes; ++i) static_cast<uint8_t*>(src->data())[i] = rng();
    PerClient& pc = cs[c];
    pc.client = *std::move(cl);
    pc.src.emplace(*std::move(src));
    pc.dst.emplace(*std::move(dst));
    auto sr = pc.client->RegisterShmRegion(*pc.src);
    auto dr = pc.client->RegisterShmRegion(*pc.dst);
    ASSERT_TRUE(sr.ok() && dr.ok());
    pc.src_region = *sr;
    pc.dst_region = *dr;
    for (int i = 0; i < kConfirmedFirst; ++i) {
      auto r = pc.client->Offload(pc.src_region, BlockOffset(i), BlockBytes(c, i)).get();
      ASSERT_TRUE(r.ok()) << r.status();
      pc.confirmed.push_back({r->block_id, BlockOffset(i), BlockBytes(c, i)});
    }
  }
  auto issue = [&](PerClient& pc, int c, int from, int to) {
    for (int i = from; i < to; ++i) {
      pc.offloads.emplace_back(i, pc.client->Offload(pc.src_region, BlockOffset(i),
                                                     BlockBytes(c, i)));
    }
  };
  for (int c = 0; c < kClients; ++c) {  // in flight at the kill: offloads and reloads
    issue(cs[c], c, kConfirmedFirst, kConfirmedFirst + kInFlight / 2);
    for (const Confirmed& b : cs[c].confirmed) {
      cs[c].reloads.emplace_back(b, cs[c].client->Reload(b.block_id, cs[c].dst_region, b.offset,
                                                         client::Priority::kUrgent));
    }
  }
  EXPECT_EQ(first.Stop(SIGKILL), 128 + SIGKILL);
  for (int c = 0; c < kClients; ++c) {  // during the outage
    issue(cs[c], c, kConfirmedFirst + kInFlight / 2, kConfirmedFirst + kInFlight);
  }
  Daemon second;
  ASSERT_TRUE(second.Start(args));
  uint64_t confirmed_total = 0;
  for (int c = 0; c < kClients; ++c) {
    PerClient& pc = cs[c];
    for (auto& [b, f] : pc.reloads) {
      auto r = f.get();
      ASSERT_TRUE(r.ok()) << "client " << c << ": " << r.status();
      EXPECT_EQ(r->bytes, b.bytes);
    }
    for (auto& [i, f] : pc.offloads) {
      auto r = f.get();
      ASSERT_TRUE(r.ok()) << "client " << c << " offload " << i << ": " << r.status();
      pc.confirmed.push_back({r->block_id, BlockOffset(i), BlockBytes(c, i)});
    }
    for (const Confirmed& b : pc.confirmed) {
      auto r = pc.client->Reload(b.block_id, pc.dst_region, b.offset, client::Priority::kUrgent)
                   .get();
      ASSERT_TRUE(r.ok()) << "client " << c << " block " << b.block_id << ": " << r.status();
      EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(pc.dst->data()) + b.offset,
                            static_cast<uint8_t*>(pc.src->data()) + b.offset, b.bytes),
                0)
          << "client " << c << " block at " << b.offset;
    }
    const client::ClientCounters counters = pc.client->counters();
    EXPECT_EQ(counters.resumes, 1u);
    EXPECT_GE(counters.resent, static_cast<uint64_t>(kInFlight / 2));
    confirmed_total += pc.confirmed.size();
  }
  auto stats = cs[0].client->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->blocks(), confirmed_total);  // orphans released, nothing stored twice
  for (int c = 0; c < kClients; ++c) {
    for (const Confirmed& b : cs[c].confirmed) {
      EXPECT_TRUE(cs[c].client->Release(b.block_id).get().ok());
    }
  }
  stats = cs[0].client->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->blocks(), 0u);
  EXPECT_EQ(stats->pool_used_bytes(), 0u);
  for (PerClient& pc : cs) pc.client->Close();
  EXPECT_EQ(second.Stop(SIGTERM), 0);
  shm_unlink(("/" + pool).c_str());
}

// Without a shared pool the stream's end is final: pending requests fail with UNAVAILABLE at
// once instead of waiting for a daemon that could not give the blocks back.
TEST(RestartTest, AnonymousPoolFailsAtOnce) {
  const std::string socket = UniqueSocketPath();
  Daemon d;
  ASSERT_TRUE(d.Start({Runfile("server/offloadd"), "--socket_path=" + socket,
                       "--pool_bytes=16MiB", "--metrics_address="}));
  client::ClientOptions o;
  o.socket_path = socket;
  o.device_id = "gpu0";
  auto cl = client::Client::Connect(o);
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ((*cl)->hello_resume_grace_seconds(), 0);
  EXPECT_EQ(d.Stop(SIGKILL), 128 + SIGKILL);
  auto released = (*cl)->Release(1).get();
  EXPECT_EQ(released.code(), absl::StatusCode::kUnavailable) << released;
  (*cl)->Close();
}

}  // namespace
}  // namespace offloadd::testing
