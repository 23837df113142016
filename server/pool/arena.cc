#include "server/pool/arena.h"

#include <errno.h>
#include <linux/capability.h>
#include <numa.h>
#include <numaif.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
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

// mlock(2) of the pool, with the error explained.
absl::Status LockPages(uint8_t* base, uint64_t bytes) {
  if (::mlock(base, bytes) == 0) return absl::OkStatus();
  const int err = errno;
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

// mbind(MPOL_BIND) of each bound slice of the pool at `base` to its node. MPOL_MF_MOVE moves
// pages already present and mapped only here (a shared pool's); pages touched later are
// allocated on the node.
absl::Status BindSlices(uint8_t* base, const std::vector<ArenaSlice>& slices) {
  for (const ArenaSlice& s : slices) {
    if (s.numa_node < 0 || s.size_bytes == 0) continue;
    struct bitmask* mask = numa_allocate_nodemask();
    numa_bitmask_setbit(mask, static_cast<unsigned>(s.numa_node));
    const long rc = mbind(base + s.offset_bytes, s.size_bytes, MPOL_BIND, mask->maskp,
                          mask->size + 1, MPOL_MF_MOVE);
    const int err = errno;
    numa_free_nodemask(mask);
    if (rc != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "mbind of the pool slice for NUMA node ", s.numa_node, " (", MiB(s.size_bytes),
          " at offset ", s.offset_bytes, ") failed: ", std::strerror(err),
          ". Check the node list (numactl --hardware) or give no NUMA nodes to leave the pool "
          "unbound"));
    }
  }
  return absl::OkStatus();
}

// Header of a shared pool object (first 4 KiB). magic is written last when the object is
// initialised, so an object whose magic is all zero was never finished and is initialised again.
struct SharedHeader {
  char magic[8];
  uint32_t layout_version;
  uint32_t record_bytes;
  uint64_t data_offset;
  uint64_t data_bytes;
  uint64_t record_slots;
};
constexpr char kSharedMagic[8] = {'O', 'F', 'F', 'L', 'D', 'P', 'L', '1'};
constexpr uint64_t kHeaderBytes = 4096;

std::string DescribeHeader(const SharedHeader& h) {
  return absl::StrCat(h.data_bytes, " bytes of pool, ", h.record_slots,
                      " block records, layout version ", h.layout_version);
}

// Prefault a mapping without changing its bytes (the pool may hold adopted blocks).
void TouchForRead(const uint8_t* base, uint64_t bytes, uint64_t page) {
  volatile const uint8_t* p = base;
  uint8_t sink = 0;
  for (uint64_t off = 0; off < bytes; off += page) sink ^= p[off];
  (void)sink;
}

// What CreateShared needs to open, size and check a shared pool object.
struct SharedLayout {
  std::string name;   // "/" + pool_shm_name
  std::string where;  // "pool object /<name> (/dev/shm/<name>)", for messages
  uint64_t bytes = 0;        // pool data bytes
  uint64_t data_offset = 0;  // header and records come first
  uint64_t total = 0;        // the object's size: data_offset + bytes
  uint64_t slots = 0;        // block record slots
  std::string config_text;   // the layout the config asks for, for messages
  std::string policy;        // what to do about a mismatch
};

SharedLayout MakeSharedLayout(const std::string& shm_name, uint64_t bytes) {
  SharedLayout l;
  l.name = "/" + shm_name;
  l.where = absl::StrCat("pool object ", l.name, " (/dev/shm", l.name, ")");
  l.bytes = bytes;
  l.data_offset = SharedDataOffset(bytes);
  l.total = l.data_offset + bytes;
  l.slots = SharedRecordSlots(bytes);
  l.config_text = absl::StrCat(bytes, " bytes of pool, ", l.slots, " block records, layout version ",
                               kLayoutVersion);
  l.policy = absl::StrCat(
      "offloadd never re-initialises a pool that may hold confirmed blocks: set pool_bytes "
      "back to the object's size to adopt its blocks, or remove it (`rm /dev/shm",
      l.name, "`, its blocks are lost) to start with an empty pool");
  return l;
}

