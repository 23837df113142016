#include "server/copy/sim_gpu_table.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <random>

#include "absl/strings/str_format.h"

namespace offloadd::copy {
namespace {

constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kEventSlotBytes = sizeof(SimEventSlot);
constexpr uint64_t kSegmentSlotBytes = sizeof(SimSegmentSlot);

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// A client may truncate its table's object while the daemon has it mapped; touching the pages
// that vanished raises SIGBUS. The daemon's mappings of tables are registered here, and the
// handler replaces the whole mapping of the table it faulted in by zero-filled private memory,
// so the access is retried and reads zeros (events complete at 0, segments free: copies on it
// fail as copies on freed memory) instead of killing the daemon. A SIGBUS anywhere else goes to
// the handler that was installed before (the shm engine's copy guard), else kills as before.
constexpr int kMaxGuardedTables = 4096;
struct GuardedRange {
  std::atomic<uintptr_t> base{0};
  std::atomic<uint64_t> size_bytes{0};
};
GuardedRange g_guarded[kMaxGuardedTables];
struct sigaction g_previous_sigbus;
std::atomic<uint64_t> g_tables_zeroed{0};

void OnTableSigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (GuardedRange& r : g_guarded) {
    const uintptr_t base = r.base.load(std::memory_order_acquire);
    const uint64_t size = r.size_bytes.load(std::memory_order_acquire);
    if (base == 0 || addr < base || addr - base >= size) continue;
    void* p = mmap(reinterpret_cast<void*>(base), size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p != MAP_FAILED) {
      g_tables_zeroed.fetch_add(1);
      return;
    }
  }
  if ((g_previous_sigbus.sa_flags & SA_SIGINFO) != 0 && g_previous_sigbus.sa_sigaction != nullptr) {
    g_previous_sigbus.sa_sigaction(sig, info, context);
    return;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

bool InstallTableSigbusGuard() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnTableSigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGBUS, &sa, &g_previous_sigbus) == 0;
  }();
  return installed;
}

// Registers [base, +size) with the guard; false when every place is taken.
bool GuardRange(uint8_t* base, uint64_t size) {
  for (GuardedRange& r : g_guarded) {
    uintptr_t expected = 0;
    if (r.base.compare_exchange_strong(expected, reinterpret_cast<uintptr_t>(base))) {
      r.size_bytes.store(size, std::memory_order_release);
      return true;
    }
  }
  return false;
}

void UnguardRange(uint8_t* base) {
  for (GuardedRange& r : g_guarded) {
    if (r.base.load() == reinterpret_cast<uintptr_t>(base)) {
      r.size_bytes.store(0, std::memory_order_release);
      r.base.store(0, std::memory_order_release);
      return;
    }
  }
}

std::string Handle(const char magic[8], uint32_t pid, uint32_t slot, uint64_t generation,
                   uint64_t instance) {
  std::string h(64, '\0');
  std::memcpy(h.data(), magic, 8);
  std::memcpy(h.data() + 8, &pid, 4);
  std::memcpy(h.data() + 12, &slot, 4);
  std::memcpy(h.data() + 16, &generation, 8);
  std::memcpy(h.data() + 24, &instance, 8);
  return h;
}

bool Parse(absl::string_view h, const char magic[8], uint32_t* pid, uint32_t* slot,
           uint64_t* generation, uint64_t* instance) {
  if (h.size() != 64 || std::memcmp(h.data(), magic, 8) != 0) return false;
  std::memcpy(pid, h.data() + 8, 4);
  std::memcpy(slot, h.data() + 12, 4);
  std::memcpy(generation, h.data() + 16, 8);
  std::memcpy(instance, h.data() + 24, 8);
  return true;
}

}  // namespace

bool ParseSimMemHandle(absl::string_view handle, SimMemRef* out) {
  return Parse(handle, kSimMemMagic, &out->pid, &out->slot, &out->generation, &out->instance);
}

bool ParseSimEventHandle(absl::string_view handle, SimEventRef* out) {
  uint64_t unused;
  return Parse(handle, kSimEventMagic, &out->pid, &out->slot, &unused, &out->instance);
}

std::string MakeSimMemHandle(const SimMemRef& ref) {
  return Handle(kSimMemMagic, ref.pid, ref.slot, ref.generation, ref.instance);
}

