// copy_sim_bench: how close the daemon's cuda copy path keeps simulated GPU copy
// engines to their modelled rate, on a machine without a GPU. Everything it reports about GPUs
// is SIMULATED: the engines are CopyTimingModel behind SimCudaApi
// (server/copy/cuda/cuda_api_sim.h), which moves no bytes; what is real is the daemon's code
// driving them — CudaCopyEngine, its device worker threads and the LinkScheduler per switch and
// direction, as the daemon wires them (session/core.cc: unpaced links, `copy_threads` workers
// each) — and the host CPU it burns.
//
// Workload: `gpus` GPUs, `gpus_per_switch` behind each switch (one link per switch), each GPU
// with `streams` offloads (D2H) and `streams` reloads (H2D, PREFETCH) of `transfer_mib` MiB
// always in flight (a finished one is replaced at once), for each chunk size in `chunk_mib`.
// Meanwhile an URGENT reload of one chunk is submitted every 20 ms on a rotating GPU.
//
// NUMA placement: the GPUs are split evenly over `numa_nodes` host memory
// nodes, and a copy whose host buffer lies on another node than its GPU moves at
// `cross_node_factor` of the modelled rate (CopyTimingModel; default 0.35, torchtitan#3519's
// ~115 vs ~330 GB/s on GB200). Placement "local" puts every transfer's host buffer on its GPU's
// node (what the daemon's per-node pool slices do); "interleaved" puts transfer i of a GPU on
// node (gpu's node + i) mod numa_nodes, as a pool with no placement spreads blocks. Both run by
// default and a line per engine and chunk size says what local placement buys (SIMULATED).
//
// Each engine (CopyChunk on blocking copy workers: "sync"; PostChunk with
// max_chunks_in_flight chunks posted per GPU: "async") runs `repeats` windows of `seconds` after
// `warmup_seconds`, the engines alternating window by window so load from other processes hits
// both alike. Figures per engine and chunk size:
//  - achieved bytes per engine / (window x modelled rate): the median over windows of the mean
//    over D2H engines (and H2D engines), and the lowest single engine (1.0 = never idle);
//  - urgent reload latency, submit to its `done` callback, in chunk-times (chunk_bytes /
//    modelled rate): median and max over all windows' samples; one chunk-time of it is its
//    own copy;
//  - host CPU seconds (getrusage, the whole process) per GiB moved, and the part of it the model
//    charged as driver cost (5 us per cudaMemcpyAsync, 1 us per event record, 0.5 us per query).
//
// Flags (--name=value): gpus 8, gpus_per_switch 4, streams 4, transfer_mib 64, chunk_mib 1,8,32,
// engine sync,async, max_chunks_in_flight 8, repeats 5, seconds 0.5, warmup_seconds 0.2,
// copy_threads 2, streams_per_direction 1 (cuda engine streams per GPU and direction),
// issue_ahead_us 50 and max_issue_ahead_us 1000 (the device worker's issue-ahead margin, its
// floor and ceiling), rate_gbps 55, switch_gbps 0 (0 = no switch limit), h2d_share 1 (H2D share while D2H runs),
// numa_nodes 2, cross_node_factor 0.35, placement local,interleaved,
// check 0 (1: exit 1 when a loose bound fails: an engine above its modelled rate, nothing
// moved, an urgent reload lost, a copy error).
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/copy_bench_backend.h"
#include "common/base/clock.h"
#include "server/copy/cuda/cuda_api_sim.h"
#include "server/copy/cuda/cuda_engine.h"
#include "server/sched/link_scheduler.h"

