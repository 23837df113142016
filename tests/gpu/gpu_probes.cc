// GPU probes of the cuda data path, run by tests/gpu/run.sh (output conventions in gpu_util.h).
// Modes (--mode=):
//   ipc       cross-process CUDA IPC without the daemon: this process fills 4 MiB, exports a
//             memory handle and an interprocess event, and runs itself as --mode=ipc_import,
//             which opens both, waits on the event and checks the bytes. Exit 3 with
//             "IPC unsupported in this sandbox: ..." when export or open is refused (gVisor and
//             some container runtimes); times cudaIpcOpenMemHandle (FIGURE ipc_open_us).
//   rates     one client, the same device buffers both ways: cudaMemcpyAsync to and from a
//             pinned host buffer (D2H, H2D, both at once on two streams), then the daemon
//             (offloads, prefetch reloads, both at once), then the latency of one-chunk URGENT
//             reloads idle and while offloads and prefetch reloads saturate both directions.
//   spin      offload A (ready at once), then B whose producer is a --spin_ms spin kernel:
//             A's latency must not include B's producer; B's bytes must be B's final ones.
//   ipc_cross_uid (root) whether CUDA IPC handles cross users: a process of uid 65534 exports
//             a memory and an event handle (--mode=ipc_export, --uid); a process of uid 65533 and
//             one of root then try to open them (--mode=ipc_import --uid); and whether the
//             handle bytes carry the exporter's pid. Prints FIGURE lines, never fails on what it
//             finds (docs/failure-modes.md states the guarantee); SKIPPED when not root.
//   free_mid  offloads --tensors tensors, frees the allocation with the copies in flight and
//             exits without closing (a client bug or a crash): run.sh then checks the daemon
//             still serves everyone else.
#include <cuda_runtime.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/kernels.h"
#include "tests/gpu/gpu_util.h"

extern char** environ;

