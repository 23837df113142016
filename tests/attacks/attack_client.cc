// attack_client: a hostile client of a --backend=cuda-sim daemon, for tests/attacks. Each mode
// drops to --uid (setgid + setuid: needs root; prints "setuid_failed 1" and exits 1 when that
// fails), makes a simulated GPU table of its own pid, and prints "key value" lines on stdout
// (values of *_code keys are gRPC/absl status codes; 0 = OK).
//
//   --mode=forge --socket=S --uid=U --victim_pid=P --victim_generation=G --victim_instance=I
//       --victim_event_slot=E --bytes=N
//     Names the victim's table (pid P, segment slot 0, generation G; event slot E) in forged
//     handles, with instance 0 and with the victim's instance I:
//     register_zero_code, register_code (RegisterRegion of the forged memory handle), and for a
//     forged region that registered: offload_code (reads the victim's memory), reload_code
//     (writes this client's bytes into it); done_zero_code, done_code (a reload into its own
//     memory naming the victim's event as done event); ready_code (an offload naming the
//     victim's event as ready event).
//   --mode=rewrite --socket=S --uid=U --bytes=N
//     Registers its own memory, starts an offload whose ready event completes 1.5 s later,
//     then, while the daemon waits for it, rewrites its table's header layout fields and the
//     segment's device, offset and size to values far outside the table. Prints offload_code,
//     then reload_code (a reload into the rewritten segment), then "done 1".
//   --mode=truncate --socket=S --uid=U --bytes=N
//     As rewrite, but truncates its table's shared-memory object to 0 bytes instead (the
//     daemon's mapping of it then has no pages behind it). Prints offload_code, then "done 1".
//   --mode=events --socket=S --uid=U --bytes=N
//     An offload with a ready event and a reload with a done event (the daemon opens both),
//     then "ready <pid>"; then waits for SIGTERM and exits cleanly (closes its session, removes
//     its table) — or is killed meanwhile.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "client/offloadd_client.h"
#include "client/sim_client_cuda_api.h"
#include "common/sim_gpu_table.h"

namespace {

volatile sig_atomic_t g_stop = 0;
void OnStop(int) { g_stop = 1; }

using offloadd::client::Client;
using offloadd::client::SimClientGpu;
namespace common = offloadd::common;

std::string Flag(int argc, char** argv, const std::string& name, const std::string& def = "") {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
  }
  return def;
}
uint64_t Num(int argc, char** argv, const std::string& name, uint64_t def = 0) {
  const std::string v = Flag(argc, argv, name);
  return v.empty() ? def : std::strtoull(v.c_str(), nullptr, 10);
}

void Print(const std::string& key, const absl::Status& st) {
  std::cout << key << " " << static_cast<int>(st.code()) << std::endl;
  if (!st.ok()) std::cout << key << "_message " << st.message() << std::endl;
}

// This process's table, one segment of `bytes` (filled with 0x5a) and a stream.
struct Gpu {
  std::shared_ptr<SimClientGpu> gpu;
  uint64_t ptr = 0;
  std::string mem_handle;
  void* stream = nullptr;
};

bool MakeGpu(uint64_t bytes, Gpu* g) {
  offloadd::client::SimClientGpuOptions o;
  o.device_bytes = 64ull << 20;
  o.event_slots = 64;
  o.segment_slots = 64;
  auto made = SimClientGpu::Create(o);
  if (!made.ok()) {
    std::cout << "error " << made.status() << std::endl;
    return false;
  }
  g->gpu = *made;
  if (g->gpu->SetDevice(0) != 0 || g->gpu->Malloc(&g->ptr, bytes) != 0 ||
      g->gpu->IpcGetMemHandle(g->ptr, &g->mem_handle) != 0 ||
      g->gpu->StreamCreate(&g->stream) != 0) {
    std::cout << "error sim gpu calls failed" << std::endl;
    return false;
  }
  std::memset(g->gpu->HostBytes(g->ptr), 0x5a, bytes);
  return true;
}

// An IPC event recorded on g's stream after a kernel of `seconds`: complete that much later.
std::string RecordedEvent(Gpu& g, double seconds) {
  void* event = nullptr;
  std::string handle;
  g.gpu->EventCreateIpc(&event);
  if (seconds > 0) g.gpu->LaunchKernel(g.stream, seconds);
  g.gpu->EventRecord(event, g.stream);
  g.gpu->IpcGetEventHandle(event, &handle);
  return handle;
}

std::unique_ptr<Client> Connect(const std::string& socket) {
  offloadd::client::ClientOptions o;
  o.socket_path = socket;
  o.client_name = "attack_client";
  o.device_id = offloadd::client::SimDeviceUuid(0);
  o.connect_timeout_seconds = 5;
  auto c = Client::Connect(o);
  if (!c.ok()) {
    std::cout << "error " << c.status() << std::endl;
    return nullptr;
  }
  return *std::move(c);
}

