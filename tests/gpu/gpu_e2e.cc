// GPU end-to-end check of offloadd's cuda backend, run by tests/gpu/run.sh against a daemon
// started with backend "cuda". Every mode prints "SKIPPED: ..." and exits 0 when there is no
// CUDA driver or GPU; "FAIL: ..." and exit 1 on any error or mismatch; figures as lines
// "FIGURE <name> <value> <unit>" for the script to collect.
//
// Modes (--mode=):
//   context   measures the device memory the daemon's context costs: free memory before and
//             after the daemon opens a first region on this GPU (run it first, one client).
//   data      one client process: --tensors tensors of --tensor_bytes in one cudaMalloc, filled
//             by kernels; checksums on the device; each offloaded with an IPC ready event
//             recorded after its producer; device memory wiped; each reloaded (URGENT,
//             release_after, with a done event) and checked against its checksum on the
//             compute stream once it has waited on the done event. Then --small_requests offload+reload pairs of 64 KiB on the same
//             region (the daemon must open its handle once). Prints D2H/H2D GB/s seen by the
//             client for the large tensors.
//   ordering  tight loop: overwrite one tensor with pattern i (kernel), record, offload at once
//             (no host sync), reload into a second tensor, check pattern i there; --iterations.
//   baseline  cudaMemcpyAsync between one pinned host buffer and the device, both ways: the
//             rate the daemon is compared with (--tensor_bytes per copy, 10 copies).
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/cuda_export.h"
#include "client/offloadd_client.h"
#include "common/base/clock.h"
#include "kernels/kernels.h"
#include "tests/gpu/gpu_util.h"