namespace offloadd::bench {
namespace {

using base::SteadyNowSeconds;
using copy::Direction;
constexpr uint64_t kMiB = 1ull << 20;
constexpr int kMaxNumaNodes = 8;
// Simulated host buffers: node n's at (n + 1) << 40, addresses no one maps. The simulator checks
// host != null and never dereferences them; HostNode tells it the node from the address.
constexpr int kHostNodeShift = 40;

int HostNode(const void* host) {
  const uintptr_t n = reinterpret_cast<uintptr_t>(host) >> kHostNodeShift;
  return n >= 1 && n <= kMaxNumaNodes ? static_cast<int>(n - 1) : -1;
}

// The simulated GPUs: a fresh SimCudaApi (and model) per measured window.
class SimBackend : public CopyBenchBackend {
 public:
  explicit SimBackend(copy::SimCudaOptions options) : api_(std::move(options)) {}
  std::unique_ptr<copy::CudaApi> Borrow() override { return api_.Borrow(); }
  std::string AddAllocation(int gpu, uint64_t size_bytes) override {
    return api_.AddAllocation(gpu, size_bytes);
  }
  std::string DeviceUuid(int gpu) override { return copy::SimCudaApi::DeviceUuid(gpu); }
  uint8_t* HostBuffer(int, int, int node, uint64_t) override {
    return reinterpret_cast<uint8_t*>(uintptr_t(node + 1) << kHostNodeShift);
  }
  uint64_t BytesDone(int gpu, Direction d) override { return api_.engine_stats(gpu, d).bytes_done; }
  double DriverHostSeconds() override { return api_.call_counts().host_seconds; }

 private:
  copy::SimCudaApi api_;
};

struct Flags {
  int gpus = 8, gpus_per_switch = 4, streams = 4, copy_threads = 2, streams_per_direction = 1;
  uint64_t transfer_mib = 64;
  std::vector<uint64_t> chunk_mib = {1, 8, 32};
  double rate_gbps = 55, switch_gbps = 0, h2d_share = 1, seconds = 0.5, warmup_seconds = 0.2;
  double issue_ahead_us = 50, max_issue_ahead_us = 1000;  // async engine (CudaEngineOptions)
  int repeats = 5;
  std::vector<std::string> engines = {"sync", "async"};
  int max_in_flight = 8;  // async: chunks posted per GPU (LinkSchedulerOptions)
  bool check = false;
  int numa_nodes = 2;
  double cross_node_factor = 0.35;
  std::vector<std::string> placements = {"local", "interleaved"};
  std::string backend = "sim";  // sim | cuda (calibration on a GPU machine)
  bool figures = false;         // also print one FIGURE line per row (tests/gpu/run.sh)
  int gpus_per_node() const { return (gpus + numa_nodes - 1) / numa_nodes; }
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a.find('=') == std::string::npos) {
      std::fprintf(stderr, "copy_sim_bench: expected --name=value, got '%s'\n", a.c_str());
      return false;
    }
    const std::string name = a.substr(2, a.find('=') - 2), v = a.substr(a.find('=') + 1);
    const std::map<std::string, int*> ints = {{"gpus", &f->gpus},
                                              {"gpus_per_switch", &f->gpus_per_switch},
                                              {"streams", &f->streams},
                                              {"copy_threads", &f->copy_threads},
                                              {"streams_per_direction", &f->streams_per_direction},
                                              {"repeats", &f->repeats},
                                              {"numa_nodes", &f->numa_nodes},
                                              {"max_chunks_in_flight", &f->max_in_flight}};
    const std::map<std::string, double*> doubles = {{"rate_gbps", &f->rate_gbps},
                                                    {"switch_gbps", &f->switch_gbps},
                                                    {"h2d_share", &f->h2d_share},
                                                    {"cross_node_factor", &f->cross_node_factor},
                                                    {"seconds", &f->seconds},
                                                    {"issue_ahead_us", &f->issue_ahead_us},
                                                    {"max_issue_ahead_us", &f->max_issue_ahead_us},
                                                    {"warmup_seconds", &f->warmup_seconds}};
    bool ok = true;
    if (auto it = ints.find(name); it != ints.end())
      ok = absl::SimpleAtoi(v, it->second) && (name != "repeats" || f->repeats > 0);
    else if (auto d = doubles.find(name); d != doubles.end())
      ok = absl::SimpleAtod(v, d->second);
    else if (name == "transfer_mib")
      ok = absl::SimpleAtoi(v, &f->transfer_mib);
    else if (name == "engine") {
      f->engines = absl::StrSplit(v, ',');
      for (const std::string& e : f->engines) ok = ok && (e == "sync" || e == "async");
    } else if (name == "placement") {
      f->placements = absl::StrSplit(v, ',');
      for (const std::string& p : f->placements) ok = ok && (p == "local" || p == "interleaved");
    } else if (name == "backend") {
      f->backend = v;
      ok = v == "sim" || v == "cuda";
    } else if (name == "figures") {
      f->figures = v == "1" || v == "true";
    } else if (name == "check")
      f->check = v == "1" || v == "true";
    else if (name == "chunk_mib") {
      f->chunk_mib.clear();
      for (absl::string_view p : absl::StrSplit(v, ',')) {
        uint64_t c = 0;
        ok = ok && absl::SimpleAtoi(p, &c) && c > 0;
        f->chunk_mib.push_back(c);
      }
    } else {
      std::fprintf(stderr, "copy_sim_bench: unknown flag --%s\n", name.c_str());
      return false;
    }
    if (!ok) {
      std::fprintf(stderr, "copy_sim_bench: bad value for --%s: '%s'\n", name.c_str(), v.c_str());
      return false;
    }
  }
  if (f->numa_nodes < 1 || f->numa_nodes > kMaxNumaNodes || !(f->cross_node_factor > 0) ||
      f->cross_node_factor > 1) {
    std::fprintf(stderr, "copy_sim_bench: numa_nodes must be 1..%d, cross_node_factor in (0, 1]\n",
                 kMaxNumaNodes);
    return false;
  }
  return f->gpus > 0 && f->gpus_per_switch > 0 && f->streams > 0 && f->transfer_mib > 0;
}

