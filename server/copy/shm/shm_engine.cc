#include "server/copy/shm/shm_engine.h"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "common/base/mutex.h"

namespace offloadd::copy {
namespace {

// One mmap of a shared-memory object, shared by its registrations; unmapped and uncharged with
// the last of them.
struct Mapping {
  uint8_t* data = nullptr;
  uint64_t length = 0;
  uint32_t uid = 0;
  std::pair<uint64_t, uint64_t> inode;  // (st_dev, st_ino)
  std::shared_ptr<ShmCopyEngine::Mappings> owner;
  ~Mapping();
};

class ShmRegion : public Region {
 public:
  using Release = std::function<void()>;
  ShmRegion(std::shared_ptr<Mapping> mapping, uint64_t size, Release release)
      : mapping_(std::move(mapping)), size_(size), release_(std::move(release)) {}
  ~ShmRegion() override {
    mapping_.reset();
    release_();
  }
  uint64_t size_bytes() const override { return size_; }
  uint8_t* data() const { return mapping_->data; }

 private:
  std::shared_ptr<Mapping> mapping_;
  uint64_t size_;
  Release release_;
};

// A client may truncate its shared-memory object while the daemon copies from or to it; touching
// the vanished pages raises SIGBUS. Copies run under a per-thread guard: the handler jumps back
// out of the copy, which then fails instead of killing the daemon. SIGBUS outside a guarded
// copy goes to the handler installed before this one (the simulated GPU tables' guard), else
// keeps its default action.
// volatile + signal fences: the compiler must not drop or move the stores around memcpy.
thread_local sigjmp_buf* volatile t_copy_guard = nullptr;
struct sigaction g_previous_sigbus;  // (another guard's, e.g. the simulated GPU tables')

void OnSigbus(int sig, siginfo_t* info, void* ctx) {
  if (t_copy_guard != nullptr) siglongjmp(*t_copy_guard, 1);
  if ((g_previous_sigbus.sa_flags & SA_SIGINFO) != 0 && g_previous_sigbus.sa_sigaction != nullptr) {
    g_previous_sigbus.sa_sigaction(sig, info, ctx);
    return;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void InstallSigbusGuard() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGBUS, &sa, &g_previous_sigbus) == 0;
  }();
  (void)installed;
}

bool GuardedCopy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  sigjmp_buf jump;
  if (sigsetjmp(jump, /*savemask=*/1) != 0) {
    t_copy_guard = nullptr;
    return false;
  }
  t_copy_guard = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, bytes);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_copy_guard = nullptr;
  return true;
}

}  // namespace

// The daemon's mappings of client objects, by inode, with their charges per uid and in total.
struct ShmCopyEngine::Mappings {
  ShmMappingLimits limits;
  base::Mutex mu;
  std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<Mapping>> by_inode GUARDED_BY(mu);
  std::map<uint32_t, ShmMappingStats> by_uid GUARDED_BY(mu);
  ShmMappingStats total GUARDED_BY(mu);

  // OK when one more mapping of `bytes` for `uid` stays within every bound; mu held.
  absl::Status AdmitLocked(uint32_t uid, uint64_t bytes) const REQUIRES(mu);
  // The object's live mapping when it covers `size_bytes`, else a new one (charged).
  absl::StatusOr<std::shared_ptr<Mapping>> Acquire(std::shared_ptr<Mappings> self, int fd,
                                                   const struct stat& st, uint64_t size_bytes,
                                                   const std::string& name);
};

namespace {

// `scope`: "this user" or "all users"; `field`: the config field of the bound.
absl::Status OverBound(const char* what, const char* scope, uint64_t have, uint64_t adding,
                       uint64_t bound, const char* field) {
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the daemon already holds %d %s of shared-memory objects for %s; this registration would "
      "add %d, past %s = %d: register fewer or smaller objects (one large region with "
      "offsets), unregister unused ones, or ask the operator to raise %s",
      have, what, scope, adding, field, bound, field));
}

}  // namespace