namespace {

using offloadd::base::SteadyNowSeconds;
using offloadd::client::IpcEvent;
using offloadd::client::Priority;
using offloadd::gpucheck::Check;
using offloadd::gpucheck::DeviceChecksum;
using offloadd::gpucheck::DoneEvent;
using offloadd::gpucheck::Fail;
using offloadd::gpucheck::Session;

struct Args {
  std::string mode = "data", socket;
  int tensors = 16, small_requests = 500, iterations = 200, seed = 1, producer_repeats = 50;
  uint64_t tensor_bytes = 64ull << 20;
};

// Allocates `bytes` on the device, connects and registers the allocation.
void Open(const Args& a, uint64_t bytes, Session* s) {
  offloadd::gpucheck::Open(a.socket, "gpu_e2e " + a.mode + " seed " + std::to_string(a.seed),
                           bytes, s);
}

int ModeContext(const Args& a) {
  Check(cudaFree(nullptr), "context");
  size_t free0 = 0, total = 0, free1 = 0;
  Check(cudaMemGetInfo(&free0, &total), "cudaMemGetInfo");
  Session s;
  Open(a, 2 << 20, &s);  // the daemon creates its context on this GPU now
  usleep(200 * 1000);
  Check(cudaMemGetInfo(&free1, &total), "cudaMemGetInfo");
  const double cost = (static_cast<double>(free0) - free1 - (2 << 20)) / (1 << 20);
  std::printf("FIGURE daemon_context_device_memory %.0f MiB\n", cost);
  std::printf("(device free before %zu, after %zu bytes, total %zu; includes the daemon's "
              "streams and the IPC mapping)\n", free0, free1, total);
  return 0;
}

int ModeData(const Args& a) {
  const uint64_t n = a.tensors, each = a.tensor_bytes;
  const uint64_t small = 64 << 10;
  Session s;
  Open(a, n * each + small, &s);
  cudaStream_t compute;
  Check(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "stream");
  uint64_t* d_sum = nullptr;
  Check(cudaMalloc(&d_sum, sizeof(uint64_t)), "cudaMalloc");
  // Producer kernels: random bytes staged once, then a device-side gather per tensor.
  std::mt19937_64 rng(a.seed);
  std::vector<uint64_t> host(each / 8);
  uint8_t* d_src = nullptr;
  Check(cudaMalloc(&d_src, each), "cudaMalloc");
  std::vector<uint64_t> sums(n);
  std::vector<IpcEvent> events;
  std::vector<std::future<absl::StatusOr<offloadd::client::OffloadResult>>> offloads;
  double t0 = 0;
  for (uint64_t i = 0; i < n; ++i) {
    for (auto& w : host) w = rng();
    Check(cudaMemcpy(d_src, host.data(), each, cudaMemcpyHostToDevice), "fill");
    offloadd::kernels::PackSegment seg{reinterpret_cast<uint64_t>(d_src), 0, each};
    offloadd::kernels::PackSegment* d_seg = nullptr;
    Check(cudaMalloc(&d_seg, sizeof(seg)), "cudaMalloc");
    Check(cudaMemcpy(d_seg, &seg, sizeof(seg), cudaMemcpyHostToDevice), "seg");
    Check(offloadd::kernels::LaunchGather(d_seg, 1, each, s.base + i * each, compute), "gather");
    Check(cudaStreamSynchronize(compute), "sync");
    cudaFree(d_seg);
    sums[i] = DeviceChecksum(s.base + i * each, each, d_sum, compute);
  }
  std::printf("OFFLOADING %llu bytes\n", static_cast<unsigned long long>(n * each));
  std::fflush(stdout);  // run.sh kills a client right after this line (copies in flight)
  t0 = SteadyNowSeconds();
  for (uint64_t i = 0; i < n; ++i) {
    IpcEvent ev = Check(s.exporter.RecordReady(compute), "RecordReady");
    events.push_back(ev);
    offloads.push_back(s.client->Offload(s.region_id, i * each, each, ev.handle));
  }
  std::vector<uint64_t> blocks;
  for (auto& f : offloads) blocks.push_back(Check(f.get(), "Offload").block_id);
  const double d2h_s = SteadyNowSeconds() - t0;
  for (auto& ev : events) s.exporter.ReleaseEvent(ev);
  Check(cudaMemset(s.base, 0, n * each), "wipe");
  Check(cudaDeviceSynchronize(), "sync");
  t0 = SteadyNowSeconds();
  std::vector<std::future<absl::StatusOr<offloadd::client::ReloadResult>>> reloads;
  std::vector<std::unique_ptr<DoneEvent>> done;
  for (uint64_t i = 0; i < n; ++i) {
    done.push_back(std::make_unique<DoneEvent>(&s));
    reloads.push_back(s.client->Reload(blocks[i], s.region_id, i * each, Priority::kUrgent, true,
                                       0, done.back()->handle()));
  }
  for (auto& f : reloads) Check(f.get(), "Reload");
  for (auto& d : done) d->Wait(nullptr);  // the bytes are there, not only the answer
  const double h2d_s = SteadyNowSeconds() - t0;
  for (uint64_t i = 0; i < n; ++i) {
    if (DeviceChecksum(s.base + i * each, each, d_sum, compute) != sums[i]) {
      Fail("tensor " + std::to_string(i) + " came back different (checksum mismatch)");
    }
  }
  std::printf("PASS data: %llu tensors x %llu MiB offloaded and reloaded, checksums equal\n",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(each >> 20));
  std::printf("FIGURE daemon_d2h_GBps %.2f GB/s\n", n * each / d2h_s / 1e9);
  std::printf("FIGURE daemon_h2d_GBps %.2f GB/s\n", n * each / h2d_s / 1e9);
  // Many small requests on the same region: one handle open in the daemon.
  const uint64_t at = n * each;
  for (int i = 0; i < a.small_requests; ++i) {
    Check(cudaMemsetAsync(s.base + at, i & 0xff, small, compute), "memset");
    IpcEvent ev = Check(s.exporter.RecordReady(compute), "RecordReady");
    auto r = Check(s.client->Offload(s.region_id, at, small, ev.handle).get(), "small Offload");
    s.exporter.ReleaseEvent(ev);
    DoneEvent d(&s);
    Check(s.client->Reload(r.block_id, s.region_id, at, Priority::kUrgent, true, 0, d.handle())
              .get()
              .status(),
          "small Reload");
    d.Wait(compute);  // the next memset on the compute stream comes after the copy
  }
  std::printf("PASS small: %d offload+reload pairs on one region (%d requests)\n",
              a.small_requests, 2 * a.small_requests);
  s.client->Close();
  return 0;
}

int ModeOrdering(const Args& a) {
  const uint64_t each = a.tensor_bytes;
  Session s;
  Open(a, 2 * each, &s);
  cudaStream_t compute;
  Check(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "stream");
  uint64_t* d_sum = nullptr;
  Check(cudaMalloc(&d_sum, sizeof(uint64_t)), "cudaMalloc");
  std::vector<uint8_t> pattern(each);
  for (int i = 0; i < a.iterations; ++i) {
    // Producer: --producer_repeats memsets of the whole tensor (~1 ms together, longer than a
    // request's round trip), the last one with pattern i; the offload is sent at once: only the
    // ready event keeps the daemon's copy from seeing an earlier value.
    for (int r = a.producer_repeats - 1; r >= 0; --r) {
      Check(cudaMemsetAsync(s.base, (i * 37 + 11 + r) & 0xff, each, compute), "memset");
    }
    IpcEvent ev = Check(s.exporter.RecordReady(compute), "RecordReady");
    auto off = Check(s.client->Offload(s.region_id, 0, each, ev.handle).get(), "Offload");
    s.exporter.ReleaseEvent(ev);
    DoneEvent d(&s);
    auto rel = s.client->Reload(off.block_id, s.region_id, each, Priority::kUrgent, true, 0,
                                d.handle());
    Check(rel.get().status(), "Reload");
    d.Wait(compute);  // the consumer below runs on the compute stream
    // Consumer on the compute stream right after ReloadDone.
    std::memset(pattern.data(), (i * 37 + 11) & 0xff, each);
    const uint64_t want = offloadd::kernels::ChecksumRef(pattern.data(), each);
    if (DeviceChecksum(s.base + each, each, d_sum, compute) != want) {
      Fail("iteration " + std::to_string(i) + ": reload does not hold the data produced " +
           "right before its offload (ordering broken)");
    }
  }
  std::printf("PASS ordering: %d produce->offload->reload->consume iterations of %llu MiB\n",
              a.iterations, static_cast<unsigned long long>(each >> 20));
  s.client->Close();
  return 0;
}

int ModeBaseline(const Args& a) {
  const uint64_t each = a.tensor_bytes;
  void* pinned = nullptr;
  void* dev = nullptr;
  Check(cudaMallocHost(&pinned, each), "cudaMallocHost");
  Check(cudaMalloc(&dev, each), "cudaMalloc");
  cudaStream_t st;
  Check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  std::memset(pinned, 1, each);
  for (int dir = 0; dir < 2; ++dir) {
    auto kind = dir == 0 ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    void* dst = dir == 0 ? pinned : dev;
    void* src = dir == 0 ? dev : pinned;
    Check(cudaMemcpyAsync(dst, src, each, kind, st), "warm-up");
    Check(cudaStreamSynchronize(st), "sync");
    const double t0 = SteadyNowSeconds();
    for (int r = 0; r < 10; ++r) Check(cudaMemcpyAsync(dst, src, each, kind, st), "copy");
    Check(cudaStreamSynchronize(st), "sync");
    std::printf("FIGURE baseline_%s_GBps %.2f GB/s\n", dir == 0 ? "d2h" : "h2d",
                10.0 * each / (SteadyNowSeconds() - t0) / 1e9);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto eq = arg.find('=');
    std::string k = arg.substr(0, eq), v = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (k == "--mode") a.mode = v;
    else if (k == "--socket") a.socket = v;
    else if (k == "--tensors") a.tensors = std::atoi(v.c_str());
    else if (k == "--tensor_mib") a.tensor_bytes = std::strtoull(v.c_str(), nullptr, 10) << 20;
    else if (k == "--small_requests") a.small_requests = std::atoi(v.c_str());
    else if (k == "--iterations") a.iterations = std::atoi(v.c_str());
    else if (k == "--seed") a.seed = std::atoi(v.c_str());
    else if (k == "--producer_repeats") a.producer_repeats = std::max(1, std::atoi(v.c_str()));
    else Fail("unknown argument " + arg);
  }
  if (!offloadd::gpucheck::UsableGpu()) return 0;
  if (a.mode == "baseline") return ModeBaseline(a);
  if (a.socket.empty()) Fail("--socket=PATH is required");
  if (a.mode == "context") return ModeContext(a);
  if (a.mode == "data") return ModeData(a);
  if (a.mode == "ordering") return ModeOrdering(a);
  Fail("unknown --mode " + a.mode);
}