// The 1-minute load average (other processes compete for these CPUs: the figures move with it).
double LoadAverage() {
  double load = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  return load;
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// One measured window of one engine and chunk size.
struct Result {
  double d2h_mean = 0, d2h_min = 0, h2d_mean = 0, h2d_min = 0, max_ratio = 0;
  std::vector<double> urgent_chunk_times;  // each urgent reload's latency
  int urgent_lost = 0;
  double cpu_seconds = 0, modelled_cpu_seconds = 0, gib_moved = 0;
  uint64_t errors = 0;
  uint64_t dry_runs = 0;  // async: times an engine idled while chunks waited (device thread late)
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Keeps one transfer at a time in flight on a scheduler until stopped.
class TransferLoop {
 public:
  TransferLoop(sched::LinkScheduler* link, sched::Transfer templ, std::atomic<bool>* stop,
               std::atomic<int>* running, std::atomic<uint64_t>* errors)
      : link_(link), templ_(std::move(templ)), stop_(stop), running_(running), errors_(errors) {}
  void Submit() {
    if (stop_->load()) {
      running_->fetch_sub(1);
      return;
    }
    auto t = std::make_shared<sched::Transfer>(templ_);
    t->done = [this](absl::Status st) {
      if (!st.ok()) errors_->fetch_add(1);
      Submit();
    };
    link_->Submit(std::move(t));
  }

 private:
  sched::LinkScheduler* link_;
  sched::Transfer templ_;
  std::atomic<bool>* stop_;
  std::atomic<int>* running_;
  std::atomic<uint64_t>* errors_;
};

// The node of the host buffer of a GPU's transfer number `i` under the placement.
int TransferNode(const Flags& f, bool interleaved, int gpu, int i) {
  const int own = gpu / f.gpus_per_node();
  return interleaved ? (own + i) % f.numa_nodes : own;
}

// `real`: the real CUDA backend (calibration); null: a simulated one made for this window.
Result RunOne(const Flags& f, bool async, uint64_t chunk_bytes, bool interleaved,
              CopyBenchBackend* real) {
  copy::SimCudaOptions so;
  so.model.gpus = f.gpus;
  so.model.gpus_per_switch = f.gpus_per_switch;
  so.model.engine_bytes_per_second = f.rate_gbps * 1e9;
  so.model.switch_bytes_per_second = f.switch_gbps * 1e9;
  so.model.h2d_share_while_d2h_busy = f.h2d_share;
  so.model.gpus_per_numa_node = f.gpus_per_node();
  so.model.cross_node_rate_factor = f.cross_node_factor;
  so.host_numa_node = HostNode;
  std::unique_ptr<CopyBenchBackend> sim;
  if (real == nullptr) sim = std::make_unique<SimBackend>(so);
  CopyBenchBackend& api = real != nullptr ? *real : *sim;
  copy::CudaEngineOptions eo;
  eo.streams_per_direction = static_cast<uint32_t>(std::max(1, f.streams_per_direction));
  eo.asynchronous = async;
  eo.issue_ahead_seconds = f.issue_ahead_us * 1e-6;
  eo.max_issue_ahead_seconds = f.max_issue_ahead_us * 1e-6;
  auto engine = std::make_unique<copy::CudaCopyEngine>(api.Borrow(), eo);
  const uint64_t transfer = f.transfer_mib * kMiB;

  std::vector<std::shared_ptr<copy::Region>> regions;
  for (int g = 0; g < f.gpus; ++g) {
    const uint64_t size = (2 * f.streams + 1) * transfer;
    copy::RegionSpec spec;
    spec.cuda_ipc_handle = api.AddAllocation(g, size);
    spec.size_bytes = size;
    spec.device_id = api.DeviceUuid(g);
    auto r = engine->OpenRegion(spec);
    if (!r.ok()) {
      std::fprintf(stderr, "copy_sim_bench: %s\n", std::string(r.status().message()).c_str());
      std::exit(2);
    }
    regions.push_back(*r);
  }
  // Each region stays mapped for the whole run, as under overlapping transfers: the engine maps
  // client memory only while a transfer uses it, and the cost of opening a mapping per transfer
  // is not what this benchmark measures.
  std::vector<std::shared_ptr<copy::TransferOrder>> keep_mapped;
  for (auto& r : regions) {
    copy::TransferSpec spec;
    spec.bytes = r->size_bytes();
    auto o = engine->BeginTransfer(*r, spec);
    if (o.ok()) keep_mapped.push_back(*o);
  }
  const int switches = (f.gpus + f.gpus_per_switch - 1) / f.gpus_per_switch;
  std::vector<std::unique_ptr<sched::LinkScheduler>> d2h, h2d;
  for (int s = 0; s < switches; ++s) {
    for (auto* v : {&d2h, &h2d}) {
      sched::LinkSchedulerOptions o;
      o.link_name = "switch" + std::to_string(s);
      o.direction = v == &d2h ? "d2h" : "h2d";
      o.chunk_bytes = o.quantum_bytes = chunk_bytes;
      o.worker_threads = static_cast<uint32_t>(f.copy_threads);
      o.max_chunks_in_flight_per_gpu = static_cast<uint32_t>(std::max(1, f.max_in_flight));
      v->push_back(std::make_unique<sched::LinkScheduler>(o));
    }
  }
  // The transfer's copy function for (direction, GPU, region offset): copy_chunk for the
  // synchronous engine, post_chunk for the asynchronous one (as the session would set them).
  // `slot`: the transfer's place in the region (offset slot x transfer) and its host buffer.
  auto set_copy = [&](sched::Transfer* t, Direction dir, int g, int slot, int node) {
    copy::CopyEngine* e = engine.get();
    uint8_t* host = api.HostBuffer(g, slot, node, transfer);
    const uint64_t base = slot * transfer;
    copy::Region* r = regions[g].get();
    if (async) {
      const copy::ChunkUrgency urgency = t->cls == sched::TrafficClass::kUrgent
                                             ? copy::ChunkUrgency::kUrgent
                                             : copy::ChunkUrgency::kNormal;
      t->post_chunk = [e, r, dir, base, urgency, host](uint64_t off, uint64_t len,
                                                       std::function<void(absl::Status)> done) {
        e->PostChunk(dir, *r, base + off, host + off, len, urgency, std::move(done));
      };
    } else {
      t->copy_chunk = [e, r, dir, base, host](uint64_t off, uint64_t len) {
        return e->CopyChunk(dir, *r, base + off, host + off, len);
      };
    }
  };

  std::atomic<bool> stop{false};
  std::atomic<int> running{0};
  std::atomic<uint64_t> errors{0};
  std::vector<std::unique_ptr<TransferLoop>> loops;
  for (int g = 0; g < f.gpus; ++g) {
    const int s = g / f.gpus_per_switch;
    for (int i = 0; i < f.streams; ++i) {
      sched::Transfer off;
      off.gpu = api.DeviceUuid(g);
      off.cls = sched::TrafficClass::kOffload;
      off.bytes = transfer;
      set_copy(&off, Direction::kDeviceToHost, g, i, TransferNode(f, interleaved, g, i));
      loops.push_back(std::make_unique<TransferLoop>(d2h[s].get(), off, &stop, &running, &errors));
      sched::Transfer rel;
      rel.gpu = off.gpu;
      rel.bytes = transfer;
      rel.cls = sched::TrafficClass::kPrefetch;
      set_copy(&rel, Direction::kHostToDevice, g, f.streams + i, TransferNode(f, interleaved, g, i));
      loops.push_back(std::make_unique<TransferLoop>(h2d[s].get(), rel, &stop, &running, &errors));
    }
  }
  running = static_cast<int>(loops.size());
  for (auto& l : loops) l->Submit();

  // Urgent reloads of one chunk, every 20 ms, rotating over the GPUs.
  std::vector<double> urgent;
  int urgent_lost = 0;
  std::atomic<bool> measuring{false};
  std::thread sampler([&] {
    for (int i = 0; !stop.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (!measuring.load()) continue;
      const int g = i % f.gpus;
      auto t = std::make_shared<sched::Transfer>();
      t->gpu = api.DeviceUuid(g);
      t->cls = sched::TrafficClass::kUrgent;
      t->bytes = chunk_bytes;
      set_copy(t.get(), Direction::kHostToDevice, g, 2 * f.streams,
               TransferNode(f, interleaved, g, i / f.gpus));
      auto done = std::make_shared<std::promise<absl::Status>>();
      auto fut = done->get_future();
      // The latency ends when the daemon learns the reload is done (its `done`, which answers
      // the client), not when this thread wakes to read the future.
      auto done_at = std::make_shared<double>(0);
      t->done = [done, done_at](absl::Status st) {
        *done_at = SteadyNowSeconds();
        done->set_value(std::move(st));
      };
      const double t0 = SteadyNowSeconds();
      h2d[g / f.gpus_per_switch]->Submit(t);
      if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready || !fut.get().ok()) {
        ++urgent_lost;
        continue;
      }
      urgent.push_back(*done_at - t0);
    }
  });

  std::this_thread::sleep_for(std::chrono::duration<double>(f.warmup_seconds));
  auto snapshot = [&](std::vector<uint64_t>* bytes) {
    bytes->clear();
    for (int g = 0; g < f.gpus; ++g) {
      bytes->push_back(api.BytesDone(g, Direction::kDeviceToHost));
      bytes->push_back(api.BytesDone(g, Direction::kHostToDevice));
    }
  };
  auto dry = [&] {
    uint64_t n = 0;
    for (const copy::CudaDeviceStats& d : engine->stats().devices) {
      n += d.dry_runs[0] + d.dry_runs[1];
    }
    return n;
  };
  std::vector<uint64_t> b0, b1;
  const uint64_t dry0 = dry();
  const double driver0 = api.DriverHostSeconds();
  const double cpu0 = CpuSeconds();
  const double t0 = SteadyNowSeconds();
  snapshot(&b0);
  measuring = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
  measuring = false;
  snapshot(&b1);
  const uint64_t dry1 = dry();
  const double t1 = SteadyNowSeconds();
  const double cpu1 = CpuSeconds();
  const double driver1 = api.DriverHostSeconds();

  const uint64_t dry_runs = dry1 - dry0;
  if (getenv("COPY_SIM_BENCH_LANES") != nullptr) {  // debugging aid: each lane's state now
    for (const copy::CudaDeviceStats& d : engine->stats().devices) {
      std::fprintf(stderr, "lanes %s: d2h %.1f GB/s learned, ahead %.0f us; h2d %.1f GB/s, %.0f us\n",
                   d.uuid.c_str(), d.learned_bytes_per_second[0] / 1e9,
                   d.issue_ahead_seconds[0] * 1e6, d.learned_bytes_per_second[1] / 1e9,
                   d.issue_ahead_seconds[1] * 1e6);
    }
  }
  stop = true;
  sampler.join();
  while (running.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (auto& l : d2h) l->Shutdown();
  for (auto& l : h2d) l->Shutdown();
  regions.clear();
  keep_mapped.clear();
  engine.reset();

  Result r;
  const double cap = (t1 - t0) * so.model.engine_bytes_per_second;
  uint64_t moved = 0;
  r.d2h_min = r.h2d_min = 1e9;
  for (int g = 0; g < f.gpus; ++g) {
    for (int d = 0; d < 2; ++d) {
      const uint64_t db = b1[2 * g + d] - b0[2 * g + d];
      moved += db;
      const double ratio = db / cap;
      r.max_ratio = std::max(r.max_ratio, ratio);
      (d == 0 ? r.d2h_mean : r.h2d_mean) += ratio / f.gpus;
      double& mn = d == 0 ? r.d2h_min : r.h2d_min;
      mn = std::min(mn, ratio);
    }
  }
  r.gib_moved = moved / double(1ull << 30);
  r.cpu_seconds = cpu1 - cpu0;
  r.modelled_cpu_seconds = driver1 - driver0;
  const double chunk_time = chunk_bytes / so.model.engine_bytes_per_second;
  for (double u : urgent) r.urgent_chunk_times.push_back(u / chunk_time);
  r.urgent_lost = urgent_lost;
  r.errors = errors.load();
  r.dry_runs = dry_runs;
  return r;
}

}  // namespace
}  // namespace offloadd::bench