// Checks the object `owner` describes is the daemon's own: its uid, mode 0600.
absl::Status CheckOwned(const struct stat& owner, const SharedLayout& l) {
  // The object must be this daemon's own and closed to everyone else: another uid can create a
  // name in /dev/shm before the daemon first starts (or after an operator removed the pool), and
  // would then read and write every offloaded byte, forge block records, or hold the lock.
  if (owner.st_uid != geteuid() || (owner.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the %s belongs to uid %d with mode %04o, but a pool object must belong to the daemon's "
        "uid %d with mode 0600 (no access for group or others): another user may have created "
        "it to read or forge the pool. Remove it (`rm /dev/shm%s`) and start offloadd again, or "
        "use another pool_shm_name",
        l.where, owner.st_uid, owner.st_mode & 07777, geteuid(), l.name));
  }
  return absl::OkStatus();
}

// CheckOwned, then the object's lock.
absl::Status CheckOwnedAndLock(int fd, const SharedLayout& l) {
  struct stat owner {};
  if (fstat(fd, &owner) != 0) {
    return absl::UnavailableError(
        absl::StrCat("fstat of the ", l.where, ": ", std::strerror(errno)));
  }
  if (absl::Status s = CheckOwned(owner, l); !s.ok()) return s;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "another process holds the ", l.where,
        " (a second offloadd with the same pool_shm_name?): stop it, or give this daemon "
        "another pool_shm_name"));
  }
  return absl::OkStatus();
}

// The refusal of an existing object of `size_bytes` that is not l.total: what its header says
// it holds, and how to proceed without losing blocks (l.policy).
absl::Status SizeMismatch(int fd, uint64_t size_bytes, const SharedLayout& l) {
  SharedHeader h{};
  if (size_bytes < sizeof(h) || pread(fd, &h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h))) {
    h = SharedHeader{};
  }
  const bool ours = std::memcmp(h.magic, kSharedMagic, sizeof(kSharedMagic)) == 0;
  return absl::FailedPreconditionError(absl::StrCat(
      "the ", l.where, " has ", size_bytes, " bytes",
      ours ? absl::StrCat(" (", DescribeHeader(h), ")") : std::string(" and is not an offloadd pool"),
      " but the config asks for ", l.config_text, ". ", l.policy));
}

// Sizes a new (empty) object to l.total, or checks an existing one has that size.
absl::Status SizeSharedObject(int fd, const SharedLayout& l) {
  const std::string& where = l.where;
  const uint64_t total = l.total;
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return absl::UnavailableError(absl::StrCat("fstat of the ", where, ": ", std::strerror(errno)));
  }
  const bool fresh_file = st.st_size == 0;
  if (fresh_file) {
    auto avail = ReadMemAvailableBytes();
    if (avail.ok()) {
      if (auto s = CheckMemAvailable(total, *avail); !s.ok()) return s;
    }
    const int err = posix_fallocate(fd, 0, static_cast<off_t>(total));
    if (err != 0) {
      if (ftruncate(fd, 0) != 0) {
        LOG(WARNING) << "cannot empty the " << where << ": " << std::strerror(errno);
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot size the ", where, " to ", MiB(total), ": ", std::strerror(err),
          ". /dev/shm (tmpfs) must hold the pool: raise its size (in a container, the pod's "
          "emptyDir medium Memory sizeLimit or docker --shm-size), or lower pool_bytes"));
    }
  } else if (static_cast<uint64_t>(st.st_size) != total) {
    return SizeMismatch(fd, static_cast<uint64_t>(st.st_size), l);
  }
  return absl::OkStatus();
}

