#include "server/pool/arena.h"

#include <errno.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "glog/logging.h"

namespace offloadd::pool {
namespace {

constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

constexpr char kMemlockAdvice[] =
    "Raise the limit: LimitMEMLOCK=infinity in the systemd unit; `ulimit -l unlimited` in the "
    "shell that starts offloadd; in Docker `--ulimit memlock=-1:-1`; in Kubernetes the IPC_LOCK "
    "capability in the container's securityContext (or an unlimited memlock ulimit in the "
    "container runtime); or run without mlock.";

std::string MiB(uint64_t bytes) { return absl::StrCat(bytes, " bytes (", bytes >> 20, " MiB)"); }

std::string LimitText(uint64_t limit_bytes) {
  return limit_bytes == static_cast<uint64_t>(RLIM_INFINITY) ? "unlimited" : MiB(limit_bytes);
}

absl::StatusOr<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Maps `bytes` (a multiple of the page size) of anonymous memory, 2 MiB-aligned when `align_huge`
// (over-map by 2 MiB, then unmap the unaligned head and the tail).
absl::StatusOr<uint8_t*> Map(uint64_t bytes, bool populate, bool align_huge) {
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0);
  const uint64_t map_bytes = align_huge ? bytes + kHugePageBytes : bytes;
  void* p = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    auto avail = ReadMemAvailableBytes();
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of a host pool of ", MiB(bytes), " failed: ", std::strerror(err),
                     "; MemAvailable is ", avail.ok() ? MiB(*avail) : std::string("unknown"),
                     ". Lower the pool size or free host memory."));
  }
  auto* base = static_cast<uint8_t*>(p);
  if (!align_huge) return base;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(base);
  const uintptr_t aligned = (addr + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  const uint64_t head = aligned - addr;
  if (head > 0) munmap(base, head);
  const uint64_t tail = map_bytes - head - bytes;
  if (tail > 0) munmap(reinterpret_cast<uint8_t*>(aligned) + bytes, tail);
  return reinterpret_cast<uint8_t*>(aligned);
}

}  // namespace

absl::Status CheckMemlockLimit(uint64_t bytes, uint64_t limit_bytes, bool privileged) {
  if (privileged || limit_bytes == static_cast<uint64_t>(RLIM_INFINITY) || bytes <= limit_bytes) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat("cannot mlock a host pool of ", MiB(bytes),
                                                    ": RLIMIT_MEMLOCK is ", LimitText(limit_bytes),
                                                    ". ", kMemlockAdvice));
}

absl::Status CheckMemAvailable(uint64_t bytes, uint64_t available_bytes) {
  if (bytes <= available_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "host pool of ", MiB(bytes), " is larger than MemAvailable, ", MiB(available_bytes),
      " (/proc/meminfo). Lower the pool size or free host memory."));
}

absl::StatusOr<uint64_t> ParseMemAvailableBytes(absl::string_view meminfo) {
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumeSuffix(&line, "kB")) {
      return absl::InvalidArgumentError(absl::StrCat("MemAvailable has no kB unit: ", line));
    }
    uint64_t kib = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib)) {
      return absl::InvalidArgumentError(absl::StrCat("MemAvailable is not a number: ", line));
    }
    return kib * 1024;
  }
  return absl::NotFoundError("no MemAvailable line in /proc/meminfo (kernel older than 3.14?)");
}

absl::StatusOr<uint64_t> ReadMemAvailableBytes() {
  auto text = ReadFile("/proc/meminfo");
  if (!text.ok()) return text.status();
  return ParseMemAvailableBytes(*text);
}

bool MemlockPrivileged() {
  auto text = ReadFile("/proc/self/status");
  if (text.ok()) {
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      if (!absl::ConsumePrefix(&line, "CapEff:")) continue;
      uint64_t caps = 0;
      if (absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line), &caps)) {
        return (caps >> CAP_IPC_LOCK) & 1;
      }
    }
  }
  return geteuid() == 0;
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::Create(const ArenaOptions& options) {
  if (options.size_bytes == 0) {
    return absl::InvalidArgumentError("host pool size must be > 0 bytes");
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (options.size_bytes > UINT64_MAX - page) {
    return absl::InvalidArgumentError(
        absl::StrCat("host pool size ", options.size_bytes, " bytes is not a valid size"));
  }
  const uint64_t bytes = (options.size_bytes + page - 1) / page * page;

  auto avail = ReadMemAvailableBytes();
  if (avail.ok()) {
    if (auto s = CheckMemAvailable(bytes, *avail); !s.ok()) return s;
  } else {
    LOG(WARNING) << "cannot check the host pool size against MemAvailable: " << avail.status();
  }
  if (options.mlock && !MemlockPrivileged()) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
      if (auto s = CheckMemlockLimit(bytes, rl.rlim_cur, false); !s.ok()) return s;
    }
  }

  // With huge pages, advise before the first touch so faults get 2 MiB pages: no MAP_POPULATE.
  const bool populate = options.prefault && !options.huge_pages;
  auto mapped = Map(bytes, populate, options.huge_pages);
  if (!mapped.ok()) return mapped.status();
  uint8_t* base = *mapped;
  if (options.huge_pages && madvise(base, bytes, MADV_HUGEPAGE) != 0) {
    LOG(WARNING) << "madvise(MADV_HUGEPAGE) on the host pool failed (" << std::strerror(errno)
                 << "); continuing with 4 KiB pages";
  }
  if (options.prefault) {
    // A write per page. After MAP_POPULATE the pages are already present and this is cheap; with
    // huge pages (no MAP_POPULATE) it is what faults them in, as 2 MiB pages where THP allows.
    volatile uint8_t* p = base;
    for (uint64_t off = 0; off < bytes; off += page) p[off] = 0;
  }
  bool locked = false;
  if (options.mlock) {
    if (::mlock(base, bytes) != 0) {
      const int err = errno;
      munmap(base, bytes);
      struct rlimit rl {};
      getrlimit(RLIMIT_MEMLOCK, &rl);
      const std::string what =
          absl::StrCat("mlock of a host pool of ", MiB(bytes), " failed: ", std::strerror(err));
      // EPERM: RLIMIT_MEMLOCK is 0 without CAP_IPC_LOCK. ENOMEM: over the limit (which counts
      // everything the process has locked already), or out of memory.
      if (err == EPERM || (err == ENOMEM && !MemlockPrivileged() && rl.rlim_cur != RLIM_INFINITY)) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, "; RLIMIT_MEMLOCK is ", LimitText(rl.rlim_cur), ". ", kMemlockAdvice));
      }
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ". Lower the pool size or run without mlock."));
    }
    locked = true;
  }
  return std::unique_ptr<Arena>(new Arena(base, bytes, locked));
}

Arena::~Arena() {
  if (base_ != nullptr) munmap(base_, size_bytes_);
}

int Arena::numa_node() const {
  constexpr int kMpolFNode = 1 << 0, kMpolFAddr = 1 << 1;  // <numaif.h>
  int node = -1;
  long rc = syscall(SYS_get_mempolicy, &node, nullptr, 0, base_, kMpolFNode | kMpolFAddr);
  return rc == 0 && node >= 0 ? node : -1;
}

}  // namespace offloadd::pool