int main(int argc, char** argv) {
  using namespace offloadd::bench;
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  std::unique_ptr<CopyBenchBackend> real;
  if (f.backend == "cuda") {
    auto b = NewRealCudaBenchBackend(f.gpus);
    if (b.status().code() == absl::StatusCode::kUnavailable) {
      std::printf("SKIPPED: copy_sim_bench --backend=cuda: %s\n",
                  std::string(b.status().message()).c_str());
      return 0;
    }
    if (!b.ok()) {
      std::fprintf(stderr, "copy_sim_bench: %s\n", std::string(b.status().message()).c_str());
      return 2;
    }
    real = *std::move(b);
  }
  const std::string lab = real != nullptr ? "measured" : "simulated";
  std::printf(
      "%s",
      real != nullptr
          ? "copy_sim_bench --backend=cuda (MEASURED: the real CUDA driver and GPUs; 'model' "
            "below is the configured rate, the same one the simulation models): "
          : "copy_sim_bench (SIMULATED GPU copy engines: a timing model, no bytes moved): ");
  std::printf(
      "%d GPUs, %d per switch, %d offload + %d reload transfers of %llu MiB in flight per GPU, "
      "copy_threads=%d, cuda streams per direction=%d, async: %d chunks posted per GPU, modelled "
      "%.1f GB/s per engine, switch "
      "limit %s, H2D share while D2H runs %.2f, %d NUMA nodes with cross-node copies at %.2f of "
      "the rate; host: %u CPUs\n",
      f.gpus, f.gpus_per_switch, f.streams, f.streams,
      static_cast<unsigned long long>(f.transfer_mib), f.copy_threads, f.streams_per_direction,
      f.max_in_flight, f.rate_gbps,
      f.switch_gbps > 0 ? (std::to_string(f.switch_gbps) + " GB/s").c_str() : "none", f.h2d_share,
      f.numa_nodes, f.cross_node_factor, std::thread::hardware_concurrency());
  std::printf("%-18s | %-7s | %-21s | %-21s | %-29s | %s | %s\n", "engine placement", "chunk",
              "D2H ach/model med/min", "H2D ach/model med/min", "urgent reload chunk-times",
              "host CPU s/GiB (driver)", "dry runs | load");
  bool failed = false;
  for (uint64_t c : f.chunk_mib) {
    // Engines alternate window by window, so load from other processes hits them alike.
    // Keyed by "<engine> <placement>".
    std::map<std::string, std::vector<Result>> runs;
    std::vector<std::string> keys;
    for (const std::string& engine : f.engines) {
      for (const std::string& placement : f.placements) keys.push_back(engine + " " + placement);
    }
    for (int rep = 0; rep < f.repeats; ++rep) {
      for (const std::string& key : keys) {
        runs[key].push_back(RunOne(f, absl::StartsWith(key, "async"), c * kMiB,
                                   absl::EndsWith(key, "interleaved"), real.get()));
      }
    }
    std::map<std::string, std::vector<double>> medians;  // key -> D2H, H2D, urgent median
    for (const std::string& engine : keys) {
      std::vector<double> d2h, h2d, urgent;
      double d2h_min = 1e9, h2d_min = 1e9, max_ratio = 0, cpu = 0, modelled = 0, gib = 0;
      int lost = 0;
      uint64_t errors = 0, dry_runs = 0;
      for (const Result& r : runs[engine]) {
        dry_runs += r.dry_runs;
        d2h.push_back(r.d2h_mean);
        h2d.push_back(r.h2d_mean);
        d2h_min = std::min(d2h_min, r.d2h_min);
        h2d_min = std::min(h2d_min, r.h2d_min);
        max_ratio = std::max(max_ratio, r.max_ratio);
        urgent.insert(urgent.end(), r.urgent_chunk_times.begin(), r.urgent_chunk_times.end());
        cpu += r.cpu_seconds;
        modelled += r.modelled_cpu_seconds;
        gib += r.gib_moved;
        lost += r.urgent_lost;
        errors += r.errors;
      }
      std::sort(urgent.begin(), urgent.end());
      medians[engine] = {Median(d2h), Median(h2d), Median(urgent)};
      std::printf(
          "%-18s | %3llu MiB | %.3f / %.3f %s | %.3f / %.3f %s | med %6.1f "
          "max %7.1f n=%-4zu %s | %.4f (%.4f) | %llu | %.1f\n",
          engine.c_str(), static_cast<unsigned long long>(c), Median(d2h), d2h_min, lab.c_str(),
          Median(h2d), h2d_min, lab.c_str(), Median(urgent), urgent.empty() ? 0 : urgent.back(),
          urgent.size(), lab.c_str(),
          gib > 0 ? cpu / gib : 0, gib > 0 ? modelled / gib : 0,
          static_cast<unsigned long long>(dry_runs), LoadAverage());
      if (f.figures) {
        std::string key = engine;
        std::replace(key.begin(), key.end(), ' ', '_');
        std::printf(
            "FIGURE copy_%s_%s_%lluMiB d2h %.2f GB/s h2d %.2f GB/s urgent_reload_median %.1f "
            "chunk-times (%s)\n",
            real != nullptr ? "measured" : "model", key.c_str(),
            static_cast<unsigned long long>(c), Median(d2h) * f.rate_gbps,
            Median(h2d) * f.rate_gbps, Median(urgent), lab.c_str());
      }
      std::fflush(stdout);
      if (max_ratio > 1.01 || gib <= 0 || lost > 0 || errors > 0) {
        std::printf(
            "  loose bound missed: max engine ratio %.3f (must be <= 1.01), %.3f GiB "
            "moved, %d urgent reloads lost, %llu transfer errors\n",
            max_ratio, gib, lost, static_cast<unsigned long long>(errors));
        failed = true;
      }
    }
    for (const std::string& engine : f.engines) {
      auto local = medians.find(engine + " local");
      auto spread = medians.find(engine + " interleaved");
      if (local == medians.end() || spread == medians.end()) continue;
      const std::vector<double>& l = local->second;
      const std::vector<double>& i = spread->second;
      std::printf(
          "  placement buys (%s, %llu MiB, SIMULATED): local/interleaved achieved rate D2H %.2fx, "
          "H2D %.2fx; urgent reload median %.1f vs %.1f chunk-times\n",
          engine.c_str(), static_cast<unsigned long long>(c), i[0] > 0 ? l[0] / i[0] : 0,
          i[1] > 0 ? l[1] / i[1] : 0, l[2], i[2]);
    }
  }
  return f.check && failed ? 1 : 0;
}