std::string MakeSimEventHandle(const SimEventRef& ref) {
  return Handle(kSimEventMagic, ref.pid, ref.slot, 0, ref.instance);
}

std::string SimTableName(uint32_t pid) { return absl::StrFormat("/ofd-simgpu-%d", pid); }

uint64_t SimTablesZeroedTotal() { return g_tables_zeroed.load(); }

int64_t SimNowNanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Status CheckSimHandleOwner(absl::string_view handle,
                                 const std::vector<uint32_t>& session_pids, uint32_t session_uid,
                                 const std::string& shm_dir) {
  SimMemRef mem;
  SimEventRef event;
  uint32_t pid = 0;
  if (ParseSimMemHandle(handle, &mem)) {
    pid = mem.pid;
  } else if (ParseSimEventHandle(handle, &event)) {
    pid = event.pid;
  } else {
    return absl::OkStatus();  // not a simulated table's handle
  }
  bool own_pid = false;
  for (uint32_t p : session_pids) own_pid = own_pid || (p != 0 && p == pid);
  if (!own_pid) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "this handle names the simulated GPU table of pid %d, which is not this session's "
        "process: a session may register only its own process's memory and events (connect "
        "from the process that owns them)",
        pid));
  }
  struct stat st;
  const std::string path = shm_dir + SimTableName(pid);
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();  // opening says NOT_FOUND
  if (!S_ISREG(st.st_mode) || st.st_uid != session_uid) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "the simulated GPU table %s belongs to uid %d (or is not a regular file), not to this "
        "session's uid %d: remove it and let the client create its own",
        SimTableName(pid), st.st_uid, session_uid));
  }
  return absl::OkStatus();
}

bool SimGpuTable::ReadLayout() {
  const SimTableHeader& h = *header_;
  if (std::memcmp(h.magic, kSimTableMagic, 8) != 0 || h.version != kSimTableVersion) return false;
  Layout l;  // each field read once; everything below uses these copies
  l.devices = h.devices;
  l.event_slots = h.event_slots;
  l.segment_slots = h.segment_slots;
  l.device_bytes = h.device_bytes;
  l.events_offset = h.events_offset;
  l.segments_offset = h.segments_offset;
  l.memory_offset = h.memory_offset;
  l.instance = h.instance;
  // Every bound in 128 bits: no client value can wrap a sum past the object's size.
  using u128 = unsigned __int128;
  const u128 events_end = u128{l.events_offset} + u128{l.event_slots} * kEventSlotBytes;
  const u128 segments_end =
      u128{l.segments_offset} + u128{l.segment_slots} * kSegmentSlotBytes;
  const u128 memory_end = u128{l.memory_offset} + u128{l.devices} * u128{l.device_bytes};
  if (l.events_offset < kHeaderBytes || l.events_offset % 8 != 0 ||
      l.segments_offset % 8 != 0 || events_end > l.segments_offset ||
      segments_end > l.memory_offset || memory_end > size_) {
    return false;
  }
  layout_ = l;
  return true;
}

absl::StatusOr<std::shared_ptr<SimGpuTable>> SimGpuTable::Open(uint32_t pid, uint64_t instance) {
  const std::string name = SimTableName(pid);
  if (instance == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the handle names %s without its instance (0): send the handle the client's table made",
        name));
  }
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrFormat(
        "simulated GPU table %s of client pid %d: %s (the client process is gone?)", name, pid,
        strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < kHeaderBytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat("%s is too small for a table", name));
  }
  void* p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    return absl::FailedPreconditionError(absl::StrFormat("mmap %s: %s", name, strerror(errno)));
  }
  std::shared_ptr<SimGpuTable> t(new SimGpuTable());
  t->name_ = name;
  t->base_ = static_cast<uint8_t*>(p);
  t->size_ = st.st_size;
  t->header_ = reinterpret_cast<SimTableHeader*>(p);
  t->owner_uid_ = st.st_uid;
  // Before the first read: the client may truncate the object from now on.
  t->guarded_ = InstallTableSigbusGuard() && GuardRange(t->base_, t->size_);
  if (!t->guarded_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the daemon already maps %d simulated GPU tables: end sessions of exited clients",
        kMaxGuardedTables));
  }
  if (!t->ReadLayout()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not a simulated GPU table of version %d (or is damaged)", name,
        kSimTableVersion));
  }
  if (t->layout_.instance != instance) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is another table than the handle's (the client made a new one since)", name));
  }
  return t;
}