absl::Status ShmCopyEngine::Mappings::AdmitLocked(uint32_t uid, uint64_t bytes) const {
  auto it = by_uid.find(uid);
  const ShmMappingStats mine = it == by_uid.end() ? ShmMappingStats{} : it->second;
  const ShmMappingLimits& l = limits;
  if (l.max_mappings_per_uid > 0 && mine.mappings + 1 > l.max_mappings_per_uid) {
    return OverBound("mappings", "this user", mine.mappings, 1, l.max_mappings_per_uid,
                     "max_shm_mappings_per_uid");
  }
  if (l.max_mappings_total > 0 && total.mappings + 1 > l.max_mappings_total) {
    return OverBound("mappings", "all users", total.mappings, 1, l.max_mappings_total,
                     "max_shm_mappings_total");
  }
  if (l.max_mapped_bytes_per_uid > 0 && mine.mapped_bytes + bytes > l.max_mapped_bytes_per_uid) {
    return OverBound("mapped bytes", "this user", mine.mapped_bytes, bytes,
                     l.max_mapped_bytes_per_uid, "max_shm_mapped_bytes_per_uid");
  }
  if (l.max_mapped_bytes_total > 0 && total.mapped_bytes + bytes > l.max_mapped_bytes_total) {
    return OverBound("mapped bytes", "all users", total.mapped_bytes, bytes,
                     l.max_mapped_bytes_total, "max_shm_mapped_bytes_total");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Mapping>> ShmCopyEngine::Mappings::Acquire(
    std::shared_ptr<Mappings> self, int fd, const struct stat& st, uint64_t size_bytes,
    const std::string& name) {
  const std::pair<uint64_t, uint64_t> inode{st.st_dev, st.st_ino};
  const uint32_t uid = st.st_uid;
  std::shared_ptr<Mapping> live;  // released after the lock: its destructor takes it
  base::MutexLock lock(mu);
  auto it = by_inode.find(inode);
  if (it != by_inode.end()) live = it->second.lock();
  if (live != nullptr && live->length >= size_bytes) return live;
  if (absl::Status st = AdmitLocked(uid, size_bytes); !st.ok()) return st;
  // No MAP_POPULATE: faulting every page in here would build page tables (and, for a sparse
  // object, allocate its memory) for bytes no copy may ever touch.
  void* p = mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the daemon cannot map shared-memory region '%s' (%d bytes): %s; register fewer or "
        "smaller regions",
        name, size_bytes, strerror(err)));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->data = static_cast<uint8_t*>(p);
  mapping->length = size_bytes;
  mapping->uid = uid;
  mapping->inode = inode;
  mapping->owner = std::move(self);
  by_inode[inode] = mapping;
  ShmMappingStats& mine = by_uid[uid];
  ++mine.mappings;
  mine.mapped_bytes += size_bytes;
  ++total.mappings;
  total.mapped_bytes += size_bytes;
  return mapping;
}

Mapping::~Mapping() {
  munmap(data, length);
  base::MutexLock lock(owner->mu);
  auto it = owner->by_inode.find(inode);
  if (it != owner->by_inode.end() && it->second.expired()) owner->by_inode.erase(it);
  ShmMappingStats& mine = owner->by_uid[uid];
  --mine.mappings;
  mine.mapped_bytes -= length;
  if (mine.mappings == 0) owner->by_uid.erase(uid);
  --owner->total.mappings;
  owner->total.mapped_bytes -= length;
}

ShmCopyEngine::ShmCopyEngine(ShmMappingLimits limits) : mappings_(std::make_shared<Mappings>()) {
  mappings_->limits = limits;
  InstallSigbusGuard();
}

ShmMappingStats ShmCopyEngine::mapping_stats() const {
  base::MutexLock lock(mappings_->mu);
  return mappings_->total;
}

namespace {

// The spec's own checks: an shm name shm_open accepts, a non-zero size, no CUDA handle.
absl::Status CheckShmSpec(const RegionSpec& spec) {
  if (!spec.cuda_ipc_handle.empty()) {
    return absl::InvalidArgumentError(
        "this daemon runs the shm backend and cannot open CUDA IPC handles: register a "
        "shared-memory region (shm_name), or start offloadd with backend: \"cuda\"");
  }
  if (absl::Status named = CheckShmRegionName(spec.shm_name); !named.ok()) return named;
  if (spec.size_bytes == 0) {
    return absl::InvalidArgumentError("region size_bytes is 0: register a non-empty region");
  }
  return absl::OkStatus();
}

// What a failed shm_open of `name` (errno `err`) tells the client.
absl::Status ShmOpenError(const std::string& name, int err) {
  if (err == ENOENT) {
    return absl::NotFoundError(absl::StrFormat(
        "shared-memory region '%s' does not exist: create it with shm_open before registering "
        "it (the client library's ShmRegion does)",
        name));
  }
  if (err == EACCES) {
    struct stat st {};
    const bool known = stat(("/dev/shm" + name).c_str(), &st) == 0;
    return absl::PermissionDeniedError(absl::StrFormat(
        "the daemon (uid %d) may not open shared-memory region '%s'%s: create it with mode 0660 "
        "and a group the daemon is in (the Python client does for a daemon of another uid, with "
        "the socket's group; OFFLOADD_SHM_MODE and OFFLOADD_SHM_GROUP set them), or run the "
        "daemon as root",
        geteuid(), name,
        known ? absl::StrFormat(" (owner uid %d, gid %d, mode %04o)", st.st_uid, st.st_gid,
                                st.st_mode & 07777)
              : std::string()));
  }
  if (err == EINVAL || err == ELOOP || err == EISDIR || err == ENAMETOOLONG) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' is not a shared-memory object the daemon can open (%s): register an object "
        "created with shm_open",
        name, strerror(err)));
  }
  return absl::InternalError(absl::StrFormat("shm_open('%s'): %s", name, strerror(err)));
}

