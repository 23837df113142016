#include "client/cli/bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "client/cli/query.h"
#include "client/offloadd_client.h"
#include "client/plan/plan_command.h"
#include "common/base/clock.h"

namespace offloadd::cli {
namespace {

using client::Client;
using client::Priority;

// Every bench session names this one device, with transient_device set in its Hello: the daemon
// makes one link for it while the bench runs and removes it, with its metric series, when the
// last bench session ends (Core::ReleaseLink in server/session/core.h).
constexpr const char* kBenchDevice = "offloadctl-bench";

struct Options {
  uint64_t block_bytes = 64ull << 20;
  uint64_t blocks = 8;
  int rounds = 5;
  int latency_requests = 2000;
  int rate_requests = 20000;
  int window = 64;
  bool json = false;
};

absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket, const std::string& dev) {
  client::ClientOptions o;
  o.socket_path = socket;
  o.client_name = "offloadctl bench";
  o.device_id = dev;
  o.transient_device = true;  // leave no link behind on a production daemon
  return Client::Connect(o);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// GB/s of offloading then reloading every block, all in flight; checks the bytes.
absl::StatusOr<double> ThroughputRound(Client& c, uint64_t region, client::ShmRegion& shm,
                                       const Options& o) {
  const double t0 = base::SteadyNowSeconds();
  std::vector<std::future<absl::StatusOr<client::OffloadResult>>> offs;
  for (uint64_t b = 0; b < o.blocks; ++b) offs.push_back(c.Offload(region, b * o.block_bytes, o.block_bytes));
  std::vector<uint64_t> ids;
  for (auto& f : offs) {
    auto r = f.get();
    if (!r.ok()) return r.status();
    ids.push_back(r->block_id);
  }
  std::vector<std::future<absl::StatusOr<client::ReloadResult>>> rels;
  for (uint64_t b = 0; b < o.blocks; ++b) {
    rels.push_back(c.Reload(ids[b], region, b * o.block_bytes, Priority::kUrgent, true));
  }
  for (auto& f : rels) {
    auto r = f.get();
    if (!r.ok()) return r.status();
  }
  const double dt = base::SteadyNowSeconds() - t0;
  (void)shm;
  return 2.0 * o.blocks * o.block_bytes / dt / 1e9;
}

double MemcpyRound(uint8_t* region, uint8_t* host, const Options& o) {
  const uint64_t total = o.blocks * o.block_bytes;
  const double t0 = base::SteadyNowSeconds();
  std::memcpy(host, region, total);
  std::memcpy(region, host, total);
  const double dt = base::SteadyNowSeconds() - t0;
  return 2.0 * total / dt / 1e9;
}

// Sequential 4 KiB offload + reload(release) round trips; returns latencies in seconds.
absl::StatusOr<std::vector<double>> SmallLatency(Client& c, uint64_t region, int n) {
  std::vector<double> lat;
  for (int i = 0; i < n; ++i) {
    double t0 = base::SteadyNowSeconds();
    auto off = c.Offload(region, 0, 4096).get();
    if (!off.ok()) return off.status();
    auto rel = c.Reload(off->block_id, region, 4096, Priority::kUrgent, true).get();
    if (!rel.ok()) return rel.status();
    lat.push_back(base::SteadyNowSeconds() - t0);
  }
  return lat;
}

// Requests/s of 4 KiB offloads (each followed by a release) with `window` in flight.
absl::Status SmallRate(Client& c, uint64_t region, int n, int window, uint64_t* done) {
  std::vector<std::future<absl::StatusOr<client::OffloadResult>>> inflight;
  std::vector<std::future<absl::Status>> releases;
  int issued = 0;
  while (issued < n || !inflight.empty()) {
    while (issued < n && static_cast<int>(inflight.size()) < window) {
      inflight.push_back(c.Offload(region, (issued % 64) * 4096, 4096));
      ++issued;
    }
    auto r = inflight.front().get();
    inflight.erase(inflight.begin());
    if (!r.ok()) return r.status();
    releases.push_back(c.Release(r->block_id));
    *done += 2;
    if (releases.size() >= static_cast<size_t>(window)) {
      for (auto& f : releases) {
        if (absl::Status s = f.get(); !s.ok()) return s;
      }
      releases.clear();
    }
  }
  for (auto& f : releases) {
    if (absl::Status s = f.get(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The value flags, by their names with underscores (dashes are read as underscores).
bool IsBenchFlag(const std::string& name) {
  for (const char* known :
       {"block_bytes", "blocks", "rounds", "latency_requests", "rate_requests", "window"}) {
    if (name == known) return true;
  }
  return false;
}

// Returns "" when the arguments parse, else a sentence naming the bad one. Flags take
// `--name=value` or `--name value`, as `offloadctl plan`'s, with dashes or underscores
// (--block-bytes is --block_bytes); block_bytes takes a size suffix.
std::string Parse(const std::vector<std::string>& args, Options* o) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      o->json = true;
      continue;
    }
    if (a == "--help" || a == "-h") return "help";
    if (a.rfind("--", 0) != 0) return "'" + a + "' is not a flag (--name=value or --name value)";
    const size_t eq = a.find('=');
    const std::string given = a.substr(0, eq);
    std::string k = given.substr(2);
    std::replace(k.begin(), k.end(), '-', '_');
    if (!IsBenchFlag(k)) return "unknown option " + given;  // before its value is read
    if (eq == std::string::npos && i + 1 == args.size()) return given + " needs a value";
    const std::string value = eq == std::string::npos ? args[++i] : a.substr(eq + 1);
    double v = 0;
    if (k == "block_bytes") {
      absl::StatusOr<uint64_t> bytes = plan::ParseSize(k, value);
      if (!bytes.ok()) return std::string(bytes.status().message());
      v = static_cast<double>(*bytes);
    } else if (!absl::SimpleAtod(value, &v) || v < 1) {
      return given + " takes a positive count, not '" + value + "'";
    }
    if (k == "block_bytes") o->block_bytes = static_cast<uint64_t>(v);
    else if (k == "blocks") o->blocks = static_cast<uint64_t>(v);
    else if (k == "rounds") o->rounds = static_cast<int>(v);
    else if (k == "latency_requests") o->latency_requests = static_cast<int>(v);
    else if (k == "rate_requests") o->rate_requests = static_cast<int>(v);
    else o->window = static_cast<int>(v);
  }
  return "";
}

int Fail(const absl::Status& s) {
  std::cerr << "offloadctl bench: " << s.ToString() << "\n";
  return 1;
}

// The bench measures the shm data path (shared memory against memcpy, bytes checked): a daemon on
// another backend is told apart (Stats names cuda-sim) and pointed at the benchmark that fits.
int RefuseBackend(Client& c, const std::string& socket_path) {
  absl::StatusOr<v1::Stats> stats = c.GetStats();
  const std::string backend = stats.ok() ? stats->backend() : c.backend();
  std::cerr << "offloadctl bench: the daemon at " << socket_path << " runs backend " << backend
            << "; this bench measures the shm data path (shared memory against memcpy) and "
            << (backend == "cuda-sim"
                    ? "cuda-sim's timings are simulated: measure its copy engine with "
                      "`bazel run -c opt //bench:copy_sim_bench` or "
                      "`make demo ARGS=\"--backend cuda-sim\"` "
                      "(SIMULATED figures)"
                    : "needs a daemon with backend shm; on a GPU node use tests/gpu/run.sh")
            << "\n";
  return 1;
}

}  // namespace

int RunBench(const std::string& socket_path, const std::vector<std::string>& args) {
  Options o;
  const std::string problem = Parse(args, &o);
  if (!problem.empty()) {
    if (problem != "help") std::cerr << "offloadctl bench: " << problem << "\n";
    std::ostream& out = problem == "help" ? std::cout : std::cerr;
    out << "usage: offloadctl bench [--block_bytes 64MiB] [--blocks 8] [--rounds 5] "
           "[--latency_requests 2000] [--rate_requests 20000] [--window 64] [--json]\n"
           "       (each flag also as --name=value)\n";
    return problem == "help" ? 0 : 2;
  }
  if (absl::Status st = CheckSocketPresent(socket_path); !st.ok()) return Fail(st);
  auto c = Connect(socket_path, kBenchDevice);
  if (!c.ok()) return Fail(c.status());
  if ((*c)->backend() != "shm") return RefuseBackend(**c, socket_path);
  auto shm = client::ShmRegion::Create(o.blocks * o.block_bytes);
  if (!shm.ok()) return Fail(shm.status());
  auto* region_bytes = static_cast<uint8_t*>(shm->data());
  for (uint64_t i = 0; i < shm->size_bytes(); i += 8) {
    uint64_t v = i * 0x9e3779b97f4a7c15ull;
    std::memcpy(region_bytes + i, &v, 8);
  }
  auto region = (*c)->RegisterShmRegion(*shm);
  if (!region.ok()) return Fail(region.status());
  std::vector<uint8_t> host(shm->size_bytes());
  std::memcpy(host.data(), region_bytes, host.size());  // touch the pages
  std::vector<uint8_t> golden(region_bytes, region_bytes + std::min<uint64_t>(shm->size_bytes(), 1 << 20));

  std::vector<double> daemon_gbps, memcpy_gbps;
  for (int r = 0; r < o.rounds; ++r) {  // interleaved so both see the same machine state
    auto g = ThroughputRound(**c, *region, *shm, o);
    if (!g.ok()) return Fail(g.status());
    daemon_gbps.push_back(*g);
    memcpy_gbps.push_back(MemcpyRound(region_bytes, host.data(), o));
  }
  if (std::memcmp(golden.data(), region_bytes, golden.size()) != 0) {
    return Fail(absl::DataLossError("reloaded bytes differ from the offloaded ones"));
  }
  auto lat = SmallLatency(**c, *region, o.latency_requests);
  if (!lat.ok()) return Fail(lat.status());

  auto rate = [&](int sessions) -> absl::StatusOr<double> {
    std::vector<std::unique_ptr<Client>> clients;
    std::vector<uint64_t> regions;
    for (int s = 0; s < sessions; ++s) {
      auto cs = Connect(socket_path, kBenchDevice);
      if (!cs.ok()) return cs.status();
      auto rid = (*cs)->RegisterShmRegion(*shm);
      if (!rid.ok()) return rid.status();
      regions.push_back(*rid);
      clients.push_back(*std::move(cs));
    }
    std::vector<std::thread> threads;
    std::vector<absl::Status> status(sessions);
    std::vector<uint64_t> done(sessions, 0);
    const double t0 = base::SteadyNowSeconds();
    for (int s = 0; s < sessions; ++s) {
      threads.emplace_back([&, s] {
        status[s] = SmallRate(*clients[s], regions[s], o.rate_requests / sessions, o.window, &done[s]);
      });
    }
    for (auto& t : threads) t.join();
    const double dt = base::SteadyNowSeconds() - t0;
    uint64_t total = 0;
    for (int s = 0; s < sessions; ++s) {
      if (!status[s].ok()) return status[s];
      total += done[s];
    }
    for (auto& cl : clients) cl->Close();
    return total / dt;
  };
  auto rate1 = rate(1);
  if (!rate1.ok()) return Fail(rate1.status());
  auto rate4 = rate(4);
  if (!rate4.ok()) return Fail(rate4.status());
  (*c)->Close();

  const double d = Median(daemon_gbps), m = Median(memcpy_gbps);
  const double p50 = Percentile(*lat, 0.5) * 1e6, p99 = Percentile(*lat, 0.99) * 1e6;
  if (o.json) {
    std::cout << absl::StrFormat(
        "{\"block_bytes\": %d, \"blocks\": %d, \"rounds\": %d, \"daemon_gb_per_second\": %.3f, "
        "\"memcpy_gb_per_second\": %.3f, \"ratio\": %.3f, \"small_round_trip_p50_us\": %.1f, "
        "\"small_round_trip_p99_us\": %.1f, \"requests_per_second_1_session\": %.0f, "
        "\"requests_per_second_4_sessions\": %.0f}\n",
        o.block_bytes, o.blocks, o.rounds, d, m, d / m, p50, p99, *rate1, *rate4);
  } else {
    std::cout << absl::StrFormat(
        "offload+reload of %d x %d MiB, median of %d rounds:\n"
        "  through offloadd   %8.2f GB/s\n  plain memcpy       %8.2f GB/s\n"
        "  ratio              %8.3f  (project target >= 0.8 on an idle host; other load on "
        "these cores lowers it: rerun, or see BENCHMARKS.md)\n"
        "4 KiB offload+reload round trip (one at a time, %d): p50 %.0f us, p99 %.0f us\n"
        "4 KiB requests/s (offload + release, %d in flight): 1 session %.0f, 4 sessions %.0f\n",
        o.blocks, o.block_bytes >> 20, o.rounds, d, m, d / m, o.latency_requests, p50, p99,
        o.window, *rate1, *rate4);
  }
  return 0;
}

}  // namespace offloadd::cli
