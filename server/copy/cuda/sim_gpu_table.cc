#include "server/copy/cuda/sim_gpu_table.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace offloadd::copy {

using common::ParseSimEventHandle;
using common::ParseSimMemHandle;
using common::SimEventRef;
using common::SimGpuTable;
using common::SimMemRef;
using common::SimTableName;

namespace {

// The smallest object that can hold a table's header.
constexpr uint64_t kHeaderBytes = 4096;

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

}  // namespace

uint64_t SimTablesZeroedTotal() { return g_tables_zeroed.load(); }

absl::StatusOr<std::shared_ptr<SimGpuTable>> OpenSimGpuTable(uint32_t pid, uint64_t instance) {
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
  auto* base = static_cast<uint8_t*>(p);
  // Before the first read: the client may truncate the object from now on.
  if (!InstallTableSigbusGuard() || !GuardRange(base, st.st_size)) {
    munmap(base, st.st_size);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the daemon already maps %d simulated GPU tables: end sessions of exited clients",
        kMaxGuardedTables));
  }
  auto t = SimGpuTable::Adopt(name, base, st.st_size, st.st_uid, [base] { UnguardRange(base); });
  if (!t.ok()) return t.status();
  if ((*t)->instance() != instance) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is another table than the handle's (the client made a new one since)", name));
  }
  return t;
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

}  // namespace offloadd::copy