// Opens the shm object `name` read-write and checks it is a regular object of at least
// `size_bytes`; returns its descriptor (the caller closes it) and fills `st`.
absl::StatusOr<int> OpenShmObject(const std::string& name, uint64_t size_bytes,
                                  struct stat* st) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return ShmOpenError(name, errno);
  absl::Status bad;
  if (fstat(fd, st) != 0) {
    bad = absl::InternalError(absl::StrFormat("fstat('%s'): %s", name, strerror(errno)));
  } else if (static_cast<uint64_t>(st->st_size) < size_bytes) {
    bad = absl::OutOfRangeError(absl::StrFormat(
        "region '%s' is registered as %d bytes but the shared-memory object has only %d: "
        "register its real size",
        name, size_bytes, static_cast<uint64_t>(st->st_size)));
  } else if (!S_ISREG(st->st_mode)) {
    bad = absl::InvalidArgumentError(absl::StrFormat(
        "'%s' is not a regular shared-memory object: register an object created with shm_open",
        name));
  }
  if (bad.ok()) return fd;
  close(fd);
  return bad;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Region>> ShmCopyEngine::OpenRegion(const RegionSpec& spec) {
  if (absl::Status bad = CheckShmSpec(spec); !bad.ok()) return bad;
  const std::string& name = spec.shm_name;
  struct stat st;
  auto opened = OpenShmObject(name, spec.size_bytes, &st);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  auto mapping = mappings_->Acquire(mappings_, fd, st, spec.size_bytes, name);
  close(fd);
  if (!mapping.ok()) return mapping.status();
  {
    base::MutexLock lock(counts_->mu);
    HandleCounts& c = counts_->by_gpu[spec.device_id];
    ++c.opens_total;
    ++c.open;
    if (!spec.transient_device) counts_->kept.insert(spec.device_id);
  }
  // The last handle of a transient device (not kept) forgets it: a device named only by
  // transient regions (probes, projector refreshes naming ever-new ids) leaves no series.
  auto release = [counts = counts_, gpu = spec.device_id] {
    base::MutexLock lock(counts->mu);
    auto it = counts->by_gpu.find(gpu);  // present: ForgetDevice keeps a device with open handles
    if (it == counts->by_gpu.end()) return;
    if (--it->second.open == 0 && counts->kept.count(gpu) == 0) counts->by_gpu.erase(it);
  };
  return std::shared_ptr<Region>(
      new ShmRegion(*std::move(mapping), spec.size_bytes, std::move(release)));
}

std::map<std::string, HandleCounts> ShmCopyEngine::handle_counts() const {
  base::MutexLock lock(counts_->mu);
  return counts_->by_gpu;
}

void ShmCopyEngine::ForgetDevice(const std::string& device_id) {
  base::MutexLock lock(counts_->mu);
  auto it = counts_->by_gpu.find(device_id);
  if (it != counts_->by_gpu.end() && it->second.open == 0 && counts_->kept.count(device_id) == 0) {
    counts_->by_gpu.erase(it);
  }
}

absl::Status ShmCopyEngine::BlockingCopyChunk(Direction direction, Region& region,
                                              uint64_t region_offset, uint8_t* host,
                                              uint64_t bytes) {
  auto& shm = static_cast<ShmRegion&>(region);
  if (region_offset > shm.size_bytes() || bytes > shm.size_bytes() - region_offset) {
    return absl::OutOfRangeError("chunk outside the region");
  }
  uint8_t* dev = shm.data() + region_offset;
  const bool ok = direction == Direction::kDeviceToHost ? GuardedCopy(host, dev, bytes)
                                                        : GuardedCopy(dev, host, bytes);
  if (!ok) {
    return absl::DataLossError(
        "the client's shared-memory region shrank under the copy (SIGBUS): keep registered "
        "regions at their registered size until they are unregistered");
  }
  return absl::OkStatus();
}

}  // namespace offloadd::copy
