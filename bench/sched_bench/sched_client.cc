// sched_client: one simulated GPU that keeps its link saturated, for the link scheduler
// benchmark (sched_bench.py) and the short end-to-end test. shm backend only.
//
// Set-up: connects as --device, registers one shm region, offloads --reloads blocks (and the
// probe block) once, then prints {"ready": true} and waits for a line on stdin ("go").
// Load, for --duration_seconds after "go":
//   --offloads N  threads, each: Offload(block_bytes) then Release, again (D2H, class OFFLOAD)
//   --reloads N   threads, each: Reload its own block (no release), again (H2D, PREFETCH, or
//                 URGENT with --reload_urgent)
//   --probes K    one thread: from --probe_start_seconds on, every --probe_interval_seconds, an
//                 URGENT Reload of the --probe_bytes block, timed from the call to its completion
// Bytes are not checked here (checkpoint_workload does that); the daemon moves them all the same.
// Prints one JSON line: counts, bytes, errors and the probe latencies in seconds. Exit 0 when no
// request failed, 1 otherwise, 2 for usage errors.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/offloadd_client.h"
#include "common/base/clock.h"

namespace {

using offloadd::base::SleepUntilSteadySeconds;
using offloadd::base::SteadyNowSeconds;
using offloadd::client::Client;
using offloadd::client::Priority;

struct Args {
  std::string socket, device = "gpu0", name = "sched_client";
  uint64_t block_bytes = 8ull << 20, probe_bytes = 32ull << 20;
  uint64_t offloads = 4, reloads = 4, probes = 0;
  double duration_seconds = 10, probe_start_seconds = 0, probe_interval_seconds = 0.5;
  bool reload_urgent = false;
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::cerr << "sched_client: expected --name=value, got " << arg << "\n";
      return false;
    }
    const std::string key = arg.substr(2, eq - 2), v = arg.substr(eq + 1);
    bool ok = true;
    if (key == "socket") a->socket = v;
    else if (key == "device") a->device = v;
    else if (key == "name") a->name = v;
    else if (key == "block_bytes") ok = absl::SimpleAtoi(v, &a->block_bytes);
    else if (key == "probe_bytes") ok = absl::SimpleAtoi(v, &a->probe_bytes);
    else if (key == "offloads") ok = absl::SimpleAtoi(v, &a->offloads);
    else if (key == "reloads") ok = absl::SimpleAtoi(v, &a->reloads);
    else if (key == "probes") ok = absl::SimpleAtoi(v, &a->probes);
    else if (key == "duration_seconds") ok = absl::SimpleAtod(v, &a->duration_seconds);
    else if (key == "probe_start_seconds") ok = absl::SimpleAtod(v, &a->probe_start_seconds);
    else if (key == "probe_interval_seconds") ok = absl::SimpleAtod(v, &a->probe_interval_seconds);
    else if (key == "reload_urgent") a->reload_urgent = v == "true" || v == "1";
    else {
      std::cerr << "sched_client: unknown flag --" << key << "\n";
      return false;
    }
    if (!ok) {
      std::cerr << "sched_client: bad value for --" << key << ": " << v << "\n";
      return false;
    }
  }
  if (a->block_bytes == 0 || (a->probes > 0 && a->probe_bytes == 0)) {
    std::cerr << "sched_client: sizes must be > 0\n";
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) return 2;
  offloadd::client::ClientOptions o;
  o.socket_path = a.socket;
  o.client_name = a.name;
  o.device_id = a.device;
  auto client = Client::Connect(o);
  if (!client.ok()) {
    std::cerr << "sched_client: " << client.status().message() << "\n";
    return 1;
  }
  Client& c = **client;
  // Layout: offload slots, reload slots, then the probe block.
  const uint64_t probe_offset = (a.offloads + a.reloads) * a.block_bytes;
  const uint64_t size = probe_offset + (a.probes > 0 ? a.probe_bytes : 0);
  auto region = offloadd::client::ShmRegion::Create(size);
  if (!region.ok()) {
    std::cerr << "sched_client: " << region.status().message() << "\n";
    return 1;
  }
  std::memset(region->data(), 0x5a, size);  // touch every page once
  auto region_id = c.RegisterShmRegion(*region);
  if (!region_id.ok()) {
    std::cerr << "sched_client: " << region_id.status().message() << "\n";
    return 1;
  }
  auto offload_now = [&](uint64_t offset, uint64_t bytes) -> uint64_t {
    auto r = c.Offload(*region_id, offset, bytes).get();
    if (!r.ok()) {
      std::cerr << "sched_client: set-up offload failed: " << r.status().message() << "\n";
      std::exit(1);
    }
    return r->block_id;
  };
  std::vector<uint64_t> reload_blocks;
  for (uint64_t i = 0; i < a.reloads; ++i) {
    reload_blocks.push_back(offload_now((a.offloads + i) * a.block_bytes, a.block_bytes));
  }
  const uint64_t probe_block = a.probes > 0 ? offload_now(probe_offset, a.probe_bytes) : 0;

  std::cout << "{\"ready\": true}" << std::endl;
  std::string line;
  if (!std::getline(std::cin, line)) return 1;  // the driver went away
  const double t0 = SteadyNowSeconds(), stop = t0 + a.duration_seconds;

  std::atomic<uint64_t> offloads{0}, reloads{0}, errors{0};
  std::mutex mu;
  std::string first_error;
  auto fail = [&](const absl::Status& s) {
    errors.fetch_add(1);
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.empty()) first_error = std::string(s.message());
  };
  std::vector<std::thread> threads;
  for (uint64_t j = 0; j < a.offloads; ++j) {
    threads.emplace_back([&, j] {
      while (SteadyNowSeconds() < stop) {
        auto r = c.Offload(*region_id, j * a.block_bytes, a.block_bytes).get();
        if (!r.ok()) return fail(r.status());
        offloads.fetch_add(1);
        absl::Status released = c.Release(r->block_id).get();
        if (!released.ok()) return fail(released);
      }
    });
  }
  const Priority reload_priority = a.reload_urgent ? Priority::kUrgent : Priority::kPrefetch;
  for (uint64_t i = 0; i < a.reloads; ++i) {
    threads.emplace_back([&, i] {
      while (SteadyNowSeconds() < stop) {
        auto r = c.Reload(reload_blocks[i], *region_id, (a.offloads + i) * a.block_bytes,
                          reload_priority)
                     .get();
        if (!r.ok()) return fail(r.status());
        reloads.fetch_add(1);
      }
    });
  }
  std::vector<double> latencies;
  if (a.probes > 0) {
    threads.emplace_back([&] {
      for (uint64_t k = 0; k < a.probes; ++k) {
        SleepUntilSteadySeconds(t0 + a.probe_start_seconds + k * a.probe_interval_seconds);
        if (SteadyNowSeconds() >= stop) break;
        const double start = SteadyNowSeconds();
        auto r = c.Reload(probe_block, *region_id, probe_offset, Priority::kUrgent).get();
        if (!r.ok()) return fail(r.status());
        latencies.push_back(SteadyNowSeconds() - start);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double elapsed = SteadyNowSeconds() - t0;
  c.Close();
  std::vector<std::string> lat;
  for (double l : latencies) lat.push_back(absl::StrFormat("%.6f", l));
  std::cout << absl::StrFormat(
                   "{\"name\": \"%s\", \"device\": \"%s\", \"link\": \"%s\", \"offloads\": %d, "
                   "\"reloads\": %d, \"offload_bytes\": %d, \"reload_bytes\": %d, "
                   "\"block_bytes\": %d, \"probe_bytes\": %d, \"probe_latencies\": [%s], "
                   "\"errors\": %d, \"first_error\": \"%s\", \"elapsed_seconds\": %.3f}",
                   a.name, a.device, c.link(), offloads.load(), reloads.load(),
                   offloads.load() * a.block_bytes, reloads.load() * a.block_bytes,
                   a.block_bytes, a.probe_bytes, absl::StrJoin(lat, ", "), errors.load(),
                   first_error, elapsed)
            << std::endl;
  return errors.load() == 0 ? 0 : 1;
}