namespace {

using offloadd::client::IpcEvent;
using offloadd::client::OffloadResult;
using offloadd::client::Priority;
using offloadd::client::ReloadResult;
using offloadd::gpucheck::Check;
using offloadd::gpucheck::DoneEvent;
using offloadd::gpucheck::Fail;
using offloadd::gpucheck::NowSeconds;
using offloadd::gpucheck::Session;

constexpr int kIpcUnsupportedExit = 3;
constexpr uint64_t kMiB = 1ull << 20;

struct Args {
  std::string mode, socket, self, handle_hex, event_hex;
  int uid = -1;  // ipc_export / ipc_import: run as this uid (setuid before any CUDA call)
  int tensors = 16, spin_ms = 200, samples = 15;
  uint64_t tensor_bytes = 64 * kMiB, chunk_bytes = 8 * kMiB;
};

std::string Hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(p)[i];
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

bool Unhex(const std::string& s, void* out, size_t n) {
  if (s.size() != 2 * n) return false;
  for (size_t i = 0; i < n; ++i) {
    static_cast<unsigned char*>(out)[i] =
        static_cast<unsigned char>(std::strtoul(s.substr(2 * i, 2).c_str(), nullptr, 16));
  }
  return true;
}

[[noreturn]] void IpcUnsupported(const std::string& what, cudaError_t e) {
  std::printf("IPC unsupported in this sandbox: %s: %s (%d)\n", what.c_str(),
              cudaGetErrorString(e), static_cast<int>(e));
  std::fflush(stdout);
  std::exit(kIpcUnsupportedExit);
}

int ModeIpcImport(const Args& a) {
  cudaIpcMemHandle_t mh;
  cudaIpcEventHandle_t eh;
  if (!Unhex(a.handle_hex, &mh, sizeof(mh)) || !Unhex(a.event_hex, &eh, sizeof(eh))) {
    Fail("ipc_import: malformed --handle/--event");
  }
  void* p = nullptr;
  const double t0 = NowSeconds();
  cudaError_t e = cudaIpcOpenMemHandle(&p, mh, cudaIpcMemLazyEnablePeerAccess);
  const double open_us = (NowSeconds() - t0) * 1e6;
  if (e != cudaSuccess) IpcUnsupported("cudaIpcOpenMemHandle in a second process", e);
  cudaEvent_t ev;
  e = cudaIpcOpenEventHandle(&ev, eh);
  if (e != cudaSuccess) IpcUnsupported("cudaIpcOpenEventHandle in a second process", e);
  cudaStream_t s;
  Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  Check(cudaStreamWaitEvent(s, ev, 0), "cudaStreamWaitEvent(imported event)");
  std::vector<unsigned char> host(4 * kMiB);
  Check(cudaMemcpyAsync(host.data(), p, host.size(), cudaMemcpyDeviceToHost, s), "copy");
  Check(cudaStreamSynchronize(s), "sync");
  for (size_t i = 0; i < host.size(); ++i) {
    if (host[i] != 0x5a) Fail("imported memory holds 0x" + Hex(&host[i], 1) + " at " +
                              std::to_string(i) + ", not the exporter's 0x5a");
  }
  const double t1 = NowSeconds();
  Check(cudaIpcCloseMemHandle(p), "cudaIpcCloseMemHandle");
  std::printf("FIGURE ipc_open_us %.0f us (cudaIpcOpenMemHandle, first in this process)\n",
              open_us);
  std::printf("FIGURE ipc_close_us %.0f us\n", (NowSeconds() - t1) * 1e6);
  return 0;
}

int ModeIpc(const Args& a) {
  void* p = nullptr;
  Check(cudaMalloc(&p, 4 * kMiB), "cudaMalloc");
  cudaStream_t s;
  Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  Check(cudaMemsetAsync(p, 0x5a, 4 * kMiB, s), "memset");
  cudaEvent_t ev;
  Check(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming), "event");
  Check(cudaEventRecord(ev, s), "record");
  cudaIpcMemHandle_t mh;
  cudaIpcEventHandle_t eh;
  cudaError_t e = cudaIpcGetMemHandle(&mh, p);
  if (e != cudaSuccess) IpcUnsupported("cudaIpcGetMemHandle", e);
  e = cudaIpcGetEventHandle(&eh, ev);
  if (e != cudaSuccess) IpcUnsupported("cudaIpcGetEventHandle", e);
  std::string h = "--handle=" + Hex(&mh, sizeof(mh)), v = "--event=" + Hex(&eh, sizeof(eh));
  std::string mode = "--mode=ipc_import";
  char* argv[] = {const_cast<char*>(a.self.c_str()), mode.data(), h.data(), v.data(), nullptr};
  pid_t pid = 0;
  std::fflush(stdout);
  if (posix_spawn(&pid, a.self.c_str(), nullptr, nullptr, argv, environ) != 0) {
    Fail("posix_spawn of " + a.self + ": " + std::strerror(errno));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  Check(cudaStreamSynchronize(s), "sync");
  if (WIFEXITED(status) && WEXITSTATUS(status) == kIpcUnsupportedExit) {
    return kIpcUnsupportedExit;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Fail("the importing process ended with status " + std::to_string(status));
  }
  std::printf("PASS ipc: a second process opened this one's memory and event handles and read "
              "the bytes written before the event\n");
  return 0;
}

// The exporting side of ipc_cross_uid: prints "HANDLES <mem hex> <event hex> <pid>", then keeps
// the allocation and event alive until its stdin closes.
int ModeIpcExport() {
  void* p = nullptr;
  Check(cudaMalloc(&p, 4 * kMiB), "cudaMalloc");
  Check(cudaMemset(p, 0x5a, 4 * kMiB), "memset");
  cudaEvent_t ev;
  Check(cudaEventCreateWithFlags(&ev, cudaEventInterprocess | cudaEventDisableTiming), "event");
  Check(cudaEventRecord(ev, 0), "record");
  Check(cudaDeviceSynchronize(), "sync");
  cudaIpcMemHandle_t mh;
  cudaIpcEventHandle_t eh;
  cudaError_t e = cudaIpcGetMemHandle(&mh, p);
  if (e != cudaSuccess) IpcUnsupported("cudaIpcGetMemHandle", e);
  e = cudaIpcGetEventHandle(&eh, ev);
  if (e != cudaSuccess) IpcUnsupported("cudaIpcGetEventHandle", e);
  std::printf("HANDLES %s %s %d\n", Hex(&mh, sizeof(mh)).c_str(), Hex(&eh, sizeof(eh)).c_str(),
              static_cast<int>(getpid()));
  std::fflush(stdout);
  char buf[16];
  while (read(0, buf, sizeof(buf)) > 0) {
  }
  return 0;
}

// Runs `args` (after the binary) with stdin and stdout on pipes when `in` / `out` are given.
pid_t SpawnSelf(const Args& a, std::vector<std::string> args, int* in, int* out) {
  int pin[2] = {-1, -1}, pout[2] = {-1, -1};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (in != nullptr && pipe(pin) == 0) {
    posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
    posix_spawn_file_actions_addclose(&fa, pin[1]);
  }
  if (out != nullptr && pipe(pout) == 0) {
    posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
    posix_spawn_file_actions_addclose(&fa, pout[0]);
  }
  args.insert(args.begin(), a.self);
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  std::fflush(stdout);
  if (posix_spawn(&pid, a.self.c_str(), &fa, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  if (in != nullptr) close(pin[0]), *in = pin[1];
  if (out != nullptr) close(pout[1]), *out = pout[0];
  return pid;
}

// "opened" when a process of `uid` opened both handles and read the exporter's bytes, else
// what the import said (its exit status).
std::string ImportAs(const Args& a, int uid, const std::string& mem, const std::string& event) {
  pid_t pid = SpawnSelf(a, {"--mode=ipc_import", "--uid=" + std::to_string(uid),
                            "--handle=" + mem, "--event=" + event},
                        nullptr, nullptr);
  int status = 0;
  if (pid <= 0 || waitpid(pid, &status, 0) != pid) return "not_started";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "opened";
  if (WIFEXITED(status) && WEXITSTATUS(status) == kIpcUnsupportedExit) return "refused";
  return "failed_status_" + std::to_string(status);
}

int ModeIpcCrossUid(const Args& a) {
  if (geteuid() != 0) {
    std::printf("NOTE: ipc_cross_uid not run: it needs root (it runs processes as uids 65534 and "
                "65533)\n");
    return 0;
  }
  int in = -1, out = -1;
  pid_t exporter = SpawnSelf(a, {"--mode=ipc_export", "--uid=65534"}, &in, &out);
  if (exporter <= 0) Fail("cannot start the exporting process");
  std::string line;
  char c;
  while (read(out, &c, 1) == 1 && c != '\n') line += c;
  char mem[200] = {0}, event[200] = {0};
  int pid = 0;
  if (std::sscanf(line.c_str(), "HANDLES %199s %199s %d", mem, event, &pid) != 3) {
    close(in);
    waitpid(exporter, nullptr, 0);
    std::printf("NOTE: ipc_cross_uid: the exporting process (uid 65534) gave no handles: %s\n",
                line.c_str());
    return 0;
  }
  const std::string other = ImportAs(a, 65533, mem, event), root = ImportAs(a, 0, mem, event);
  close(in);
  close(out);
  waitpid(exporter, nullptr, 0);
  cudaIpcMemHandle_t mh;
  Unhex(mem, &mh, sizeof(mh));
  std::string at = "none";
  for (size_t i = 0; i + 4 <= sizeof(mh); ++i) {
    if (std::memcmp(reinterpret_cast<const char*>(&mh) + i, &pid, 4) == 0) {
      at = std::to_string(i);
      break;
    }
  }
  std::printf("FIGURE ipc_cross_uid_other_user %s (uid 65533 opening uid 65534's handles)\n",
              other.c_str());
  std::printf("FIGURE ipc_cross_uid_root %s (root opening uid 65534's handles)\n", root.c_str());
  std::printf("FIGURE ipc_handle_exporter_pid_offset %s (byte offset of the exporter's pid %d "
              "in the memory handle, little-endian u32; none: not found)\n",
              at.c_str(), pid);
  return 0;
}

// Bytes / seconds in GB/s.
double GBps(uint64_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0; }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// cudaMemcpyAsync between tensor i of `dev` and pinned buffer slot i % 2; both directions on
// their own streams when `d2h` and `h2d` are both set. Returns {d2h, h2d} GB/s from events.
std::pair<double, double> MemcpyRates(const Args& a, uint8_t* dev, uint8_t* pinned, bool d2h,
                                      bool h2d) {
  const uint64_t t = a.tensor_bytes, n = a.tensors;
  cudaStream_t st[2];
  cudaEvent_t ev[2][2];
  for (int d = 0; d < 2; ++d) {
    Check(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking), "stream");
    for (auto& e : ev[d]) Check(cudaEventCreate(&e), "event");
  }
  for (int d = 0; d < 2; ++d) Check(cudaEventRecord(ev[d][0], st[d]), "record");
  for (uint64_t i = 0; i < n; ++i) {
    // D2H reads set A (tensors 0..n-1) into slots 0/1; H2D writes set B from slots 2/3.
    if (d2h) {
      Check(cudaMemcpyAsync(pinned + (i % 2) * t, dev + i * t, t, cudaMemcpyDeviceToHost, st[0]),
            "cudaMemcpyAsync D2H");
    }
    if (h2d) {
      Check(cudaMemcpyAsync(dev + (n + i) * t, pinned + (2 + i % 2) * t, t,
                            cudaMemcpyHostToDevice, st[1]),
            "cudaMemcpyAsync H2D");
    }
  }
  float ms[2] = {0, 0};
  for (int d = 0; d < 2; ++d) {
    Check(cudaEventRecord(ev[d][1], st[d]), "record");
    Check(cudaEventSynchronize(ev[d][1]), "sync");
    Check(cudaEventElapsedTime(&ms[d], ev[d][0], ev[d][1]), "elapsed");
  }
  return {d2h ? GBps(n * t, ms[0] / 1e3) : 0, h2d ? GBps(n * t, ms[1] / 1e3) : 0};
}

struct DaemonRun {
  std::vector<uint64_t> new_blocks;
  double d2h_seconds = 0, h2d_seconds = 0;
};

// Offloads tensors [off_first, +n) (if `offload`) and reloads `reload_blocks` into tensors
// [reload_first, +n) at PREFETCH priority, all sent at once; each direction timed from the
// first send to its last answer (waited on its own thread).
DaemonRun DaemonTransfers(const Args& a, Session* s, IpcEvent ready, bool offload,
                          uint64_t off_first, const std::vector<uint64_t>& reload_blocks,
                          uint64_t reload_first) {
  const uint64_t t = a.tensor_bytes;
  std::vector<std::future<absl::StatusOr<OffloadResult>>> offs;
  std::vector<std::future<absl::StatusOr<ReloadResult>>> rels;
  std::vector<std::unique_ptr<DoneEvent>> done;
  const double t0 = NowSeconds();
  for (uint64_t i = 0; i < static_cast<uint64_t>(a.tensors); ++i) {
    if (offload) offs.push_back(s->client->Offload(s->region_id, (off_first + i) * t, t,
                                                   ready.handle));
    if (i < reload_blocks.size()) {
      done.push_back(std::make_unique<DoneEvent>(s));
      rels.push_back(s->client->Reload(reload_blocks[i], s->region_id, (reload_first + i) * t,
                                       Priority::kPrefetch, false, 0, done.back()->handle()));
    }
  }
  DaemonRun r;
  std::thread waiter([&] {
    for (auto& f : rels) Check(f.get(), "prefetch Reload");
    for (auto& d : done) d->Wait(nullptr);  // copied, not only answered
    r.h2d_seconds = NowSeconds() - t0;
  });
  for (auto& f : offs) r.new_blocks.push_back(Check(f.get(), "Offload").block_id);
  r.d2h_seconds = NowSeconds() - t0;
  waiter.join();
  return r;
}

void PrintRatio(const char* name, double daemon, double memcpy) {
  std::printf("FIGURE ratio_%s_daemon_vs_cudaMemcpyAsync %.2f (daemon %.2f GB/s, "
              "cudaMemcpyAsync %.2f GB/s, same device buffers)\n",
              name, memcpy > 0 ? daemon / memcpy : 0, daemon, memcpy);
}

// Latency (seconds) of one URGENT reload of `block` into `offset`: send to the bytes being
// there (its done event completed, on the host).
double UrgentReload(Session* s, uint64_t block, uint64_t offset) {
  DoneEvent d(s);
  const double t0 = NowSeconds();
  Check(s->client->Reload(block, s->region_id, offset, Priority::kUrgent, false, 0, d.handle())
            .get(),
        "urgent Reload");
  d.Wait(nullptr);
  return NowSeconds() - t0;
}

void ReleaseAll(Session* s, const std::vector<uint64_t>& blocks) {
  for (uint64_t b : blocks) Check(s->client->Release(b).get(), "Release");
}

// Urgent one-chunk reloads, idle and under saturation (offloads of set A and prefetch reloads
// of `set_b_blocks` into set B, repeated on a background thread).
void UrgentUnderSaturation(const Args& a, Session* s, IpcEvent ready,
                           const std::vector<uint64_t>& set_b_blocks, double h2d_gbps) {
  const uint64_t n = a.tensors, t = a.tensor_bytes, slots = 2 * n * t;
  std::vector<uint64_t> urgent;
  for (int i = 0; i < 4; ++i) {
    urgent.push_back(Check(s->client->Offload(s->region_id, slots + i * a.chunk_bytes,
                                              a.chunk_bytes, ready.handle).get(),
                           "urgent-slot Offload").block_id);
  }
  std::vector<double> idle, busy;
  for (int i = 0; i < 5; ++i) {
    idle.push_back(UrgentReload(s, urgent[i % 4], slots + (i % 4) * a.chunk_bytes));
  }
  std::atomic<bool> stop{false};
  std::thread load([&] {
    while (!stop.load()) {
      DaemonRun r = DaemonTransfers(a, s, ready, true, 0, set_b_blocks, n);
      ReleaseAll(s, r.new_blocks);
    }
  });
  usleep(100 * 1000);  // let both directions fill
  for (int i = 0; i < a.samples; ++i) {
    busy.push_back(UrgentReload(s, urgent[i % 4], slots + (i % 4) * a.chunk_bytes));
    usleep(20 * 1000);
  }
  stop = true;
  load.join();
  ReleaseAll(s, urgent);
  const double chunk_s = h2d_gbps > 0 ? a.chunk_bytes / (h2d_gbps * 1e9) : 0;
  const double mi = Median(idle), mb = Median(busy);
  std::printf("FIGURE urgent_reload_idle_median_ms %.3f ms (%.1f chunk-times of %llu MiB)\n",
              mi * 1e3, chunk_s > 0 ? mi / chunk_s : 0,
              static_cast<unsigned long long>(a.chunk_bytes / kMiB));
  std::printf("FIGURE urgent_reload_saturated_median_ms %.3f ms (%.1f chunk-times of %llu MiB "
              "at the daemon's H2D %.1f GB/s; max %.3f ms over %d samples)\n",
              mb * 1e3, chunk_s > 0 ? mb / chunk_s : 0,
              static_cast<unsigned long long>(a.chunk_bytes / kMiB), h2d_gbps,
              *std::max_element(busy.begin(), busy.end()) * 1e3, a.samples);
}

int ModeRates(const Args& a) {
  const uint64_t n = a.tensors, t = a.tensor_bytes;
  Session s;
  offloadd::gpucheck::Open(a.socket, "gpu_probes rates", 2 * n * t + 4 * a.chunk_bytes, &s);
  for (uint64_t i = 0; i < 2 * n; ++i) Check(cudaMemset(s.base + i * t, i & 0xff, t), "fill");
  uint8_t* pinned = nullptr;
  Check(cudaMallocHost(&pinned, 4 * t), "cudaMallocHost");
  std::memset(pinned, 7, 4 * t);
  MemcpyRates(a, s.base, pinned, true, true);  // warm-up
  auto d2h = MemcpyRates(a, s.base, pinned, true, false);
  auto h2d = MemcpyRates(a, s.base, pinned, false, true);
  auto both = MemcpyRates(a, s.base, pinned, true, true);
  Check(cudaDeviceSynchronize(), "sync");
  cudaStream_t st;
  Check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  IpcEvent ready = Check(s.exporter.RecordReady(st), "RecordReady");
  DaemonRun off = DaemonTransfers(a, &s, ready, true, 0, {}, 0);          // set A out
  DaemonRun rel = DaemonTransfers(a, &s, ready, false, 0, off.new_blocks, 0);  // and back in
  DaemonRun mix = DaemonTransfers(a, &s, ready, true, n, off.new_blocks, 0);   // B out, A in
  ReleaseAll(&s, off.new_blocks);
  const double dd = GBps(n * t, off.d2h_seconds), dh = GBps(n * t, rel.h2d_seconds);
  PrintRatio("d2h", dd, d2h.first);
  PrintRatio("h2d", dh, h2d.second);
  PrintRatio("both_at_once_d2h", GBps(n * t, mix.d2h_seconds), both.first);
  PrintRatio("both_at_once_h2d", GBps(n * t, mix.h2d_seconds), both.second);
  UrgentUnderSaturation(a, &s, ready, mix.new_blocks, dh);
  ReleaseAll(&s, mix.new_blocks);
  s.exporter.ReleaseEvent(ready);
  std::printf("PASS rates: %llu x %llu MiB each way, through the daemon and cudaMemcpyAsync\n",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(t / kMiB));
  s.client->Close();
  return 0;
}

int ModeSpin(const Args& a) {
  const uint64_t a_bytes = 4 * a.tensor_bytes, b_bytes = a.tensor_bytes;
  Session s;
  offloadd::gpucheck::Open(a.socket, "gpu_probes spin", a_bytes + b_bytes, &s);
  uint8_t* tensor_b = s.base + a_bytes;
  cudaStream_t st;
  Check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  uint64_t* d_sum = nullptr;
  Check(cudaMalloc(&d_sum, sizeof(uint64_t)), "cudaMalloc");
  // Reference: A alone.
  Check(cudaMemsetAsync(s.base, 1, a_bytes, st), "memset A");
  IpcEvent ev_a = Check(s.exporter.RecordReady(st), "RecordReady");
  double t0 = NowSeconds();
  auto alone = Check(s.client->Offload(s.region_id, 0, a_bytes, ev_a.handle).get(), "Offload A");
  const double alone_s = NowSeconds() - t0;
  Check(s.client->Release(alone.block_id).get(), "Release");
  // A ready now; B's producer: a spin kernel, then B's final bytes.
  Check(cudaMemsetAsync(s.base, 2, a_bytes, st), "memset A");
  Check(cudaMemsetAsync(tensor_b, 0x11, b_bytes, st), "memset B (early)");
  IpcEvent ev_a2 = Check(s.exporter.RecordReady(st), "RecordReady");
  Check(offloadd::kernels::LaunchSpin(uint64_t{1000000} * a.spin_ms, st), "LaunchSpin");
  Check(cudaMemsetAsync(tensor_b, 0x22, b_bytes, st), "memset B (final)");
  IpcEvent ev_b = Check(s.exporter.RecordReady(st), "RecordReady");
  t0 = NowSeconds();
  auto fa = s.client->Offload(s.region_id, 0, a_bytes, ev_a2.handle);
  auto fb = s.client->Offload(s.region_id, a_bytes, b_bytes, ev_b.handle);
  auto ra = Check(fa.get(), "Offload A");
  const double a_s = NowSeconds() - t0;
  auto rb = Check(fb.get(), "Offload B");
  const double b_s = NowSeconds() - t0;
  for (const IpcEvent& e : {ev_a, ev_a2, ev_b}) s.exporter.ReleaseEvent(e);
  Check(cudaMemsetAsync(tensor_b, 0, b_bytes, st), "wipe B");
  Check(cudaStreamSynchronize(st), "sync");
  DoneEvent done_b(&s);
  Check(s.client->Reload(rb.block_id, s.region_id, a_bytes, Priority::kUrgent, true, 0,
                         done_b.handle())
            .get(),
        "Reload B");
  done_b.Wait(st);
  std::vector<uint8_t> want(b_bytes, 0x22);
  const bool b_ok = offloadd::gpucheck::DeviceChecksum(tensor_b, b_bytes, d_sum, st) ==
                    offloadd::kernels::ChecksumRef(want.data(), b_bytes);
  Check(s.client->Release(ra.block_id).get(), "Release");
  std::printf("FIGURE spin_probe_A_ms %.2f ms behind B's %d ms producer (A alone %.2f ms; "
              "B %.2f ms)\n", a_s * 1e3, a.spin_ms, alone_s * 1e3, b_s * 1e3);
  s.client->Close();
  if (!b_ok) Fail("spin: B's block does not hold the bytes written after the spin kernel");
  if (a_s > alone_s + a.spin_ms / 2e3) {
    Fail("spin: offload A took " + std::to_string(a_s * 1e3) + " ms: it waited for B's " +
         std::to_string(a.spin_ms) + " ms producer (an offload's ready-wait stalls others)");
  }
  std::printf("PASS spin: A did not wait for B's producer; B holds its final bytes\n");
  return 0;
}

int ModeFreeMid(const Args& a) {
  const uint64_t n = a.tensors, t = a.tensor_bytes;
  Session s;
  offloadd::gpucheck::Open(a.socket, "gpu_probes free_mid", n * t, &s);
  Check(cudaMemset(s.base, 3, n * t), "fill");
  Check(cudaDeviceSynchronize(), "sync");
  cudaStream_t st;
  Check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  IpcEvent ready = Check(s.exporter.RecordReady(st), "RecordReady");
  std::vector<std::future<absl::StatusOr<OffloadResult>>> offs;
  for (uint64_t i = 0; i < n; ++i) offs.push_back(s.client->Offload(s.region_id, i * t, t,
                                                                    ready.handle));
  usleep(2000);  // the first chunks are copying now
  Check(cudaFree(s.base), "cudaFree with copies in flight");
  std::printf("FREED %llu bytes with %llu offloads sent; exiting without Close\n",
              static_cast<unsigned long long>(n * t), static_cast<unsigned long long>(n));
  std::fflush(stdout);
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  char exe[4096] = {0};
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  a.self = len > 0 ? std::string(exe, len) : std::string(argv[0]);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto eq = arg.find('=');
    std::string k = arg.substr(0, eq), v = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (k == "--mode") a.mode = v;
    else if (k == "--socket") a.socket = v;
    else if (k == "--handle") a.handle_hex = v;
    else if (k == "--event") a.event_hex = v;
    else if (k == "--uid") a.uid = std::atoi(v.c_str());
    else if (k == "--tensors") a.tensors = std::max(1, std::atoi(v.c_str()));
    else if (k == "--tensor_mib") a.tensor_bytes = std::strtoull(v.c_str(), nullptr, 10) * kMiB;
    else if (k == "--chunk_mib") a.chunk_bytes = std::strtoull(v.c_str(), nullptr, 10) * kMiB;
    else if (k == "--spin_ms") a.spin_ms = std::max(1, std::atoi(v.c_str()));
    else if (k == "--samples") a.samples = std::max(1, std::atoi(v.c_str()));
    else Fail("unknown argument " + arg);
  }
  if (a.uid >= 0 && (setgid(a.uid) != 0 || setuid(a.uid) != 0)) {
    std::printf("IPC unsupported in this sandbox: setuid(%d) failed\n", a.uid);
    return kIpcUnsupportedExit;
  }
  if (a.mode == "ipc_import") {  // the second process must see the GPU the first one uses
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      Fail("ipc_import: the second process finds no usable GPU");
    }
  }
  if (!offloadd::gpucheck::UsableGpu()) return 0;
  if (a.mode == "ipc") return ModeIpc(a);
  if (a.mode == "ipc_import") return ModeIpcImport(a);
  if (a.mode == "ipc_export") return ModeIpcExport();
  if (a.mode == "ipc_cross_uid") return ModeIpcCrossUid(a);
  if (a.socket.empty()) Fail("--socket=PATH is required");
  if (a.mode == "rates") return ModeRates(a);
  if (a.mode == "spin") return ModeSpin(a);
  if (a.mode == "free_mid") return ModeFreeMid(a);
  Fail("unknown --mode " + a.mode);
}
