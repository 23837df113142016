// projector_service_bench: the refresh SERVICE around the LAPACK backend (server/projector/
// refresh_service.h), in process, with G and P in a POSIX shm object read and written through the
// shm CopyEngine, as the daemon does. Everything is measured in one run and reported as ratios.
//
//   1. overhead: median latency of a refresh through the service (submit, queue, copy G in,
//      refresh, copy P out, wake the waiter) / median of RefreshProjector called directly on the
//      same bytes. Target <= 1.25 (the copies are ~10 GB/s; the SVD dominates).
//   2. head-of-line: with one worker, parameter "big" has --backlog refreshes queued (the first
//      running) when a small parameter submits one. The small one's latency in units of one big
//      refresh: round robin over parameters bounds it near 1 (the big refresh already running);
//      one FIFO queue would make it about --backlog. Target <= 1.6.
//   3. de-duplication: the same (parameter, step) submitted --microbatches times runs once.
//   4. workers: --parameters refreshes of distinct parameters with 1 worker and with 2 workers
//      (OpenBLAS threads = hardware threads / workers): throughput ratio, reported only.
//
// Flags (--name=value): --dim=1536 (big gradients dim x dim), --rank=128, --method=randomized|
// exact, --backlog=4, --microbatches=8, --parameters=6, --repeats=3.
// Output: a table and one JSON line; exit 1 when a target is missed.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "server/copy/shm/shm_engine.h"
#include "server/projector/lapack_backend.h"
#include "server/projector/refresh_service.h"
#include "server/projector/synthetic.h"

namespace offloadd::projector {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::map<std::string, std::string> flags;
int64_t Flag(const char* name, int64_t def) {
  int64_t v;
  auto it = flags.find(name);
  return it != flags.end() && absl::SimpleAtoi(it->second, &v) ? v : def;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A shm object holding one gradient at 0 and its projector after it.
struct Staged {
  std::string name;
  uint64_t bytes = 0;
  uint8_t* map = nullptr;
  int64_t rows = 0, cols = 0;
  Staged(int64_t m, int64_t n, uint64_t seed) : rows(m), cols(n) {
    static int count = 0;
    name = "/ofd-psb-" + std::to_string(getpid()) + "-" + std::to_string(count++);
    bytes = 2 * m * n * 4 + (1 << 20);
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, bytes) != 0) std::abort();
    map = static_cast<uint8_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    std::vector<float> g = LowRankPlusNoise(
        m, n, GeometricSpectrum(std::min<int64_t>(256, std::min(m, n) / 2), 1.0, 0.98), 0.01, seed);
    std::memcpy(map, g.data(), g.size() * 4);
  }
  ~Staged() {
    munmap(map, bytes);
    shm_unlink(name.c_str());
  }
  ServiceRequest Request(const std::string& parameter, int64_t step, int64_t rank,
                         SvdMethod method) const {
    ServiceRequest r;
    r.parameter_id = parameter;
    r.step = step;
    r.gradient.region.shm_name = name;
    r.gradient.region.size_bytes = bytes;
    r.gradient.region.device_id = "bench";
    r.shape = {rows, cols};
    r.rank = rank;
    r.method = method;
    r.projector.offset_bytes = rows * cols * 4;
    r.measure_residual = false;
    return r;
  }
};

double ServiceLatency(RefreshService& service, const ServiceRequest& request) {
  const Clock::time_point start = Clock::now();
  auto submitted = service.Submit(request);
  if (!submitted.ok()) std::abort();
  auto record = service.Wait(submitted->id);
  if (!record.ok() || record->state != RefreshState::kDone) std::abort();
  return Since(start);
}