// Writes the header of a new object (*adopted = whether it still holds records), or checks an
// existing one matches `l`.
absl::Status InitOrCheckHeader(uint8_t* map, const SharedLayout& l, bool* adopted) {
  const std::string& where = l.where;
  const std::string& name = l.name;
  const uint64_t bytes = l.bytes, data_offset = l.data_offset, slots = l.slots;
  auto* header = reinterpret_cast<SharedHeader*>(map);
  static const char kZero[8] = {};
  *adopted = true;
  if (std::memcmp(header->magic, kZero, sizeof(kZero)) == 0) {
    // New (or its initialisation never finished): its records are all zero, as fallocate left
    // them. A record that is not means the header of a pool in use was damaged (its magic
    // zeroed): keep the records, which check themselves at adoption, and write the header again
    // rather than wipe confirmed blocks.
    const uint8_t* records = map + kHeaderBytes;
    *adopted = std::any_of(records, static_cast<const uint8_t*>(map + data_offset),
                           [](uint8_t b) { return b != 0; });
    if (*adopted) {
      LOG(WARNING) << "the " << where << " has block records but no header: its header was "
                   << "damaged; writing it again and adopting the records that pass their check";
    }
    std::memset(map, 0, kHeaderBytes);
    SharedHeader h{};
    h.layout_version = kLayoutVersion;
    h.record_bytes = kRecordBytes;
    h.data_offset = data_offset;
    h.data_bytes = bytes;
    h.record_slots = slots;
    std::memcpy(map, &h, sizeof(h));
    std::memcpy(header->magic, kSharedMagic, sizeof(kSharedMagic));
  } else if (std::memcmp(header->magic, kSharedMagic, sizeof(kSharedMagic)) != 0 ||
             header->layout_version != kLayoutVersion || header->record_bytes != kRecordBytes ||
             header->data_offset != data_offset || header->data_bytes != bytes ||
             header->record_slots != slots) {
    const bool ours = std::memcmp(header->magic, kSharedMagic, sizeof(kSharedMagic)) == 0;
    const std::string found =
        ours ? DescribeHeader(*header) : std::string("not an offloadd pool");
    // Same size, other layout: pool_bytes cannot fix it (a damaged header or another version).
    const bool same_size = ours && header->data_bytes == bytes;
    const std::string advice =
        same_size ? absl::StrCat("Its size matches, so its header is damaged or was written by "
                                 "another offloadd version (layout ", header->layout_version,
                                 "): start the version that wrote it to drain its blocks, or "
                                 "remove it (`rm /dev/shm", name,
                                 "`, its blocks are lost) to start with an empty pool")
                  : l.policy;
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", where, " holds ", found, " but the config asks for ", l.config_text, ". ",
        advice));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t SharedRecordSlots(uint64_t size_bytes) {
  return std::max<uint64_t>(4096, size_bytes / (16 * 1024));
}

uint64_t SharedDataOffset(uint64_t size_bytes) {
  const uint64_t meta = kHeaderBytes + SharedRecordSlots(size_bytes) * kRecordBytes;
  return (meta + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

SharedPoolObject InspectSharedPool(const std::string& shm_name, uint64_t pool_bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const SharedLayout l = MakeSharedLayout(shm_name, (pool_bytes + page - 1) / page * page);
  SharedPoolObject o;
  struct stat st {};
  if (stat(("/dev/shm" + l.name).c_str(), &st) != 0) {
    if (errno != ENOENT) {
      o.usable = absl::FailedPreconditionError(absl::StrCat(
          "cannot look at the ", l.where, ": ", std::strerror(errno),
          ". Run the check as the daemon's user"));
    }
    return o;
  }
  o.exists = true;
  o.size_bytes = static_cast<uint64_t>(st.st_size);
  o.resident_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
  o.usable = CheckOwned(st, l);
  if (o.usable.ok() && o.size_bytes != l.total) {
    const int fd = shm_open(l.name.c_str(), O_RDONLY | O_CLOEXEC, 0);
    o.usable = SizeMismatch(fd, o.size_bytes, l);
    if (fd >= 0) close(fd);
  }
  return o;
}

absl::Status ShmHugePagesFor(absl::string_view mountinfo, absl::string_view shmem_enabled) {
  // shmem_enabled lists every value with the current one in brackets.
  const size_t open = shmem_enabled.find('[');
  const size_t close = shmem_enabled.find(']');
  const absl::string_view global = open != absl::string_view::npos && close > open
                                       ? shmem_enabled.substr(open + 1, close - open - 1)
                                       : absl::string_view();
  if (global == "force") return absl::OkStatus();
  // The last mount on /dev/shm is the one a path there reaches; its huge= option decides.
  std::string huge = "never";
  bool found = false;
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || f[4] != "/dev/shm" || f.end() - dash < 4) continue;
    found = true;
    huge = "never";
    for (absl::string_view opt : absl::StrSplit(dash[3], ',')) {
      if (absl::ConsumePrefix(&opt, "huge=")) huge = std::string(opt);
    }
  }
  if (found && huge != "never" && huge != "deny" && global != "deny") return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "pool_huge_pages is set, but the shared pool (pool_shm_name) lives in /dev/shm, ",
      !found ? std::string("which is not a mount point here, ")
             : absl::StrCat("a tmpfs mounted with huge=", huge, ", "),
      "where the kernel gives it no huge pages", global == "deny" ? " (shmem_enabled is deny)" : "",
      ": it runs on 4 KiB pages. Mount /dev/shm with huge=within_size (`mount -o "
      "remount,huge=within_size /dev/shm`, and in /etc/fstab; pages already in the pool object "
      "keep their size), or set pool_huge_pages: false"));
}