absl::StatusOr<std::shared_ptr<SimGpuTable>> SimGpuTable::Create(uint32_t pid, uint32_t devices,
                                                                uint64_t device_bytes,
                                                                uint32_t event_slots,
                                                                uint32_t segment_slots) {
  const std::string name = SimTableName(pid);
  const uint64_t events_offset = kHeaderBytes;
  const uint64_t segments_offset = AlignUp(events_offset + event_slots * kEventSlotBytes, 4096);
  const uint64_t memory_offset =
      AlignUp(segments_offset + segment_slots * kSegmentSlotBytes, 2ull << 20);
  const uint64_t size = memory_offset + uint64_t{devices} * device_bytes;
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return absl::AlreadyExistsError(absl::StrFormat("shm_open %s: %s", name, strerror(errno)));
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(absl::StrFormat("ftruncate %s: %s", name, strerror(e)));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(absl::StrFormat("mmap %s: %s", name, strerror(errno)));
  }
  auto* h = static_cast<SimTableHeader*>(p);
  std::memcpy(h->magic, kSimTableMagic, 8);
  h->version = kSimTableVersion;
  h->devices = devices;
  h->event_slots = event_slots;
  h->segment_slots = segment_slots;
  h->device_bytes = device_bytes;
  h->events_offset = events_offset;
  h->segments_offset = segments_offset;
  h->memory_offset = memory_offset;
  uint64_t instance = 0;  // random: a handle's instance is known only to who read the table
  std::random_device rd;
  while (instance == 0) instance = (uint64_t{rd()} << 32) | rd();
  h->instance = instance;
  std::shared_ptr<SimGpuTable> t(new SimGpuTable());
  t->name_ = name;
  t->base_ = static_cast<uint8_t*>(p);
  t->size_ = size;
  t->header_ = h;
  t->owner_ = true;
  t->owner_uid_ = geteuid();
  if (!t->ReadLayout()) abort();  // (what Create writes always fits)
  for (uint32_t i = 0; i < event_slots; ++i) t->event(i)->complete_at_ns = kSimNever;
  return t;
}

SimGpuTable::~SimGpuTable() {
  if (guarded_) UnguardRange(base_);
  if (base_ != nullptr) munmap(base_, size_);
  if (owner_) shm_unlink(name_.c_str());
}

SimEventSlot* SimGpuTable::event(uint32_t slot) const {
  if (slot >= layout_.event_slots) return nullptr;
  return reinterpret_cast<SimEventSlot*>(base_ + layout_.events_offset +
                                         uint64_t{slot} * kEventSlotBytes);
}

SimSegmentSlot* SimGpuTable::segment(uint32_t slot) const {
  if (slot >= layout_.segment_slots) return nullptr;
  return reinterpret_cast<SimSegmentSlot*>(base_ + layout_.segments_offset +
                                           uint64_t{slot} * kSegmentSlotBytes);
}

bool SimGpuTable::Geometry(const SimSegmentSlot& s, SimSegmentGeometry* out) const {
  SimSegmentGeometry g;  // each field read once
  g.device = s.device;
  g.offset = s.offset;
  g.size_bytes = s.size;
  if (g.device >= layout_.devices || g.offset > layout_.device_bytes ||
      g.size_bytes > layout_.device_bytes - g.offset) {
    return false;
  }
  g.memory = base_ + layout_.memory_offset + uint64_t{g.device} * layout_.device_bytes + g.offset;
  *out = g;
  return true;
}

uint8_t* SimGpuTable::SegmentMemory(const SimSegmentSlot& s) const {
  SimSegmentGeometry g;
  return Geometry(s, &g) ? g.memory : nullptr;
}

void SimGpuTable::CountViolation(SimViolation v) const {
  header_->violations[static_cast<int>(v)].fetch_add(1);
}

uint64_t SimGpuTable::violations(SimViolation v) const {
  return header_->violations[static_cast<int>(v)].load();
}

}  // namespace offloadd::copy