int Forge(int argc, char** argv, Client& c, Gpu& g, uint64_t bytes) {
  const auto pid = static_cast<uint32_t>(Num(argc, argv, "victim_pid"));
  const uint64_t generation = Num(argc, argv, "victim_generation", 1);
  const uint64_t instance = Num(argc, argv, "victim_instance");
  const auto event_slot = static_cast<uint32_t>(Num(argc, argv, "victim_event_slot"));
  auto zero = c.RegisterRegion({common::MakeSimMemHandle({pid, 0, generation, 0}), "", bytes});
  Print("register_zero_code", zero.status());
  auto forged = c.RegisterRegion({common::MakeSimMemHandle({pid, 0, generation, instance}), "",
                                  bytes});
  Print("register_code", forged.status());
  auto own = c.RegisterRegion({g.mem_handle, "", bytes});
  Print("register_own_code", own.status());
  if (!own.ok()) return 1;
  auto block = c.Offload(*own, 0, bytes).get();  // this client's own bytes (0x5a)
  Print("offload_own_code", block.status());
  for (const auto* r : {&zero, &forged}) {
    if (!r->ok()) continue;
    Print("offload_code", c.Offload(**r, 0, bytes).get().status());
    if (block.ok()) {
      Print("reload_code",
            c.Reload(block->block_id, **r, 0, offloadd::client::Priority::kUrgent).get().status());
    }
  }
  if (!block.ok()) return 1;
  for (uint64_t inst : {uint64_t{0}, instance}) {
    const std::string done = common::MakeSimEventHandle({pid, event_slot, inst});
    auto r = c.Reload(block->block_id, *own, 0, offloadd::client::Priority::kUrgent, false, 0,
                      done).get();
    Print(inst == 0 ? "done_zero_code" : "done_code", r.status());
  }
  const std::string ready = common::MakeSimEventHandle({pid, event_slot, instance});
  Print("ready_code", c.Offload(*own, 0, bytes, ready).get().status());
  return 0;
}

// Rewrites every layout field the daemon once trusted, far outside the table.
void RewriteTable(Gpu& g) {
  common::SimMemRef ref;
  common::ParseSimMemHandle(g.mem_handle, &ref);
  const common::SimGpuTable& t = g.gpu->table();
  common::SimSegmentSlot* seg = t.segment(ref.slot);
  common::SimTableHeader& h = t.header();
  constexpr uint64_t kFar = uint64_t{1} << 46;
  h.memory_offset = kFar;
  h.events_offset = kFar;
  h.segments_offset = kFar;
  h.device_bytes = kFar;
  h.devices = 1u << 20;
  h.event_slots = 1u << 30;
  h.segment_slots = 1u << 30;
  seg->offset = kFar;
  seg->size = kFar;
  seg->device = 7;
}

int Rewrite(Client& c, Gpu& g, uint64_t bytes) {
  auto region = c.RegisterRegion({g.mem_handle, "", bytes});
  Print("register_own_code", region.status());
  if (!region.ok()) return 1;
  const std::string ready = RecordedEvent(g, 1.5);
  auto offload = c.Offload(*region, 0, bytes, ready);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the daemon waits on `ready`
  RewriteTable(g);
  auto result = offload.get();
  Print("offload_code", result.status());
  if (result.ok()) {
    Print("reload_code", c.Reload(result->block_id, *region, 0,
                                  offloadd::client::Priority::kUrgent).get().status());
  }
  std::cout << "done 1" << std::endl;
  return 0;
}

int Truncate(Client& c, Gpu& g, uint64_t bytes) {
  auto region = c.RegisterRegion({g.mem_handle, "", bytes});
  Print("register_own_code", region.status());
  if (!region.ok()) return 1;
  auto offload = c.Offload(*region, 0, bytes, RecordedEvent(g, 1.5));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the daemon waits on `ready`
  const int fd = shm_open(common::SimTableName(getpid()).c_str(), O_RDWR, 0);
  if (fd < 0 || ftruncate(fd, 0) != 0) {
    std::cout << "error truncating the table: " << std::strerror(errno) << std::endl;
    return 1;
  }
  close(fd);
  Print("offload_code", offload.get().status());
  std::cout << "done 1" << std::endl;
  std::_Exit(0);  // (this process's own table is gone too: no destructors touching it)
}

int Events(Client& c, Gpu& g, uint64_t bytes) {
  auto region = c.RegisterRegion({g.mem_handle, "", bytes});
  if (!region.ok()) return 1;
  auto block = c.Offload(*region, 0, bytes, RecordedEvent(g, 0)).get();
  Print("offload_code", block.status());
  if (!block.ok()) return 1;
  void* done = nullptr;
  std::string done_handle;
  g.gpu->EventCreateIpc(&done);
  g.gpu->IpcGetEventHandle(done, &done_handle);
  auto reload = c.Reload(block->block_id, *region, 0, offloadd::client::Priority::kUrgent, true,
                         0, done_handle, RecordedEvent(g, 0)).get();
  Print("reload_code", reload.status());
  std::cout << "ready " << getpid() << std::endl;
  while (!g_stop) pause();
  c.Close();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = Flag(argc, argv, "mode");
  signal(SIGTERM, OnStop);
  const auto uid = static_cast<uid_t>(Num(argc, argv, "uid", 65534));
  if (setgid(uid) != 0 || setuid(uid) != 0) {
    std::cout << "setuid_failed 1" << std::endl;
    return 1;
  }
  const uint64_t bytes = Num(argc, argv, "bytes", 4ull << 20);
  Gpu g;
  if (!MakeGpu(bytes, &g)) return 1;
  auto c = Connect(Flag(argc, argv, "socket"));
  if (c == nullptr) return 1;
  if (mode == "forge") return Forge(argc, argv, *c, g, bytes);
  if (mode == "rewrite") return Rewrite(*c, g, bytes);
  if (mode == "events") return Events(*c, g, bytes);
  if (mode == "truncate") return Truncate(*c, g, bytes);
  std::cerr << "usage: attack_client --mode=forge|rewrite|events --socket=PATH [--uid=U] ...\n";
  return 2;
}