absl::Status ShmHugePages() {
  auto mountinfo = ReadFile("/proc/self/mountinfo");
  if (!mountinfo.ok()) return mountinfo.status();
  auto shmem = ReadFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  return ShmHugePagesFor(*mountinfo, shmem.ok() ? *shmem : std::string());
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::CreateShared(const ArenaOptions& options,
                                                           uint64_t bytes) {
  const SharedLayout l = MakeSharedLayout(options.shm_name, bytes);
  const int fd = shm_open(l.name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot open the ", l.where, ": ",
                                                      std::strerror(errno),
                                                      ". Check pool_shm_name and /dev/shm."));
  }
  auto fail = [&](absl::Status st) {
    close(fd);
    return st;
  };
  if (absl::Status s = CheckOwnedAndLock(fd, l); !s.ok()) return fail(s);
  if (absl::Status s = SizeSharedObject(fd, l); !s.ok()) return fail(s);
  const uint64_t total = l.total;
  const bool bind = !options.numa_nodes.empty();
  const bool populate = options.prefault && !options.huge_pages && !bind;
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                 MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  if (p == MAP_FAILED) {
    return fail(absl::ResourceExhaustedError(absl::StrCat(
        "mmap of the ", l.where, " (", MiB(total), ") failed: ", std::strerror(errno))));
  }
  auto* map = static_cast<uint8_t*>(p);
  bool adopted = true;
  if (absl::Status s = InitOrCheckHeader(map, l, &adopted); !s.ok()) {
    munmap(map, total);
    return fail(s);
  }
  uint8_t* base = map + l.data_offset;
  if (options.huge_pages) {
    if (absl::Status s = ShmHugePages(); !s.ok()) LOG(WARNING) << s.message();
  }
  if (options.huge_pages && madvise(base, bytes, MADV_HUGEPAGE) != 0) {
    LOG(WARNING) << "madvise(MADV_HUGEPAGE) on the shared pool failed (" << std::strerror(errno)
                 << "); continuing with 4 KiB pages";
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const std::vector<ArenaSlice> slices = ArenaSlices(bytes, options.numa_nodes);
  // Pages posix_fallocate made (or a previous daemon left) exist already: map them all here so
  // MPOL_MF_MOVE moves them to their slice's node.
  if (options.prefault || bind) TouchForRead(base, bytes, page);
  if (absl::Status s = BindSlices(base, slices); !s.ok()) {
    munmap(map, total);
    return fail(s);
  }
  bool locked = false;
  if (options.mlock) {
    if (absl::Status s = LockPages(base, bytes); !s.ok()) {
      munmap(map, total);
      return fail(s);
    }
    locked = true;
  }
  std::unique_ptr<Arena> arena(new Arena(base, bytes, locked));
  arena->map_base_ = map;
  arena->map_bytes_ = total;
  arena->fd_ = fd;
  arena->adopted_ = adopted;
  arena->table_ = std::make_unique<BlockTable>(map + kHeaderBytes, l.slots, bytes);
  arena->slices_ = slices;
  return arena;
}

