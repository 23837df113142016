// soak_client: one client process of the chaos soak (tests/soak/soak.py). It offloads blocks of
// random sizes filled with pseudo-random bytes, reloads them (some by tag before their offload
// has completed, some releasing them), verifies every reloaded byte against the checksum taken
// at offload, and releases blocks at random — until SIGTERM, when it reloads and verifies every
// block it still holds, closes, and exits 0.
//
// Accounting of every block it offloaded (the soak's invariant: nothing is lost silently):
//  - verified:          reloaded and its checksum matched;
//  - corrupted:         reloaded "successfully" with other bytes (must stay 0);
//  - lost_reported:     the daemon went away (stream ended: UNAVAILABLE) while the block was held
//                       — on an anonymous pool offloaded blocks do not survive a daemon restart,
//                       and the client is told; on a shared pool the client resumes by itself
//                       (auto_resume) and this stays 0;
//  - unconfirmed:       a reload with release_after in flight when the daemon crashed, whose
//                       block the restarted daemon no longer has: the client answers DATA_LOSS
//                       ("nothing can confirm it": the copy may or may not have landed before
//                       the crash), as documented — reported to the caller, so not silent;
//  - reloads_refused:   a reload the daemon refused with RESOURCE_EXHAUSTED (a spilled block's
//                       stage-back found no pool room within admission_deadline_seconds, as
//                       documented): the block is still the daemon's and stays held, to be
//                       reloaded later (the final pass retries it for up to 30 s);
//  - lost_unexpectedly: any other failure of a reload or release of a held block (must stay 0).
// An offload the daemon refuses (RESOURCE_EXHAUSTED, pool full) is counted as refused: the client
// never held that block. After the daemon goes away the client reconnects (retrying for up to
// --reconnect_seconds) and starts over.
//
// Counters are written as one JSON object to --stats (atomically, every 0.2 s and at exit) so the
// driver keeps the figures of a client it SIGKILLs.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "client/offloadd_client.h"
#include "common/base/clock.h"

namespace {

using offloadd::base::SteadyNowSeconds;
using offloadd::client::Client;
using offloadd::client::Priority;

std::atomic<bool> g_stop{false};

std::string Flag(int argc, char** argv, const std::string& name, const std::string& def) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
  }
  return def;
}

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void Fill(uint8_t* p, uint64_t bytes, uint64_t key) {
  uint64_t s = Mix(key);
  uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    s = Mix(s);
    std::memcpy(p + i, &s, 8);
  }
  for (; i < bytes; ++i) p[i] = static_cast<uint8_t>(Mix(s + i));
}