int Main() {
  const int64_t dim = Flag("dim", 1536), rank = Flag("rank", 128);
  const int backlog = static_cast<int>(Flag("backlog", 4));
  const int microbatches = static_cast<int>(Flag("microbatches", 8));
  const int parameters = static_cast<int>(Flag("parameters", 6));
  const int repeats = static_cast<int>(Flag("repeats", 3));
  const SvdMethod method = flags["method"] == "exact" ? SvdMethod::kExact : SvdMethod::kRandomized;
  copy::ShmCopyEngine engine;
  LapackSvdBackend lapack;
  bool ok = true;

  // 1. Overhead (one worker).
  SetBlasThreads(BlasThreadsFor(1));
  Staged big(dim, dim, 1);
  std::vector<double> direct, through;
  {
    RefreshServiceOptions o;
    RefreshService service(o, &engine, nullptr);
    RefreshRequest rr;
    rr.gradient = {big.map, static_cast<size_t>(dim * dim * 4), {dim, dim}, DType::kFloat32};
    rr.rank = rank;
    rr.method = method;
    rr.measure_residual = false;
    RefreshScratch scratch;
    ServiceLatency(service, big.Request("warm", 0, rank, method));  // map the region once
    for (int i = 0; i < repeats; ++i) {
      const Clock::time_point t = Clock::now();
      if (!RefreshProjector(rr, lapack, &scratch).ok()) std::abort();
      direct.push_back(Since(t));
      through.push_back(ServiceLatency(service, big.Request("w", i, rank, method)));
    }
  }
  const double big_seconds = Median(direct);
  const double overhead = Median(through) / big_seconds;
  ok &= overhead <= 1.25;

  // 2. Head-of-line blocking (one worker).
  Staged small(256, 256, 2);
  double small_wait = 0;
  {
    RefreshServiceOptions o;
    RefreshService service(o, &engine, nullptr);
    // Warm: map both regions and grow the worker's buffers, as in a running daemon.
    ServiceLatency(service, big.Request("warm", 0, rank, method));
    ServiceLatency(service, small.Request("warm-small", 0, 16, method));
    std::vector<uint64_t> ids;
    for (int s = 0; s < backlog; ++s) {
      ids.push_back(service.Submit(big.Request("big", s, rank, method))->id);
    }
    small_wait = ServiceLatency(service, small.Request("small", 0, 16, method)) / big_seconds;
    for (uint64_t id : ids) service.Wait(id);
  }
  ok &= small_wait <= 1.6;

  // 3. De-duplication of one key from several micro-batches.
  int distinct = 0;
  {
    RefreshServiceOptions o;
    RefreshService service(o, &engine, nullptr);
    std::vector<uint64_t> ids;
    for (int i = 0; i < microbatches; ++i) {
      auto s = service.Submit(small.Request("dup", 200, 16, method));
      ids.push_back(s->id);
    }
    std::sort(ids.begin(), ids.end());
    distinct = static_cast<int>(std::unique(ids.begin(), ids.end()) - ids.begin());
    service.Wait(ids[0]);
  }
  ok &= distinct == 1;

  // 4. Workers: distinct parameters, 1 vs 2 workers.
  std::vector<std::unique_ptr<Staged>> grads;
  const int64_t mid = std::max<int64_t>(256, dim / 2);
  for (int i = 0; i < parameters; ++i) grads.push_back(std::make_unique<Staged>(mid, mid, 10 + i));
  double seconds_by_workers[3] = {0, 0, 0};
  for (int workers : {1, 2}) {
    SetBlasThreads(BlasThreadsFor(workers));
    RefreshServiceOptions o;
    o.workers = workers;
    RefreshService service(o, &engine, nullptr);
    for (int i = 0; i < parameters; ++i) {  // warm: map every region
      service.Wait(service.Submit(grads[i]->Request("p" + std::to_string(i), 0, rank, method))->id);
    }
    const Clock::time_point t = Clock::now();
    std::vector<uint64_t> ids;
    for (int i = 0; i < parameters; ++i) {
      ids.push_back(
          service.Submit(grads[i]->Request("p" + std::to_string(i), 1, rank, method))->id);
    }
    for (uint64_t id : ids) service.Wait(id);
    seconds_by_workers[workers] = Since(t);
  }

  std::printf(
      "projector_service_bench: %s, big %lldx%lld r=%lld (%.3f s direct), %d hardware "
      "threads\n",
      method == SvdMethod::kExact ? "exact" : "randomized", static_cast<long long>(dim),
      static_cast<long long>(dim), static_cast<long long>(rank), big_seconds,
      static_cast<int>(std::thread::hardware_concurrency()));
  std::printf("  %-52s %8.3f  (target <= 1.25)\n", "service latency / direct refresh", overhead);
  std::printf("  %-52s %8.3f  (target <= 1.6; FIFO ~%d)\n",
              "small refresh behind big backlog, in big refreshes", small_wait, backlog);
  std::printf("  %-52s %8d  (target 1)\n", "refreshes run for one key from N micro-batches",
              distinct);
  std::printf("  %-52s %8.3f  (reported)\n", "throughput 2 workers / 1 worker",
              seconds_by_workers[1] / seconds_by_workers[2]);
  std::printf(
      "{\"bench\":\"projector_service\",\"method\":\"%s\",\"dim\":%lld,\"rank\":%lld,"
      "\"direct_seconds\":%.4f,\"overhead_ratio\":%.4f,\"head_of_line_big_refreshes\":"
      "%.4f,\"backlog\":%d,\"dedup_refreshes\":%d,\"workers_speedup\":%.4f,\"ok\":%s}\n",
      method == SvdMethod::kExact ? "exact" : "randomized", static_cast<long long>(dim),
      static_cast<long long>(rank), big_seconds, overhead, small_wait, backlog, distinct,
      seconds_by_workers[1] / seconds_by_workers[2], ok ? "true" : "false");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace offloadd::projector

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a.find('=') == std::string::npos) {
      std::fprintf(stderr, "usage: projector_service_bench [--name=value ...] (see the source)\n");
      return 2;
    }
    offloadd::projector::flags[a.substr(2, a.find('=') - 2)] = a.substr(a.find('=') + 1);
  }
  return offloadd::projector::Main();
}