absl::Status CheckMemlockLimit(uint64_t bytes, uint64_t limit_bytes, bool privileged) {
  if (privileged || limit_bytes == static_cast<uint64_t>(RLIM_INFINITY) || bytes <= limit_bytes) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat("cannot mlock a host pool of ", MiB(bytes),
                                                    ": RLIMIT_MEMLOCK is ", LimitText(limit_bytes),
                                                    ". ", kMemlockAdvice));
}

std::vector<ArenaSlice> ArenaSlices(uint64_t size_bytes, const std::vector<int>& numa_nodes) {
  if (numa_nodes.empty()) return {ArenaSlice{-1, 0, size_bytes}};
  const uint64_t n = numa_nodes.size();
  const uint64_t align = size_bytes / n >= kHugePageBytes ? kHugePageBytes : 4096;
  const uint64_t part = size_bytes / n / align * align;
  std::vector<ArenaSlice> slices;
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t offset = i * part;
    slices.push_back({numa_nodes[i], offset, i + 1 == n ? size_bytes - offset : part});
  }
  return slices;
}

absl::Status CheckNumaNodes(const std::vector<int>& numa_nodes) {
  if (numa_nodes.empty()) return absl::OkStatus();
  if (numa_available() < 0) {
    return absl::FailedPreconditionError(
        "NUMA nodes were given for the pool but the kernel has no NUMA support "
        "(numa_available() < 0): give no nodes");
  }
  std::vector<int> present;
  for (int node = 0; node <= numa_max_node(); ++node) {
    if (numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(node))) present.push_back(node);
  }
  std::set<int> seen;
  for (int node : numa_nodes) {
    if (std::find(present.begin(), present.end(), node) == present.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NUMA node ", node, " is not a node this process may allocate memory on (nodes it may: ",
          absl::StrJoin(present, ", "), "; numactl --hardware lists them)"));
    }
    if (!seen.insert(node).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("NUMA node ", node, " is listed twice for the pool; list each node once"));
    }
  }
  return absl::OkStatus();
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
  if (absl::Status s = CheckNumaNodes(options.numa_nodes); !s.ok()) return s;
  if (!options.shm_name.empty()) {
    if (options.mlock && !MemlockPrivileged()) {
      struct rlimit rl;
      if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (auto s = CheckMemlockLimit(bytes, rl.rlim_cur, false); !s.ok()) return s;
      }
    }
    return CreateShared(options, bytes);
  }

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
  // With NUMA slices, bind before the first touch so the pages are allocated on their node.
  const bool populate = options.prefault && !options.huge_pages && options.numa_nodes.empty();
  auto mapped = Map(bytes, populate, options.huge_pages);
  if (!mapped.ok()) return mapped.status();
  uint8_t* base = *mapped;
  const std::vector<ArenaSlice> slices = ArenaSlices(bytes, options.numa_nodes);
  if (absl::Status st = BindSlices(base, slices); !st.ok()) {
    munmap(base, bytes);
    return st;
  }
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
    if (absl::Status st = LockPages(base, bytes); !st.ok()) {
      munmap(base, bytes);
      return st;
    }
    locked = true;
  }
  std::unique_ptr<Arena> arena(new Arena(base, bytes, locked));
  arena->slices_ = slices;
  return arena;
}

Arena::~Arena() {
  if (map_base_ != nullptr) {
    munmap(map_base_, map_bytes_);  // the object and its blocks stay for the next daemon
    close(fd_);                     // drops the flock
  } else if (base_ != nullptr) {
    munmap(base_, size_bytes_);
  }
}

int Arena::numa_node() const {
  constexpr int kMpolFNode = 1 << 0, kMpolFAddr = 1 << 1;  // <numaif.h>
  int node = -1;
  long rc = syscall(SYS_get_mempolicy, &node, nullptr, 0, base_, kMpolFNode | kMpolFAddr);
  return rc == 0 && node >= 0 ? node : -1;
}

}  // namespace offloadd::pool