uint64_t Checksum(const uint8_t* p, uint64_t bytes) {
  uint64_t h = 0x84222325cbf29ce4ull ^ bytes;
  uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

struct Counters {
  uint64_t requests = 0, offloads = 0, reloads = 0, releases = 0, refused = 0;
  uint64_t bytes_offloaded = 0, bytes_verified = 0, verified = 0;
  uint64_t corrupted = 0, lost_reported = 0, lost_unexpectedly = 0, unconfirmed = 0;
  uint64_t reconnects = 0, resumes = 0, held = 0, reloads_refused = 0;
  std::string last_problem;
};

void WriteStats(const std::string& path, const Counters& c, bool final_pass_done) {
  if (path.empty()) return;
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return;
  std::string problem = c.last_problem;
  for (char& ch : problem) ch = (ch == '"' || ch == '\\' || ch < 32) ? ' ' : ch;
  std::fprintf(f,
               "{\"requests\": %llu, \"offloads\": %llu, \"reloads\": %llu, \"releases\": %llu, "
               "\"refused\": %llu, \"bytes_offloaded\": %llu, \"bytes_verified\": %llu, "
               "\"verified\": %llu, \"corrupted\": %llu, \"lost_reported\": %llu, "
               "\"lost_unexpectedly\": %llu, \"unconfirmed\": %llu, \"reconnects\": %llu, "
               "\"resumes\": %llu, \"reloads_refused\": %llu, "
               "\"held\": %llu, \"final_pass_done\": %s, \"last_problem\": \"%s\"}\n",
               (unsigned long long)c.requests, (unsigned long long)c.offloads,
               (unsigned long long)c.reloads, (unsigned long long)c.releases,
               (unsigned long long)c.refused, (unsigned long long)c.bytes_offloaded,
               (unsigned long long)c.bytes_verified, (unsigned long long)c.verified,
               (unsigned long long)c.corrupted, (unsigned long long)c.lost_reported,
               (unsigned long long)c.lost_unexpectedly, (unsigned long long)c.unconfirmed,
               (unsigned long long)c.reconnects,
               (unsigned long long)c.resumes, (unsigned long long)c.reloads_refused,
               (unsigned long long)c.held,
               final_pass_done ? "true" : "false", problem.c_str());
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

struct Block {
  uint64_t block_id = 0, bytes = 0, checksum = 0;
  // When its offload was confirmed (seconds since the client started) and how many times the
  // client had resumed by then: a problem with the block names the daemon incarnation it came
  // from.
  double confirmed_seconds = 0;
  uint64_t resumes_at_confirm = 0;
};

class SoakClient {
 public:
  SoakClient(std::string socket, std::string name, uint64_t seed, uint64_t max_block_bytes,
             int max_blocks, std::string stats, double reconnect_seconds)
      : socket_(std::move(socket)),
        name_(std::move(name)),
        rng_(seed),
        seed_(seed),
        max_block_bytes_(max_block_bytes),
        max_blocks_(max_blocks),
        stats_path_(std::move(stats)),
        reconnect_seconds_(reconnect_seconds) {}

  int Run() {
    if (!Connect()) return 1;
    double last_flush = 0;
    while (!g_stop) {
      Step();
      if (SteadyNowSeconds() - last_flush > 0.2) {
        Flush(false);
        last_flush = SteadyNowSeconds();
      }
    }
    // Final pass: every held block is reloaded and verified before the client leaves.
    if (client_ && client_->stream_status().ok()) {
      std::vector<uint64_t> ids;
      for (auto& [id, b] : held_) ids.push_back(id);
      const double deadline = SteadyNowSeconds() + 30;
      for (uint64_t id : ids) {
        if (client_ == nullptr || held_.count(id) == 0) break;  // the daemon went away meanwhile
        while (!ReloadAndVerify(id, /*release=*/true, Priority::kUrgent)) {  // refused: no room
          if (SteadyNowSeconds() > deadline) {
            c_.lost_unexpectedly++;
            c_.last_problem = History(held_.at(id), "final reload refused for 30 s");
            held_.erase(id);
            break;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
    }
    if (client_) client_->Close();
    Flush(true);
    return 0;
  }

 private:
  static constexpr int kSlots = 4;  // source slots for concurrent offloads; slot kSlots: reloads

  bool Connect() {
    const double deadline = SteadyNowSeconds() + reconnect_seconds_;
    while (true) {
      offloadd::client::ClientOptions o;
      o.socket_path = socket_;
      o.client_name = name_;
      o.device_id = absl::StrFormat("gpu%d", seed_ % 4);
      o.connect_timeout_seconds = 2;
      auto c = Client::Connect(o);
      if (c.ok()) {
        client_ = *std::move(c);
        auto id = client_->RegisterShmRegion(*region_);
        if (id.ok()) {
          region_id_ = *id;
          return true;
        }
        client_.reset();
      }
      if (SteadyNowSeconds() > deadline || g_stop) {
        c_.last_problem = "could not reconnect: " + c.status().ToString();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // The daemon went away: every held block is reported lost; reconnect.
  void DaemonGone(const absl::Status& why) {
    c_.lost_reported += held_.size();
    held_.clear();
    c_.last_problem = why.ToString();
    resumes_before_ += client_->counters().resumes;
    client_.reset();
    c_.reconnects++;
    if (!Connect()) g_stop = true;
  }

  uint8_t* Slot(int i) { return static_cast<uint8_t*>(region_->data()) + i * max_block_bytes_; }

  void Step() {
    std::uniform_real_distribution<double> u(0, 1);
    const double p = u(rng_);
    if (held_.size() < static_cast<size_t>(max_blocks_) && (p < 0.45 || held_.empty())) {
      OffloadBatch(u(rng_) < 0.25);
    } else if (p < 0.85) {
      auto it = held_.begin();
      std::advance(it, std::uniform_int_distribution<size_t>(0, held_.size() - 1)(rng_));
      ReloadAndVerify(it->first, u(rng_) < 0.3,
                      u(rng_) < 0.5 ? Priority::kUrgent : Priority::kPrefetch);
    } else {
      auto it = held_.begin();
      std::advance(it, std::uniform_int_distribution<size_t>(0, held_.size() - 1)(rng_));
      const uint64_t id = it->first;
      c_.requests++;
      absl::Status st = client_->Release(id).get();
      if (st.ok()) {
        c_.releases++;
        held_.erase(id);
      } else if (st.code() == absl::StatusCode::kUnavailable) {
        DaemonGone(st);
      } else {
        c_.lost_unexpectedly++;
        c_.last_problem = History(held_.at(id), "release: " + st.ToString());
        held_.erase(id);
      }
    }
  }

  // 1..kSlots offloads at once, each of a random size; with `tagged_reload`, the first is
  // reloaded by tag right away (queued behind its offload) and checked.
  void OffloadBatch(bool tagged_reload) {
    const int n = std::uniform_int_distribution<int>(1, kSlots)(rng_);
    std::vector<Block> blocks(n);
    std::vector<std::future<absl::StatusOr<offloadd::client::OffloadResult>>> futures;
    const uint64_t tag = ++next_tag_;
    for (int i = 0; i < n; ++i) {
      Block& b = blocks[i];
      b.bytes = std::uniform_int_distribution<uint64_t>(1, max_block_bytes_)(rng_);
      Fill(Slot(i), b.bytes, rng_());
      b.checksum = Checksum(Slot(i), b.bytes);
      c_.requests++;
      futures.push_back(client_->Offload(region_id_, i * max_block_bytes_, b.bytes, "",
                                         i == 0 && tagged_reload ? tag : 0));
    }
    std::future<absl::StatusOr<offloadd::client::ReloadResult>> early;
    if (tagged_reload) {
      c_.requests++;
      early =
          client_->ReloadTagged(tag, region_id_, kSlots * max_block_bytes_, Priority::kPrefetch);
    }
    absl::Status gone;
    for (int i = 0; i < n; ++i) {
      auto r = futures[i].get();
      if (r.ok()) {
        blocks[i].block_id = r->block_id;
        blocks[i].confirmed_seconds = SteadyNowSeconds() - start_seconds_;
        blocks[i].resumes_at_confirm = Resumes();
        held_[r->block_id] = blocks[i];
        c_.offloads++;
        c_.bytes_offloaded += blocks[i].bytes;
      } else if (r.status().code() == absl::StatusCode::kUnavailable) {
        gone = r.status();
      } else if (r.status().code() == absl::StatusCode::kResourceExhausted) {
        c_.refused++;
      } else {
        c_.lost_unexpectedly++;
        c_.last_problem = "offload: " + r.status().ToString();
        std::fprintf(stderr, "soak_client %s: problem: %s\n", name_.c_str(),
                     c_.last_problem.c_str());
      }
    }
    if (tagged_reload) {
      auto r = early.get();
      if (r.ok()) {
        Verify(blocks[0], kSlots);
      } else if (r.status().code() == absl::StatusCode::kUnavailable) {
        gone = r.status();
      } else if (r.status().code() == absl::StatusCode::kResourceExhausted &&
                 blocks[0].block_id != 0) {
        c_.reloads_refused++;  // no room to stage it back in time: still held, reloaded later
      } else if (blocks[0].block_id != 0) {  // the offload succeeded, its tagged reload did not
        c_.lost_unexpectedly++;
        c_.last_problem = History(blocks[0], "tagged reload: " + r.status().ToString());
      }  // else: the offload was refused and the reload failed with it, as documented
      c_.reloads += r.ok();
    }
    if (!gone.ok()) DaemonGone(gone);
  }

  void Verify(const Block& b, int slot) {
    if (Checksum(Slot(slot), b.bytes) == b.checksum) {
      c_.verified++;
      c_.bytes_verified += b.bytes;
    } else {
      c_.corrupted++;
      c_.last_problem =
          absl::StrFormat("block %d of %d bytes came back with other bytes", b.block_id, b.bytes);
    }
  }

  // Reloads held block `id` and verifies it; false when the daemon refused the reload for room
  // (RESOURCE_EXHAUSTED: counted in reloads_refused, the block stays held), else true.
  bool ReloadAndVerify(uint64_t id, bool release, Priority priority) {
    const Block b = held_.at(id);
    std::memset(Slot(kSlots), 0xA5, b.bytes);  // stale bytes must not pass for the block's
    c_.requests++;
    auto r = client_->Reload(id, region_id_, kSlots * max_block_bytes_, priority, release).get();
    if (r.ok()) {
      c_.reloads++;
      Verify(b, kSlots);
      if (release) held_.erase(id);
    } else if (r.status().code() == absl::StatusCode::kUnavailable) {
      DaemonGone(r.status());
    } else if (r.status().code() == absl::StatusCode::kResourceExhausted) {
      c_.reloads_refused++;  // documented: no pool room to stage a spilled block back in time
      return false;
    } else if (release && r.status().code() == absl::StatusCode::kDataLoss &&
               absl::StrContains(r.status().message(), "release_after")) {
      c_.unconfirmed++;  // documented outcome of a crash during a release_after reload
      held_.erase(id);
    } else {
      c_.lost_unexpectedly++;
      c_.last_problem = History(b, "reload: " + r.status().ToString());
      held_.erase(id);
    }
    return true;
  }

  uint64_t Resumes() const {
    return resumes_before_ + (client_ ? client_->counters().resumes : 0);
  }

  // Where a block came from, for a problem's message (and stderr, kept with the run's logs).
  // `what`: the failure (also on stderr: last_problem keeps only the newest problem, and the
  // daemon going away later overwrites it).
  std::string History(const Block& b, const std::string& what) const {
    std::string h = absl::StrFormat(
        " [block %d confirmed %.3f s after the client started, after %d resumes; now %.3f s, "
        "%d resumes]",
        b.block_id, b.confirmed_seconds, b.resumes_at_confirm,
        SteadyNowSeconds() - start_seconds_, Resumes());
    std::fprintf(stderr, "soak_client %s: problem: %s%s\n", name_.c_str(), what.c_str(),
                 h.c_str());
    return what + h;
  }

  void Flush(bool final_pass_done) {
    c_.held = held_.size();
    c_.resumes = Resumes();
    WriteStats(stats_path_, c_, final_pass_done);
  }

 public:
  bool MakeRegion() {
    auto r = offloadd::client::ShmRegion::Create((kSlots + 1) * max_block_bytes_);
    if (!r.ok()) return false;
    region_ = std::make_unique<offloadd::client::ShmRegion>(*std::move(r));
    return true;
  }

 private:
  const std::string socket_, name_;
  std::mt19937_64 rng_;
  const uint64_t seed_, max_block_bytes_;
  const int max_blocks_;
  const std::string stats_path_;
  const double reconnect_seconds_;
  const double start_seconds_ = SteadyNowSeconds();
  std::unique_ptr<offloadd::client::ShmRegion> region_;
  std::unique_ptr<Client> client_;
  uint64_t region_id_ = 0, next_tag_ = 0, resumes_before_ = 0;
  std::map<uint64_t, Block> held_;
  Counters c_;
};

}  // namespace

int main(int argc, char** argv) {
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop = true; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  SoakClient c(Flag(argc, argv, "socket", ""), Flag(argc, argv, "name", "soak"),
               std::strtoull(Flag(argc, argv, "seed", "1").c_str(), nullptr, 10),
               std::strtoull(Flag(argc, argv, "max_block_bytes", "4194304").c_str(), nullptr, 10),
               std::atoi(Flag(argc, argv, "max_blocks", "16").c_str()),
               Flag(argc, argv, "stats", ""),
               std::atof(Flag(argc, argv, "reconnect_seconds", "60").c_str()));
  if (!c.MakeRegion()) {
    std::fprintf(stderr, "soak_client: cannot create the shm region\n");
    return 1;
  }
  return c.Run();
}
